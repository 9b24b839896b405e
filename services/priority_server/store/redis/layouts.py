"""The records and replies the Python store and the Lua scripts exchange, each declared once here.

A script's KEYS and ARGV are declared in :mod:`.scripts` (``ScriptArgs``). What travels *inside*
them is declared here: the tab-separated records (a report's outcome, a lease) and the replies
(``sample.lua``'s, ``report.lua``'s), by field name and position. The Python side packs and reads
them through these layouts (no bare ``res[5]`` or stride of 5); the Lua side names the same
positions in ``lua/lib.lua`` (``local OUTCOME = { member = 1, ... }``), and
``tests/unit/store/test_layouts.py`` checks those tables against these layouts, so a field added
on one side only fails a unit test.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Layout:
    """One record or reply: a head of named fields, then ``each`` repeated, then a tail.

    Attributes:
        name: the Lua table that declares it in ``lua/lib.lua`` (upper case), or "" for a layout
            only Python reads (a reply whose Lua side builds it in one place).
        head: the fixed fields, in order.
        each: the fields of one repeated item after the head (a leased problem), in order; () for none.
        tail: the fixed fields after the repeated items, in order.
        sep: the separator of a packed record (``\\t``); "" for a reply (a Redis array).
    """

    name: str
    head: tuple[str, ...]
    each: tuple[str, ...] = ()
    tail: tuple[str, ...] = ()
    sep: str = "\t"

    def __post_init__(self) -> None:
        names = self.head + self.each + self.tail
        if len(set(names)) != len(names):
            raise ValueError(f"layout {self.name}: a field is named twice in {names}")

    def at(self, field: str) -> int:
        """The 0-based position of head field ``field``.

        Raises:
            KeyError: ``field`` is not a head field.
        """
        try:
            return self.head.index(field)
        except ValueError:
            raise KeyError(f"layout {self.name or self.head} has no head field {field!r}") from None

    def items(self, row: Sequence[Any], n: int) -> list[dict[str, Any]]:
        """The ``n`` repeated items of ``row`` (a reply or split record), each as ``{field: value}``.

        Raises:
            ValueError: ``row`` is shorter than the head, ``n`` items and the tail.
        """
        width, start = len(self.each), len(self.head)
        if len(row) < start + n * width + len(self.tail):
            raise ValueError(f"layout {self.name or self.head}: {len(row)} values hold fewer than {n} items")
        return [dict(zip(self.each, row[i : i + width], strict=True)) for i in range(start, start + n * width, width)]

    def tail_of(self, row: Sequence[Any]) -> dict[str, Any]:
        """The tail fields of ``row`` by name (its last ``len(tail)`` values)."""
        return dict(zip(self.tail, row[len(row) - len(self.tail) :], strict=True)) if self.tail else {}

    def pack(self, **values: Any) -> str:
        """A record of the head fields: ``values`` joined by :attr:`sep`, in the declared order.

        Raises:
            TypeError: a head field missing or a name not declared (the message names them).
        """
        missing, extra = set(self.head) - set(values), set(values) - set(self.head)
        if missing or extra:
            raise TypeError(f"layout {self.name}: missing {sorted(missing)}, not declared {sorted(extra)}")
        return self.sep.join(str(values[f]) for f in self.head)

    def lua_table(self) -> dict[str, int]:
        """The Lua declaration's content: each head field's 1-based position, and for a layout with
        repeated items ``first`` (the 1-based position of the first item) and ``stride``."""
        out = {f: i + 1 for i, f in enumerate(self.head)}
        if self.each:
            out |= {"first": len(self.head) + 1, "stride": len(self.each)}
            out |= {f"each_{f}": i for i, f in enumerate(self.each)}
        return out


#: One outcome of a report (``report.lua`` ARGV[7 + 2j], :meth:`RedisStore._report`): the problem's
#: member, the group's kind (rules.GroupKind value), G, Σr and Σr² (%.17g), the forgetting and
#: breakthrough flags (0/1, were it from the solved / unsolved pool), the completion tokens (0: none
#: sent) and k = rules.evidence_groups(G, pool_evidence).
OUTCOME = Layout(
    "OUTCOME", ("member", "kind", "group_size", "sum_r", "sum_r2", "forgetting", "breakthrough", "tokens", "evidence")
)

#: A lease record (the ``leases`` hash's value, written by ``sample.lua``): the batch's step and the
#: deadline (unix s, %.17g), then per leased problem its member, source pool and heap/pool score.
LEASE = Layout("LEASE", ("step", "deadline"), each=("member", "source", "score"))

#: ``sample.lua``'s answer (``OK``; ``SAME`` for a retried request whose lease is live, with the lease
#: id before the tail): status, the lease's step, the policy version and weights URI, the earliest
#: other deadline ('' for none), n, ω_unseen, then per problem member, source pool, statistics value,
#: problem JSON, group size (0: the worker's own G), then the deadline and the script's clock reading.
SAMPLE_REPLY = Layout(
    "",
    ("status", "step", "version", "uri", "earliest", "n", "omega_unseen"),
    each=("member", "source", "stats", "problem", "group_size"),
    tail=("deadline", "now"),
    sep="",
)
#: ``sample.lua``'s ``SAME`` answer: as ``OK``, with the live lease's id before the tail.
SAME_REPLY = Layout("", SAMPLE_REPLY.head, each=SAMPLE_REPLY.each, tail=("lease_id", "deadline", "now"), sep="")
#: ``sample.lua``'s ``PACE`` answer: no room under the pace bound (nothing leased).
PACE_REPLY = Layout("", ("status", "step", "version", "uri", "earliest", "now"), sep="")

#: ``report.lua``'s answer codes (its first value).
REPORT_NOT_LIVE, REPORT_APPLIED, REPORT_OUTCOME_NOT_LEASED, REPORT_UNSERVABLE_NOT_LEASED = 0, 1, -1, -2
#: ``report.lua``'s ``REPORT_APPLIED`` answer.
REPORT_REPLY = Layout("", ("status", "queued", "filtered", "skipped", "quarantined"), sep="")

#: The layouts ``lua/lib.lua`` declares, by their Lua table's name.
LUA_LAYOUTS = {layout.name: layout for layout in (OUTCOME, LEASE)}
