"""prioreplay: problem-level prioritized replay for GRPO post-training as a service.

Implements Fatemi, "Prioritized Replay for RL Post-training" (arXiv 2601.02648): a problem's
priority is p(1 − p) from its empirical success rate; batches come from a max-heap of
priorities; always-solved and always-failed problems leave the heap for retest pools.

Heavy modules (torch, transformers, grpc) are imported only by the roles that need them.
"""

__version__ = "0.1.0"

from pathlib import Path as _Path

# From a source checkout, services/<role>/ is prioreplay.<role> also where this folder comes first on
# sys.path (``python -m ...`` or pytest in the repository root shadow the installed link tree, the only
# place that holds both): the roles' folder joins the package's search path. An installed wheel has no
# services/ beside it and adds nothing (docs/INTERFACES.md, "Static tools").
_services = _Path(__file__).resolve().parent.parent / "services"
if (_services / "priority_server" / "__init__.py").is_file() and str(_services) not in __path__:
    __path__.append(str(_services))
del _Path, _services
