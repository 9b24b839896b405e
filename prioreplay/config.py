"""Typed configuration: one pydantic model per command, one source of truth.

Every command's model is a :class:`PrioreplaySettings`. Values come from, highest first:
command-line flags (``--kebab-case``), environment variables (``PRIOREPLAY_<FIELD>``), the
config file's section named after the command (``--config FILE`` or ``PRIOREPLAY_CONFIG``; YAML
or TOML, e.g. ``server: {port: 50051}``), then the field defaults. Bounds live on the fields, so
a bad value fails at start-up with the field, the value and the allowed range.

One definition per setting: a setting that several commands take is declared once, with its
bounds and help, and composed by the others: the shared types :data:`Seed` and :data:`LogLevel`
here, and :func:`setting` for a field another command's model declares (``prioreplay demo`` takes
the worker's ``group_size`` that way). ``tests/unit/config/test_settings.py`` fails when two models declare
the same setting with different bounds, types or defaults.

This module imports only pydantic: ``prioreplay --help`` must stay fast.
"""

from __future__ import annotations

import logging
import os
import tomllib
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, BeforeValidator, Field, SecretStr, model_validator
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_SERVER = "127.0.0.1:50051"
MAX_MESSAGE_MB_DEFAULT = 64

#: Largest seed any command takes. Seeds go to the server's tie-break key (8 signed bytes,
#: ``store.tie_member``) and sampler hash (``samplers.step_seed``: only its 32-bit BLAKE2 digest
#: reaches Lua, so Redis' double-precision numbers never see a seed), ``torch.manual_seed`` and
#: ``random.seed`` (learner), and per batch ``seed + k`` to the generation backends, which take
#: seeds below 2**63 (``SamplingParams``; vLLM's per-request torch generator). 2**62 leaves 2**62
#: derived seeds (a worker's batch index, ``compare``'s seed + arm) inside signed 64 bits.
SEED_MAX = 2**62

#: A seed: an integer in [0, SEED_MAX]. Every command's ``seed`` field has this type.
Seed = Annotated[int, Field(ge=0, le=SEED_MAX)]

#: The log levels every command accepts (Python's logging names).
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def _log_level(value: object) -> object:
    """``value`` upper-cased; a name outside :data:`LOG_LEVELS` is refused naming the value."""
    if isinstance(value, str) and value.upper() in LOG_LEVELS:
        return value.upper()
    raise ValueError(f"log_level ({value!r}) must be one of {', '.join(LOG_LEVELS)} (any case)")


#: A log level, in any case (``--log-level debug`` = ``DEBUG``). Every command's ``log_level``
#: field has this type and so the same help and the same check.
LogLevel = Annotated[
    Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"],
    BeforeValidator(_log_level),
    Field(description="log level: DEBUG, INFO, WARNING, ERROR or CRITICAL (any case)"),
]


def setting(owner: type[BaseModel], name: str, default: Any = ..., default_factory: Any = None) -> Any:
    """The field ``name`` as ``owner`` declares it (type bounds, help, default), for another
    command's model that takes the same setting: ``group_size: int = setting(WorkerConfig,
    "group_size", 4)``.

    Args:
        owner: the model that declares the setting (e.g. ``WorkerConfig``).
        name: the field's name in ``owner``.
        default: this command's own default instead of the owner's (``...``: the owner's). A model
            that gives one names the field and the reason in its ``own_defaults`` class variable,
            which ``tests/unit/config/test_settings.py`` reads; bounds and help stay the owner's.
        default_factory: as ``default``, for a mutable default (a list).

    Raises:
        KeyError: ``owner`` has no field ``name`` (the message names the model and the field).
    """
    if name not in owner.model_fields:
        raise KeyError(f"{owner.__name__} has no setting {name!r}; choose one of {', '.join(owner.model_fields)}")
    info = FieldInfo.merge_field_infos(owner.model_fields[name])  # a copy: the owner's stays as it is
    if default_factory is not None:
        info.default, info.default_factory = PydanticUndefined, default_factory
    elif default is not ...:
        info.default, info.default_factory = default, None
    for key in ("default", "default_factory"):
        info._attributes_set.pop(key, None)  # so that pydantic's merge keeps the values set here
    if info.default_factory is None:
        info._attributes_set["default"] = info.default
    else:
        info._attributes_set["default_factory"] = info.default_factory
    return info


def read_config_file(path: str | os.PathLike, section: str) -> dict[str, Any]:
    """Read the ``section`` of a YAML or TOML config file.

    Args:
        path: file ending in ``.yaml``, ``.yml`` or ``.toml``.
        section: the command name (``server``, ``worker``, ...). A file without that top-level
            key yields ``{}``: one file can configure the whole stack.

    Raises:
        InvalidArgument: the file is missing, unparsable, or the section is not a mapping.
    """
    from prioreplay.errors import InvalidArgument

    p = Path(path)
    if not p.is_file():
        raise InvalidArgument(f"config file {str(p)!r} does not exist; pass --config with an existing YAML or TOML file")
    text = p.read_text(encoding="utf-8")
    try:
        if p.suffix == ".toml":
            data = tomllib.loads(text)
        else:
            import yaml

            data = yaml.safe_load(text) or {}
    except Exception as e:  # noqa: BLE001 - any parser error becomes one clear message
        raise InvalidArgument(f"config file {str(p)!r} could not be parsed: {e}") from e
    if not isinstance(data, dict):
        raise InvalidArgument(f"config file {str(p)!r} must hold a mapping of sections, got {type(data).__name__}")
    sec = data.get(section, {})
    if not isinstance(sec, dict):
        raise InvalidArgument(f"section {section!r} of config file {str(p)!r} must be a mapping")
    return sec


#: Longest input a validation message repeats, characters (a longer one is cut, marked with "...").
MAX_SHOWN_INPUT = 120


def explain_error(err: Mapping[str, Any], shown: Callable[[tuple, Any], Any] | None = None) -> str:
    """One pydantic error (an entry of ``ValidationError.errors()``) as a message that names the
    field and its value only, never every input: ``field (value): message``.

    A check of ours (``value_error``) names the value: its message, after the field unless the
    message names it. A cross-field check (no field) and a missing field, whose input pydantic
    gives as every setting, give no value. A value longer than :data:`MAX_SHOWN_INPUT` characters is cut.

    Args:
        err: the error dict (``loc``, ``msg``, ``type``, ``input``).
        shown: how the input may be shown (e.g. secrets hidden), given ``(loc, input)``; default as is.
    """
    msg = err["msg"].removeprefix("Value error, ")
    loc = ".".join(str(part) for part in err["loc"])
    if not loc or (err["type"] == "value_error" and str(err["loc"][-1]) in msg):
        return msg
    if err["type"] in ("missing", "value_error"):
        return f"{loc}: {msg}"
    value = repr(shown(tuple(err["loc"]), err.get("input")) if shown else err.get("input"))
    if len(value) > MAX_SHOWN_INPUT:
        value = value[:MAX_SHOWN_INPUT] + "..."
    return f"{loc} ({value}): {msg}"


#: Renamed settings already warned about in this process, (model, old name): each warns once.
_WARNED: set[tuple[str, str]] = set()


def warn_renamed(model: type, old: str, new: str) -> None:
    """Warn once per process that ``model``'s setting ``old`` is now ``new``: a
    ``DeprecationWarning`` and a log line, both naming the new flag."""
    if (model.__name__, old) in _WARNED:
        return
    _WARNED.add((model.__name__, old))
    msg = f"--{old.replace('_', '-')} is deprecated: use --{new.replace('_', '-')} (same value)"
    warnings.warn(msg, DeprecationWarning, stacklevel=3)
    logging.getLogger("prioreplay.config").warning(msg)


def renamed_values(model: type, values: dict[str, Any]) -> dict[str, Any]:
    """``values`` (field name -> value) with each renamed setting of ``model`` under its new name
    (:attr:`PrioreplaySettings.renamed`); where both names are given, the new one wins."""
    renamed = getattr(model, "renamed", {})
    out = {k: v for k, v in values.items() if k not in renamed}
    for old, new in renamed.items():
        if old in values:
            warn_renamed(model, old, new)
            out.setdefault(new, values[old])
    return out


def renamed_flags(model: type, argv: list[str]) -> list[str]:
    """``argv`` with each renamed setting's old flag (``--old-name V``, ``--old-name=V``) of
    ``model`` spelt as its new flag, warning once per old flag (:func:`warn_renamed`)."""
    flags = {f"--{old.replace('_', '-')}": (old, new) for old, new in getattr(model, "renamed", {}).items()}
    out = []
    for arg in argv:
        flag, eq, value = arg.partition("=")
        if flag in flags:
            old, new = flags[flag]
            warn_renamed(model, old, new)
            arg = f"--{new.replace('_', '-')}{eq}{value}"
        out.append(arg)
    return out


class _FileSource(PydanticBaseSettingsSource):
    """Settings source for the command's section of the config file (lowest but defaults)."""

    def __init__(self, settings_cls: type[BaseSettings], values: Mapping[str, Any]):
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is used
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return {k.replace("-", "_"): v for k, v in self._values.items()}


class _RenamedEnvSource(PydanticBaseSettingsSource):
    """Settings source for the old environment variables of renamed settings
    (``PRIOREPLAY_<OLD>``), below the current ones: ``PRIOREPLAY_<NEW>`` wins over it."""

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is used
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        renamed = getattr(self.settings_cls, "renamed", {})
        given = {old: os.environ[f"PRIOREPLAY_{old.upper()}"] for old in renamed if f"PRIOREPLAY_{old.upper()}" in os.environ}
        return renamed_values(self.settings_cls, given)


#: The config file's section values of the settings being built in this context (:func:`file_values`).
_FILE_VALUES: ContextVar[Mapping[str, Any] | None] = ContextVar("prioreplay_file_values", default=None)


@contextmanager
def file_values(values: Mapping[str, Any]) -> Iterator[None]:
    """Build settings inside this block with ``values`` (a config file's section) as their file source.

    A context variable, not a class attribute: the values reach only the settings built in this
    block, in this thread or task, so two parses in one process (tests, the demo's children) never
    see each other's file.
    """
    token = _FILE_VALUES.set(values)
    try:
        yield
    finally:
        _FILE_VALUES.reset(token)


class PrioreplaySettings(BaseSettings):
    """Base of every command's configuration (flags, ``PRIOREPLAY_*`` env, config file)."""

    model_config = SettingsConfigDict(
        env_prefix="PRIOREPLAY_",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        cli_avoid_json=True,
        cli_hide_none_type=True,
        extra="forbid",
        validate_default=True,
    )

    #: Settings renamed, old field name -> new. The old flag (:func:`renamed_flags`), environment
    #: variable and config-file key are still taken, under the new name, with a deprecation
    #: warning naming the new flag; given both ways, the new name wins.
    renamed: ClassVar[dict[str, str]] = {}

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        return (init_settings, env_settings, _RenamedEnvSource(settings_cls), _FileSource(settings_cls, _FILE_VALUES.get() or {}))

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, values: Any) -> Any:
        # Keyword arguments and config-file keys under a renamed setting's old name.
        return renamed_values(cls, values) if isinstance(values, dict) and cls.renamed else values


class ChannelSettings(BaseModel):
    """The settings both ends of the gRPC channel take: the bearer token and the message limit.

    Declared once here and composed into :class:`ClientSettings` and the server's
    ``ServerConfig``, so the two ends share bounds, defaults and help.
    """

    auth_token: SecretStr | None = Field(
        None,
        description="bearer token: the server requires it on every RPC but health, clients send it "
        "(env PRIOREPLAY_AUTH_TOKEN); never logged",
    )
    auth_token_file: Path | None = Field(None, description="file holding the bearer token (alternative to --auth-token)")
    max_message_mb: int = Field(MAX_MESSAGE_MB_DEFAULT, ge=1, le=2000, description="largest gRPC message sent or received, MiB")

    def token(self) -> str | None:
        """The bearer token from ``auth_token`` or ``auth_token_file`` (stripped), or None.

        Raises:
            InvalidArgument: the token file cannot be read or is empty.
        """
        return read_token(self.auth_token, self.auth_token_file)


class ClientSettings(PrioreplaySettings, ChannelSettings):
    """How a client (worker, learner, load, stats) reaches the priority server."""

    server: str = Field(
        DEFAULT_SERVER,
        description="priority server address HOST:PORT, or dns:///HOST:PORT to "
        "spread RPCs over every address HOST resolves to (round_robin; scaled servers)",
    )
    tls_ca_file: Path | None = Field(None, description="CA certificate (PEM) to trust; enables TLS to the server")
    rpc_timeout_s: float = Field(30.0, gt=0, le=3600, description="deadline of each RPC, seconds")


def read_token(token: SecretStr | None, token_file: Path | None) -> str | None:
    """The bearer token from a secret or a file (stripped), or None when neither is given.

    Used by the clients' and the server's settings alike.

    Raises:
        InvalidArgument: the token file cannot be read or is empty.
    """
    from prioreplay.errors import InvalidArgument

    if token is not None:
        return token.get_secret_value()
    if token_file is None:
        return None
    try:
        tok = Path(token_file).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise InvalidArgument(f"auth token file {str(token_file)!r} cannot be read: {e.strerror}") from e
    if not tok:
        raise InvalidArgument(f"auth token file {str(token_file)!r} is empty; write the token into it")
    return tok


def check_role_settings(model: str, device: str, log_level: str | None = None) -> None:
    """Checks shared by the worker's and the learner's settings.

    Args:
        model: the model name (non-empty).
        device: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
        log_level: unused; the :data:`LogLevel` type checks every command's log level.

    Raises:
        InvalidArgument: a device other than auto/cpu/cuda/cuda:N, or an empty model name (each
            message names the value and the accepted forms).
    """
    from prioreplay.errors import InvalidArgument

    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise InvalidArgument(f"device ({device!r}) must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not model.strip():
        raise InvalidArgument("model is empty; give an alias (smollm2-135m), a local directory or a Hugging Face id")
