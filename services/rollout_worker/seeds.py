"""Generation seeds: every completion's randomness distinct across problems, leases, replicas and restarts.

A seed of ``config.seed + batch index`` repeats itself: every replica starts at the same default,
a restart starts over, and vLLM gives child j of a request the seed s + j, so consecutive batches
share all but one of their children's seeds (verl #6857, ms-swift #7858). With unchanged weights a
problem leased again would get near-copies of its last completions, which the server would count
as new evidence.

Instead each problem of a lease gets its own seed, a hash of everything that identifies it::

    seed(S, worker, lease, problem) = blake2b(S, worker id, lease id, problem id) as a 63-bit integer

Lease ids are 128 random bits drawn by the server for every lease, so two leases (of any worker,
before or after any restart) never share a seed, whatever ``--seed`` is; the worker id and the
problem id separate the problems of one lease and guard against a store that reuses lease ids.
The backend draws the group's G completions from that one seed (vLLM: child j from seed + j; the
63-bit seeds of two problems are 2^-60-unlikely to lie within G of each other).

Reproducibility: the same ``--seed S``, worker id, lease id and problem id (and the same weights,
prompt and sampling parameters) give the same seed, so a recorded lease can be replayed. The vLLM
backend seeds every prompt alone; the transformers backend decodes several prompts together, so
its completions also depend on the lease's other problems and ``--max-batch-sequences``.
"""

from __future__ import annotations

import hashlib

#: Seeds are in [0, 2**63): what SamplingParams accepts (and vLLM and torch take).
SEED_BITS = 63


def mix_seed(*parts: object) -> int:
    """A 63-bit seed hashed (BLAKE2b, 8-byte digest) from ``parts``, each turned into text and
    length-prefixed, so ``("ab", "c")`` and ``("a", "bc")`` give different seeds."""
    h = hashlib.blake2b(digest_size=8, person=b"prioreplay-seed")
    for part in parts:
        data = str(part).encode("utf-8")
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return int.from_bytes(h.digest(), "little") >> (64 - SEED_BITS)


def problem_seed(run_seed: int, worker_id: str, lease_id: str, problem_id: str) -> int:
    """The seed of one problem's group in one lease (see the module docstring), in [0, 2**63).

    Args:
        run_seed: the worker's ``--seed``.
        worker_id: the worker's ``--worker-id``.
        lease_id: the lease's id (as ``SampleProblems`` returned it).
        problem_id: the problem's stable id.
    """
    return mix_seed("problem", run_seed, worker_id, lease_id, problem_id)
