"""The entry points: the ``prioreplay`` command and the programs that drive the roles.

========================  ==========================================================================
module                    what
========================  ==========================================================================
``cli``                   the ``prioreplay`` command: one subcommand per role (``python -m
                          prioreplay.apps.cli`` is the same program)
``demo``, ``demo_config`` ``prioreplay demo``: server, workers and learner on one machine, a run report
``compare``,              ``prioreplay compare``: demo runs side by side, ``compare.json`` and
``compare_config``,       ``compare.png``
``compare_figure``
``report_figure``         the run report's picture (``report.png``)
``evaluate``              held-out scoring of a checkpoint (the demo's before/after accuracy)
========================  ==========================================================================

This layer sits above the roles (``prioreplay.priority_server``, ``prioreplay.rollout_worker``,
``prioreplay.learner``) and the core (the rest of ``prioreplay``). It imports a role only inside
the function that runs it, except a role's settings modules (``config``, ``samplers``), so
``prioreplay --help`` answers without torch or grpc (docs/INTERFACES.md, "Layers").
"""
