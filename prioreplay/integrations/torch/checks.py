"""What a :class:`~prioreplay.integrations.torch.PrioritySampler` refuses, and the fix it names:
bad constructor arguments, and a server that holds problems of another dataset.
"""

from __future__ import annotations

import math

from prioreplay.errors import FailedPrecondition, InvalidArgument
from prioreplay.v1 import priority_service_pb2 as pb

#: Kind of client sent with every request (the server's ``source`` metrics label).
SOURCES = {"torch": pb.CLIENT_SOURCE_TORCH, "trl": pb.CLIENT_SOURCE_TRL, "verl": pb.CLIENT_SOURCE_VERL}


def check_arguments(n, batch_size, group_size, repeat_each, repeat_batch, num_batches, partial_groups, on_resume, source) -> None:
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


def check_sampling(temperature: float, top_p: float) -> None:
    """Raise InvalidArgument unless temperature ≥ 0 and top_p in [0, 1] (0: not sent, read as 1)."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise InvalidArgument(f"temperature ({temperature!r}) must be a finite number >= 0 (0: not sent)")
    if not (isinstance(top_p, (int, float)) and 0.0 <= top_p <= 1.0):
        raise InvalidArgument(f"top_p ({top_p!r}) must be in [0, 1] (0: not sent)")


def other_dataset(server: str, total: int, n: int, written: bool) -> FailedPrecondition:
    """The refusal of the server at ``server`` holding ``total`` problems for a dataset of ``n``; ``written``: this
    run's rows were registered before the server's count showed it (said in the message)."""
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
