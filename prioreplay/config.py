"""Typed configuration: one pydantic model per command, one source of truth.

Every command's model is a :class:`PrioreplaySettings`. Values come from, highest first:
command-line flags (``--kebab-case``), environment variables (``PRIOREPLAY_<FIELD>``), the
config file's section named after the command (``--config FILE`` or ``PRIOREPLAY_CONFIG``; YAML
or TOML, e.g. ``server: {port: 50051}``), then the field defaults. Bounds live on the fields, so
a bad value fails at start-up with the field, the value and the allowed range.

This module imports only pydantic: ``prioreplay --help`` must stay fast.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, SecretStr
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

DEFAULT_SERVER = "127.0.0.1:50051"
MAX_MESSAGE_MB_DEFAULT = 64


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


class _FileSource(PydanticBaseSettingsSource):
    """Settings source for the command's section of the config file (lowest but defaults)."""

    def __init__(self, settings_cls: type[BaseSettings], values: dict[str, Any]):
        super().__init__(settings_cls)
        self._values = values

    def get_field_value(self, field, field_name):  # pragma: no cover - __call__ is used
        return self._values.get(field_name), field_name, False

    def __call__(self) -> dict[str, Any]:
        return {k.replace("-", "_"): v for k, v in self._values.items()}


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

    #: Set by the CLI dispatcher before construction: the config file's section values.
    _file_values: ClassVar[dict[str, Any]] = {}

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings):
        return (init_settings, env_settings, _FileSource(settings_cls, cls._file_values))


class ChannelSettings(BaseModel):
    """The settings both ends of the gRPC channel take: the bearer token and the message limit.

    Declared once here and composed into :class:`ClientSettings` and the server's
    ``ServerConfig``, so the two ends share bounds, defaults and help.
    """

    auth_token: SecretStr | None = Field(
        None, description="bearer token: the server requires it on every RPC but health, clients send it "
        "(env PRIOREPLAY_AUTH_TOKEN); never logged"
    )
    auth_token_file: Path | None = Field(None, description="file holding the bearer token (alternative to --auth-token)")
    max_message_mb: int = Field(
        MAX_MESSAGE_MB_DEFAULT, ge=1, le=2000, description="largest gRPC message sent or received, MiB"
    )

    def token(self) -> str | None:
        """The bearer token from ``auth_token`` or ``auth_token_file`` (stripped), or None.

        Raises:
            InvalidArgument: the token file cannot be read or is empty.
        """
        return read_token(self.auth_token, self.auth_token_file)


class ClientSettings(PrioreplaySettings, ChannelSettings):
    """How a client (worker, learner, load, stats) reaches the priority server."""

    server: str = Field(DEFAULT_SERVER, description="priority server address HOST:PORT, or dns:///HOST:PORT to "
                        "spread RPCs over every address HOST resolves to (round_robin; scaled servers)")
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


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")


def check_role_settings(model: str, device: str, log_level: str) -> None:
    """Checks shared by the worker's and the learner's settings.

    Raises:
        InvalidArgument: an unknown log level, a device other than auto/cpu/cuda/cuda:N, or an
            empty model name (each message names the value and the accepted forms).
    """
    from prioreplay.errors import InvalidArgument

    if log_level.upper() not in LOG_LEVELS:
        raise InvalidArgument(f"log_level ({log_level!r}) must be DEBUG, INFO, WARNING or ERROR")
    if not (device in ("auto", "cpu", "cuda") or (device.startswith("cuda:") and device[5:].isdigit())):
        raise InvalidArgument(f"device ({device!r}) must be 'auto', 'cpu', 'cuda' or 'cuda:N'")
    if not model.strip():
        raise InvalidArgument("model is empty; give an alias (smollm2-135m), a local directory or a Hugging Face id")
