"""A torch ``Sampler[int]`` whose indices come from the priority server's leases.

The public entry point of the torch integration; its modules, by job: :mod:`.table` (a dataset's
rows as problems), :mod:`.sampler` (:class:`PrioritySampler`), :mod:`.leases` (the leases a
sampler holds and its saved state), :mod:`.checks` (what it refuses), :mod:`.release` (leases
returned when the process ends).

:class:`PrioritySampler` registers a dataset's rows as problems, leases batches of them from the
server (the top of the priority heap plus a retest share, Fatemi, arXiv 2601.02648), yields their
dataset indices, and sends each problem's group of rewards back once the group is complete. It
works with ``torch.utils.data.DataLoader`` and with torchdata's ``StatefulDataLoader`` (it keeps
``state_dict()`` / ``load_state_dict()``). The TRL and verl integrations are built on it.

The lifecycle of one batch::

    SampleProblems(B) ─▶ indices yielded (each ``repeat_each`` times, the block ``repeat_batch`` times)
                     ─▶ report(ids, rewards) buffers per problem until G rewards arrived
                     ─▶ every problem of the lease complete ─▶ one report (rewards only; in parts
                        when over the message limit: ``PriorityClient.report_lease``)

A lease is reported once, whole (the server's counting rule), so rewards are buffered per problem
until all of a lease's groups are complete. Partial groups (fewer than G rewards) are sent only by
:meth:`PrioritySampler.flush` (at the end of training, on ``close()``, on a ``return`` resume): with
``partial_groups="report"`` (default) a problem with k < G rewards is reported as a group of k —
the server's statistics are sums over completions, so nothing is lost, but the pool decision
(solved / unsolved / heap) is made on those k rewards; with ``"drop"`` such problems are left out
and return to where they were with unchanged statistics. Problems without any reward always
return unchanged.
"""

from prioreplay.integrations.torch.checks import SOURCES
from prioreplay.integrations.torch.leases import STATE_VERSION
from prioreplay.integrations.torch.sampler import PrioritySampler
from prioreplay.integrations.torch.table import ANSWER_COLUMNS, MAX_ID_BYTES, NO_ANSWER, ProblemTable, prompt_text

__all__ = [
    "ANSWER_COLUMNS",
    "MAX_ID_BYTES",
    "NO_ANSWER",
    "SOURCES",
    "STATE_VERSION",
    "PrioritySampler",
    "ProblemTable",
    "prompt_text",
]
