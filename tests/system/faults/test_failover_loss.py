"""No acknowledged report is lost in a Redis failover under the default ``--min-replica-acks all``.

Each fault of the loss harness (:mod:`benchmarks.failover_loss`: a primary, two replicas, three
sentinels as real processes; the real gRPC server on ``redis+sentinel://``; clients reporting at
full rate) runs once; afterwards every acknowledged report is looked up on the new primary. The
run is bounded (each phase ``bound_s``) and small (30 reports acknowledged before the fault, 30
after the recovery). The measured loss of the weaker settings is in docs/GUARANTEES.md.
"""

from __future__ import annotations

import pytest

from benchmarks.failover_loss import FAULTS, run_fault

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("fault", FAULTS)
def test_no_acknowledged_report_is_lost_with_every_promotable_replica_acknowledging(fault, tmp_path, record_property):
    r = run_fault(fault, "all", workdir=tmp_path, warmup_acks=30, after_acks=30, bound_s=30.0)
    for name in ("acknowledged", "lost", "duplicated", "no_service_s"):
        record_property(name, getattr(r, name))
    print(f"\n{r}")
    assert r.acknowledged >= 60, r  # before the fault and after the recovery
    assert r.lost == 0 and r.found == r.acknowledged, r
    assert r.duplicated == 0, r
    assert r.promoted.startswith("replica"), r  # a failover did happen: the first primary is gone or paused
