"""Prioritized problems inside trainers people already run: one module per trainer, each an extra.

================================  =====================  ==============================================
module                            extra                  what it gives
================================  =====================  ==============================================
``prioreplay.integrations.torch``  ``prioreplay[torch]``  :class:`PrioritySampler`, a ``Sampler[int]`` for
                                                          any ``DataLoader`` / ``StatefulDataLoader`` loop
``prioreplay.integrations.trl``    ``prioreplay[trl]``    ``PriorityGRPOTrainer`` and ``attach`` for TRL's
                                                          ``GRPOTrainer``
``prioreplay.integrations.verl``   ``prioreplay[verl]``   ``make_train_sampler`` and ``RewardReporter`` for
                                                          verl's ``RayPPOTrainer``
================================  =====================  ==============================================

The trainer keeps its model, generation and reward code; the priority server decides *which
problems* it trains on and receives every group's rewards (``docs/INTEGRATIONS.md``). Nothing
here is imported by ``import prioreplay``.
"""
