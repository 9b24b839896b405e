"""LeaseRenewer without a server: what one renewal round sends, and what it does with refusals."""

from __future__ import annotations

import pytest

from prioreplay.errors import InvalidArgument, NotFound, StoreUnavailable
from prioreplay.integrations.renewal import LeaseRenewer, check_lease_timeout


class _Client:
    """Records renewals; answers each lease id with what ``answers`` says (default: renewed)."""

    def __init__(self, answers: dict[str, Exception] | None = None):
        self.calls: list[tuple[str, str, float, int]] = []
        self.answers = answers or {}

    def renew(self, lease_id, worker_id="", lease_timeout_s=0.0, client_source=0):
        self.calls.append((lease_id, worker_id, lease_timeout_s, client_source))
        if lease_id in self.answers:
            raise self.answers[lease_id]


def test_a_round_renews_every_held_lease_as_its_holder():
    client = _Client()
    r = LeaseRenewer(client, "trl-host-1", 6.0, lambda: ["a", "b"], client_source=2)  # type: ignore[arg-type]
    assert r.renew_now() == 2
    assert client.calls == [("a", "trl-host-1", 6.0, 2), ("b", "trl-host-1", 6.0, 2)]
    assert r.renewed == 2 and r.lost == set()


def test_a_lost_lease_is_recorded_once_and_an_outage_is_retried_next_round():
    held = ["gone", "down", "fine"]
    client = _Client({"gone": NotFound("lease gone cannot be renewed: expired"), "down": StoreUnavailable("unreachable")})
    r = LeaseRenewer(client, "w", 6.0, lambda: list(held))  # type: ignore[arg-type]
    assert r.renew_now() == 1
    assert r.lost == {"gone"}
    assert r.renew_now() == 1 and r.lost == {"gone"}  # not asked again
    assert [c[0] for c in client.calls].count("gone") == 1
    held.remove("gone")
    client.answers["reported"] = NotFound("already reported")
    assert r.renew_now() == 1 and r.lost == {"gone"}  # a lease reported meanwhile is not lost


def test_the_period_is_a_third_of_the_timeout_and_the_thread_stops():
    r = LeaseRenewer(_Client(), "w", 3.0, lambda: [])  # type: ignore[arg-type]
    r.start(granted_s=600.0)
    assert r.period_s == pytest.approx(1.0)
    r.stop(wait_s=5.0)
    assert r._thread is not None and not r._thread.is_alive()
    server_default = LeaseRenewer(_Client(), "w", 0.0, lambda: [])  # type: ignore[arg-type]
    server_default.start(granted_s=600.0)  # 0: the server's default, as granted
    assert server_default.period_s == pytest.approx(200.0)
    server_default.stop()


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "60"])
def test_a_bad_lease_timeout_is_refused_with_the_default(bad):
    with pytest.raises(InvalidArgument, match=r"lease_timeout_s .* must be a finite number of seconds >= 0 .*default is 60"):
        check_lease_timeout(bad)


def test_leases_returned_at_exit_get_one_retry_not_the_clients_whole_back_off(caplog):
    """At exit the server may be gone already: eight retries with back-off cost about a minute a
    sampler (a test run spent minutes so after its last test). The exit path retries once, and a
    failure is logged, not raised."""
    from types import SimpleNamespace

    from prioreplay.integrations.torch import release

    class Sampler:
        worker_id = "w-exit"

        def __init__(self) -> None:
            self.client = SimpleNamespace(max_retries=8)
            self.retries_seen: int | None = None

        def close(self) -> None:
            self.retries_seen = self.client.max_retries
            raise StoreUnavailable("ReportOutcomes: connection refused")

    sampler = Sampler()
    release._LIVE.add(sampler)  # type: ignore[arg-type]
    try:
        release.release_all()
    finally:
        release._LIVE.discard(sampler)  # type: ignore[arg-type]
    assert sampler.retries_seen == release.EXIT_RETRIES == 1
    assert "could not return the leases of w-exit" in caplog.text


def test_renewals_end_quietly_once_the_client_is_closed():
    """A sampler's client closed under its running renewer (grpc's "closed channel" ValueError)
    crashed the thread in a CI run; the renewer now stops instead."""

    class Closed(_Client):
        def renew(self, lease_id, **kw):
            raise ValueError("Cannot invoke RPC on closed channel!")

    r = LeaseRenewer(Closed(), "w", 6.0, lambda: ["a", "b"])  # type: ignore[arg-type]
    assert r.renew_now() == 0
    assert r._stop.is_set() and not r.lost  # stopped; nothing counted as lost on the server
