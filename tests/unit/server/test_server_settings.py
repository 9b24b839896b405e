"""One definition per setting on the server's side: the fields the server shares with the stores
and with the clients are declared once and composed, with one bound, default and help.

Also the checks at construction of :class:`StoreConfig` (InvalidArgument naming the field, the
value and the bound) and the one lease-timeout check both models share.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import ValidationError

from prioreplay.config import ChannelSettings, ClientSettings
from prioreplay.errors import InvalidArgument
from prioreplay.priority_server.config import ServerConfig, StoreConfig, StoreSettings
from prioreplay.rules import PriorityParams

REPO = Path(__file__).resolve().parents[3]
SETTINGS_MODULES = [REPO / "prioreplay" / "config.py", *sorted((REPO / "services" / "priority_server").rglob("*.py"))]


def _same_declaration(a, b) -> bool:
    return (a.annotation, a.default, a.default_factory, a.description, a.metadata) == (
        b.annotation,
        b.default,
        b.default_factory,
        b.description,
        b.metadata,
    )


def test_settings_shared_by_server_and_stores_are_one_declaration():
    shared = set(ServerConfig.model_fields) & set(StoreConfig.model_fields)
    assert shared == set(StoreSettings.model_fields)  # everything the server passes on to the store
    # with sampler_args (docs/SAMPLERS.md), the report rules, warm start, heap ageing, unseen prior, the pace bound
    assert len(shared) == 28
    for name in shared:
        assert _same_declaration(ServerConfig.model_fields[name], StoreConfig.model_fields[name]), name


def test_settings_shared_by_server_and_clients_are_one_declaration():
    shared = set(ServerConfig.model_fields) & set(ClientSettings.model_fields)
    assert shared == set(ChannelSettings.model_fields) == {"auth_token", "auth_token_file", "max_message_mb"}
    for name in shared:
        assert _same_declaration(ServerConfig.model_fields[name], ClientSettings.model_fields[name]), name


def test_no_shared_setting_is_declared_twice_in_the_source():
    """A field of StoreSettings or ChannelSettings is declared in exactly one settings class body
    (a class named ``*Settings`` / ``*Config``; request values such as SampleRequest do not count)."""
    names = set(StoreSettings.model_fields) | set(ChannelSettings.model_fields)
    where: dict[str, list[str]] = {n: [] for n in names}
    for path in SETTINGS_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.name.endswith(("Settings", "Config")):
                for stmt in node.body:
                    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name) and stmt.target.id in names:
                        where[stmt.target.id].append(f"{path.name}:{node.name}")
    assert {n: w for n, w in where.items() if len(w) != 1} == {}


def test_server_config_builds_the_store_config_from_its_own_values():
    cfg = ServerConfig(sampler="gumbel", gumbel_temperature=0.3, seed=5, lease_timeout_s=30, decay=0.9, prior_alpha=1.0)
    store = cfg.to_store_config()
    assert all(getattr(store, n) == getattr(cfg, n) for n in StoreSettings.model_fields)
    assert store.params == PriorityParams(decay=0.9, prior_alpha=1.0, prior_beta=0.0)


@pytest.mark.parametrize(
    "field, value, bound",
    [
        ("alpha", 0.0, "greater than 0"),
        ("alpha", 101.0, "less than or equal to 100"),
        ("retest_fraction", 1.5, "less than or equal to 1"),
        ("max_batch_size", 0, "greater than or equal to 1"),
        ("lease_timeout_s", float("nan"), "less than or equal to"),
        ("seed", -1, "greater than or equal to 0"),
    ],
)
def test_store_config_refuses_out_of_bounds_values_naming_field_value_and_bound(field, value, bound):
    with pytest.raises(InvalidArgument) as err:
        StoreConfig(**{field: value})
    msg = str(err.value)
    assert msg.startswith(f"{field} (") and repr(value) in msg and bound in msg
    with pytest.raises(ValidationError, match=field):
        ServerConfig(**{field: value})  # the same bound on the command line


def test_the_lease_timeout_check_is_one_rule_for_both_models():
    for make, error in ((StoreConfig, InvalidArgument), (ServerConfig, ValidationError)):
        with pytest.raises(error, match=r"lease_timeout_s \(120.0\) must be <= max_lease_timeout_s \(60.0\)"):
            make(lease_timeout_s=120, max_lease_timeout_s=60)
        assert make(lease_timeout_s=60, max_lease_timeout_s=60).lease_timeout_s == 60


def test_store_config_is_immutable_and_refuses_unknown_fields():
    cfg = StoreConfig(seed=2)
    with pytest.raises(ValidationError):
        cfg.seed = 3
    with pytest.raises(InvalidArgument, match="lease_timout_s"):
        StoreConfig(lease_timout_s=5)
    assert StoreConfig(seed=2) == cfg and hash(StoreConfig(seed=2)) == hash(cfg)


def test_several_processes_need_a_redis_store():
    with pytest.raises(ValidationError, match=r"processes \(2\) > 1 needs a Redis store"):
        ServerConfig(processes=2)
    assert ServerConfig(processes=2, store="redis://127.0.0.1:6379/0").processes == 2


def test_backpressure_is_on_by_default_and_its_bound_fits_the_documented_arithmetic():
    """redis #6941: an unbounded queue by default grew ~1 GB while a learner was down."""
    from prioreplay.priority_server.config import DEFAULT_MAX_QUEUE_DEPTH

    depth = ServerConfig().max_queue_depth
    assert depth == DEFAULT_MAX_QUEUE_DEPTH > 0
    group_bytes = 8 * 512 * (4 + 4) + 8 * 1024  # G=8 x 512 tokens x (id + log-prob) + prompt and framing
    assert depth * group_bytes <= 64 * 2**20  # far below the compose Redis's 4 GiB maxmemory
    assert ServerConfig(max_queue_depth=0).max_queue_depth == 0  # still possible to turn off


def test_retest_versions_is_off_by_default_reaches_the_store_and_refuses_negative_values():
    assert ServerConfig(_cli_parse_args=[]).to_store_config().retest_versions == 0  # the paper's step clock
    cfg = ServerConfig(_cli_parse_args=["--retest-versions", "2"])
    assert cfg.to_store_config().retest_versions == 2
    with pytest.raises(InvalidArgument, match="retest_versions"):
        StoreConfig(retest_versions=-1)
