"""Reading the protobuf wire format directly, where decoding into Python objects costs too much.

``ReportOutcomes`` carries every completion's behaviour log-probabilities (G × tokens floats per
problem). Turning repeated protobuf floats into Python floats one by one costs ~0.5 µs each,
which at 256 problems × G = 8 × 128 tokens is most of a report's handling time; reading the
packed float32 bytes and checking them with numpy in one go is ~100 times cheaper.
:func:`canonical_groups` does that for a whole report and also queues each mixed group from the bytes
as received instead of rebuilding a ``TrajectoryGroup`` message from its fields.
:func:`lease_response` writes a ``SampleProblemsResponse`` from the ``Problem`` bytes the memory
store keeps with each record, instead of building a ``Problem`` message per leased problem.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING

import numpy as np

from prioreplay import rules
from prioreplay.convert import ReportedGroup, outcome_to_group, problem_bytes, trajectory_fields
from prioreplay.errors import InvalidArgument
from prioreplay.v1 import priority_service_pb2 as pb

from .store.records import GroupOutcome

if TYPE_CHECKING:  # pragma: no cover
    from .store.records import Lease

#: A behaviour log-probability may exceed 0 by this much (float32 rounding of log-softmax), nats.
LOGPROB_TOLERANCE = 1e-3

_COMPLETIONS_FIELD = pb.ProblemOutcome.DESCRIPTOR.fields_by_name["completions"].number
_LOGPROBS_FIELD = pb.Completion.DESCRIPTOR.fields_by_name["logprobs"].number


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def length_delimited_fields(buf: bytes, wanted: int) -> Iterator[bytes]:
    """Yield the payload bytes of every length-delimited field number ``wanted`` of a serialized message.

    Raises:
        ValueError: a group wire type (3, 4), which proto3 never writes.
    """
    pos, n = 0, len(buf)
    while pos < n:
        tag, pos = _varint(buf, pos)
        wire = tag & 7
        if wire == 0:
            _, pos = _varint(buf, pos)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            size, pos = _varint(buf, pos)
            if tag >> 3 == wanted:
                yield buf[pos : pos + size]
            pos += size
        else:  # groups (3, 4) are not used by proto3
            raise ValueError(f"unexpected wire type {wire}")


def logprobs_all_valid(outcomes: Iterable[pb.ProblemOutcome]) -> bool:
    """True when every log-probability of every completion is finite and <= 0 (+ tolerance).

    One vectorised check over the packed float32 bytes of the re-serialized outcomes.
    """
    parts = [
        lp
        for o in outcomes
        for c in length_delimited_fields(o.SerializeToString(), _COMPLETIONS_FIELD)
        for lp in length_delimited_fields(c, _LOGPROBS_FIELD)
    ]
    if not parts:
        return True
    a = np.frombuffer(b"".join(parts), dtype="<f4")
    return bool(np.isfinite(a).all() and a.max() <= LOGPROB_TOLERANCE)


# -- the ReportOutcomes decode: canonical bytes read as columns, else per-field checks --------
# Views of the same wire bytes with other declared types, in a private descriptor pool: a packed
# repeated scalar field and a sub-message are both length-delimited on the wire, so declaring them
# ``bytes`` makes the C parser hand over the packed values / the sub-message as received, without
# creating a Python object per value. Only valid for canonical encodings (each packed field once,
# packed), which :func:`canonical_groups` checks first.
def _views() -> dict[str, type]:
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="prioreplay_wire_views.proto", package="prioreplay_wire_views", syntax="proto3")

    def message(name: str, fields: list[tuple[str, int, int, bool, str]]) -> None:
        m = fdp.message_type.add(name=name)
        for fname, number, ftype, repeated, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=F.LABEL_REPEATED if repeated else F.LABEL_OPTIONAL)
            if type_name:
                f.type_name = f".prioreplay_wire_views.{type_name}"

    # The completions of a whole report as columns. ``outcomes`` and ``completions`` are declared
    # singular, so the parser merges all their occurrences into one message whose repeated fields
    # concatenate, in report order: every written reward (proto3 leaves out a reward of +0.0) and
    # every completion's packed token ids / float32 log-probs as bytes (left out when empty). One
    # parse, no Python object per completion.
    message(
        "CompletionColumns",
        [
            ("reward", 1, F.TYPE_DOUBLE, True, ""),
            ("token_ids", 2, F.TYPE_BYTES, True, ""),
            ("logprobs", 3, F.TYPE_BYTES, True, ""),
        ],
    )
    message("OutcomeColumns", [("completions", 4, F.TYPE_MESSAGE, False, "CompletionColumns")])
    message("ReportColumns", [("outcomes", 2, F.TYPE_MESSAGE, False, "OutcomeColumns")])
    # ProblemOutcome with its completions as serialized bytes
    message(
        "OutcomeView",
        [
            ("problem_id", 1, F.TYPE_STRING, False, ""),
            ("policy_version", 2, F.TYPE_INT64, False, ""),
            ("prompt_token_ids", 3, F.TYPE_BYTES, False, ""),
            ("completions", 4, F.TYPE_BYTES, True, ""),
            ("sampling_temperature", 5, F.TYPE_DOUBLE, False, ""),
            ("sampling_top_p", 6, F.TYPE_DOUBLE, False, ""),
        ],
    )
    message("ReportView", [("outcomes", 2, F.TYPE_MESSAGE, True, "OutcomeView")])
    # TrajectoryGroup with the same bytes: serializes to exactly what pb.TrajectoryGroup would
    message(
        "GroupView",
        [
            ("problem_id", 2, F.TYPE_STRING, False, ""),
            ("policy_version", 3, F.TYPE_INT64, False, ""),
            ("prompt_token_ids", 4, F.TYPE_BYTES, False, ""),
            ("completions", 5, F.TYPE_BYTES, True, ""),
            ("reported_unix_s", 7, F.TYPE_DOUBLE, False, ""),
            ("sampling_temperature", 8, F.TYPE_DOUBLE, False, ""),
            ("sampling_top_p", 9, F.TYPE_DOUBLE, False, ""),
        ],
    )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    return {
        m.name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"prioreplay_wire_views.{m.name}"))
        for m in fdp.message_type
    }


_VIEWS = _views()

#: Reports smaller than this (bytes) take the per-field path: for a few completions its fixed
#: cost (a few Python calls) is below the column path's (numpy calls, two extra parses).
COLUMN_MIN_BYTES = 8192


def _varint_counts(chunks: list[bytes]) -> np.ndarray:
    """Number of varints in each of ``chunks`` (packed uint32 fields, each complete), int64 array."""
    lens = np.fromiter(map(len, chunks), np.int64, len(chunks))
    ends = np.cumsum(lens)
    buf = np.frombuffer(b"".join(chunks), np.uint8)
    cum = np.concatenate((np.zeros(1, np.int64), np.cumsum(buf < 0x80, dtype=np.int64)))
    return cum[ends] - cum[ends - lens]


def _tag_byte(message: type, field: str, wire_type: int) -> int:
    return message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type  # type: ignore[attr-defined]  # a generated message class


_REWARD_TAG = _tag_byte(pb.Completion, "reward", 1)  # a double
_TOKEN_IDS_TAG = _tag_byte(pb.Completion, "token_ids", 2)  # packed
_LOGPROBS_TAG = _tag_byte(pb.Completion, "logprobs", 2)  # packed


def _varint_sizes(n: np.ndarray) -> np.ndarray:
    """Bytes of the varint of each value of ``n`` (int64, 0 <= n < 2^35)."""
    return 1 + (n >= 1 << 7) + (n >= 1 << 14) + (n >= 1 << 21) + (n >= 1 << 28)


def _per_completion(
    comps: list[bytes], rewards: list[float], tokens: list[bytes], logprobs: list[bytes]
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Each completion's reward, token count and log-probability bytes, from the columns of a report.

    ``comps`` are the canonical serialized Completions; ``rewards``, ``tokens`` (packed token ids)
    and ``logprobs`` (packed float32) the values the columns view collected from them in order,
    each only from the completions that wrote the field (proto3 leaves out +0.0 and empty fields).
    In a canonical encoding the fields come in field-number order, so which completions wrote
    which field follows from the tag byte where each field would start: vectorised over all
    completions, no Python loop per completion.

    Returns:
        (rewards (C,) float64, token ids (C,) int64, log-probability bytes (C,) int64), or None
        when the columns and the tags disagree (not a canonical encoding).
    """
    lens = np.fromiter(map(len, comps), np.int64, len(comps))  # (C,)
    buf = np.frombuffer(b"".join(comps) + b"\0", np.uint8)  # one spare byte: a tag read at the very end
    end = np.cumsum(lens)  # (C,)
    pos = end - lens  # (C,) where the next field of each completion starts

    def wrote(tag: int, count: int) -> np.ndarray | None:
        has = (pos < end) & (buf[np.minimum(pos, buf.size - 1)] == tag)
        return has if int(has.sum()) == count else None

    has_reward = wrote(_REWARD_TAG, len(rewards))
    if has_reward is None:
        return None
    out_rewards = np.zeros(len(comps), np.float64)
    out_rewards[has_reward] = rewards
    pos = pos + 9 * has_reward  # tag + 8 bytes
    has_tokens = wrote(_TOKEN_IDS_TAG, len(tokens))
    if has_tokens is None:
        return None
    token_bytes = np.zeros(len(comps), np.int64)
    token_bytes[has_tokens] = np.fromiter(map(len, tokens), np.int64, len(tokens))
    pos = pos + has_tokens * (1 + _varint_sizes(token_bytes) + token_bytes)
    has_lps = wrote(_LOGPROBS_TAG, len(logprobs))
    if has_lps is None:
        return None
    n_tokens = np.zeros(len(comps), np.int64)
    if tokens:
        n_tokens[has_tokens] = _varint_counts(tokens)
    lp_bytes = np.zeros(len(comps), np.int64)
    lp_bytes[has_lps] = np.fromiter(map(len, logprobs), np.int64, len(logprobs))
    return out_rewards, n_tokens, lp_bytes


def canonical_groups(
    raw: bytes, request: pb.ReportOutcomesRequest, reported_unix_s: float, queue: bool, zero_variance: bool = False
) -> list[ReportedGroup] | None:
    """The fast half of :func:`report_groups`: a valid report's groups read from its bytes, or None.

    ``request`` is ``raw`` decoded (the decode is what proves the bytes are valid protobuf). When
    ``request`` re-serializes to exactly ``raw`` (a canonical encoding: what every protobuf
    library writes), the report is parsed twice with views (:func:`_views`): once with each
    outcome's completions as bytes, once as columns of all rewards, packed token ids and packed
    log-probabilities (no Python object per completion). The log-probabilities are checked in one numpy
    pass (finite, <= :data:`LOGPROB_TOLERANCE`), the number of log-probabilities of each
    completion is compared with its number of token ids from the packed varints, and each mixed
    group's payload is made from the received bytes of its prompt token ids and completions (a
    ``TrajectoryGroup``, byte for byte what :func:`prioreplay.convert.trajectory_payload` gives).

    Returns:
        [(problem_id, rewards, payload)] in report order (payload b"" unless the group is mixed, or
        any with ``zero_variance``, and ``queue``), or None when the report is under :data:`COLUMN_MIN_BYTES`, the encoding is not
        canonical or any message-level check fails: the caller then runs the per-field checks,
        which name the bad value.
    """
    if len(raw) < COLUMN_MIN_BYTES or not request.outcomes or request.SerializeToString() != raw:
        return None
    view = _VIEWS["ReportView"].FromString(raw)  # type: ignore[attr-defined]  # a generated message class, passed as type
    comps = [c for o in view.outcomes for c in o.completions]  # (completions,) serialized Completion
    cols = _VIEWS["ReportColumns"].FromString(raw).outcomes.completions  # type: ignore[attr-defined]  # a generated message class
    lps = list(cols.logprobs)
    columns = _per_completion(comps, list(cols.reward), list(cols.token_ids), lps)
    if columns is None:
        return None
    rewards, n_tokens, n_lps = columns  # (completions,) each
    if (n_lps % 4).any() or not (n_tokens * 4 == n_lps).all():
        return None
    a = np.frombuffer(b"".join(lps), dtype="<f4")
    if a.size and not (np.isfinite(a).all() and a.max() <= LOGPROB_TOLERANCE):
        return None
    group = _VIEWS["GroupView"]
    out = []
    ends = np.cumsum([len(o.completions) for o in view.outcomes], dtype=np.int64)  # (outcomes,)
    starts = np.concatenate((np.zeros(1, np.int64), ends[:-1]))  # (outcomes,)
    prefix = np.concatenate((np.zeros(1, np.int64), np.cumsum(n_tokens)))  # (completions + 1,)
    group_tokens = prefix[ends] - prefix[starts]  # (outcomes,)
    all_rewards = rewards.tolist()
    for o, a0, a1, n_group in zip(view.outcomes, starts.tolist(), ends.tolist(), group_tokens.tolist(), strict=True):
        if not o.problem_id or o.policy_version < 0 or not (o.sampling_temperature >= 0 and o.sampling_temperature != _INF):
            return None  # NaN fails >= 0
        if not 0.0 <= o.sampling_top_p <= 1.0:
            return None  # NaN fails too
        group_rewards = tuple(all_rewards[a0:a1])
        payload = b""
        if queue and group_rewards and (zero_variance or rules.classify(group_rewards) is rules.GroupKind.MIXED):
            payload = group(**trajectory_fields(o, reported_unix_s)).SerializeToString()
        out.append(ReportedGroup(o.problem_id, group_rewards, payload, int(n_group)))
    return out


_INF = float("inf")


def validate_outcome(o: pb.ProblemOutcome, index: int, check_values: bool = True) -> None:
    """Message-level checks of one reported group (the store checks rewards and membership).

    Raises:
        InvalidArgument: empty problem id, negative policy_version, a completion whose logprobs
            length differs from its token_ids length, or a log-probability that is NaN, infinite
            or above 0 (beyond :data:`LOGPROB_TOLERANCE`). The message names the outcome and
            completion index. ``check_values=False`` skips the per-value scan (the servicer checks
            all values at once with :func:`logprobs_all_valid` and rescans only a bad report).
    """
    where = f"outcomes[{index}] (problem {o.problem_id!r})"
    if not o.problem_id:
        raise InvalidArgument(f"outcomes[{index}]: problem_id is empty; quote the id of a leased problem")
    if o.policy_version < 0:
        raise InvalidArgument(f"{where}: policy_version ({o.policy_version}) must be >= 0")
    if not (math.isfinite(o.sampling_temperature) and o.sampling_temperature >= 0):
        raise InvalidArgument(
            f"{where}: sampling_temperature ({o.sampling_temperature}) must be a finite number >= 0 (0: not sent)"
        )
    if not (math.isfinite(o.sampling_top_p) and 0.0 <= o.sampling_top_p <= 1.0):
        raise InvalidArgument(f"{where}: sampling_top_p ({o.sampling_top_p}) must be in [0, 1] (0: not sent, read as 1)")
    for j, c in enumerate(o.completions):
        lps = c.logprobs
        if len(lps) != len(c.token_ids):
            raise InvalidArgument(
                f"{where} completions[{j}]: {len(lps)} logprobs for {len(c.token_ids)} token_ids; "
                "send one behaviour log-probability per generated token"
            )
        if check_values:
            for k, lp in enumerate(lps):
                if not (math.isfinite(lp) and lp <= LOGPROB_TOLERANCE):
                    raise InvalidArgument(
                        f"{where} completions[{j}].logprobs[{k}] = {lp!r}: log-probabilities must be finite and <= 0 nats"
                    )


def _checked_groups(
    request: pb.ReportOutcomesRequest, reported_unix_s: float, queue: bool, zero_variance: bool = False
) -> list[GroupOutcome]:
    """The per-field half of :func:`report_groups`: :func:`validate_outcome` and
    :func:`~prioreplay.convert.outcome_to_group` for each outcome.

    Raises:
        InvalidArgument: the first bad outcome, named by index (see :func:`validate_outcome`).
    """
    for i, o in enumerate(request.outcomes):
        validate_outcome(o, i, check_values=False)
    if not logprobs_all_valid(request.outcomes):
        for i, o in enumerate(request.outcomes):  # find the bad value for the message
            validate_outcome(o, i)
    return [GroupOutcome(*outcome_to_group(o, reported_unix_s, queue, zero_variance)) for o in request.outcomes]


def report_groups(
    raw: bytes,
    request: pb.ReportOutcomesRequest,
    reported_unix_s: float,
    queue: bool,
    *,
    fast: bool = True,
    zero_variance: bool = False,
) -> list[GroupOutcome]:
    """The store's groups of one ReportOutcomes request: the one report decode of the server.

    ``raw`` is the request's bytes as received (or a decoded request re-serialized) and ``request``
    those bytes decoded. A canonical, valid report of at least :data:`COLUMN_MIN_BYTES` is read
    from the bytes (:func:`canonical_groups`); any other report (or ``fast=False``, for
    comparisons) goes through the per-field checks, which name the bad value. Both halves give
    the same groups for the same valid report (``tests/unit/wire/test_report_bytes_path.py``).

    Args:
        reported_unix_s: the store clock when the report arrived, seconds (stamped on payloads).
        queue: False for ``rewards_only`` reports (no payloads are made).
        zero_variance: payloads for every group, not only mixed ones (``--queue-zero-variance``).

    Returns:
        One :class:`GroupOutcome` per outcome, in report order.

    Raises:
        InvalidArgument: the first bad outcome, named by index (see :func:`validate_outcome`).
    """
    fast_groups = canonical_groups(raw, request, reported_unix_s, queue, zero_variance) if fast else None
    if fast_groups is not None:
        return [GroupOutcome(*g) for g in fast_groups]
    return _checked_groups(request, reported_unix_s, queue, zero_variance)


# -- the lean PullTrajectories path -------------------------------------------------------------
# A queued payload is a serialized TrajectoryGroup without group_id (field 1) and delivery_count
# (field 6). Protobuf parsers take the last occurrence of a singular field, so appending the two
# fields to the payload gives the group a learner would get by decoding the payload, setting the
# two fields and encoding it again, without the decode and the encode.
_GROUP_ID_TAG = bytes([pb.TrajectoryGroup.DESCRIPTOR.fields_by_name["group_id"].number << 3 | 2])
_DELIVERY_COUNT_TAG = bytes([pb.TrajectoryGroup.DESCRIPTOR.fields_by_name["delivery_count"].number << 3 | 0])
_GROUPS_TAG = bytes([pb.PullTrajectoriesResponse.DESCRIPTOR.fields_by_name["groups"].number << 3 | 2])
_QUEUE_DEPTH_TAG = bytes([pb.PullTrajectoriesResponse.DESCRIPTOR.fields_by_name["queue_depth"].number << 3 | 0])


def encode_varint(n: int) -> bytes:
    """The protobuf base-128 varint of ``n`` >= 0."""
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def pulled_group(payload: bytes, group_id: str, delivery_count: int) -> bytes:
    """The serialized ``TrajectoryGroup`` a learner receives for a queued ``payload``: the payload
    as queued with ``group_id`` and ``delivery_count`` appended; it decodes to the message of
    :func:`per_field_group`.

    Raises:
        google.protobuf.message.DecodeError: ``payload`` is not a valid ``TrajectoryGroup`` (it is
            parsed once, as the per-field path does, and not encoded again).
    """
    pb.TrajectoryGroup.FromString(payload)
    gid = group_id.encode("utf-8")
    return b"".join((payload, _GROUP_ID_TAG, encode_varint(len(gid)), gid, _DELIVERY_COUNT_TAG, encode_varint(delivery_count)))


def per_field_group(payload: bytes, group_id: str, delivery_count: int) -> pb.TrajectoryGroup:
    """The per-field path :func:`pulled_group` must agree with: decode, set the two fields.

    Raises:
        google.protobuf.message.DecodeError: ``payload`` is not a valid ``TrajectoryGroup``.
    """
    g = pb.TrajectoryGroup.FromString(payload)
    g.group_id = group_id
    g.delivery_count = delivery_count
    return g


def pull_response(groups: Iterable[bytes], queue_depth: int) -> bytes:
    """A serialized ``PullTrajectoriesResponse`` of serialized groups (:func:`pulled_group`)."""
    parts: list[bytes] = []
    for g in groups:
        parts += (_GROUPS_TAG, encode_varint(len(g)), g)
    if queue_depth:
        parts += (_QUEUE_DEPTH_TAG, encode_varint(queue_depth))
    return b"".join(parts)


# -- the lean SampleProblems path ---------------------------------------------------------------
# A SampleProblemsResponse written field by field in field-number order, as protobuf's serializer
# writes it: the scalar fields before and after ``problems`` come from two small messages, and each
# LeasedProblem is its Problem's bytes (kept with the record, :func:`prioreplay.convert.problem_bytes`)
# plus its three scalars, so no Problem message is built per leased problem.
def _tag(message: type, field: str, wire_type: int) -> bytes:
    return encode_varint(message.DESCRIPTOR.fields_by_name[field].number << 3 | wire_type)  # type: ignore[attr-defined]  # a generated message class


_LP_PROBLEM_TAG = _tag(pb.LeasedProblem, "problem", 2)
_LP_PRIORITY_TAG = _tag(pb.LeasedProblem, "priority", 1)
_LP_SOURCE_TAG = _tag(pb.LeasedProblem, "source", 0)
_LP_GROUP_SIZE_TAG = _tag(pb.LeasedProblem, "group_size", 0)
_PROBLEMS_TAG = _tag(pb.SampleProblemsResponse, "problems", 2)
_ZERO_DOUBLE = bytes(8)
_pack_double = struct.Struct("<d").pack
#: Varints of 0 .. 2^14 - 1 (lengths of problems and leased problems), built once.
_SMALL_VARINTS = [encode_varint(n) for n in range(1 << 14)]


def _varint_of(n: int) -> bytes:
    return _SMALL_VARINTS[n] if n < 16384 else encode_varint(n)


def leased_problem(problem: bytes, priority: float, source: int, group_size: int) -> bytes:
    """A serialized ``LeasedProblem`` of a serialized ``Problem``: byte for byte what
    ``pb.LeasedProblem(problem=..., priority=..., source=..., group_size=...).SerializeToString()``
    gives (proto3: a field at its default, 0 or +0.0, is not written; -0.0 is).

    Raises:
        ValueError: ``source`` or ``group_size`` is negative (never for a store's lease).
    """
    if source < 0 or group_size < 0:
        raise ValueError(f"source ({source}) and group_size ({group_size}) must be >= 0")
    parts = [_LP_PROBLEM_TAG, _varint_of(len(problem)), problem]
    d = _pack_double(priority)
    if d != _ZERO_DOUBLE:
        parts += (_LP_PRIORITY_TAG, d)
    if source:
        parts += (_LP_SOURCE_TAG, _varint_of(source))
    if group_size:
        parts += (_LP_GROUP_SIZE_TAG, _varint_of(group_size))
    return b"".join(parts)


def lease_response(lease: Lease) -> bytes:
    """The serialized ``SampleProblemsResponse`` of a store's lease: byte for byte
    ``convert.lease_to_proto(lease).SerializeToString()`` (``tests/unit/wire/test_sample_bytes_path.py``).

    Each problem's bytes are ``SampledProblem.wire`` (kept by the memory store) or, where a store
    leaves it empty, :func:`prioreplay.convert.problem_bytes` of the record.
    """
    head = pb.SampleProblemsResponse(lease_id=lease.lease_id, lease_deadline_unix_s=lease.deadline if lease.problems else 0.0)
    tail = pb.SampleProblemsResponse(
        policy_version=lease.policy_version, weights_uri=lease.weights_uri, retry_after_s=lease.retry_after_s, step=lease.step
    )
    parts = [head.SerializeToString()]
    for s in lease.problems:
        lp = leased_problem(s.wire or problem_bytes(s.problem), s.priority, int(s.source), s.group_size or 0)
        parts += (_PROBLEMS_TAG, _varint_of(len(lp)), lp)
    parts.append(tail.SerializeToString())
    return b"".join(parts)
