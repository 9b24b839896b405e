"""Hand-made protobuf bytes for the encoding tests: valid ``ReportOutcomesRequest`` bytes in the
unpacked (non-canonical) encoding, which no protobuf library writes but every parser accepts."""

from __future__ import annotations

import struct


def tag(field: int, wire: int) -> bytes:
    """The one-byte key of field number ``field`` (< 16) with wire type ``wire``."""
    return bytes([field << 3 | wire])


def unpacked_completion(reward: float, tokens: list[int], logprobs: list[float]) -> bytes:
    """A Completion whose repeated fields use the unpacked encoding (valid protobuf, not canonical)."""
    out = tag(1, 1) + struct.pack("<d", reward)
    for t in tokens:
        out += tag(2, 0) + bytes([t])  # t < 128
    for lp in logprobs:
        out += tag(3, 5) + struct.pack("<f", lp)
    return out


def report_bytes(lease_id: str, pid: str, completions: list[bytes]) -> bytes:
    """A ReportOutcomesRequest of one outcome (problem ``pid``) holding ``completions`` (each < 128 bytes)."""
    o = tag(1, 2) + bytes([len(pid)]) + pid.encode()
    for c in completions:
        o += tag(4, 2) + bytes([len(c)]) + c
    return tag(1, 2) + bytes([len(lease_id)]) + lease_id.encode() + tag(2, 2) + bytes([len(o)]) + o
