"""Part 2c: the simulator calibrated to real runs (docs/METHOD.md, "How the figures are
measured"; figures ``calib.*`` in benchmarks/RESULTS.md).

Fits the per-problem learning and forgetting of :mod:`benchmarks.simulate` to the per-problem
outcome histories of real ``prioreplay demo`` / ``prioreplay compare`` runs (each run
directory's ``outcomes.jsonl``: one line per reported group, see
:func:`prioreplay.apps.demo_report.collect_outcomes`), by maximum likelihood of the observed binomial
pass counts.

The model is the simulator's (:class:`benchmarks.simulate.Population`) with one skill (K = 1:
the run's dataset is one skill, so the skill part is a transfer to every problem of the set).
Problem j's logit when a group is generated with policy version v (v optimizer steps done) is

    ℓ_j(v) = b_j + η_b · S_j(v) + η_z · S(v) − δ · (v − n_j(v)),    b_j ~ N(μ, σ²),

with S_j(v) the sum of ω̂ = p̂(1 − p̂) over the problem's own trained groups before v, n_j(v)
their number, S(v) the sum of ω̂ over every trained group of the run before v. A group's pass
count is Binomial(G, σ(ℓ_j(v))). The latent b_j is integrated out by Gauss-Hermite quadrature;
a problem that appears in several runs (the arms of one comparison start from the same model)
has one b_j across them. The parameters θ = (μ, σ, η_b, η_z, δ) are the simulator's
``logit_mean``, ``problem_sd`` (with ``skill_sd`` folded in), ``lr_problem``, ``lr_skill`` and
``forget_drift`` (per optimizer step of the runs' learner).

Which groups were trained, and in which step, comes from the run's ``learner.jsonl``
(``trained_groups`` of each step). Without it (older runs, the simulator) every mixed group
generated at version v is taken as trained in step v + 1: exact in the simulator, but a real
learner trains ``batch_groups`` groups a step, some steps after they were generated, and drops
groups staler than ``max_staleness``.

Maximisation is by Nelder-Mead in numpy (scipy is not a dependency); intervals are percentile
bootstraps over problems (a resampled problem keeps its whole history; the run-wide S(v) stays
that of the run).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks import simulate

#: The fitted parameters, in the order of a parameter vector θ.
NAMES = ("logit_mean", "logit_sd", "lr_problem", "lr_skill", "forget_drift")
#: Gauss-Hermite nodes for the integral over b_j.
QUADRATURE_NODES = 32


@dataclass(frozen=True)
class Histories:
    """Observed groups of one or more runs with the covariates of the model, one entry per group.

    Rows are sorted by (problem, run, policy version, report order). ``problem`` indexes
    ``problem_ids``; ``run`` indexes ``runs``.
    """

    problem_ids: tuple[str, ...]
    runs: tuple[str, ...]  # "<sampler>-seed<k>"
    problem: np.ndarray  # (M,) int
    run: np.ndarray  # (M,) int
    passes: np.ndarray  # (M,) k, completions with reward 1
    size: np.ndarray  # (M,) G of the group
    version: np.ndarray  # (M,) v, optimizer steps before the group
    own_omega: np.ndarray  # (M,) S_j(v)
    own_trained: np.ndarray  # (M,) n_j(v)
    all_omega: np.ndarray  # (M,) S(v)
    visit: np.ndarray  # (M,) 1-based visit number of the problem within its run

    @property
    def n_problems(self) -> int:
        return len(self.problem_ids)


#: A training event: (problem id, ω̂ of the trained group, policy version that first includes it).
Event = tuple[str, float, int]


def run_name(row: dict[str, Any]) -> str:
    """The run an outcome row belongs to: ``<sampler>-seed<k>``."""
    return f"{row['sampler']}-seed{row['seed']}"


def read_outcomes(run_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """The ``outcomes.jsonl`` rows of run directories, in file order.

    Raises:
        FileNotFoundError: a run directory has no outcomes.jsonl (runs from before the demo wrote one).
    """
    rows: list[dict[str, Any]] = []
    for d in run_dirs:
        path = Path(d) / "outcomes.jsonl"
        if not path.is_file():
            raise FileNotFoundError(f"{path}: no outcome history; rerun the arm with a demo that writes outcomes.jsonl")
        rows += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return rows


def read_trained(run_dirs: Iterable[Path]) -> dict[str, list[Event]]:
    """The groups each run's learner trained, from ``learner.jsonl`` lines with ``trained_groups``
    (learners from before that field give none): {run name: [(problem id, ω̂, version after the step)]}.
    A run without such lines is left out (its training is then inferred, :func:`build_histories`)."""
    out: dict[str, list[Event]] = {}
    for d in run_dirs:
        log, outcomes = Path(d) / "learner.jsonl", Path(d) / "outcomes.jsonl"
        if not (log.is_file() and outcomes.is_file()):
            continue
        first = outcomes.read_text().split("\n", 1)[0]
        lines = [json.loads(x) for x in log.read_text().splitlines() if x.strip()]
        events = [
            (pid, p * (1.0 - p), int(line["policy_version"]))
            for line in lines
            for pid, _version, p in line.get("trained_groups") or ()
        ]
        if events and first:
            out[run_name(json.loads(first))] = events
    return out


def build_histories(rows: Sequence[dict[str, Any]], trained: dict[str, list[Event]] | None = None) -> Histories:
    """The model's covariates from outcome rows (``problem_id``, ``policy_version``, ``rewards``,
    ``sampler``, ``seed``) of any number of runs; a run is one (sampler, seed).

    Args:
        trained: per run, the groups its learner trained (:func:`read_trained`); a run not in it
            is taken to have trained every mixed group generated at version v in step v + 1.

    Raises:
        ValueError: no rows, or a reward other than 0 or 1 (the model is binomial).
    """
    if not rows:
        raise ValueError("no outcome rows to fit; give run directories whose outcomes.jsonl is not empty")
    by_run: dict[str, list[tuple[int, dict[str, Any]]]] = defaultdict(list)
    for i, r in enumerate(rows):
        rewards = [float(x) for x in r["rewards"]]
        if any(x not in (0.0, 1.0) for x in rewards):
            raise ValueError(f"{r['problem_id']}: rewards {rewards} are not all 0 or 1; the fit is for binary rewards")
        by_run[run_name(r)].append((i, r))
    pids = sorted({r["problem_id"] for r in rows})
    pindex = {p: j for j, p in enumerate(pids)}
    runs = sorted(by_run)
    cols: dict[str, list[float]] = defaultdict(list)
    for ri, name in enumerate(runs):
        ordered = [r for _, r in sorted(by_run[name], key=lambda t: (t[1]["policy_version"], t[0]))]
        events = (trained or {}).get(name)
        if events is None:
            events = [(r["problem_id"], _omega(r["rewards"]), int(r["policy_version"]) + 1) for r in ordered]
            events = [e for e in events if e[1] > 0]
        _run_covariates(ri, ordered, sorted(events, key=lambda e: e[2]), pindex, cols)
    keys = [np.asarray(cols[k]) for k in ("version", "run", "problem")]
    order = np.lexsort([np.arange(len(cols["problem"])), *keys])
    arr = {k: np.asarray(v)[order] for k, v in cols.items()}
    return Histories(
        problem_ids=tuple(pids),
        runs=tuple(runs),
        problem=arr["problem"].astype(np.int64),
        run=arr["run"].astype(np.int64),
        passes=arr["passes"],
        size=arr["size"],
        version=arr["version"],
        own_omega=arr["own_omega"],
        own_trained=arr["own_trained"],
        all_omega=arr["all_omega"],
        visit=arr["visit"].astype(np.int64),
    )


def _omega(rewards: Sequence[float]) -> float:
    """ω̂ = p̂(1 − p̂) of a group's rewards."""
    p = sum(rewards) / len(rewards)
    return p * (1.0 - p)


def _run_covariates(
    ri: int, rows: list[dict[str, Any]], events: list[Event], pindex: dict[str, int], cols: dict[str, list[float]]
) -> None:
    """Append one run's rows (sorted by version) with S_j(v), n_j(v), S(v) to ``cols``: the
    training ``events`` (sorted by version) of version <= v count before a row of version v."""
    own_omega: dict[str, float] = defaultdict(float)
    own_n: dict[str, int] = defaultdict(int)
    visits: dict[str, int] = defaultdict(int)
    total, e = 0.0, 0
    for r in rows:
        v = int(r["policy_version"])
        while e < len(events) and events[e][2] <= v:
            pid, w, _ = events[e]
            own_omega[pid] += w
            own_n[pid] += 1
            total += w
            e += 1
        g, k = len(r["rewards"]), float(sum(r["rewards"]))
        pid = r["problem_id"]
        visits[pid] += 1
        for key, val in (
            ("problem", pindex[pid]),
            ("run", ri),
            ("passes", k),
            ("size", g),
            ("version", v),
            ("own_omega", own_omega[pid]),
            ("own_trained", own_n[pid]),
            ("all_omega", total),
            ("visit", visits[pid]),
        ):
            cols[key].append(val)


class Likelihood:
    """The marginal log-likelihood of θ on fixed histories, per problem, with problem weights.

    ``loglik(theta, weights)`` = Σ_j w_j log ∫ Π_t Binom(k_t | G_t, σ(b + off_t(θ))) N(b | μ, σ²) db.
    """

    def __init__(self, h: Histories, nodes: int = QUADRATURE_NODES):
        self.h = h
        x, w = np.polynomial.hermite.hermgauss(nodes)
        self.x = x * math.sqrt(2.0)  # (Q,) standard-normal nodes
        self.logw = np.log(w / math.sqrt(math.pi))  # (Q,)
        k, g = h.passes, h.size
        self.log_choose = np.array(
            [math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1) for a, b in zip(g, k, strict=True)]
        )
        self.starts = np.flatnonzero(np.r_[True, h.problem[1:] != h.problem[:-1]])  # (P,) rows of each problem
        self.untrained = np.maximum(h.version - h.own_trained, 0.0)  # (M,)

    def row_loglik(self, theta: np.ndarray) -> np.ndarray:
        """log Binom(k_t | G_t, σ(ℓ)) at every row and node: (M, Q)."""
        mu, sd, eta_b, eta_z, delta = theta
        h = self.h
        off = eta_b * h.own_omega + eta_z * h.all_omega - delta * self.untrained  # (M,)
        logit = mu + abs(sd) * self.x[None, :] + off[:, None]  # (M, Q)
        log_p = -np.logaddexp(0.0, -logit)  # log σ(ℓ)
        log_q = -np.logaddexp(0.0, logit)  # log σ(−ℓ)
        return self.log_choose[:, None] + h.passes[:, None] * log_p + (h.size - h.passes)[:, None] * log_q

    def per_problem(self, theta: np.ndarray) -> np.ndarray:
        """Each problem's marginal log-likelihood: (P,)."""
        ll = np.add.reduceat(self.row_loglik(theta), self.starts, axis=0)  # (P, Q)
        return _logsumexp(ll + self.logw[None, :], axis=1)

    def loglik(self, theta: np.ndarray, weights: np.ndarray | None = None) -> float:
        """Σ_j w_j · per-problem log-likelihood (weights None: all 1)."""
        pp = self.per_problem(theta)
        return float(pp.sum() if weights is None else weights @ pp)


def _logsumexp(a: np.ndarray, axis: int) -> np.ndarray:
    m = a.max(axis=axis, keepdims=True)
    return np.squeeze(m, axis=axis) + np.log(np.exp(a - m).sum(axis=axis))


def nelder_mead(
    f: Callable[[np.ndarray], float], x0: np.ndarray, step: np.ndarray, max_evals: int = 4000, tol: float = 1e-7
) -> tuple[np.ndarray, float]:
    """Minimise ``f`` from ``x0`` (standard coefficients 1, 2, 0.5, 0.5; Nelder & Mead 1965).

    Stops when the simplex's values differ by less than ``tol`` (absolute) or after ``max_evals``.
    Returns (x, f(x)).
    """
    n = x0.size
    simplex = np.vstack([x0] + [x0 + np.eye(n)[i] * step[i] for i in range(n)])  # (n+1, n)
    vals = np.array([f(x) for x in simplex])
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(vals)
        simplex, vals = simplex[order], vals[order]
        if vals[-1] - vals[0] < tol:
            break
        centroid = simplex[:-1].mean(axis=0)
        xr = centroid + (centroid - simplex[-1])
        fr = f(xr)
        evals += 1
        if fr < vals[0]:
            xe = centroid + 2.0 * (centroid - simplex[-1])
            fe = f(xe)
            evals += 1
            simplex[-1], vals[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < vals[-2]:
            simplex[-1], vals[-1] = xr, fr
        else:
            xc = centroid + 0.5 * (simplex[-1] - centroid) if fr >= vals[-1] else centroid + 0.5 * (xr - centroid)
            fc = f(xc)
            evals += 1
            if fc < min(fr, vals[-1]):
                simplex[-1], vals[-1] = xc, fc
            else:  # shrink towards the best vertex
                simplex[1:] = simplex[0] + 0.5 * (simplex[1:] - simplex[0])
                vals[1:] = [f(x) for x in simplex[1:]]
                evals += n
    best = int(np.argmin(vals))
    return simplex[best], float(vals[best])


#: Where the search starts and its first step per parameter (logits; per unit ω̂; per step).
START = np.array([-0.5, 1.5, 0.5, 0.05, 0.0])
STEP = np.array([0.5, 0.5, 0.5, 0.05, 0.01])


def fit(
    lik: Likelihood,
    weights: np.ndarray | None = None,
    start: np.ndarray | None = None,
    restarts: int = 2,
    fixed: dict[str, float] | None = None,
) -> np.ndarray:
    """The maximum-likelihood θ (``NAMES`` order): Nelder-Mead from ``start``, restarted from its
    own result ``restarts`` times (a restart escapes a collapsed simplex); parameters named in
    ``fixed`` are held at their values."""
    x = START.copy() if start is None else np.asarray(start, dtype=float).copy()
    for name, value in (fixed or {}).items():
        x[NAMES.index(name)] = value
    free = np.array([n not in (fixed or {}) for n in NAMES])

    def full(t: np.ndarray) -> np.ndarray:
        y = x.copy()
        y[free] = t
        return y

    t = x[free]
    for _ in range(restarts + 1):
        t, _ = nelder_mead(lambda u: -lik.loglik(full(u), weights), t, STEP[free])
    x = full(t)
    x[1] = abs(x[1])
    return x


def bootstrap(
    lik: Likelihood, theta: np.ndarray, resamples: int, seed: int = 0, fixed: dict[str, float] | None = None
) -> np.ndarray:
    """θ refitted on ``resamples`` resamples of the problems (with replacement, multinomial
    weights), each search from ``theta``: (resamples, 5)."""
    rng = np.random.default_rng(seed)
    P = lik.h.n_problems
    weights = [rng.multinomial(P, np.full(P, 1.0 / P)).astype(float) for _ in range(resamples)]
    return np.array([fit(lik, w, theta, restarts=1, fixed=fixed) for w in weights])


def default_theta(params: simulate.SimParams | None = None, groups_per_step: int = 4) -> np.ndarray:
    """The uncalibrated simulator's θ in the runs' units: the logit spread of b_j + z_c, and the
    forgetting per step scaled from ``batch_size`` groups to ``groups_per_step`` (interference
    per trained group); ``params`` None: the simulator's defaults."""
    params = params or simulate.SimParams()
    return np.array(
        [
            params.logit_mean,
            math.hypot(params.problem_sd, params.skill_sd),
            params.lr_problem,
            params.lr_skill,
            params.forget_drift * groups_per_step / params.batch_size,
        ]
    )


def predictive_check(lik: Likelihood, theta: np.ndarray, max_visit: int = 5) -> list[dict[str, Any]]:
    """One-step-ahead check by visit number: for each group, the pass rate predicted from the
    problem's earlier groups in the same run (posterior over b_j by quadrature), against the
    observed k/G; rows for visits 1 .. ``max_visit`` (the last one pools ≥ ``max_visit``).

    Returns:
        [{"visit", "groups", "observed", "predicted", "loglik_per_group"}] (rates are means over groups).
    """
    h = lik.h
    ll = lik.row_loglik(theta)  # (M, Q)
    mu, sd, eta_b, eta_z, delta = theta
    off = eta_b * h.own_omega + eta_z * h.all_omega - delta * lik.untrained
    p = 1.0 / (1.0 + np.exp(-(mu + abs(sd) * lik.x[None, :] + off[:, None])))  # (M, Q)
    prior = np.zeros_like(ll)  # log Π of the same problem's earlier rows in the same run
    for i in range(1, ll.shape[0]):
        if h.problem[i] == h.problem[i - 1] and h.run[i] == h.run[i - 1]:
            prior[i] = prior[i - 1] + ll[i - 1]
    logpost = prior + lik.logw[None, :]
    logpost -= _logsumexp(logpost, axis=1)[:, None]
    post = np.exp(logpost)
    pred = (post * p).sum(axis=1)  # (M,)
    step_ll = _logsumexp(logpost + ll, axis=1)  # (M,) log p(k_t | earlier)
    visit = np.minimum(h.visit, max_visit)
    out = []
    for v in range(1, max_visit + 1):
        m = visit == v
        if m.any():
            out.append(
                {
                    "visit": f"{v}+" if v == max_visit else str(v),
                    "groups": int(m.sum()),
                    "observed": float((h.passes[m] / h.size[m]).mean()),
                    "predicted": float(pred[m].mean()),
                    "loglik_per_group": float(step_ll[m].mean()),
                }
            )
    return out


def held_out(h: Histories, theta_default: np.ndarray, seed: int = 0, fixed: dict[str, float] | None = None) -> dict[str, float]:
    """Fit on a random half of the problems, score the other half: log-likelihood per group of
    the fitted θ against ``theta_default`` (higher is better)."""
    rng = np.random.default_rng([seed, 7])
    lik = Likelihood(h)
    test = np.zeros(h.n_problems, dtype=bool)
    test[rng.permutation(h.n_problems)[: h.n_problems // 2]] = True
    theta = fit(lik, (~test).astype(float), fixed=fixed)
    groups = float(np.bincount(h.problem, minlength=h.n_problems)[test].sum())
    fitted = lik.loglik(theta, test.astype(float)) / groups
    default = lik.loglik(theta_default, test.astype(float)) / groups
    return {"groups": groups, "fitted_nats_per_group": fitted, "default_nats_per_group": default, "gain": fitted - default}


#: Held fixed by default: the transfer η_z is not identified apart from the drift δ when every
#: learner step trains the same number of groups (S(v) then grows linearly in v; the two runs of
#: the calibration (``calib.*`` in benchmarks/RESULTS.md) gave a bootstrap correlation of 0.98 and η_b < 0 along that ridge). With
#: η_z = 0, −δ is the drift of every problem a step does not train, of either sign.
FIXED: dict[str, float] = {"lr_skill": 0.0}


def calibrate(
    h: Histories, resamples: int = 200, seed: int = 0, groups_per_step: int = 4, fixed: dict[str, float] | None = FIXED
) -> dict[str, Any]:
    """The fit (``fixed`` parameters held), its bootstrap intervals, the predictive check and the
    held-out comparison.

    Returns:
        {"theta": {name: value}, "ci95": {name: [lo, hi]}, "corr_lr_skill_forget", "loglik",
        "default_theta", "default_loglik", "check", "check_default", "held_out", "groups",
        "problems", "runs"}.
    """
    lik = Likelihood(h)
    theta = fit(lik, fixed=fixed)
    boots = bootstrap(lik, theta, resamples, seed, fixed) if resamples else np.full((1, len(NAMES)), np.nan)
    lo, hi = np.percentile(boots, [2.5, 97.5], axis=0)
    dflt = default_theta(groups_per_step=groups_per_step)
    corr = float(np.corrcoef(boots[:, 3], boots[:, 4])[0, 1]) if resamples > 2 and not (fixed or {}) else math.nan
    return {
        "theta": dict(zip(NAMES, map(float, theta), strict=True)),
        "ci95": {n: [float(a), float(b)] for n, a, b in zip(NAMES, lo, hi, strict=True)},
        "corr_lr_skill_forget": corr,
        "loglik": lik.loglik(theta),
        "default_theta": dict(zip(NAMES, map(float, dflt), strict=True)),
        "default_loglik": lik.loglik(dflt),
        "check": predictive_check(lik, theta),
        "check_default": predictive_check(lik, dflt),
        "held_out": held_out(h, dflt, seed, fixed),
        "fixed": dict(fixed or {}),
        "groups": int(h.passes.size),
        "problems": h.n_problems,
        "runs": list(h.runs),
        "resamples": resamples,
    }


def calibrated_params(
    theta: dict[str, float],
    n_problems: int,
    skill_size: int = 64,
    batch_size: int = 64,
    group_size: int = 4,
    forget_scale: float = 1.0,
    **extra: Any,
) -> simulate.SimParams:
    """SimParams from a fit: skills of about ``skill_size`` problems (a real run's dataset is one
    skill; the divisor of ``n_problems`` nearest to it), all of the fitted logit spread in b_j
    (``skill_sd`` 0: the spread between skills is not identified by one dataset), and the
    forgetting per simulated step = the fitted one per step of the runs × ``forget_scale`` (1: a
    simulated step is one of the runs' steps; ``batch_size / groups per real step``: forgetting
    is interference per trained group)."""
    divisors = [k for k in range(1, n_problems + 1) if n_problems % k == 0]
    return simulate.SimParams(
        n_problems=n_problems,
        n_skills=min(divisors, key=lambda k: (abs(n_problems / k - skill_size), k)),
        logit_mean=theta["logit_mean"],
        problem_sd=theta["logit_sd"],
        skill_sd=0.0,
        group_size=group_size,
        batch_size=batch_size,
        lr_problem=theta["lr_problem"],
        lr_skill=theta["lr_skill"],
        forget_drift=theta["forget_drift"] * forget_scale,
        **extra,
    )


def synthetic_rows(params: simulate.SimParams, method: simulate.Method, seed: int) -> list[dict[str, Any]]:
    """Outcome rows of one simulated run (the format of ``outcomes.jsonl``)."""
    rows: list[dict[str, Any]] = []
    asyncio.run(simulate.run_one(params, method, seed, history=rows))
    return rows


def initial_success(theta: dict[str, float], nodes: int = QUADRATURE_NODES) -> float:
    """E[σ(b)] for b ~ N(logit_mean, logit_sd²): the population's mean pass@1 before training."""
    x, w = np.polynomial.hermite.hermgauss(nodes)
    b = theta["logit_mean"] + abs(theta["logit_sd"]) * math.sqrt(2.0) * x
    return float((w / math.sqrt(math.pi)) @ (1.0 / (1.0 + np.exp(-b))))


def projection_target(theta: dict[str, float]) -> float:
    """The projection's target mean pass@1, fixed before any projection ran: halfway from the
    fitted initial mean pass@1 p0 to 1, p0 + (1 − p0)/2."""
    p0 = initial_success(theta)
    return p0 + 0.5 * (1.0 - p0)


def project(
    theta: dict[str, float], n_problems: int, epochs: float, seeds: Sequence[int], target_success: float | None = None, **kw: Any
) -> dict[str, Any]:
    """The calibrated simulator, uniform vs heap + retest, at ``n_problems`` for ``epochs`` passes
    of G completions per problem: :func:`benchmarks.simulate.run_simulation`'s summary.
    ``target_success`` None: :func:`projection_target`; ``kw``: :func:`calibrated_params`'s."""
    base = calibrated_params(theta, n_problems, **kw)
    budget = int(epochs * n_problems * base.group_size)
    target = projection_target(theta) if target_success is None else target_success
    params = replace(base, budget_rollouts=budget, target_success=target)
    methods = [m for m in simulate.METHODS if m.name in ("uniform", "heap")]
    return simulate.run_simulation(params, seeds, methods=methods)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.calibrate", description=__doc__.split("\n")[0])
    ap.add_argument("runs", nargs="+", type=Path, help="run directories with outcomes.jsonl")
    ap.add_argument("--resamples", type=int, default=200, help="bootstrap resamples over problems")
    ap.add_argument("--out", type=Path, default=None, help="write the fit as JSON here")
    args = ap.parse_args(argv)
    out = calibrate(build_histories(read_outcomes(args.runs), read_trained(args.runs)), args.resamples)
    text = json.dumps(out, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
