"""Reading the protobuf wire format directly, for the one check where decoding costs too much.

``ReportOutcomes`` carries every completion's behaviour log-probabilities (G × tokens floats per
problem). Turning repeated protobuf floats into Python floats one by one costs ~0.5 µs each,
which at 256 problems × G = 8 × 128 tokens is most of a report's handling time; reading the
packed float32 bytes and checking them with numpy in one go is ~100 times cheaper.
"""

from __future__ import annotations

from typing import Iterable, Iterator

import numpy as np

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
                yield buf[pos:pos + size]
            pos += size
        else:  # groups (3, 4) are not used by proto3
            raise ValueError(f"unexpected wire type {wire}")


def logprobs_all_valid(outcomes: Iterable[pb.ProblemOutcome]) -> bool:
    """True when every log-probability of every completion is finite and <= 0 (+ tolerance).

    One vectorised check over the packed float32 bytes of the re-serialized outcomes.
    """
    parts = [lp for o in outcomes for c in length_delimited_fields(o.SerializeToString(), _COMPLETIONS_FIELD)
             for lp in length_delimited_fields(c, _LOGPROBS_FIELD)]
    if not parts:
        return True
    a = np.frombuffer(b"".join(parts), dtype="<f4")
    return bool(np.isfinite(a).all() and a.max() <= LOGPROB_TOLERANCE)
