"""The ``prioreplay`` command: one subcommand per role.

Each subcommand is a typed settings model (flags, ``PRIOREPLAY_*`` environment variables and an
optional ``--config FILE`` section map onto the same model) plus a ``run(config) -> int``
function. Models live in light modules; the run functions import torch/grpc only when called,
so ``prioreplay --help`` answers quickly.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from prioreplay.redact import hide_passwords


@dataclass(frozen=True)
class Command:
    """A subcommand: where its settings model and its entry point live, and the install extra it
    needs beyond the base install ("": none)."""

    config: str  # "module:Class"
    run: str  # "module:function"
    help: str
    extra: str = ""
    holds_stop: bool = False  # a stop signal before run() installs its handler is kept for it (process.hold_stop_signals)


COMMANDS: dict[str, Command] = {
    "server": Command(
        "prioreplay.priority_server.config:ServerConfig",
        "prioreplay.priority_server.server:run",
        "run the priority server (gRPC + /metrics)",
    ),
    "load": Command(
        "prioreplay.priority_server.config:LoadConfig",
        "prioreplay.priority_server.admin:run_load",
        "register a dataset's problems with a running server",
    ),
    "stats": Command(
        "prioreplay.priority_server.config:StatsConfig",
        "prioreplay.priority_server.admin:run_stats",
        "print pool sizes, the priority histogram and counters",
    ),
    "worker": Command(
        "prioreplay.rollout_worker.config:WorkerConfig",
        "prioreplay.rollout_worker.main:run",
        "lease problems, generate G completions each, verify, report",
        extra="worker",
        holds_stop=True,
    ),
    "learner": Command(
        "prioreplay.learner.config:LearnerConfig",
        "prioreplay.learner.main:run",
        "pull trajectory groups, run GRPO steps, publish policy versions",
        extra="learner",
        holds_stop=True,
    ),
    "demo": Command(
        "prioreplay.apps.demo_config:DemoConfig",
        "prioreplay.apps.demo:run",
        "the whole system on one machine: server, workers, learner, report",
        extra="demo",
    ),
    "model": Command(
        "prioreplay.apps.model_config:ModelConfig",
        "prioreplay.apps.model_config:run",
        "prepare a model folder (convert an alias such as smollm2-135m once) and print its path",
        extra="worker",
    ),
    "export-stats": Command(
        "prioreplay.apps.export_stats:ExportStatsConfig",
        "prioreplay.apps.export_stats:run",
        "a run's per-problem statistics as a warm-start file for a new run (--warm-start)",
    ),
    "compare": Command(
        "prioreplay.apps.compare_config:CompareConfig",
        "prioreplay.apps.compare:run",
        "samplers side by side: demo runs with one rollout budget, compare.json/png",
        extra="demo",
    ),
}


def _load(ref: str):
    mod, _, attr = ref.partition(":")
    return getattr(importlib.import_module(mod), attr)


def _usage() -> str:
    width = max(len(n) for n in COMMANDS)
    lines = [
        "usage: prioreplay COMMAND [--config FILE] [options]",
        "",
        "Problem-level prioritized replay for GRPO post-training (Fatemi, arXiv 2601.02648).",
        "",
        "commands:",
        *(f"  {name.ljust(width)}  {cmd.help}" for name, cmd in COMMANDS.items()),
        "",
        "Every option can also be set as PRIOREPLAY_<OPTION> or in a config file section named",
        "after the command. 'prioreplay COMMAND --help' lists a command's options.",
    ]
    return "\n".join(lines)


def _pop_config(argv: list[str]) -> tuple[list[str], str | None]:
    out, path, i = [], os.environ.get("PRIOREPLAY_CONFIG") or None, 0
    while i < len(argv):
        a = argv[i]
        if a == "--config" and i + 1 < len(argv):
            path, i = argv[i + 1], i + 2
            continue
        if a.startswith("--config="):
            path = a.split("=", 1)[1]
        else:
            out.append(a)
        i += 1
    return out, path


def parse(name: str, argv: list[str]):
    """Build the settings model of subcommand ``name`` from ``argv``, env and config file.

    Raises:
        InvalidArgument: unknown command, unreadable config file, or invalid values (the
            message names each field, the value given and the allowed range).
        SystemExit: for ``--help`` (exit 0) or unparsable flags (exit 2), as argparse does.
    """
    import re

    from pydantic import ValidationError
    from pydantic_settings import SettingsError

    from prioreplay.config import file_values, read_config_file, renamed_flags
    from prioreplay.errors import InvalidArgument

    if name not in COMMANDS:
        raise InvalidArgument(f"unknown command {name!r}; choose one of: {', '.join(COMMANDS)}")
    cls = _load(COMMANDS[name].config)
    argv, cfg_path = _pop_config(renamed_flags(cls, argv))
    try:
        with file_values(read_config_file(cfg_path, name) if cfg_path else {}):
            return cls(_cli_settings_source=_cli_source(cls, f"prioreplay {name}")(args=argv))
    except ValidationError as e:
        problems = "; ".join(_problem(err) for err in e.errors())
        raise InvalidArgument(f"invalid configuration for 'prioreplay {name}': {problems}") from None
    except SettingsError as e:  # a value the flag parser cannot read as JSON, e.g. a list with nan
        field = re.search(r'field "(\w+)"', str(e))
        key = field.group(1) if field else "setting"
        value = getattr(e.__cause__, "doc", None)  # the text read as JSON, e.g. '[nan]'
        raise InvalidArgument(
            f"invalid configuration for 'prioreplay {name}': --{key.replace('_', '-')} / PRIOREPLAY_{key.upper()} "
            f"({value!r}) cannot be read ({e.__cause__ or e}); a list is comma-separated after its flag (1,0.5) and "
            f'a JSON list in the environment (\'["a", "b"]\'); numbers must be finite (no nan or inf)'
        ) from None


def _problem(err: Mapping[str, Any]) -> str:
    """One pydantic error as ``field (value): message`` (:func:`prioreplay.config.explain_error`),
    with secrets and passwords hidden."""
    from prioreplay.config import explain_error

    return hide_passwords(explain_error(err, _shown))


def _cli_source(cls, prog: str):
    """pydantic-settings' flag parser for ``cls``, whose help shows a default factory's value
    (``(default: [])``) instead of the factory's name, or nothing where the value depends on
    the process (a worker id): the field's help describes that default. A None default whose
    help says what it means (``(default runs/<sampler>-<date>)``) is not shown again as ``None``."""
    import re

    from pydantic_settings import CliSettingsSource

    class Source(CliSettingsSource):
        def _help_format(self, field_name, field_info, model_default, *args, **kwargs) -> str:  # noqa: ANN001
            text = super()._help_format(field_name, field_info, model_default, *args, **kwargs)
            if field_info.default is None and re.search(r"\(default[ :]", field_info.description or ""):
                text = text.replace(" (default: None)", "")  # the help says what None means
            factory = field_info.default_factory
            if factory is None or "(default factory: " not in text:
                return text
            try:
                value = factory()
            except TypeError:  # a factory of the validated data: no value to show
                value = None
            shown = f"(default: {value})".replace("%", "%%") if isinstance(value, (list, tuple, dict)) else ""
            return re.sub(r" ?\(default factory: [^)]*\)", (" " + shown) if shown else "", text)

    return Source(cls, cli_prog_name=prog)


#: Fields whose values are secrets: an error message shows ``***`` instead.
_SECRET_FIELDS = ("auth_token",)


def _shown(loc: tuple, value):
    """A configuration input as an error message may show it: secrets hidden, also inside the
    dict of every input that a cross-field check reports."""
    if isinstance(value, dict):
        return {k: _shown((k,), v) for k, v in value.items()}
    if loc and str(loc[-1]) in _SECRET_FIELDS and value is not None:
        return "***"
    return hide_passwords(value) if isinstance(value, str) else value


def _about(flag: str) -> int:
    """Print the usage (``--help``) or the version (``--version``); returns 0."""
    if flag in ("-V", "--version"):
        from prioreplay import __version__

        print(f"prioreplay {__version__}")
    else:
        print(_usage())
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``prioreplay`` console script; returns the process exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    name = argv[0] if argv else "help"
    from prioreplay.errors import PrioreplayError

    try:
        if name in ("-h", "--help", "help", "-V", "--version"):
            return _about(name)
        if name in COMMANDS and COMMANDS[name].holds_stop and not ({"-h", "--help"} & set(argv)):
            from prioreplay.process import hold_stop_signals

            hold_stop_signals()  # a SIGTERM while the settings parse and the model loads is a stop, not a kill
        config = parse(name, argv[1:])
        return int(_load(COMMANDS[name].run)(config) or 0)
    except PrioreplayError as e:
        print(f"prioreplay {name}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"prioreplay {name}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `prioreplay stats | head`: the reader left; exit as the shell's tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that flushing stdout at exit raises nothing
        return 141  # 128 + SIGPIPE
    except ModuleNotFoundError as e:  # a role command on an install without its extra
        extra = COMMANDS[name].extra
        if not extra or not e.name or e.name.partition(".")[0] == "prioreplay":
            raise
        print(
            f"prioreplay {name}: error: this install lacks {e.name!r}, which 'prioreplay {name}' needs; "
            f"install it with: pip install 'prioreplay[{extra}]'",
            file=sys.stderr,
        )
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
