"""The :class:`PrioritySampler`: dataset indices in the order the priority server leases them.

The package docstring (:mod:`prioreplay.integrations.torch`) gives the lifecycle of a batch and
what happens to partial groups.
"""

from __future__ import annotations

import logging
import math
import os
import socket
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, Literal

from torch.utils.data import Sampler

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import outcome_to_proto
from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.integrations.renewal import DEFAULT_LEASE_TIMEOUT_S, LeaseRenewer, check_lease_timeout
from prioreplay.integrations.torch.checks import SOURCES, check_arguments, check_sampling, other_dataset
from prioreplay.integrations.torch.leases import GEOMETRY, STATE_VERSION, Lease, leases_from_state
from prioreplay.integrations.torch.release import forget, release_on_exit
from prioreplay.integrations.torch.table import Column, ProblemTable
from prioreplay.v1 import priority_service_pb2 as pb

log = logging.getLogger(__name__)


def _client(server: str | ClientSettings | PriorityClient) -> tuple[PriorityClient, bool]:
    """(client, owned): a ready client for ``server``; owned clients are closed by ``close()``."""
    if isinstance(server, PriorityClient):
        return server, False
    settings = server if isinstance(server, ClientSettings) else ClientSettings(server=str(server))
    return PriorityClient(settings), True


class PrioritySampler(Sampler[int]):
    """Dataset indices in the order the priority server leases their problems.

    Each batch is one or more leases of ``batch_size`` problems in total. The sampler yields each
    leased problem's index ``repeat_each`` times in a row and the whole block ``repeat_batch``
    times (TRL's ``RepeatSampler`` layout; 1 and 1 for a plain loop), ``num_batches`` batches per
    epoch (``__iter__``). The caller reports rewards with :meth:`report`; a lease is sent to the
    server once every problem in it has ``group_size`` rewards.

    Args:
        dataset: a map-style dataset (``len`` and ``[i]``); see :meth:`ProblemTable.from_dataset`.
        server: ``HOST:PORT``, :class:`~prioreplay.config.ClientSettings` (token, TLS, limits) or a
            :class:`~prioreplay.client.PriorityClient` (not closed by this sampler).
        batch_size: problems per batch B, 1..len(dataset).
        group_size: rewards per problem G that complete its group (≥ 1).
        ids, prompt_column, answer_column: how rows become problems (see ``ProblemTable``).
        num_batches: batches per epoch; default ``len(dataset) // batch_size`` (as many problems
            per epoch as a shuffled pass over the data).
        repeat_each, repeat_batch: the yield layout above (≥ 1).
        register: upsert the rows on the server at construction (statistics of known ids are
            kept); False when they were registered before with the same ids.
        partial_groups: ``"report"`` or ``"drop"``: what :meth:`flush` does with groups that have
            fewer than G rewards (module docstring).
        on_resume: ``"continue"``: :meth:`load_state_dict` keeps the saved leases and yields the
            rest of the saved batch first; ``"return"``: it reports what the saved leases buffered
            (as :meth:`flush`) and starts with new leases.
        lease_timeout_s: lease length asked for, seconds (default ``DEFAULT_LEASE_TIMEOUT_S``, 60;
            0: the server's default, 600 s; at most the server's ``--max-lease-timeout-s``).
        renew_leases: renew every held lease each third of ``lease_timeout_s`` from a background
            thread (``RenewLease``; :class:`~prioreplay.integrations.renewal.LeaseRenewer`), so a
            step slower than the lease keeps its problems and a process killed outright frees them
            within one ``lease_timeout_s``. False: a lease lasts ``lease_timeout_s`` (ask for one
            longer than the slowest step).
        wait_timeout_s: how long to wait for free problems when every other one is leased by
            other clients before raising (the message says who holds them).
        source: ``"torch"``, ``"trl"`` or ``"verl"``: the server's metrics label for this client.
        worker_id: the lease holder's name on the server (default ``<source>-<host>-<pid>``).
        temperature, top_p: the sampling parameters the completions are drawn at, sent with every
            group (``ProblemOutcome.sampling_temperature`` / ``sampling_top_p``; 0: not sent).
        accepts_group_size: this loop generates :meth:`group_size_of` completions per problem, so
            samplers with screening probes (``screened``, ...) may lease to it. False (TRL, verl:
            one G for all): such a server refuses with FailedPrecondition naming the sampler and
            the alternative.

    Raises:
        InvalidArgument: bad sizes or sampling parameters (the message names the value and the
            fix) or a bad dataset.
        FailedPrecondition: the server holds problems of other datasets (give the run its own
            server or namespace).
        StoreUnavailable: the server cannot be reached (registration).

    Leases are returned (groups reported as :meth:`flush` does) by :meth:`close`, the ``with``
    block, at interpreter exit and on SIGTERM / SIGHUP; a killed process stops renewing, so its
    leases expire within ``lease_timeout_s`` (60 s by default).

    Not thread-safe across iterators: one active ``__iter__`` at a time (``report`` may be called
    from any thread).
    """

    def __init__(
        self,
        dataset,
        *,
        server: str | ClientSettings | PriorityClient,
        batch_size: int,
        group_size: int,
        ids: str | Sequence[str] | None = None,
        prompt_column: Column = "prompt",
        answer_column: Column = None,
        num_batches: int | None = None,
        repeat_each: int = 1,
        repeat_batch: int = 1,
        register: bool = True,
        partial_groups: Literal["report", "drop"] = "report",
        on_resume: Literal["continue", "return"] = "continue",
        lease_timeout_s: float = DEFAULT_LEASE_TIMEOUT_S,
        renew_leases: bool = True,
        wait_timeout_s: float = 60.0,
        source: str = "torch",
        worker_id: str | None = None,
        temperature: float = 0.0,
        top_p: float = 0.0,
        accepts_group_size: bool = True,
    ):
        n = len(dataset)
        check_arguments(n, batch_size, group_size, repeat_each, repeat_batch, num_batches, partial_groups, on_resume, source)
        check_sampling(temperature, top_p)
        self.table = ProblemTable.from_dataset(dataset, ids, prompt_column, answer_column)
        self.index_of = {pid: i for i, pid in enumerate(self.table.ids)}
        self.batch_size, self.group_size = batch_size, group_size
        self.repeat_each, self.repeat_batch = repeat_each, repeat_batch
        self.num_batches = num_batches or n // batch_size
        self.partial_groups, self.on_resume = partial_groups, on_resume
        self.lease_timeout_s, self.wait_timeout_s = check_lease_timeout(lease_timeout_s), wait_timeout_s
        self.source, self.accepts_group_size = source, accepts_group_size
        self.temperature, self.top_p = float(temperature), float(top_p)
        self.worker_id = worker_id or f"{source}-{socket.gethostname()}-{os.getpid()}"[:128]
        self.client, self._owns_client = _client(server)
        self._lock = threading.RLock()
        self._leases: dict[str, Lease] = {}  # outstanding, in lease order
        self._lease_of: dict[str, str] = {}  # problem id -> lease id
        self._block: list[int] = []  # dataset indices of the current batch (B of them)
        self._pos = 0  # yields done from the current batch's layout
        self._batches_done = 0  # batches started in the current epoch
        #: Counters: leases taken, reports accepted/refused, groups and completions sent; seconds spent
        #: leasing a batch (``lease_s``), in :meth:`report` (``report_s``) and in RPCs of either (``rpc_s``).
        self.counters: dict[str, float] = dict(
            leases=0, reports_accepted=0, reports_refused=0, groups=0, completions=0, lease_s=0.0, report_s=0.0, rpc_s=0.0
        )
        self._pid = os.getpid()
        #: Renews the held leases (None with ``renew_leases=False``); started by the first lease.
        self.renewer = (
            LeaseRenewer(self.client, self.worker_id, self.lease_timeout_s, self._held_lease_ids, SOURCES[source])
            if renew_leases
            else None
        )
        self._register(register)
        release_on_exit(self)

    def _register(self, register: bool) -> None:
        """Upsert the rows (``register``), refusing a server that holds problems of other datasets.

        A server that already holds more problems than this dataset is refused before anything is
        written to it (a user's ``prioreplay load`` of another dataset must not gain this run's
        rows); one that holds more only once the rows are in (another, smaller dataset) is refused
        after, and the message says the rows were written.

        Raises:
            FailedPrecondition: the server has more problems than this dataset (e.g. a
                ``prioreplay load`` of another dataset): it would lease problems this run cannot
                train on. The message gives the fix (a server or namespace of its own).
        """
        n, server = len(self.table.ids), self.client.settings.server
        t0 = time.perf_counter()
        held = self.client.stats().problems
        if held > n:
            raise other_dataset(server, held, n, written=False)
        total = self.client.register(self.table.records(self.source)).total if register else held
        log.info(
            "prioreplay: server %s (client %s, worker %s): dataset %s, %d problems%s in %.2f s; the server holds %d",
            server,
            self.source,
            self.worker_id,
            self.table.fingerprint,
            n,
            " registered" if register else "",
            time.perf_counter() - t0,
            total,
        )
        if total > n:
            raise other_dataset(server, total, n, written=register)

    # -- the Sampler protocol ---------------------------------------------------------------------
    def __len__(self) -> int:
        return self.num_batches * self.batch_size * self.repeat_each * self.repeat_batch

    def __iter__(self) -> Iterator[int]:
        # A generator: nothing runs (no lease) until the first next(), so the iterator a
        # StatefulDataLoader creates and discards before load_state_dict() costs nothing.
        per_batch = self.batch_size * self.repeat_each * self.repeat_batch
        while True:
            with self._lock:
                if self._pos >= per_batch or not self._block:
                    if self._batches_done >= self.num_batches:
                        self._batches_done = 0
                        return
                    self._block, self._pos = self._lease_batch(), 0
                    self._batches_done += 1
                index = self._layout(self._pos)
                self._pos += 1
            yield index

    def _layout(self, pos: int) -> int:
        """The dataset index at position ``pos`` of the current batch's yield layout."""
        within = pos % (self.batch_size * self.repeat_each)
        return self._block[within // self.repeat_each]

    # -- leasing --------------------------------------------------------------------------------------
    def _lease_batch(self) -> list[int]:
        """Lease ``batch_size`` problems (one or more leases) and return their dataset indices."""
        t0 = time.perf_counter()
        try:
            return self._lease_batch_inner()
        finally:
            self.counters["lease_s"] += time.perf_counter() - t0

    def _lease_batch_inner(self) -> list[int]:
        got: list[int] = []
        deadline = time.monotonic() + self.wait_timeout_s
        taken: list[Lease] = []
        try:
            while len(got) < self.batch_size:
                need = self.batch_size - len(got)
                self._check_capacity(need)
                resp = self._sample(need)
                if resp.problems:
                    lease = self._adopt(resp)
                    taken.append(lease)
                    got += [self.index_of[p] for p in lease.problem_ids]
                    continue
                if time.monotonic() > deadline:
                    raise InvalidArgument(self._wait_message(len(got)))
                time.sleep(min(resp.retry_after_s or 0.05, max(0.0, deadline - time.monotonic()), 1.0))
        except BaseException:
            for lease in taken:  # give back what this batch took, so nothing waits for an expiry
                try:
                    self._send(lease, partial=False)
                except Exception as e:  # noqa: BLE001 - the lease expires on its own; keep the first error
                    log.warning("could not return lease %s (%s); it expires on the server", lease.lease_id, e)
            raise
        return got

    def _sample(self, need: int) -> pb.SampleProblemsResponse:
        """One ``SampleProblems`` call; a sampler with probes meets a fixed-G client with the fix."""
        t0 = time.perf_counter()
        try:
            return self.client.sample(
                need,
                worker_id=self.worker_id,
                lease_timeout_s=self.lease_timeout_s,
                client_source=SOURCES[self.source],
                accepts_group_size=self.accepts_group_size,
            )
        except FailedPrecondition as e:
            if self.accepts_group_size:
                raise
            raise FailedPrecondition(
                f"{e} [the {self.source} integration generates the same G={self.group_size} completions for every "
                f"problem, so it cannot run screening probes: start the server with a sampler without probes "
                f"(--sampler heap, posterior or gumbel), or use prioreplay.integrations.torch.PrioritySampler, "
                f"whose loop generates group_size_of(problem) completions]"
            ) from None
        finally:
            self.counters["rpc_s"] += time.perf_counter() - t0

    def _wait_message(self, got: int) -> str:
        """Why a batch could not fill: who holds the server's leased problems (this sampler or others)."""
        mine, my_leases = len(self._lease_of), len(self._leases)
        others = None
        try:
            st = self.client.stats()
            others = max(0, st.leased - mine)
            held = (
                f"the server has {st.leased} problems in {st.active_leases} leases: {mine} in {my_leases} held by this "
                f"sampler ({self.worker_id}), {others} in {max(0, st.active_leases - my_leases)} by other clients"
            )
        except Exception as e:  # noqa: BLE001 - the message is the error; stats are a courtesy
            held = f"this sampler ({self.worker_id}) holds {mine} in {my_leases} leases (server stats failed: {e})"
        if others == 0:  # nobody else holds any: waiting longer frees nothing
            fix = "Report the rewards of the batches this sampler holds before asking for more, or lower batch_size"
        else:
            fix = (
                "Wait for the other clients' leases to be reported or to expire (a crashed client's within its lease "
                "timeout), lower batch_size, or raise wait_timeout_s"
            )
        return f"the server had only {got} of {self.batch_size} problems free for {self.wait_timeout_s:g} s; {held}. {fix}"

    def _check_capacity(self, need: int) -> None:
        held = len(self._lease_of)
        free = len(self.table.ids) - held
        if free < need:
            raise InvalidArgument(
                f"the next batch needs {need} more problems but this sampler itself holds {held} of the dataset's "
                f"{len(self.table.ids)} in leases whose groups were not reported yet, so no client can free them "
                "while it waits: report each batch's rewards before asking for the next, prefetch fewer batches "
                "(DataLoader num_workers/prefetch_factor), or use a smaller batch_size"
            )

    def _adopt(self, resp: pb.SampleProblemsResponse) -> Lease:
        ids = [lp.problem.id for lp in resp.problems]
        sizes = {lp.problem.id: int(lp.group_size) for lp in resp.problems if lp.group_size}
        lease = Lease(lease_id=resp.lease_id, problem_ids=ids, policy_version=resp.policy_version, sizes=sizes)
        foreign = [p for p in ids if p not in self.index_of]
        if foreign:
            lease.problem_ids = []
            self._send(lease, partial=False)  # release the whole lease: nothing of it is ours to train on
            raise InvalidArgument(
                f"the server leased problem {foreign[0]!r}, which is not a row of this dataset: the server holds other "
                "problems too; give this run its own server or namespace (prioreplay server --namespace)"
            )
        self._leases[lease.lease_id] = lease
        for p in ids:
            self._lease_of[p] = lease.lease_id
        self.counters["leases"] += 1
        if self.renewer is not None and os.getpid() == self._pid:
            self.renewer.start(granted_s=resp.lease_deadline_unix_s - time.time())
        retests = sum(lp.source in (pb.POOL_SOLVED, pb.POOL_UNSOLVED) for lp in resp.problems)
        log.info(
            "prioreplay: lease %s from %s: %d problems (%d retests, %d probes), step %d, policy version %d",
            lease.lease_id[:8],
            self.client.settings.server,
            len(ids),
            retests,
            len(sizes),
            resp.step,
            resp.policy_version,
        )
        return lease

    def _held_lease_ids(self) -> list[str]:
        """Ids of the leases this sampler holds (the renewer's thread calls it)."""
        with self._lock:
            return list(self._leases)

    def group_size_of(self, problem: str | int) -> int:
        """Completions to generate for a served problem (id or dataset index): the server's
        per-problem ``group_size`` (a screening probe) where it set one, else ``group_size``.

        Raises:
            InvalidArgument: the problem is not in an outstanding lease of this sampler.
        """
        pid = self.table.ids[problem] if isinstance(problem, int) else str(problem)
        with self._lock:
            if pid not in self._lease_of:
                raise InvalidArgument(f"problem {pid!r} is not in an outstanding lease of this sampler")
            return self._leases[self._lease_of[pid]].size(pid, self.group_size)

    # -- reporting ------------------------------------------------------------------------------------
    def problem_id(self, index: int) -> str:
        """The problem id of dataset index ``index``."""
        return self.table.ids[index]

    def report(self, ids: Sequence[str | int], rewards: Sequence[float | None], passed: Sequence[bool] | None = None) -> int:
        """Record one reward per completion; send every lease whose groups became complete.

        Args:
            ids: per completion, its problem id (str) or dataset index (int).
            rewards: per completion, a reward in [0, 1], or None for a completion that counts
                toward its group but has no reward to send (e.g. TRL's None).
            passed: per completion, its pass/fail under a reward plugin's rule
                (:class:`prioreplay.rewards.PluginReward`), sent with the reward
                (``Completion.passed``); None: not sent (pass is reward == 1).

        Returns:
            The number of leases sent to the server by this call.

        Raises:
            InvalidArgument: lengths differ (ids, rewards, pass flags); an id that is not in a lease of this sampler (not
                served, or its lease already sent); a reward that is NaN, infinite or outside
                [0, 1] (map it first, e.g. ``float(r > 0)``); more than G rewards for a problem.
                Nothing is recorded when any entry is bad.
        """
        t0 = time.perf_counter()
        if len(ids) != len(rewards):
            raise InvalidArgument(f"report: {len(ids)} ids for {len(rewards)} rewards; give one id per reward")
        if passed is not None and len(passed) != len(rewards):
            raise InvalidArgument(f"report: {len(passed)} pass flags for {len(rewards)} rewards; give one per reward")
        flags = list(passed) if passed is not None else [None] * len(rewards)
        with self._lock:
            pids = [self.table.ids[k] if isinstance(k, int) else str(k) for k in ids]
            values = [self._checked(pid, r) for pid, r in zip(pids, rewards, strict=True)]
            adds: dict[str, int] = {}
            for pid in pids:
                adds[pid] = adds.get(pid, 0) + 1
            for pid, k in adds.items():
                lease = self._leases[self._lease_of[pid]]
                if lease.slots.get(pid, 0) + k > lease.size(pid, self.group_size):
                    raise InvalidArgument(
                        f"report: problem {pid!r} would get {lease.slots.get(pid, 0) + k} rewards in "
                        f"one lease; its group has group_size={lease.size(pid, self.group_size)} (group_size_of)"
                    )
            touched: dict[str, Lease] = {}
            for pid, r, ok in zip(pids, values, flags, strict=True):
                lease = self._leases[self._lease_of[pid]]
                lease.slots[pid] = lease.slots.get(pid, 0) + 1
                if r is not None:
                    lease.rewards.setdefault(pid, []).append(r)
                    if ok is not None:
                        lease.passed.setdefault(pid, []).append(bool(ok))
                touched[lease.lease_id] = lease
            sent = 0
            for lease in touched.values():
                if lease.complete(self.group_size):
                    self._send(lease, partial=False)
                    sent += 1
        self.counters["report_s"] += time.perf_counter() - t0
        return sent

    def _checked(self, pid: str, r: Any) -> float | None:
        """``r`` as a float (None stays None) after the checks :meth:`report` documents."""
        if pid not in self._lease_of:
            raise InvalidArgument(
                f"report: problem {pid!r} is not in a lease of this sampler (never served, or its "
                "group was already sent); report only the completions of served batches, once"
            )
        if r is None:
            return None
        try:
            x = float(r)
        except (TypeError, ValueError):
            x = math.nan
        if not (math.isfinite(x) and 0.0 <= x <= 1.0):
            raise InvalidArgument(
                f"report: reward {r!r} for problem {pid!r} must be a finite number in [0, 1] (or "
                "None); map other scales first, e.g. float(r > 0)"
            )
        return x

    def _send(self, lease: Lease, partial: bool) -> bool:
        """Report ``lease`` (complete groups; with ``partial``, per ``partial_groups``) and forget it.

        Returns whether the server accepted it. The lease is dropped from the buffer only after the
        server answered; an RPC error propagates with the lease still buffered (retrying is safe).
        """
        outcomes = []
        for pid in lease.problem_ids:
            rewards = lease.rewards.get(pid, [])
            whole = lease.slots.get(pid, 0) >= lease.size(pid, self.group_size)
            if rewards and (whole or (partial and self.partial_groups == "report")):
                flags = lease.passed.get(pid)
                flags = flags if flags is not None and len(flags) == len(rewards) else None
                outcomes.append(
                    outcome_to_proto(
                        pid, lease.policy_version, rewards, temperature=self.temperature, top_p=self.top_p, passed=flags
                    )
                )
        t0 = time.perf_counter()
        resp = self.client.report_lease(
            lease.lease_id, outcomes, worker_id=self.worker_id, client_source=SOURCES[self.source], rewards_only=True
        )
        self.counters["rpc_s"] += time.perf_counter() - t0
        self._leases.pop(lease.lease_id, None)
        for pid in lease.problem_ids:
            if self._lease_of.get(pid) == lease.lease_id:
                del self._lease_of[pid]
        if resp.accepted:
            self.counters["reports_accepted"] += 1
            self.counters["groups"] += len(outcomes)
            self.counters["completions"] += sum(len(o.completions) for o in outcomes)
        else:
            self.counters["reports_refused"] += 1
            if outcomes:
                log.warning(
                    "lease %s was not accepted (%s); its %d group(s) are not counted here",
                    lease.lease_id,
                    resp.reason,
                    len(outcomes),
                )
            else:
                log.info("lease %s returned without groups was %s already", lease.lease_id, resp.reason)
        return resp.accepted

    def flush(self, problems: Iterable[str] | None = None) -> int:
        """Send outstanding leases now, complete groups and partial ones (``partial_groups``).

        Args:
            problems: only the leases holding one of these problem ids (e.g. a step's batch whose
                rewards are all in); None: every outstanding lease, and the rest of the current
                batch is not yielded (its leases are gone): iteration continues with new leases.

        Problems without a reward return to where they were, unchanged.

        Returns:
            The number of leases sent.
        """
        with self._lock:
            if problems is None:
                leases = list(self._leases.values())
                self._block, self._pos = [], 0
            else:
                wanted = {self._lease_of[p] for p in problems if p in self._lease_of}
                leases = [lease for lid, lease in self._leases.items() if lid in wanted]
            for lease in leases:
                self._send(lease, partial=True)
        return len(leases)

    def close(self) -> None:
        """:meth:`flush`, then close the client if this sampler created it. Idempotent.

        Also run for every live sampler at interpreter exit and on SIGTERM / SIGHUP (module
        function :func:`~.release.release_on_exit`), so a script that crashes or is stopped returns its leases
        instead of locking its problems until the lease timeout.
        """
        if getattr(self, "_closed", False) or os.getpid() != self._pid:
            return  # a forked copy (DataLoader worker) never reports its parent's leases
        self._closed = True
        forget(self)
        if self.renewer is not None:
            self.renewer.stop()
        try:
            self.flush()
        finally:
            if self._owns_client:
                self.client.close()

    def __enter__(self) -> PrioritySampler:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    @property
    def outstanding(self) -> dict[str, list[str]]:
        """Lease id → problem ids of the leases served and not yet sent."""
        with self._lock:
            return {k: list(v.problem_ids) for k, v in self._leases.items()}

    # -- checkpoints ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """A JSON-ready copy of the position and the outstanding leases (with their buffered rewards)."""
        with self._lock:
            return {
                "version": STATE_VERSION,
                "fingerprint": self.table.fingerprint,
                "batch_size": self.batch_size,
                "group_size": self.group_size,
                "repeat_each": self.repeat_each,
                "repeat_batch": self.repeat_batch,
                "block": list(self._block),
                "pos": self._pos,
                "batches_done": self._batches_done,
                "leases": [lease.to_state() for lease in self._leases.values()],
            }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Resume from :meth:`state_dict`: continue the saved leases or return them (``on_resume``).

        Leases this sampler holds already are flushed first. With ``continue`` a saved lease that
        has expired or was reported meanwhile (e.g. by the run that crashed after the checkpoint)
        is refused by the server when its groups are sent: it is counted once, by that earlier
        report, never twice.

        Raises:
            InvalidArgument: the state is of another layout version, dataset (fingerprint) or
                batch geometry (batch_size, group_size, repeats); nothing changes.
        """
        geometry = {key: getattr(self, key) for key in GEOMETRY}
        leases = leases_from_state(state, self.table.fingerprint, geometry, self.index_of)
        with self._lock:
            if self._leases:
                log.warning("load_state_dict: returning %d lease(s) this sampler held", len(self._leases))
                self.flush()
            for lease in leases:
                self._leases[lease.lease_id] = lease
                for p in lease.problem_ids:
                    self._lease_of[p] = lease.lease_id
            if leases and self.renewer is not None and os.getpid() == self._pid:  # kept alive as new ones
                self.renewer.start(granted_s=self.lease_timeout_s or 600.0)
            self._batches_done = int(state.get("batches_done", 0))
            if self.on_resume == "continue":
                self._block, self._pos = [int(i) for i in state.get("block", [])], int(state.get("pos", 0))
            else:
                self.flush()
