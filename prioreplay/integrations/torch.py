"""A torch ``Sampler[int]`` whose indices come from the priority server's leases.

:class:`PrioritySampler` registers a dataset's rows as problems, leases batches of them from the
server (the top of the priority heap plus a retest share, Fatemi, arXiv 2601.02648), yields their
dataset indices, and sends each problem's group of rewards back once the group is complete. It
works with ``torch.utils.data.DataLoader`` and with torchdata's ``StatefulDataLoader`` (it keeps
``state_dict()`` / ``load_state_dict()``). The TRL and verl integrations are built on it.

The lifecycle of one batch::

    SampleProblems(B) ─▶ indices yielded (each ``repeat_each`` times, the block ``repeat_batch`` times)
                     ─▶ report(ids, rewards) buffers per problem until G rewards arrived
                     ─▶ every problem of the lease complete ─▶ one report (rewards only; in parts
                        when over the message limit: ``PriorityClient.report_lease``)

A lease is reported once, whole (the server's counting rule), so rewards are buffered per problem
until all of a lease's groups are complete. Partial groups (fewer than G rewards) are sent only by
:meth:`PrioritySampler.flush` (at the end of training, on ``close()``, on a ``return`` resume): with
``partial_groups="report"`` (default) a problem with k < G rewards is reported as a group of k —
the server's statistics are sums over completions, so nothing is lost, but the pool decision
(solved / unsolved / heap) is made on those k rewards; with ``"drop"`` such problems are left out
and return to where they were with unchanged statistics. Problems without any reward always
return unchanged.
"""

from __future__ import annotations

import atexit
import hashlib
import logging
import math
import os
import signal
import socket
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from torch.utils.data import Sampler

from prioreplay.client import PriorityClient
from prioreplay.config import ClientSettings
from prioreplay.convert import outcome_to_proto, problem_to_proto
from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.integrations.renewal import DEFAULT_LEASE_TIMEOUT_S, LeaseRenewer, check_lease_timeout
from prioreplay.problems import ProblemRecord
from prioreplay.v1 import priority_service_pb2 as pb

log = logging.getLogger(__name__)

#: Kind of client sent with every request (the server's ``source`` metrics label).
SOURCES = {"torch": pb.CLIENT_SOURCE_TORCH, "trl": pb.CLIENT_SOURCE_TRL, "verl": pb.CLIENT_SOURCE_VERL}
#: Columns tried, in order, for a problem's reference answer when ``answer_column`` is not given.
ANSWER_COLUMNS = ("answer", "solution", "ground_truth")
#: The answer registered for rows without one (the server requires one; the trainer scores itself).
NO_ANSWER = "(scored by the trainer)"
#: Version of the :meth:`PrioritySampler.state_dict` layout.
STATE_VERSION = 1
#: Longest problem id the server accepts, bytes.
MAX_ID_BYTES = 256

Column = str | Callable[[Mapping], Any] | None


def prompt_text(value: Any) -> str:
    """A prompt as text: a string as is, chat messages as ``role: content`` lines, else ``str()``."""
    if isinstance(value, str):
        return value
    if isinstance(value, Sequence) and value and all(isinstance(m, Mapping) and "content" in m for m in value):
        return "\n".join(f"{m.get('role', 'user')}: {m['content']}" for m in value)
    return str(value)


def _column(row: Mapping, col: Column) -> Any:
    return col(row) if callable(col) else row[col]


def _rows(dataset) -> list[Mapping] | None:
    """The rows of a map-style dataset as mappings, or None when they are not mappings."""
    n = len(dataset)
    if hasattr(dataset, "column_names") and hasattr(dataset, "to_list"):  # a datasets.Dataset: one columnar read
        return dataset.to_list()
    rows = [dataset[i] for i in range(n)]
    return rows if all(isinstance(r, Mapping) for r in rows) else None


@dataclass(frozen=True)
class ProblemTable:
    """The problems of a dataset: ``ids[i]`` is the problem id of dataset index ``i``.

    Attributes:
        ids: one stable, unique id per row (≤ 256 bytes of UTF-8).
        prompts, answers: the text registered with the server (informational: the trainer keeps
            its own prompts and scores its own completions).
        fingerprint: 16 hex chars of SHA-256 over every row's id, prompt and answer; a saved
            sampler state is accepted only by a sampler over the same table.
    """

    ids: list[str]
    prompts: list[str]
    answers: list[str]
    fingerprint: str

    @classmethod
    def from_dataset(
        cls, dataset, ids: str | Sequence[str] | None = None, prompt_column: Column = "prompt", answer_column: Column = None
    ) -> ProblemTable:
        """Read a map-style dataset's problems.

        Args:
            dataset: ``len()`` and ``dataset[i]``; rows are mappings (a ``datasets.Dataset``, a
                list of dicts) unless ``ids`` is a list.
            ids: None: ``<fingerprint of the rows' text>:<row index>`` (stable while the data is
                unchanged; any edit makes new problems); a column name: that column, as text; a
                list: one id per row.
            prompt_column, answer_column: a column name or ``row -> value``; the answer defaults to
                the first of ``answer``, ``solution``, ``ground_truth`` present, else
                :data:`NO_ANSWER`. Rows that are not mappings register ``row <i>`` as prompt.

        Raises:
            InvalidArgument: an empty dataset, rows that are not mappings without an id list, a
                missing column, an id list of the wrong length, or ids that repeat, are empty or
                longer than 256 bytes (the message names the row).
        """
        n = len(dataset)
        if n == 0:
            raise InvalidArgument("the dataset is empty; a PrioritySampler needs at least one row")
        if not isinstance(ids, (str, type(None))) and len(ids) != n:
            raise InvalidArgument(f"ids has {len(ids)} entries for {n} rows; give exactly one id per row")
        rows = _rows(dataset) if isinstance(ids, (str, type(None))) or prompt_column is not None else None
        if rows is None and isinstance(ids, (str, type(None))):
            raise InvalidArgument(
                f"the dataset's rows are {type(dataset[0]).__name__}, not mappings: pass "
                "ids=[...] (one stable id per row) so problems can be named"
            )
        if rows is None:
            prompts, answers = [f"row {i}" for i in range(n)], [NO_ANSWER] * n
        else:
            prompts, answers = cls._texts(rows, prompt_column, answer_column)
        h = hashlib.sha256()
        for i in range(n):
            given = "" if ids is None else str(_column(rows[i], ids) if isinstance(ids, str) else ids[i])  # type: ignore[index]  # loaded in __init__ before any use
            for part in (given, prompts[i], answers[i]):
                h.update(part.encode("utf-8", "surrogatepass") + b"\x00")
        fp = h.hexdigest()[:16]
        if ids is None:
            out = [f"{fp}:{i}" for i in range(n)]
        elif isinstance(ids, str):
            out = [str(_column(r, ids)) for r in rows]  # type: ignore[union-attr]  # loaded in __init__ before any use
        else:
            out = [str(x) for x in ids]
        cls._check_ids(out)
        return cls(ids=out, prompts=prompts, answers=answers, fingerprint=fp)

    @staticmethod
    def _texts(rows: list[Mapping], prompt_column: Column, answer_column: Column) -> tuple[list[str], list[str]]:
        if answer_column is None:
            answer_column = next((c for c in ANSWER_COLUMNS if c in rows[0]), None)
        try:
            prompts = [
                prompt_text(_column(r, prompt_column)) if prompt_column is not None else f"row {i}" for i, r in enumerate(rows)
            ]
            answers = [str(_column(r, answer_column)) if answer_column is not None else NO_ANSWER for r in rows]
        except KeyError as e:
            raise InvalidArgument(
                f"column {e} is missing from the dataset's rows (columns: {sorted(rows[0])}); "
                "pass prompt_column= / answer_column= naming existing columns"
            ) from None
        return ([p if p.strip() else f"row {i}" for i, p in enumerate(prompts)], [a if a.strip() else NO_ANSWER for a in answers])

    @staticmethod
    def _check_ids(ids: list[str]) -> None:
        seen: dict[str, int] = {}
        for i, pid in enumerate(ids):
            if not pid or len(pid.encode("utf-8")) > MAX_ID_BYTES:
                raise InvalidArgument(f"row {i}: problem id {pid[:40]!r} must be 1..{MAX_ID_BYTES} bytes of UTF-8")
            if pid in seen:
                raise InvalidArgument(f"rows {seen[pid]} and {i} share the problem id {pid!r}; ids must be unique")
            seen[pid] = i

    def records(self, source: str) -> Iterator[pb.Problem]:
        """The rows as ``pb.Problem`` messages (metadata: client kind, dataset fingerprint, row index)."""
        for i, pid in enumerate(self.ids):
            meta = {"client": source, "dataset": self.fingerprint, "row": str(i)}
            yield problem_to_proto(ProblemRecord(id=pid, prompt=self.prompts[i], answer=self.answers[i], metadata=meta))


@dataclass
class _Lease:
    """A lease this sampler holds: its problems, and the rewards received so far per problem."""

    lease_id: str
    problem_ids: list[str]
    policy_version: int = 0
    rewards: dict[str, list[float]] = field(default_factory=dict)  # finite rewards, in arrival order
    slots: dict[str, int] = field(default_factory=dict)  # completions seen (None rewards included)
    sizes: dict[str, int] = field(default_factory=dict)  # LeasedProblem.group_size where the server set it

    def size(self, pid: str, group_size: int) -> int:
        """Completions that complete ``pid``'s group: the server's per-problem size, else ``group_size``."""
        return self.sizes.get(pid, group_size)

    def complete(self, group_size: int) -> bool:
        return all(self.slots.get(p, 0) >= self.size(p, group_size) for p in self.problem_ids)

    def to_state(self) -> dict[str, Any]:
        return {
            "lease_id": self.lease_id,
            "problem_ids": list(self.problem_ids),
            "policy_version": self.policy_version,
            "rewards": {k: list(v) for k, v in self.rewards.items()},
            "slots": dict(self.slots),
            "sizes": dict(self.sizes),
        }

    @classmethod
    def from_state(cls, d: Mapping) -> _Lease:
        return cls(
            lease_id=str(d["lease_id"]),
            problem_ids=[str(p) for p in d["problem_ids"]],
            policy_version=int(d.get("policy_version", 0)),
            rewards={str(k): [float(x) for x in v] for k, v in d.get("rewards", {}).items()},
            slots={str(k): int(v) for k, v in d.get("slots", {}).items()},
            sizes={str(k): int(v) for k, v in d.get("sizes", {}).items()},
        )


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
        self._check_args(n, batch_size, group_size, repeat_each, repeat_batch, num_batches, partial_groups, on_resume, source)
        self._check_sampling(temperature, top_p)
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
        self._leases: dict[str, _Lease] = {}  # outstanding, in lease order
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
        _release_on_exit(self)

    @staticmethod
    def _check_args(n, batch_size, group_size, repeat_each, repeat_batch, num_batches, partial_groups, on_resume, source):
        """Raise InvalidArgument naming the first bad constructor argument and its fix."""
        for name, value, low in (
            ("batch_size", batch_size, 1),
            ("group_size", group_size, 1),
            ("repeat_each", repeat_each, 1),
            ("repeat_batch", repeat_batch, 1),
        ):
            if not isinstance(value, int) or value < low:
                raise InvalidArgument(f"{name} ({value!r}) must be an integer >= {low}")
        if batch_size > n:
            raise InvalidArgument(f"batch_size ({batch_size}) is larger than the dataset ({n} rows); use at most {n}")
        if num_batches is not None and (not isinstance(num_batches, int) or num_batches < 1):
            raise InvalidArgument(f"num_batches ({num_batches!r}) must be an integer >= 1")
        if partial_groups not in ("report", "drop"):
            raise InvalidArgument(f"partial_groups ({partial_groups!r}) must be 'report' or 'drop'")
        if on_resume not in ("continue", "return"):
            raise InvalidArgument(f"on_resume ({on_resume!r}) must be 'continue' or 'return'")
        if source not in SOURCES:
            raise InvalidArgument(f"source ({source!r}) must be one of {', '.join(SOURCES)}")

    @staticmethod
    def _check_sampling(temperature: float, top_p: float) -> None:
        """Raise InvalidArgument unless temperature ≥ 0 and top_p in [0, 1] (0: not sent, read as 1)."""
        if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
            raise InvalidArgument(f"temperature ({temperature!r}) must be a finite number >= 0 (0: not sent)")
        if not (isinstance(top_p, (int, float)) and 0.0 <= top_p <= 1.0):
            raise InvalidArgument(f"top_p ({top_p!r}) must be in [0, 1] (0: not sent)")

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
            raise self._other_dataset(held, n, written=False)
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
            raise self._other_dataset(total, n, written=register)

    def _other_dataset(self, total: int, n: int, written: bool) -> FailedPrecondition:
        """The refusal of a server holding ``total`` problems for a dataset of ``n``; ``written``: this
        run's rows were registered before the server's count showed it (said in the message)."""
        server = self.client.settings.server
        rows = (
            f" This dataset's {n} rows were registered there before the count showed it; a server started afresh drops them."
            if written
            else " Nothing was written to it."
        )
        return FailedPrecondition(
            f"the priority server at {server} holds {total} problems and this dataset has {n}: it would lease "
            f"problems of another dataset, which this run cannot train on. Give this run a server of its own "
            f"(prioreplay server --store memory --port PORT --metrics-port 0) or a Redis namespace of its own "
            f"(prioreplay server --store redis://HOST:6379/0 --namespace NAME), and point it there "
            f"(PRIOREPLAY_SERVER=HOST:PORT).{rows}"
        )

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
        taken: list[_Lease] = []
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

    def _adopt(self, resp: pb.SampleProblemsResponse) -> _Lease:
        ids = [lp.problem.id for lp in resp.problems]
        sizes = {lp.problem.id: int(lp.group_size) for lp in resp.problems if lp.group_size}
        lease = _Lease(lease_id=resp.lease_id, problem_ids=ids, policy_version=resp.policy_version, sizes=sizes)
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

    def report(self, ids: Sequence[str | int], rewards: Sequence[float | None]) -> int:
        """Record one reward per completion; send every lease whose groups became complete.

        Args:
            ids: per completion, its problem id (str) or dataset index (int).
            rewards: per completion, a reward in [0, 1], or None for a completion that counts
                toward its group but has no reward to send (e.g. TRL's None).

        Returns:
            The number of leases sent to the server by this call.

        Raises:
            InvalidArgument: lengths differ; an id that is not in a lease of this sampler (not
                served, or its lease already sent); a reward that is NaN, infinite or outside
                [0, 1] (map it first, e.g. ``float(r > 0)``); more than G rewards for a problem.
                Nothing is recorded when any entry is bad.
        """
        t0 = time.perf_counter()
        if len(ids) != len(rewards):
            raise InvalidArgument(f"report: {len(ids)} ids for {len(rewards)} rewards; give one id per reward")
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
            touched: dict[str, _Lease] = {}
            for pid, r in zip(pids, values, strict=True):
                lease = self._leases[self._lease_of[pid]]
                lease.slots[pid] = lease.slots.get(pid, 0) + 1
                if r is not None:
                    lease.rewards.setdefault(pid, []).append(r)
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

    def _send(self, lease: _Lease, partial: bool) -> bool:
        """Report ``lease`` (complete groups; with ``partial``, per ``partial_groups``) and forget it.

        Returns whether the server accepted it. The lease is dropped from the buffer only after the
        server answered; an RPC error propagates with the lease still buffered (retrying is safe).
        """
        outcomes = []
        for pid in lease.problem_ids:
            rewards = lease.rewards.get(pid, [])
            whole = lease.slots.get(pid, 0) >= lease.size(pid, self.group_size)
            if rewards and (whole or (partial and self.partial_groups == "report")):
                outcomes.append(
                    outcome_to_proto(pid, lease.policy_version, rewards, temperature=self.temperature, top_p=self.top_p)
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
        function ``_release_on_exit``), so a script that crashes or is stopped returns its leases
        instead of locking its problems until the lease timeout.
        """
        if getattr(self, "_closed", False) or os.getpid() != self._pid:
            return  # a forked copy (DataLoader worker) never reports its parent's leases
        self._closed = True
        _LIVE.discard(self)
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
        if state.get("version") != STATE_VERSION:
            raise InvalidArgument(f"sampler state version {state.get('version')!r} is not {STATE_VERSION}")
        if state.get("fingerprint") != self.table.fingerprint:
            raise InvalidArgument(
                f"the sampler state is for dataset {state.get('fingerprint')!r}, this sampler's "
                f"dataset is {self.table.fingerprint!r}: resume with the same data and ids"
            )
        for key in ("batch_size", "group_size", "repeat_each", "repeat_batch"):
            if state.get(key) != getattr(self, key):
                raise InvalidArgument(
                    f"the sampler state has {key}={state.get(key)!r}, this sampler "
                    f"{getattr(self, key)!r}: resume with the same batch geometry"
                )
        leases = [_Lease.from_state(d) for d in state.get("leases", [])]
        unknown = [p for lease in leases for p in lease.problem_ids if p not in self.index_of]
        if unknown:
            raise InvalidArgument(f"the sampler state names problem {unknown[0]!r}, which is not in this dataset")
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


# -- releasing leases when the process ends ---------------------------------------------------------
_LIVE: weakref.WeakSet[PrioritySampler] = weakref.WeakSet()
_PREVIOUS_HANDLERS: dict[int, Any] = {}
_RELEASE_SIGNALS = ("SIGTERM", "SIGHUP")
EXIT_RETRIES = 1  # attempts after the first when returning leases at exit or on a signal


def _release_all() -> None:
    """Close every live sampler of this process (returns their leases); errors are logged.

    The process is ending, so each return gets one retry, not the client's whole back-off: against
    a server that is already gone, eight retries cost about a minute per sampler at exit (the
    lease then expires on the server within its short, renewed timeout anyway).
    """
    for sampler in list(_LIVE):
        client = getattr(sampler, "client", None)
        if client is not None and getattr(client, "max_retries", 0) > EXIT_RETRIES:
            client.max_retries = EXIT_RETRIES
        try:
            sampler.close()
        except Exception as e:  # noqa: BLE001 - at exit: the leases then expire on the server
            log.warning("prioreplay: could not return the leases of %s (%s); they expire on the server", sampler.worker_id, e)


def _on_signal(signum: int, frame) -> None:
    """Return every live sampler's leases, then do what the signal did before (default: exit 128 + signum)."""
    log.warning("prioreplay: signal %d: returning the leases of %d sampler(s)", signum, len(_LIVE))
    _release_all()
    previous = _PREVIOUS_HANDLERS.get(signum)
    if callable(previous):
        previous(signum, frame)
        return
    raise SystemExit(128 + signum)


atexit.register(_release_all)


def _release_on_exit(sampler: PrioritySampler) -> None:
    """Track ``sampler``; the first time, hook interpreter exit and (from the main thread) SIGTERM/SIGHUP.

    A signal left ignored (``SIG_IGN``) stays ignored. SIGINT needs no handler: Python raises
    KeyboardInterrupt, and the ``with`` block, TRL's ``train`` or the exit hook returns the leases.
    """
    _LIVE.add(sampler)
    if threading.current_thread() is not threading.main_thread():
        return
    for name in _RELEASE_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is None or sig in _PREVIOUS_HANDLERS:
            continue
        previous = signal.getsignal(sig)
        _PREVIOUS_HANDLERS[sig] = previous
        if previous is not signal.SIG_IGN:
            signal.signal(sig, _on_signal)


__all__ = ["PrioritySampler", "ProblemTable", "prompt_text", "SOURCES"]
