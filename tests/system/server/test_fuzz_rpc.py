"""Property tests: arbitrary (well-formed or raw) requests never crash the server or break its invariants.

Hypothesis draws sequences of calls to every RPC with random ids, sizes, rewards (NaN/inf
included), token ids, log-prob lengths and versions; lease and problem ids are drawn partly
from the real ones, so many reports are valid and change the state. Every answer must carry a
documented status code; after every example the store's invariants hold (every problem in exactly
one place, leased exactly when in a live lease, Σ n over problems == completions_reported, the
queue no longer than the mixed groups reported). Raw bytes sent to each method path must be
answered too: grpc itself answers UNKNOWN ("Error parsing message", a DecodeError) for an
undecodable unary request; the servicer answers INVALID_ARGUMENT for an undecodable chunk of the
RegisterProblems stream.
"""

from __future__ import annotations

import math

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from prioreplay.priority_server.config import ServerConfig
from prioreplay.priority_server.store.contract import UNSEEN_SCORE
from prioreplay.rules import Pool
from prioreplay.v1 import priority_service_pb2 as pb
from prioreplay.v1 import priority_service_pb2_grpc as pb_grpc
from tests.conftest import drop_namespace, start_background_server

# hypothesis drives hundreds of messages through every RPC: make test-fast leaves it out
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

DOCUMENTED = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
SETTINGS = settings(
    max_examples=40,
    derandomize=True,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
N_PROBLEMS = 24
SERVICE = "/prioreplay.v1.PriorityService/"


@pytest.fixture(scope="module", params=["memory", "redis", "redis:unseen-prior"])
def srv(request, redis_url):
    """A server on each store; the third with the prior for unseen problems (its unseen band, Lua)."""
    import uuid

    kind, _, prior = request.param.partition(":")

    # decay 1: check_invariants counts every completion in the statistics (the default decays them)
    cfg = ServerConfig(
        metrics_port=0,
        snapshot_interval_s=0,
        max_message_mb=1,
        max_batch_size=16,
        max_lease_timeout_s=3600,
        reaper_interval_s=0.2,
        stats_interval_s=0.5,
        decay=1.0,
        unseen_prior="fit" if prior else "off",
    )
    ns = f"fuzz-{uuid.uuid4().hex[:10]}"
    s = start_background_server(kind, redis_url, ns, cfg)
    try:
        with grpc.insecure_channel(s.address) as ch:
            stub = pb_grpc.PriorityServiceStub(ch)
            stub.RegisterProblems(
                iter(
                    [
                        pb.RegisterProblemsRequest(
                            problems=[pb.Problem(id=f"p{i}", prompt=f"q{i}", answer=str(i)) for i in range(N_PROBLEMS)]
                        )
                    ]
                ),
                timeout=10,
            )
        s.known_leases = ["", "f" * 32]
        yield s
    finally:
        s.stop()
        if kind == "redis":
            drop_namespace(redis_url, ns)


@pytest.fixture
def stub(srv):
    with grpc.insecure_channel(srv.address) as ch:
        yield pb_grpc.PriorityServiceStub(ch)


def check_invariants(srv) -> None:
    d = srv.call(srv.store.dump())
    c = d["counters"]
    assert set(d["problems"]) >= {f"p{i}" for i in range(N_PROBLEMS)}
    assert all(v[0] in (int(Pool.HEAP), int(Pool.SOLVED), int(Pool.UNSOLVED), int(Pool.LEASED)) for v in d["problems"].values())
    leased = [pid for lease in d["leases"] for pid in lease]
    assert len(leased) == len(set(leased))
    assert sorted(leased) == sorted(pid for pid, v in d["problems"].items() if v[0] == int(Pool.LEASED))
    n_sum = sum(v[1] for v in d["problems"].values())
    assert math.isclose(n_sum, c["completions_reported"], abs_tol=1e-6), (n_sum, c)
    groups = c["groups_mixed"] + c["groups_all_correct"] + c["groups_all_wrong"] + c["groups_constant"]
    assert groups <= c["completions_reported"]
    assert len(d["queue"]) <= c["groups_mixed"]
    assert 0 <= c["reward_sum"] <= c["completions_reported"]
    s = srv.call(srv.store.stats())
    assert s.heap_size + s.solved + s.unsolved + s.leased == s.problems
    if srv.store.unseen_band:  # the unseen band holds exactly the unseen problems of the heap
        heap = [v for v in d["problems"].values() if v[0] == int(Pool.HEAP)]
        assert all((v[4] == UNSEEN_SCORE) == (v[1] == 0.0) for v in heap)
        assert sum(s.priority_histogram) == s.heap_size and d["unseen_fit"][0] <= s.problems - s.unseen


# -- strategies ------------------------------------------------------------------------------
floats = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.0, 1.0, 0.5, -0.0]))
rewards = st.one_of(st.sampled_from([0.0, 1.0]), floats)
texts = st.text(max_size=40)
problem_ids = st.one_of(st.sampled_from([f"p{i}" for i in range(N_PROBLEMS)]), texts)
u32 = st.one_of(st.integers(0, 20), st.integers(0, 2**32 - 1))
i64 = st.one_of(st.integers(-3, 10), st.integers(-(2**63), 2**63 - 1))


@st.composite
def completions(draw):
    n_tokens = draw(st.integers(0, 6))
    n_lp = draw(st.sampled_from([n_tokens, n_tokens, max(0, n_tokens - 1), n_tokens + 1]))
    return pb.Completion(
        reward=draw(rewards),
        token_ids=draw(st.lists(u32, min_size=n_tokens, max_size=n_tokens)),
        logprobs=draw(
            st.lists(
                st.one_of(st.floats(-20, 0, width=32), floats.map(lambda x: x if not math.isfinite(x) or abs(x) < 3e38 else 0.0)),
                min_size=n_lp,
                max_size=n_lp,
            )
        ),
        text=draw(st.text(max_size=8)),
        truncated=draw(st.booleans()),
    )


@st.composite
def report_request(draw):
    # an int picks one of the latest real leases when the call is made (the strategy itself must
    # not read mutable state); a string is sent as it is
    pick = draw(st.one_of(st.integers(0, 5), st.text(max_size=40)))
    outs = draw(
        st.lists(
            st.builds(
                pb.ProblemOutcome,
                problem_id=problem_ids,
                policy_version=i64,
                prompt_token_ids=st.lists(u32, max_size=4),
                completions=st.lists(completions(), max_size=5),
            ),
            max_size=4,
        )
    )
    return pick, pb.ReportOutcomesRequest(outcomes=outs, worker_id=draw(st.text(max_size=140)))


def requests():
    return st.one_of(
        st.builds(
            lambda b, t, w: ("SampleProblems", pb.SampleProblemsRequest(batch_size=b, lease_timeout_s=t, worker_id=w)),
            u32,
            st.one_of(st.sampled_from([0.0, 0.3, 600.0]), floats),
            st.text(max_size=140),
        ),
        report_request().map(lambda r: ("ReportOutcomes", r)),
        st.builds(
            lambda m, w, c, o: (
                "PullTrajectories",
                pb.PullTrajectoriesRequest(max_groups=m, wait_s=w, consumer=c, include_own_pending=o),
            ),
            u32,
            st.one_of(st.sampled_from([0.0, 0.01]), floats.filter(lambda x: not 0.01 < x <= 60)),
            st.text(max_size=140),
            st.booleans(),
        ),
        st.builds(
            lambda ids: ("AckTrajectories", pb.AckTrajectoriesRequest(group_ids=ids)),
            st.lists(st.one_of(st.text(max_size=30), st.from_regex(r"\A[0-9]{1,14}-[0-9]{1,3}\Z")), max_size=6),
        ),
        st.builds(
            lambda v, u: ("PublishPolicy", pb.PublishPolicyRequest(version=v, weights_uri=u)),
            i64,
            st.one_of(st.sampled_from(["ckpt/a", "ckpt/b"]), st.text(max_size=50)),
        ),
        st.builds(lambda b: ("GetStats", pb.GetStatsRequest(histogram_buckets=b)), u32),
        st.builds(
            lambda ps: ("RegisterProblems", [pb.RegisterProblemsRequest(problems=ps)]),
            st.lists(
                st.builds(
                    pb.Problem,
                    id=problem_ids,
                    prompt=texts,
                    answer=texts,
                    verifier=st.sampled_from(["", "exact", "math", "gsm8k", "python"]),
                    metadata=st.dictionaries(st.text(max_size=5), st.text(max_size=5), max_size=2),
                ),
                max_size=4,
            ),
        ),
    )


def _call(stub, method, request):
    fn = getattr(stub, method)
    try:
        if method == "RegisterProblems":
            return grpc.StatusCode.OK, fn(iter(request), timeout=20)
        return grpc.StatusCode.OK, fn(request, timeout=20)
    except grpc.RpcError as e:
        assert e.details(), f"{method}: {e.code()} without a message"
        return e.code(), e


# -- well-formed messages --------------------------------------------------------------------
def test_arbitrary_messages_get_documented_codes_and_keep_the_invariants(srv, stub):
    @SETTINGS
    @given(calls=st.lists(requests(), min_size=1, max_size=8))
    def run(calls):
        for method, request in calls:
            if method == "ReportOutcomes":
                pick, request = request
                recent = srv.known_leases[-6:]
                request.lease_id = recent[pick % len(recent)] if isinstance(pick, int) else pick
            code, resp = _call(stub, method, request)
            assert code in DOCUMENTED, f"{method} answered {code}: {resp}"
            if method == "SampleProblems" and code == grpc.StatusCode.OK and resp.lease_id:
                srv.known_leases.append(resp.lease_id)
                # report some leases properly, so reports that change the state are exercised too;
                # only leases that cannot expire during the call (a drawn lease_timeout_s of 1e-300 s
                # expires at once, and its report is rightly refused as late)
                lasting = request.lease_timeout_s == 0 or request.lease_timeout_s >= 60
                if len(srv.known_leases) % 2 and lasting:
                    outs = [
                        pb.ProblemOutcome(
                            problem_id=lp.problem.id,
                            completions=[
                                pb.Completion(reward=float(k % 2), token_ids=[1], logprobs=[-1.0]) for k in range(i % 3 + 1)
                            ],
                        )
                        for i, lp in enumerate(resp.problems)
                    ]
                    assert stub.ReportOutcomes(
                        pb.ReportOutcomesRequest(lease_id=resp.lease_id, outcomes=outs), timeout=20
                    ).accepted
        check_invariants(srv)

    run()
    s = stub.GetStats(pb.GetStatsRequest(), timeout=10)
    assert s.completions_reported > 0 and s.problems >= N_PROBLEMS  # the fuzzing did change the state


# -- raw bytes at the transport --------------------------------------------------------------
UNARY = ["SampleProblems", "ReportOutcomes", "PullTrajectories", "AckTrajectories", "PublishPolicy", "GetStats"]


def test_raw_bytes_to_every_method_are_answered(srv):
    with grpc.insecure_channel(srv.address) as ch:
        unary = {m: ch.unary_unary(SERVICE + m) for m in UNARY}  # identity serializers: bytes in, bytes out
        register = ch.stream_unary(SERVICE + "RegisterProblems")

        @SETTINGS
        @given(
            method=st.sampled_from(UNARY + ["RegisterProblems"]),
            chunks=st.lists(
                st.one_of(st.binary(max_size=64), st.sampled_from([b"\xff\xff\xff", b"\x0a\x05ab", b"\x08\x01", b""])),
                min_size=1,
                max_size=3,
            ),
        )
        def run(method, chunks):
            try:
                if method == "RegisterProblems":
                    register(iter(chunks), timeout=20)
                else:
                    unary[method](chunks[0], timeout=20)
                return
            except grpc.RpcError as e:
                code, details = e.code(), e.details() or ""
            if code == grpc.StatusCode.UNKNOWN:  # grpc's own answer to an undecodable unary request
                assert method != "RegisterProblems" and "Error parsing message" in details, details
            else:
                assert code in DOCUMENTED, (method, code, details)
            check_invariants(srv)

        run()
        assert pb.GetStatsResponse.FromString(unary["GetStats"](b"", timeout=10)).problems >= N_PROBLEMS
    check_invariants(srv)


# -- every sampler, its parameters drawn from its model ----------------------------------------------
def sampler_params(model):
    """A strategy of ``model`` instances (a sampler's parameter model): each field drawn within its
    declared bounds (annotated-types Ge/Gt/Le/Lt), so every sampler's parameters are fuzzed."""
    import annotated_types as at

    fields = {}
    for name, info in model.model_fields.items():
        if name == "name":
            continue
        bounds = (("Ge", at.Ge, "ge"), ("Gt", at.Gt, "gt"), ("Le", at.Le, "le"), ("Lt", at.Lt, "lt"))
        b = {key: getattr(m, attr) for m in info.metadata for key, cls, attr in bounds if isinstance(m, cls)}
        if info.annotation in (int, "int"):
            lo, hi = b.get("Ge", b.get("Gt", -1) + 1), min(b.get("Le", b.get("Lt", 2**31) - 1), 64)
            fields[name] = st.integers(lo, hi)
        elif info.annotation in (float, "float"):
            lo, hi = b.get("Ge", b.get("Gt", -1e6)), b.get("Le", b.get("Lt", 1e6))
            fields[name] = st.floats(lo, hi, exclude_min="Gt" in b, exclude_max="Lt" in b, allow_nan=False)
        elif info.annotation in (bool, "bool"):
            fields[name] = st.booleans()
        else:
            fields[name] = st.just(info.default)
    return st.builds(model, **fields)


def _sampler_cases():
    from prioreplay.priority_server.samplers import SAMPLERS

    return [(k, name) for name, spec in SAMPLERS.items() for k in ("memory", "redis") if k == "memory" or spec.lua_branch]


@pytest.mark.parametrize(("kind", "sampler"), _sampler_cases())
def test_every_sampler_with_drawn_parameters_answers_and_keeps_the_invariants(kind, sampler, redis_url):
    import uuid

    from hypothesis import assume
    from pydantic import ValidationError

    from prioreplay.errors import InvalidArgument
    from prioreplay.priority_server.samplers import SAMPLERS

    model = SAMPLERS[sampler].params
    flat = set(ServerConfig.model_fields)

    @settings(SETTINGS, max_examples=3)
    @given(params=sampler_params(model), calls=st.lists(requests(), min_size=1, max_size=6))
    def run(params, calls):
        values = params.model_dump(exclude={"name"})
        try:
            cfg = ServerConfig(
                metrics_port=0,
                snapshot_interval_s=0,
                max_batch_size=16,
                max_lease_timeout_s=3600,
                reaper_interval_s=0.2,
                stats_interval_s=0.5,
                decay=1.0,
                sampler=sampler,
                sampler_args={k: v for k, v in values.items() if k not in flat},
                **{k: v for k, v in values.items() if k in flat},
            )
        except (InvalidArgument, ValidationError):
            assume(False)  # a combination the settings refuse (max_group_size below mean_group_size)
        assert cfg.sampler_params == params
        ns = f"fuzz-{uuid.uuid4().hex[:10]}"
        s = start_background_server(kind, redis_url, ns, cfg)
        try:
            with grpc.insecure_channel(s.address) as ch:
                stub = pb_grpc.PriorityServiceStub(ch)
                problems = [pb.Problem(id=f"p{i}", prompt=f"q{i}", answer=str(i)) for i in range(N_PROBLEMS)]
                stub.RegisterProblems(iter([pb.RegisterProblemsRequest(problems=problems)]), timeout=10)
                for method, request in calls:
                    if method == "ReportOutcomes":
                        request = request[1]
                        request.lease_id = "f" * 32
                    if method == "SampleProblems":
                        request.accepts_group_size = True  # probing samplers serve it only then
                    code, resp = _call(stub, method, request)
                    assert code in DOCUMENTED, f"{sampler}: {method} answered {code}: {resp}"
                lease = stub.SampleProblems(pb.SampleProblemsRequest(batch_size=4, accepts_group_size=True), timeout=10)
                assert len(lease.problems) <= 4 and bool(lease.lease_id) == bool(lease.problems)
            check_invariants(s)
        finally:
            s.stop()
            if kind == "redis":
                drop_namespace(redis_url, ns)

    run()
