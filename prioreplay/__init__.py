"""prioreplay: problem-level prioritized replay for GRPO post-training as a service.

Implements Fatemi, "Prioritized Replay for RL Post-training" (arXiv 2601.02648): a problem's
priority is p(1 − p) from its empirical success rate; batches come from a max-heap of
priorities; always-solved and always-failed problems leave the heap for retest pools.

Heavy modules (torch, transformers, grpc) are imported only by the roles that need them.
"""

__version__ = "0.1.0"
