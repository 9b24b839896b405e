"""How a distributed learner splits one batch across ranks (pure: no process group, no model)."""

from __future__ import annotations

import contextlib

import pytest
import torch

from prioreplay.errors import InvalidArgument
from prioreplay.learner.batch import Batch
from prioreplay.learner.distributed import Distributed, from_env


class _Model:
    """Stands in for DDP: counts the micro-batches run without gradient sync."""

    def __init__(self):
        self.no_sync_calls = 0

    def no_sync(self):
        self.no_sync_calls += 1
        return contextlib.nullcontext()


def _batch(b: int, t: int = 5) -> Batch:
    ids = torch.arange(b * t).reshape(b, t)  # (B, T): row i starts at i * t
    return Batch(
        ids,
        torch.ones(b, t, dtype=torch.long),
        torch.ones(b, t - 1, dtype=torch.bool),
        torch.zeros(b, t - 1),
        torch.zeros(b),
        torch.zeros(b),
    )


@pytest.mark.parametrize("b,k,size", [(7, 2, 3), (8, 2, 3), (3, 4, 2), (16, 3, 4)])
def test_every_sequence_is_trained_on_exactly_one_rank_and_every_rank_runs_as_many_micro_batches(b, k, size):
    batch, seen, counts = _batch(b), [], set()
    for rank in range(k):
        model = _Model()
        mbs = list(Distributed(rank, k, rank).micro_batches(batch, size, model))
        counts.add(len(mbs))
        assert model.no_sync_calls == len(mbs) - 1  # gradients are all-reduced once, after the last
        for mb, _ in mbs:
            assert len(mb) <= size
            if mb.completion_mask.any():  # a real slice (a padding one has an all-zero mask)
                seen += [int(row[0]) // 5 for row in mb.input_ids]
    assert sorted(seen) == list(range(b))  # each sequence once, none left out
    assert len(counts) == 1  # same count on every rank: collectives stay matched


def test_from_env_is_none_outside_a_job_of_two_or_more_ranks_and_checks_the_rank():
    assert from_env({}) is None and from_env({"WORLD_SIZE": "1", "RANK": "0"}) is None
    d = from_env({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "2"})
    assert (d.rank, d.world_size, d.local_rank, d.is_main) == (2, 4, 2, False)
    with pytest.raises(InvalidArgument, match="RANK"):
        from_env({"WORLD_SIZE": "2", "RANK": "2"})


def test_a_fixed_cuda_device_is_refused_under_torchrun():
    with pytest.raises(InvalidArgument, match="cuda:LOCAL_RANK"):
        Distributed(1, 2, 1).device("cuda:1")
