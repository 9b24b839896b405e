"""The Redis store's Lua scripts: where they are, which are followed by ``WAIT``, and their sources
(each ``lua/<name>.lua`` with the shared library ``lua/lib.lua`` and the namespace identity check
``lua/namespace_check.lua`` prepended).

The check takes seven KEYS and one ARGV in front of every script's own (:data:`CHECK_KEYS`, then the
identity the server claimed, "" for no check) and refuses the call with the error reply
``NAMESPACE_CHANGED <stored identity>`` when the namespace's identity is not the claimed one, a
loss marker exists, or a key it must hold is missing (:mod:`..identity`, :func:`..identity.missing_keys`);
the store adds them to every call (``RedisClient._script_call``), so the scripts' own KEYS and ARGV,
and their headers, are numbered as if it were not there."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prioreplay import rules, unseen_prior

from ..contract import EXPIRE_LIMIT, TOMBSTONE_TTL_S
from .keys import STATE_KEYS

if TYPE_CHECKING:  # pragma: no cover
    from ...config import StoreConfig

#: The folder of the Lua files (shipped as package data).
LUA_DIR = Path(__file__).with_name("lua")
#: The store's scripts, each ``lua/<name>.lua``.
SCRIPT_NAMES = ("register", "sample", "report", "renew", "expire", "publish", "pull", "ack", "seen", "claim")
#: The keys the namespace check (``lua/namespace_check.lua``) takes in front of every script's KEYS.
CHECK_KEYS = ("identity", "lost", "settings", "counters", "problems", "stats", "heap")
#: Scripts whose change a client is told is done: with ``min_replica_acks`` each is followed by WAIT.
#: (A lost lease of ``sample`` or a lost expiry changes nothing a client was promised: a report of
#: that lease is answered ``unknown lease``, the problems are leased again. A lost renewal leaves the
#: earlier deadline: the next renewal moves it again, or the lease expires as if its holder had died.)
WAITED_SCRIPTS = frozenset({"register", "report", "publish", "ack"})


@dataclass(frozen=True)
class ScriptArgs:
    """The arguments of one script, declared once: its KEYS and ARGV by name, in order.

    The Lua file's header comment lists the same names (``-- KEYS[i]  name`` and ``-- ARGV[i]  name``
    lines; ``-- ARGV[i...]  name`` for a variadic tail); ``tests/unit/store/test_lua_headers.py`` checks
    the two lists against each other, so an argument added on one side only fails a unit test.

    Attributes:
        name: the script, ``lua/<name>.lua``.
        keys: its KEYS, each a key name of :data:`.keys.KEY_NAMES` (or ``parts``: ``parts:<lease id>``).
        argv: its ARGV, by position (at most :data:`MAX_ARGV`).
        rest: the name of a variadic tail after ``argv`` ("" for none).
    """

    name: str
    keys: tuple[str, ...]
    argv: tuple[str, ...]
    rest: str = ""

    def __post_init__(self) -> None:
        if len(self.argv) > MAX_ARGV:
            raise ValueError(f"{self.name}.lua declares {len(self.argv)} positional ARGV, more than {MAX_ARGV}; pass a JSON one")

    def key_list(self, keys: Mapping[str, str]) -> list[str]:
        """The KEYS of a call: ``keys[name]`` for each declared key name, in order.

        Raises:
            KeyError: a declared key missing from ``keys``.
        """
        return [keys[n] for n in self.keys]

    def arg_list(self, rest: Sequence[Any] = (), **values: Any) -> list[Any]:
        """The ARGV of a call: the declared names' values in order, then ``rest`` (the variadic tail).

        Raises:
            TypeError: a declared argument missing, one not declared given, or a tail for a script without one.
        """
        missing, extra = set(self.argv) - set(values), set(values) - set(self.argv)
        if missing or extra or (rest and not self.rest):
            raise TypeError(
                f"{self.name}.lua takes ARGV {list(self.argv)}{' + ' + self.rest if self.rest else ''}; "
                f"missing {sorted(missing)}, not declared {sorted(extra)}"
            )
        return [values[n] for n in self.argv] + list(rest)


#: Positional ARGV a script may declare; more parameters travel as one JSON argument.
MAX_ARGV = 10

#: Every script's arguments (the Lua headers say the same: tests/unit/store/test_lua_headers.py).
SCRIPT_ARGS = {
    a.name: a
    for a in (
        ScriptArgs(
            "register",
            ("stats", "heap", "problems", "solved", "unsolved", "quarantine", "counters"),
            ("initial", "priority", "chunk", "replace", "warm"),
        ),
        ScriptArgs(
            "sample",
            (*STATE_KEYS, "problems", "policy", "requests", "requests:due", "tokens", "owners", "stream"),
            ("now", "batch_size", "lease_s", "lease_id", "expected_step", "seed32", "request_id", "worker_id", "run", "sampler"),
        ),
        ScriptArgs(
            "report",
            (*STATE_KEYS, "stream", "parts", "quarantine", "tokens", "policy", "owners", "evidence"),
            ("now", "lease_id", "more_parts", "group", "run", "n_outcomes"),
            rest="outcomes",
        ),
        ScriptArgs(
            "renew",
            (*STATE_KEYS, "owners", "requests", "requests:due", "parts"),
            ("now", "lease_id", "worker_id", "lease_s"),
        ),
        ScriptArgs("expire", (*STATE_KEYS, "owners"), ("now", "limit")),
        ScriptArgs("publish", ("policy",), ("version", "uri")),
        ScriptArgs("pull", ("stream",), ("group", "consumer", "max", "own", "min_idle_ms", "watch")),
        ScriptArgs("ack", ("stream", "counters"), ("group",), rest="group_ids"),
        ScriptArgs("seen", ("counters", "stats"), ()),
        ScriptArgs("claim", ("identity", "lost", "settings", "counters"), ("run_id", "accept_loss", "settings")),
    )
}


def lua_library() -> str:
    """The shared Lua functions (``lua/lib.lua``) every script of the store is prefixed with."""
    return (LUA_DIR / "lib.lua").read_text(encoding="utf-8")


#: The line of ``sample.lua`` where the samplers' files go.
SAMPLERS_MARK = "--@samplers"


def sampler_files() -> dict[str, Path]:
    """{branch name: ``lua/samplers/<name>.lua``}: each file adds its branch to sample.lua's ``branches``."""
    return {f.stem: f for f in sorted((LUA_DIR / "samplers").glob("*.lua"))}


def load_scripts() -> dict[str, str]:
    """{script name: its source}: ``lua/lib.lua``, ``lua/namespace_check.lua``, then ``lua/<name>.lua``;
    in ``sample.lua`` the line :data:`SAMPLERS_MARK` is replaced by every ``lua/samplers/<name>.lua``
    (name order).

    Raises:
        RuntimeError: sample.lua lacks the mark (its samplers would be missing).
    """
    lib = lua_library() + "\n" + (LUA_DIR / "namespace_check.lua").read_text(encoding="utf-8")
    out = {n: lib + "\n" + (LUA_DIR / f"{n}.lua").read_text(encoding="utf-8") for n in SCRIPT_NAMES}
    if SAMPLERS_MARK + "\n" not in out["sample"]:
        raise RuntimeError(f"lua/sample.lua has no line {SAMPLERS_MARK!r} for the samplers' files")
    samplers = "\n".join(f.read_text(encoding="utf-8") for f in sampler_files().values())
    out["sample"] = out["sample"].replace(SAMPLERS_MARK + "\n", samplers + "\n", 1)
    return out


SCRIPTS = load_scripts()


# -- the run settings the scripts take (one JSON argument each) ---------------------------------
def report_run(config: StoreConfig) -> str:
    """``report.lua``'s ARGV ``run``: the statistics' decay and prior, the bands, the pools' clock, what
    is queued, and the ageing of statistics and heap (the script's header names each)."""
    p = config.params
    return json.dumps(
        {
            "decay": p.decay,
            "prior_alpha": p.prior_alpha,
            "prior_beta": p.prior_beta,
            "solved_at": config.solved_at,
            "unsolved_at": config.unsolved_at,
            "retest_versions": config.retest_versions,
            "queue_zero_variance": config.queue_zero_variance,
            "age_decay": config.age_decay,
            "heap_age_decay": config.heap_age_decay,
        }
    )


def sample_run(config: StoreConfig, retest_rate: float, pace: dict) -> str:
    """``sample.lua``'s ARGV ``run`` for a batch whose retest quota runs at ``retest_rate`` = f·B (0 for a
    sampler without retests), with the prior for unseen problems (:mod:`prioreplay.unseen_prior`):
    ``unseen`` = {on, fit, value (ω_unseen when not fitted: the fixed one, or ω₀ when off), base ω₀, k0 K₀},
    and the pace bound's fields ``pace`` (:func:`.pace.pace_args`)."""
    base = rules.priority(rules.Stats(), config.params)
    setting = config.unseen_prior
    fixed = setting not in (unseen_prior.OFF, unseen_prior.FIT)
    return json.dumps(
        {
            "retest_rate": retest_rate,
            "interval": config.retest_interval,
            "expire_limit": EXPIRE_LIMIT,
            "tomb_ttl": TOMBSTONE_TTL_S,
            "prior_alpha": config.params.prior_alpha,
            "prior_beta": config.params.prior_beta,
            "retest_versions": config.retest_versions,
            "unseen": {
                "on": setting != unseen_prior.OFF,
                "fit": setting == unseen_prior.FIT,
                "value": float(setting) if fixed else base,
                "base": base,
                "k0": unseen_prior.PSEUDO_VISITS,
            },
            **pace,
        }
    )
