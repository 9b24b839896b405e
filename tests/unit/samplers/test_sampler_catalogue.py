"""docs/SAMPLERS.md's catalogue table against the registry: one row per registered sampler in
registry order, each row's parameters exactly its model's fields with the model's defaults, and its
Redis column the sampler's Lua file (or "memory only" for a sampler without a Lua branch)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prioreplay.priority_server.samplers import DEFAULT_SAMPLER, SAMPLERS

DOC = Path(__file__).resolve().parents[3] / "docs" / "SAMPLERS.md"
LUA = Path(__file__).resolve().parents[3] / "services" / "priority_server" / "store" / "redis"


def catalogue() -> dict[str, tuple[str, str]]:
    """The table's rows: ``{sampler: (parameters cell, Redis cell)}``, in the table's order."""
    rows: dict[str, tuple[str, str]] = {}
    for line in DOC.read_text(encoding="utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        match = re.fullmatch(r"`([a-z][a-z-]*)`( \(default\))?", cells[0]) if line.startswith("| `") else None
        if match and len(cells) == 4:
            rows[match.group(1)] = (cells[2], cells[3])
            if match.group(2):
                assert match.group(1) == DEFAULT_SAMPLER, f"the table marks {match.group(1)!r} default, not {DEFAULT_SAMPLER!r}"
    return rows


def test_the_catalogue_lists_every_registered_sampler_once_in_registry_order():
    assert list(catalogue()) == list(SAMPLERS)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_rows_parameters_are_its_models_fields_with_their_defaults(name):
    cell = catalogue()[name][0]
    written = dict(re.findall(r"`--([a-z-]+)` = ([0-9.]+)", cell))
    model = SAMPLERS[name].params
    expected = {f.replace("_", "-"): info.default for f, info in model.model_fields.items() if f != "name"}
    assert set(written) == set(expected), f"{name}: the table names {sorted(written)}, the model has {sorted(expected)}"
    for flag, default in expected.items():
        assert float(written[flag]) == float(default), f"{name}: --{flag} = {written[flag]} in the table, {default} in the model"
    assert (cell == "none") == (not expected)


@pytest.mark.parametrize("name", list(SAMPLERS))
def test_a_rows_redis_column_is_its_lua_file(name):
    cell = catalogue()[name][1]
    branch = SAMPLERS[name].lua_branch
    if branch is None:
        assert cell == "memory only"
    else:
        assert cell == f"`lua/samplers/{branch}.lua`"
        assert (LUA / "lua" / "samplers" / f"{branch}.lua").is_file()


def test_the_check_catches_a_row_that_drifted(monkeypatch, tmp_path):
    """The parser reads what a drifted row says: a changed default no longer matches."""
    drifted = tmp_path / "SAMPLERS.md"
    drifted.write_text(DOC.read_text(encoding="utf-8").replace("`--alpha` = 1.0", "`--alpha` = 2.0"), encoding="utf-8")
    monkeypatch.setitem(globals(), "DOC", drifted)
    assert catalogue()["weighted"][0] == "`--alpha` = 2.0"
    with pytest.raises(AssertionError, match="--alpha = 2.0 in the table"):
        test_a_rows_parameters_are_its_models_fields_with_their_defaults("weighted")
