"""One definition per setting: no two configuration models declare the same setting differently.

Every configuration model of the project is found from the source (a class named ``*Config`` or
``*Settings``, pydantic or dataclass, in ``prioreplay/`` or ``services/``) and imported; each field
a model declares itself (not inherited) is one declaration. Two declarations of one field name
must agree in type, bounds (ge/gt/le/lt, lengths: pydantic's field metadata) and default. A model
whose default is deliberately its own (``prioreplay demo`` runs G = 4 on a CPU) names the field and
the reason in its ``own_defaults`` class variable; its type and bounds must still agree.
"""

from __future__ import annotations

import ast
import dataclasses
import importlib
import typing
from pathlib import Path
from typing import Any, ClassVar

import pytest
from pydantic import BaseModel, Field
from pydantic.fields import FieldInfo

REPO = Path(__file__).resolve().parents[3]

#: Declarations that still disagree, each being removed by other work now in progress. The merger
#: deletes an entry once that work has landed; the test then holds the rest to one definition.
KNOWN: dict[tuple[str, str], str] = {}

#: Defaults that are a role's own by design, in models whose own_defaults this test cannot add.
ROLE_OWN_DEFAULTS: dict[tuple[str, str], str] = {
    ("WorkerConfig", "metrics_port"): "each role its own /metrics port (docs/INTERFACES.md, Ports)",
    ("LearnerConfig", "metrics_port"): "each role its own /metrics port (docs/INTERFACES.md, Ports)",
    ("LearnerConfig", "max_retry_sleep_s"): "a step waits on the server longer (30 s) than a worker's lease does (5 s)",
}


@dataclasses.dataclass(frozen=True)
class Declaration:
    """One field as one model declares it."""

    model: str
    field: str
    type: str
    bounds: tuple[str, ...]
    default: Any
    own_default: bool  # listed in the model's own_defaults (or ROLE_OWN_DEFAULTS)


def _config_modules() -> list[str]:
    """Modules that define a class named ``*Config`` or ``*Settings`` (read with ast, not imported)."""
    out = []
    for root, package in ((REPO / "prioreplay", "prioreplay"), (REPO / "services", "prioreplay")):
        for path in sorted(root.rglob("*.py")):
            if "_pb2" in path.name or "__pycache__" in path.parts:
                continue
            tree = ast.parse(path.read_text(encoding="utf-8"))
            if any(isinstance(n, ast.ClassDef) and n.name.endswith(("Config", "Settings")) for n in tree.body):
                parts = path.relative_to(root).with_suffix("").parts
                out.append(".".join((package, *(p for p in parts if p != "__init__"))))
    return out


def config_models() -> list[type]:
    """Every configuration model of the project: pydantic models and dataclasses named *Config/*Settings."""
    models = []
    for name in _config_modules():
        for obj in vars(importlib.import_module(name)).values():
            if not isinstance(obj, type) or obj.__module__ != name or not obj.__name__.endswith(("Config", "Settings")):
                continue
            if issubclass(obj, BaseModel) or dataclasses.is_dataclass(obj):
                models.append(obj)
    return models


def _bounds(metadata: list[Any]) -> tuple[str, ...]:
    return tuple(sorted(repr(m) for m in metadata if type(m).__module__.startswith("annotated_types")))


def _type_name(annotation: Any) -> str:
    return repr(annotation).replace("typing.", "")


def declarations(model: type) -> list[Declaration]:
    """The fields ``model`` declares itself (inherited ones are the parent's declarations)."""
    own = set(model.__dict__.get("__annotations__", {}))
    if getattr(model, "derived_from", None):
        return []  # a value built from another model's fields declares no setting of its own
    own_defaults = set(getattr(model, "own_defaults", {})) | {f for m, f in ROLE_OWN_DEFAULTS if m == model.__name__}
    out = []
    if issubclass(model, BaseModel):
        for name, info in model.model_fields.items():
            if name in own:
                default = info.get_default(call_default_factory=True, validated_data={})
                out.append(
                    Declaration(
                        model.__name__, name, _type_name(info.annotation), _bounds(info.metadata), default, name in own_defaults
                    )
                )
        return out
    hints = typing.get_type_hints(model, include_extras=True)
    for f in dataclasses.fields(model):
        if f.name not in own:
            continue
        hint, metadata = hints[f.name], []
        if typing.get_origin(hint) is typing.Annotated:
            hint, *extras = typing.get_args(hint)
            for extra in extras:
                metadata += extra.metadata if isinstance(extra, FieldInfo) else [extra]
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out.append(Declaration(model.__name__, f.name, _type_name(hint), _bounds(metadata), default, f.name in own_defaults))
    return out


def setting_conflicts(models: list[type], known: dict[tuple[str, str], str] = KNOWN) -> list[str]:
    """Every field name that two models declare with different types, bounds or defaults."""
    by_name: dict[str, list[Declaration]] = {}
    for model in models:
        for d in declarations(model):
            if (d.model, d.field) not in known and (d.model, "*") not in known:
                by_name.setdefault(d.field, []).append(d)
    wrong = []
    for name, decls in sorted(by_name.items()):
        for what, key in (("type", lambda d: d.type), ("bounds", lambda d: d.bounds)):
            if len({key(d) for d in decls}) > 1:
                wrong.append(f"{name}: {what} differ: " + "; ".join(f"{d.model} {key(d)}" for d in decls))
        shared = [d for d in decls if not d.own_default]
        if len({repr(d.default) for d in shared}) > 1:
            wrong.append(
                f"{name}: defaults differ: "
                + "; ".join(f"{d.model} {d.default!r}" for d in shared)
                + " (compose the setting with prioreplay.config.setting, or list it in own_defaults with why)"
            )
    return wrong


MODELS = config_models()


def test_the_walk_finds_every_command_model():
    names = {m.__name__ for m in MODELS}
    assert {
        "PrioreplaySettings",
        "ClientSettings",
        "ServerConfig",
        "LoadConfig",
        "StatsConfig",
        "WorkerConfig",
        "LearnerConfig",
        "DemoConfig",
        "CompareConfig",
        "StoreConfig",
    } <= names


def test_no_two_models_declare_one_setting_differently():
    wrong = setting_conflicts(MODELS)
    assert not wrong, "settings declared more than once, differently:\n" + "\n".join(wrong)


def test_every_seed_and_log_level_has_the_one_type():
    from prioreplay.config import SEED_MAX

    seeds = [d for m in MODELS for d in declarations(m) if d.field == "seed"]
    levels = [d for m in MODELS for d in declarations(m) if d.field == "log_level"]
    assert len(seeds) >= 4 and len(levels) >= 4  # the store settings (server and store), worker, learner, demo
    assert {d.bounds for d in seeds} == {("Ge(ge=0)", f"Le(le={SEED_MAX})")}
    assert len({d.type for d in levels}) == 1 and "CRITICAL" in levels[0].type


def test_own_defaults_name_fields_whose_default_is_really_the_models_own():
    for model in MODELS:
        for name, why in getattr(model, "own_defaults", {}).items():
            assert name in model.model_fields and why.strip(), f"{model.__name__}.own_defaults: {name!r}"
            others = [d for m in MODELS if m is not model for d in declarations(m) if d.field == name]
            mine = model.model_fields[name].get_default(call_default_factory=True, validated_data={})
            assert others and any(d.default != mine for d in others), f"{model.__name__}.{name}: not its own default"


def test_known_entries_are_still_conflicts():
    """A KNOWN entry whose conflict is gone must be deleted, so the list only shrinks."""
    for entry in KNOWN:
        rest = {k: v for k, v in KNOWN.items() if k != entry}
        if entry[1] != "*":
            assert setting_conflicts(MODELS, rest), f"KNOWN {entry}: no conflict left; delete the entry"


# -- the check itself ------------------------------------------------------------------------------
class _Worker(BaseModel):
    group_size: int = Field(8, ge=1, le=1024)
    name: str = "w"


class _WiderBounds(BaseModel):
    group_size: int = Field(8, ge=1, le=64)


class _OtherDefault(BaseModel):
    group_size: int = Field(4, ge=1, le=1024)


class _OwnDefault(BaseModel):
    own_defaults: ClassVar[dict[str, str]] = {"group_size": "a small run"}
    group_size: int = Field(4, ge=1, le=1024)


class _OtherType(BaseModel):
    name: int = 0


@dataclasses.dataclass
class _DataclassConfig:
    group_size: int = 16


@pytest.mark.parametrize(
    "planted, expected",
    [
        (_WiderBounds, "group_size: bounds differ"),
        (_OtherDefault, "group_size: defaults differ"),
        (_OtherType, "name: type differ"),
        (_DataclassConfig, "group_size: bounds differ"),
    ],
)
def test_the_check_catches_a_planted_duplicate(planted, expected):
    assert not setting_conflicts([_Worker])
    wrong = "\n".join(setting_conflicts([_Worker, planted]))
    assert expected in wrong, wrong


def test_the_check_accepts_a_composed_setting_and_a_declared_own_default():
    from prioreplay.config import setting

    class Composed(BaseModel):
        group_size: int = setting(_Worker, "group_size")

    class ComposedOwn(BaseModel):
        own_defaults: ClassVar[dict[str, str]] = {"group_size": "a small run"}
        group_size: int = setting(_Worker, "group_size", 4)

    assert not setting_conflicts([_Worker, Composed, ComposedOwn, _OwnDefault])
    assert ComposedOwn.model_fields["group_size"].metadata == _Worker.model_fields["group_size"].metadata
    assert ComposedOwn().group_size == 4 and Composed().group_size == 8 and _Worker().group_size == 8
    with pytest.raises(KeyError, match="_Worker has no setting 'groups'"):
        setting(_Worker, "groups")


# -- the shared settings on the command line -------------------------------------------------------
@pytest.mark.parametrize("command", ["server", "worker", "learner", "demo"])
def test_every_command_takes_the_same_log_level_in_any_case(command):
    from prioreplay.apps.cli import parse
    from prioreplay.errors import InvalidArgument

    assert parse(command, ["--log-level", "debug"]).log_level == "DEBUG"
    assert parse(command, ["--log-level", "Warning"]).log_level == "WARNING"
    with pytest.raises(InvalidArgument, match=r"log_level \('loud'\) must be one of DEBUG, INFO"):
        parse(command, ["--log-level", "loud"])


def test_a_demo_seed_whose_worker_seeds_pass_the_bound_is_refused():
    from prioreplay.apps.cli import parse
    from prioreplay.apps.demo_config import worker_seed
    from prioreplay.config import SEED_MAX
    from prioreplay.errors import InvalidArgument

    top = SEED_MAX // 1000
    assert worker_seed(parse("demo", ["--seed", str(top - 1)]).seed, 0) <= SEED_MAX
    with pytest.raises(InvalidArgument, match="workers' seeds"):
        parse("demo", ["--seed", str(top + 1)])
    with pytest.raises(InvalidArgument, match="lower --seed"):
        parse("compare", ["--seed", str(top - 1), "--seeds", "3"])


def test_help_shows_defaults_not_factories_and_compare_has_no_single_sampler(capsys):
    from prioreplay.apps.cli import parse

    for command in ("worker", "compare"):
        with pytest.raises(SystemExit):
            parse(command, ["--help"])
        text = capsys.readouterr().out
        assert "default factory" not in text and "(default: [])" in text
        if command == "compare":
            assert "--samplers" in text and "--sampler " not in text


def test_a_cross_field_error_gives_its_message_not_every_input():
    from prioreplay.apps.cli import parse
    from prioreplay.errors import InvalidArgument

    with pytest.raises(InvalidArgument) as e:
        parse("server", ["--lease-timeout-s", "100", "--max-lease-timeout-s", "10"])
    assert "lease_timeout_s (100.0) must be <= max_lease_timeout_s (10.0)" in str(e.value)
    assert "snapshot_interval_s" not in str(e.value)  # the other settings are not dumped


def test_a_validation_message_names_the_field_and_its_value_never_every_input():
    from pydantic import BaseModel, ValidationError

    from prioreplay.config import MAX_SHOWN_INPUT, explain_error

    class _Run(BaseModel):
        steps: int
        seed: int = 0
        note: str = ""

    with pytest.raises(ValidationError) as e:
        _Run.model_validate({"seed": list(range(1000)), "note": "every other setting"})
    missing, long = sorted((explain_error(err) for err in e.value.errors()), key=lambda m: not m.startswith("steps"))
    assert missing == "steps: Field required"  # pydantic's input there is every setting: not shown
    assert long.startswith("seed ([0, 1, 2,") and long.endswith("...): Input should be a valid integer")
    assert len(long) <= len("seed (") + MAX_SHOWN_INPUT + len("...): Input should be a valid integer")
    assert "every other setting" not in missing + long


def test_a_none_default_that_the_help_explains_is_not_shown_again(capsys):
    from prioreplay.apps.cli import parse

    with pytest.raises(SystemExit):
        parse("demo", ["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default runs/<sampler>-<date>)" in text
    assert "(default runs/<sampler>-<date>) (default: None)" not in text
    assert "(default: None)" in text  # a None default the help does not explain is still shown


# -- renamed settings: the old flag, variable and key still work, with a warning -----------------
@pytest.mark.parametrize(
    "command, old, new, field",
    [
        ("server", "--temperature", "--gumbel-temperature", "gumbel_temperature"),
        ("worker", "--grace-s", "--batch-grace-s", "batch_grace_s"),
        ("worker", "--lease-timeout-s", "--requested-lease-s", "requested_lease_s"),
    ],
)
def test_a_renamed_flag_still_sets_the_setting_and_warns_naming_the_new_flag(command, old, new, field, monkeypatch):
    from prioreplay import config
    from prioreplay.apps.cli import parse

    monkeypatch.setattr(config, "_WARNED", set())
    with pytest.warns(DeprecationWarning, match=f"{old} is deprecated: use {new}"):
        assert getattr(parse(command, [old, "0.5"]), field) == 0.5
    assert getattr(parse(command, [f"{old}=0.25", new, "0.75"]), field) == 0.75  # the new flag, given last, wins
    assert getattr(parse(command, [new, "0.5"]), field) == 0.5


def test_a_renamed_setting_is_read_from_its_old_variable_and_config_key_below_the_new(monkeypatch, tmp_path):
    from prioreplay import config
    from prioreplay.apps.cli import parse

    monkeypatch.setattr(config, "_WARNED", set())
    monkeypatch.setenv("PRIOREPLAY_GRACE_S", "3")
    with pytest.warns(DeprecationWarning, match="--grace-s is deprecated: use --batch-grace-s"):
        assert parse("worker", []).batch_grace_s == 3.0
    monkeypatch.setenv("PRIOREPLAY_BATCH_GRACE_S", "4")
    assert parse("worker", []).batch_grace_s == 4.0
    monkeypatch.delenv("PRIOREPLAY_GRACE_S")
    monkeypatch.delenv("PRIOREPLAY_BATCH_GRACE_S")
    (tmp_path / "c.yaml").write_text("server:\n  temperature: 0.5\n", encoding="utf-8")
    with pytest.warns(DeprecationWarning, match="use --gumbel-temperature"):
        assert parse("server", ["--config", str(tmp_path / "c.yaml")]).gumbel_temperature == 0.5


def test_a_renamed_setting_warns_once_per_process(monkeypatch):
    import warnings

    from prioreplay import config
    from prioreplay.apps.cli import parse

    monkeypatch.setattr(config, "_WARNED", set())
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        parse("server", ["--temperature", "0.5"])
        parse("server", ["--temperature", "0.5"])
    assert len([w for w in seen if issubclass(w.category, DeprecationWarning)]) == 1


def test_a_derived_model_is_built_from_its_source_and_agrees_with_its_defaults():
    """A model that names ``derived_from`` declares no setting; its source model must exist, and the
    value the source builds from its own defaults must equal the derived model's defaults (else one
    default is written twice, differently)."""
    derived = [m for m in MODELS if getattr(m, "derived_from", None)]
    assert any(m.__name__ == "LossSettings" for m in derived)
    by_name = {m.__name__: m for m in MODELS}
    for model in derived:
        source = by_name.get(model.derived_from)
        assert source is not None, f"{model.__name__}.derived_from names {model.derived_from!r}, not a configuration model"
        built = [v for v in vars(source).values() if isinstance(v, property)]
        values = [p.fget(source.model_construct()) for p in built]
        made = [v for v in values if isinstance(v, model)]
        assert made, f"{source.__name__} has no property that builds a {model.__name__}"
        assert made == [model()] * len(made), f"{source.__name__}'s defaults build {made}, {model.__name__}() is {model()}"


def test_a_config_files_values_reach_only_the_parse_that_named_it(tmp_path):
    """The file's section is a context variable of the parse, not a class attribute: a later parse
    or a settings model built in code in the same process never reads an earlier parse's file."""
    from prioreplay.apps.cli import parse
    from prioreplay.config import file_values
    from prioreplay.priority_server.config import ServerConfig

    (tmp_path / "c.yaml").write_text("server:\n  retest-interval: 7\n", encoding="utf-8")
    assert parse("server", ["--config", str(tmp_path / "c.yaml")]).retest_interval == 7
    default = ServerConfig.model_fields["retest_interval"].default
    assert default != 7
    assert ServerConfig().retest_interval == default  # built in code after that parse: no file
    assert parse("server", []).retest_interval == default
    with file_values({"retest_interval": 5}):
        assert ServerConfig().retest_interval == 5
        assert ServerConfig(retest_interval=6).retest_interval == 6  # the file is below every other source
    assert ServerConfig().retest_interval == default
