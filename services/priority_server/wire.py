"""Reading the protobuf wire format directly, where decoding into Python objects costs too much.

``ReportOutcomes`` carries every completion's behaviour log-probabilities (G × tokens floats per
problem). Turning repeated protobuf floats into Python floats one by one costs ~0.5 µs each,
which at 256 problems × G = 8 × 128 tokens is most of a report's handling time; reading the
packed float32 bytes and checking them with numpy in one go is ~100 times cheaper.
:func:`lean_report` does that for a whole report and also queues each mixed group from the bytes
as received instead of rebuilding a ``TrajectoryGroup`` message from its fields.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from prioreplay import rules
from prioreplay.convert import ReportedGroup, trajectory_fields
from prioreplay.v1 import priority_service_pb2 as pb

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


# -- the lean ReportOutcomes path ---------------------------------------------------------------
# Views of the same wire bytes with other declared types, in a private descriptor pool: a packed
# repeated scalar field and a sub-message are both length-delimited on the wire, so declaring them
# ``bytes`` makes the C parser hand over the packed values / the sub-message as received, without
# creating a Python object per value. Only valid for canonical encodings (each packed field once,
# packed), which :func:`lean_report` checks first.
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

    # Completion as received: reward, and the packed token ids / float32 log-probs as bytes
    message(
        "CompletionView",
        [
            ("reward", 1, F.TYPE_DOUBLE, False, ""),
            ("token_ids", 2, F.TYPE_BYTES, False, ""),
            ("logprobs", 3, F.TYPE_BYTES, False, ""),
        ],
    )
    message("CheckOutcomeView", [("completions", 4, F.TYPE_MESSAGE, True, "CompletionView")])
    message("CheckReportView", [("outcomes", 2, F.TYPE_MESSAGE, True, "CheckOutcomeView")])
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
#: cost (a few Python calls) is below the lean path's (numpy calls, two extra parses).
LEAN_MIN_BYTES = 8192


def _varint_counts(chunks: list[bytes]) -> np.ndarray:
    """Number of varints in each of ``chunks`` (packed uint32 fields, each complete), int64 array."""
    lens = np.fromiter(map(len, chunks), np.int64, len(chunks))
    ends = np.cumsum(lens)
    buf = np.frombuffer(b"".join(chunks), np.uint8)
    cum = np.concatenate((np.zeros(1, np.int64), np.cumsum(buf < 0x80, dtype=np.int64)))
    return cum[ends] - cum[ends - lens]


def lean_report(raw: bytes, request: pb.ReportOutcomesRequest, reported_unix_s: float, queue: bool) -> list[ReportedGroup] | None:
    """The groups of a valid report, read from its received bytes; None when the slow path must decide.

    ``request`` is ``raw`` decoded (the decode is what proves the bytes are valid protobuf). When
    ``request`` re-serializes to exactly ``raw`` (a canonical encoding: what every protobuf
    library writes), the packed log-probabilities of all completions are checked in one numpy
    pass (finite, <= :data:`LOGPROB_TOLERANCE`), the number of log-probabilities of each
    completion is compared with its number of token ids from the packed varints, and each mixed
    group's payload is made from the received bytes of its prompt token ids and completions (a
    ``TrajectoryGroup``, byte for byte what :func:`prioreplay.convert.trajectory_payload` gives).

    Returns:
        [(problem_id, rewards, payload)] in report order (payload b"" unless the group is mixed and
        ``queue``), or None when the report is under :data:`LEAN_MIN_BYTES`, the encoding is not
        canonical or any message-level check fails: the caller then runs the per-field checks,
        which name the bad value.
    """
    if len(raw) < LEAN_MIN_BYTES or not request.outcomes or request.SerializeToString() != raw:
        return None
    check = _VIEWS["CheckReportView"].FromString(raw)  # type: ignore[attr-defined]  # a generated message class, passed as type
    comps = [c for o in check.outcomes for c in o.completions]
    n_tokens = np.zeros(0, np.int64)  # (completions,) token ids of each completion
    if comps:
        lps = [c.logprobs for c in comps]
        n_lps = np.fromiter(map(len, lps), np.int64, len(lps))
        n_tokens = _varint_counts([c.token_ids for c in comps])
        if (n_lps % 4).any() or not (n_tokens * 4 == n_lps).all():
            return None
        a = np.frombuffer(b"".join(lps), dtype="<f4")
        if a.size and not (np.isfinite(a).all() and a.max() <= LOGPROB_TOLERANCE):
            return None
    view = _VIEWS["ReportView"].FromString(raw)  # type: ignore[attr-defined]  # a generated message class, passed as type
    group = _VIEWS["GroupView"]
    out = []
    ends = np.cumsum([len(c.completions) for c in check.outcomes], dtype=np.int64)  # (outcomes,)
    prefix = np.concatenate((np.zeros(1, np.int64), np.cumsum(n_tokens)))  # (completions + 1,)
    group_tokens = prefix[ends] - prefix[np.concatenate((np.zeros(1, np.int64), ends[:-1]))]  # (outcomes,)
    for o, c, tokens in zip(view.outcomes, check.outcomes, group_tokens.tolist(), strict=True):
        if not o.problem_id or o.policy_version < 0 or not (o.sampling_temperature >= 0 and o.sampling_temperature != _INF):
            return None  # NaN fails >= 0
        if not 0.0 <= o.sampling_top_p <= 1.0:
            return None  # NaN fails too
        rewards = tuple([x.reward for x in c.completions])
        payload = b""
        if queue and rewards and rules.classify(rewards) is rules.GroupKind.MIXED:
            payload = group(**trajectory_fields(o, reported_unix_s)).SerializeToString()
        out.append(ReportedGroup(o.problem_id, rewards, payload, int(tokens)))
    return out


_INF = float("inf")


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
