"""Reward plugins: score completions with functions the user writes (docs/REWARDS.md).

A plugin is a function ``score(completion, reference, metadata)``:

* ``completion`` (str): the generated text;
* ``reference`` (str): the problem's reference answer (``ProblemRecord.answer``);
* ``metadata`` (dict[str, str]): the problem's metadata, with ``problem_id`` and ``verifier`` (the
  problem's verifier name) added unless it has them;

returning a reward in [0, 1] (a number, ``bool`` included), or a pair ``(reward, passed)`` whose
``passed`` is the function's own pass/fail.

A worker names its rewards with ``--reward SPEC`` (repeatable), each SPEC one of:

``verifier``
    the problem's own verifier (``math``, ``gsm8k``, ``exact``, ``reasoning-gym``); the default
    when no ``--reward`` is given;
``package.module:function``
    a function of an importable module (the working directory is searched too, as ``python -m`` does);
``path/to/file.py:function``
    a function of a Python file (verl's ``custom_reward_function.path`` / ``name``);
``NAME``
    an installed package's entry point ``NAME`` in the group ``prioreplay.rewards``.

Plugins replace the problem's verifier: a problem is scored by exactly the rewards named, so a
user's domain never meets a math verifier it did not ask for; name ``verifier`` among them to add
it back (a format reward on top of the answer check).

Combination (TRL's ``reward_weights``, normalised so that the reward stays in the [0, 1] the
server's statistics take): ``reward = Σ_i w_i r_i / Σ_i w_i`` with weights ``--reward-weights``
(default all 1). TRL sums ``Σ w_i r_i``; the two differ by the constant factor ``Σ w_i``, which
the learner's default advantage ``(r − mean) / std`` (``--advantage grpo``) cancels; under
``--advantage drgrpo`` (``r − mean``) it scales the advantages by ``1 / Σ w_i``.

Pass rule: reward ``i`` passes when the function returned ``(r, passed)`` with ``passed`` true, or,
when it returned a number, when ``r >= pass_threshold`` (default 1.0: a plugin's reward passes
exactly when it is the 1 the built-in verifiers give a correct answer and the server counts as
correct). A completion passes when every named reward passes. A failed call never passes.

Failures: an exception, a time-out (``verify_timeout_s``), a non-finite or out-of-range reward or
a wrong return type gives that reward 0 and not passed, counted in
``prioreplay_worker_reward_errors_total{reward, kind}`` and logged with the problem id; the other
rewards of the completion still count. Plugins run in the verification process pool
(:func:`prioreplay.verifiers.pool_call`): a call that overruns is killed, whatever it holds.
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import logging
import math
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from importlib.metadata import entry_points
from typing import Any

from prioreplay.errors import InvalidArgument

log = logging.getLogger(__name__)

__all__ = [
    "ENTRY_POINT_GROUP",
    "PASS_THRESHOLD",
    "VERIFIER",
    "RewardSpec",
    "RewardSet",
    "PluginReward",
    "Scored",
    "InvalidReward",
    "parse_specs",
    "load_plugin",
    "check_value",
]

#: The entry-point group installed packages register reward functions under.
ENTRY_POINT_GROUP = "prioreplay.rewards"
#: The default pass threshold: the reward a built-in verifier gives a correct answer.
PASS_THRESHOLD = 1.0
#: The reward name that means the problem's own verifier.
VERIFIER = "verifier"
#: Failure kinds of a plugin call (the ``kind`` label of the worker's error counter).
ERROR_KINDS = ("error", "timeout", "invalid")


class InvalidReward(ValueError):
    """A plugin returned something that is not a reward: a non-number, NaN, inf, outside [0, 1]."""


@dataclass(frozen=True)
class RewardSpec:
    """One named reward of a worker.

    Attributes:
        name: as the user wrote it (``verifier``, ``pkg.mod:fn``, ``file.py:fn`` or an entry-point
            name); the ``reward`` label of the metrics.
        target: what the pool process loads: ``module:function`` or ``path.py:function`` (an entry
            point resolved to its value); "" for ``verifier``.
        weight: its weight in the combination (> 0).
    """

    name: str
    target: str
    weight: float = 1.0


def _entry_point_target(name: str) -> str:
    found = {ep.name: ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)}
    if name not in found:
        known = ", ".join(sorted(found)) or "none installed"
        raise InvalidArgument(
            f"reward {name!r} is not 'verifier', a 'module:function' or 'file.py:function', nor an entry point "
            f"of group {ENTRY_POINT_GROUP!r} ({known}); install the package that provides it, or name the function"
        )
    return found[name]


def parse_specs(names: Sequence[str], weights: Sequence[float] = ()) -> list[RewardSpec]:
    """The rewards of ``--reward`` and ``--reward-weights``, validated; entry points resolved.

    Args:
        names: reward specs (module docstring); empty means ``["verifier"]``.
        weights: one weight > 0 per name, or empty for all 1.

    Raises:
        InvalidArgument: a count mismatch, a weight ≤ 0 or not finite, a name given twice, a
            malformed ``module:function``, or an entry-point name that no installed package provides.
    """
    names = list(names) or [VERIFIER]
    if weights and len(weights) != len(names):
        raise InvalidArgument(
            f"reward_weights ({list(weights)}) has {len(weights)} weights for {len(names)} rewards {names}; give one per --reward"
        )
    ws = list(weights) or [1.0] * len(names)
    for w in ws:
        if not (math.isfinite(w) and w > 0):
            raise InvalidArgument(f"reward weight ({w}) must be a finite number > 0; drop a reward rather than weigh it 0")
    if len(set(names)) != len(names):
        raise InvalidArgument(f"reward ({names}) names a reward twice; give each once and weigh it with --reward-weights")
    specs = []
    for name, w in zip(names, ws, strict=True):
        if name == VERIFIER:
            specs.append(RewardSpec(name, "", w))
            continue
        target = name if ":" in name else _entry_point_target(name)
        where, _, fn = target.rpartition(":")
        if not where or not fn.isidentifier():
            raise InvalidArgument(f"reward {name!r} must read 'package.module:function' or 'path/file.py:function'")
        specs.append(RewardSpec(name, target, w))
    return specs


@lru_cache(maxsize=64)
def load_plugin(target: str) -> Callable[..., Any]:
    """Import the function ``target`` names (``module:function`` or ``path.py:function``).

    Raises:
        InvalidArgument: the module or file cannot be imported (the import error and the fix in the
            message), or it has no such callable.
    """
    where, _, fn = target.rpartition(":")
    is_file = where.endswith(".py") or os.sep in where or "/" in where
    try:
        if is_file:
            folder = os.path.dirname(os.path.abspath(where))
            if os.path.isdir(folder) and folder not in sys.path:
                sys.path.append(folder)  # as `python file.py`: its sibling modules import (appended: never shadows)
            spec = importlib.util.spec_from_file_location(f"prioreplay_reward_{abs(hash(where))}", where)
            if spec is None or spec.loader is None:
                raise FileNotFoundError(f"no Python file at {where!r}")
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # as an import does (dataclasses, pickling look it up there)
            spec.loader.exec_module(module)
        else:
            if "" not in sys.path and os.getcwd() not in sys.path:
                sys.path.append(os.getcwd())  # as `python -m`: a module in the working directory imports
            module = importlib.import_module(where)
    except Exception as exc:  # noqa: BLE001 - any import failure is a configuration error
        if is_file and not os.path.isfile(where):
            fix = f"check the file's path (a relative path starts at the working directory, {os.getcwd()})"
        elif is_file:
            fix = "install what the file imports in this environment (modules beside the file are found)"
        else:
            fix = (
                "install its package in this environment, run from the folder that holds the module, "
                f"or give the file's path ('file.py:{fn}')"
            )
        raise InvalidArgument(f"reward plugin {target!r} cannot be imported ({type(exc).__name__}: {exc}); {fix}") from None
    func = getattr(module, fn, None)
    if not callable(func):
        defined = _functions_defined(module)
        raise InvalidArgument(
            f"reward plugin {target!r}: {where} has no function {fn!r}; name a callable defined there ("
            + (f"it defines {', '.join(defined)}" if defined else "it defines no function")
            + ")"
        )
    _check_callable(target, func)
    return func


def _functions_defined(module: Any) -> list[str]:
    """The public functions ``module`` defines itself (not those it imports), sorted: what a
    ``--reward`` target could name there."""
    import inspect

    return sorted(
        name
        for name, value in vars(module).items()
        if inspect.isfunction(value) and not name.startswith("_") and value.__module__ == module.__name__
    )


def _check_callable(target: str, func: Callable[..., Any]) -> None:
    """Refuse, at start, a callable whose every call would fail: a coroutine or generator function
    (its call returns an awaitable or an iterator, not a reward) or one that cannot take
    ``(completion, reference, metadata)`` (a class, a two-argument function).

    Raises:
        InvalidArgument: naming the plugin, what it is and the fix.
    """
    if inspect.iscoroutinefunction(func) or inspect.iscoroutinefunction(type(func).__call__):
        raise InvalidArgument(
            f"reward plugin {target!r} is an async function; a plugin returns its reward: make it a plain def "
            "(run awaitable work inside it with asyncio.run, within --verify-timeout-s)"
        )
    if inspect.isgeneratorfunction(func) or inspect.isasyncgenfunction(func):
        raise InvalidArgument(f"reward plugin {target!r} is a generator function; return the reward instead of yielding it")
    try:
        inspect.signature(func).bind("completion", "reference", {})
    except TypeError as exc:
        raise InvalidArgument(
            f"reward plugin {target!r} cannot be called as f(completion, reference, metadata) ({exc}); "
            "take the three arguments (a class: name an instance, or a function)"
        ) from None
    except ValueError:  # no signature to read (some builtins): the first call tells
        pass


def check_value(value: object) -> tuple[float, bool | None]:
    """A plugin's return value as ``(reward, passed or None)``.

    Raises:
        InvalidReward: not a number or a ``(number, bool)`` pair; NaN or inf; outside [0, 1].
    """
    passed, number = None, value
    if isinstance(value, (tuple, list)):
        if len(value) != 2 or type(value[1]).__name__ not in ("bool", "bool_"):  # a bool, numpy's included
            raise InvalidReward(f"returned {value!r:.80}; return a reward, or a pair (reward, passed) with passed a bool")
        number, passed = value[0], bool(value[1])
    if isinstance(number, (str, bytes)) or not hasattr(number, "__float__"):
        raise InvalidReward(f"returned {type(number).__name__} {number!r:.80}; return a number in [0, 1]")
    try:
        reward = float(number)  # ints, floats, bools, numpy and torch scalars
    except (TypeError, ValueError):
        raise InvalidReward(f"returned {type(number).__name__} {number!r:.80}; return one number in [0, 1]") from None
    if not math.isfinite(reward) or not 0.0 <= reward <= 1.0:
        raise InvalidReward(f"returned {reward}; a reward must be a finite number in [0, 1]")
    return reward, passed


def prepare_in_pool(target: str) -> bool:
    """Pool-process side: import the plugin once (its import is not timed as a call)."""
    load_plugin(target)
    return True


def score_in_pool(target: str, completion: str, reference: str, metadata: dict[str, str]) -> list:
    """Pool-process side: call the plugin; ``[reward, passed or None]`` (:func:`check_value`)."""
    return list(check_value(load_plugin(target)(completion, reference, metadata)))


@dataclass(frozen=True)
class Scored:
    """The combined score of one completion.

    Attributes:
        reward: ``Σ w_i r_i / Σ w_i`` over the named rewards, in [0, 1].
        passed: every named reward passed (module docstring).
        failures: ``(reward name, kind, message)`` for each reward that failed (its r_i is 0);
            kind is ``error`` (raised; a verifier error), ``timeout`` or ``invalid`` (a bad return value).
    """

    reward: float
    passed: bool
    failures: list[tuple[str, str, str]] = field(default_factory=list)


def _kind(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "timeout"
    return "invalid" if str(exc).startswith(InvalidReward.__name__) else "error"


class RewardSet:
    """The rewards of a worker, combined (module docstring).

    Args:
        specs: from :func:`parse_specs`.
        pass_threshold: a number-returning reward passes at ``r >= pass_threshold`` (0 < t ≤ 1).
        timeout_s: bound on one plugin or verifier call, seconds.
        call: runs a pool request (default :func:`prioreplay.verifiers.pool_call`).
        verify: scores the ``verifier`` reward (default :func:`prioreplay.verifiers.verify`).

    Raises:
        InvalidArgument: ``pass_threshold`` outside (0, 1].
    """

    def __init__(
        self,
        specs: Sequence[RewardSpec],
        pass_threshold: float = PASS_THRESHOLD,
        timeout_s: float = 5.0,
        call: Callable[..., object] | None = None,
        verify: Callable[..., Any] | None = None,
    ):
        if not 0.0 < pass_threshold <= 1.0:
            raise InvalidArgument(f"pass_threshold ({pass_threshold}) must be in (0, 1]")
        from prioreplay import verifiers

        self.specs = list(specs)
        self.pass_threshold = pass_threshold
        self.timeout_s = timeout_s
        self._call = call or verifiers.pool_call
        self._verify = verify or verifiers.verify
        self._total = sum(s.weight for s in self.specs)

    @property
    def only_verifier(self) -> bool:
        """True when the only reward is the problem's verifier (the worker's default)."""
        return [s.name for s in self.specs] == [VERIFIER]

    def check_imports(self) -> None:
        """Import every plugin here, so a worker refuses to start on one that cannot be imported.

        Raises:
            InvalidArgument: a plugin cannot be imported or is not a function (:func:`load_plugin`).
        """
        for s in self.specs:
            if s.target:
                load_plugin(s.target)

    def score(self, text: str, reference: str, verifier: str, metadata: Mapping[str, str]) -> Scored:
        """Score one completion with every reward; never raises for a failing plugin."""
        total, passed, failures = 0.0, True, []
        for s in self.specs:
            try:
                r, flag = self._one(s, text, reference, verifier, metadata)
            except Exception as exc:  # noqa: BLE001 - one bad plugin gives 0, never stops the worker
                kind = _kind(exc)
                fix = "; make the function faster or raise --verify-timeout-s" if kind == "timeout" else ""
                failures.append((s.name, kind, f"{exc}"[:300] + fix))
                passed = False
                continue
            total += s.weight * r
            passed = passed and (flag if flag is not None else r >= self.pass_threshold)
        return Scored(min(1.0, total / self._total), passed, failures)

    def _one(
        self, s: RewardSpec, text: str, reference: str, verifier: str, metadata: Mapping[str, str]
    ) -> tuple[float, bool | None]:
        if not s.target:
            res = self._verify(verifier, text, reference, timeout_s=self.timeout_s)
            if res.error:
                raise RuntimeError(res.error)
            return res.reward, res.reward >= 1.0
        kwargs = {"target": s.target, "completion": text, "reference": reference, "metadata": dict(metadata)}
        request = {"op": "call", "target": "prioreplay.rewards:score_in_pool", "kwargs": kwargs}
        needs = {"op": "call", "target": "prioreplay.rewards:prepare_in_pool", "kwargs": {"target": s.target}}
        answer: Any = self._call(request, self.timeout_s, needs)  # [reward, passed or None] from score_in_pool
        return float(answer[0]), answer[1]


class PluginReward:
    """A reward plugin as a trainer's reward function: TRL's ``reward_funcs`` form, and one
    completion at a time for a torch loop. Runs in the calling process, as a trainer runs its
    reward functions (no pool: the trainer owns its processes).

    Args:
        plugin: the function (module docstring) or its spec (``pkg.mod:fn``, ``file.py:fn``, an
            entry-point name).
        reference: the dataset column that holds the reference answer (TRL passes columns as
            keyword arguments).
        pass_threshold: as :class:`RewardSet` (default 1.0).

    Attributes:
        last_passed: the pass flags of the latest call (one per completion); the TRL integration
            sends them with the rewards (``Completion.passed``).
        errors: failures so far by kind (``error``, ``invalid``); each gave reward 0, not passed.

    Raises:
        InvalidArgument: a spec that cannot be imported; ``pass_threshold`` outside (0, 1].
    """

    def __init__(self, plugin: Callable[..., Any] | str, reference: str = "answer", pass_threshold: float = PASS_THRESHOLD):
        if isinstance(plugin, str):
            target = parse_specs([plugin])[0].target
            if not target:
                raise InvalidArgument(
                    f"PluginReward({plugin!r}): 'verifier' names a worker's problem verifier, not a function; "
                    "give a plugin function or its 'module:function' / 'file.py:function' spec"
                )
            plugin = load_plugin(target)
        else:
            _check_callable(getattr(plugin, "__name__", repr(plugin)), plugin)
        if not 0.0 < pass_threshold <= 1.0:
            raise InvalidArgument(f"pass_threshold ({pass_threshold}) must be in (0, 1]")
        self.plugin, self.reference, self.pass_threshold = plugin, reference, pass_threshold
        self.__name__ = getattr(plugin, "__name__", type(plugin).__name__)  # TRL logs rewards by this name
        self.last_passed: list[bool] = []
        self.errors = dict.fromkeys(ERROR_KINDS, 0)

    def score(self, completion: str, reference: str, metadata: Mapping[str, str] | None = None) -> tuple[float, bool]:
        """``(reward, passed)`` of one completion; a failing call gives (0.0, False), counted and logged."""
        try:
            reward, flag = check_value(self.plugin(completion, reference, dict(metadata or {})))
        except Exception as exc:  # noqa: BLE001 - as in the worker: one bad call scores 0
            kind = "invalid" if isinstance(exc, InvalidReward) else "error"
            self.errors[kind] += 1
            log.warning("reward %s failed (%s, scored 0): %s: %s", self.__name__, kind, type(exc).__name__, exc)
            return 0.0, False
        return reward, flag if flag is not None else reward >= self.pass_threshold

    def __call__(self, prompts: Sequence[Any] = (), completions: Sequence[Any] = (), **columns: Any) -> list[float]:
        """TRL's reward function: one reward per completion; sets :attr:`last_passed`.

        Raises:
            InvalidArgument: the ``reference`` column is not among the keyword arguments.
        """
        if self.reference not in columns:
            raise InvalidArgument(
                f"reward {self.__name__}: no {self.reference!r} column among {sorted(columns)}; "
                "name the dataset's reference column with PluginReward(..., reference=...)"
            )
        refs, skip = columns[self.reference], {self.reference, "completion_ids", "environments"}  # not row columns
        out = []
        for i, comp in enumerate(completions):
            text = comp if isinstance(comp, str) else "".join(m.get("content", "") for m in comp)  # conversational
            meta = {k: str(v[i]) for k, v in columns.items() if k not in skip and isinstance(v, list) and len(v) > i}
            out.append(self.score(text, str(refs[i]), meta))
        self.last_passed = [ok for _, ok in out]
        return [r for r, _ in out]
