"""The learner against a real in-process priority server (memory store) and the tiny model.

Groups are synthetic: prompts from the tiny tokenizer's chat template, random completion tokens,
and behaviour log-probs computed by the same tiny model (so the first step's ratio is exactly 1).
The server, its client and the tiny model are this folder's conftest.py fixtures; the learner
stopped and resumed: test_learner_resume.py.
"""

from __future__ import annotations

import json
import signal

import pytest
import torch

from prioreplay import checkpoint_reader as checkpoints
from prioreplay.learner import checkpoint as ckpt
from prioreplay.learner.config import LearnerConfig
from prioreplay.v1 import priority_service_pb2 as pb
from tests.system.learner.conftest import ServerThread  # noqa: F401 - the other learner tests use tl.ServerThread

# training steps and learner processes: tens of seconds; make test-fast leaves them out
pytestmark = pytest.mark.slow

G = 4  # completions per group
COMPLETION_TOKENS = 6  # tokens per completion (reduced: fast steps)


def make_config(server, tiny_dir, tmp_path, **overrides) -> LearnerConfig:
    kw = dict(
        server=server.address,
        model=str(tiny_dir),
        checkpoint_dir=tmp_path / "ckpt",
        batch_groups=2,
        micro_batch_size=3,  # 8 sequences → micro-batches of 3, 3, 2: accumulation is exercised
        lr=1e-2,
        max_staleness=2,
        publish_every=1,
        checkpoint_every=1,
        keep_checkpoints=2,
        metrics_port=0,
        pull_wait_s=0.2,
        batch_timeout_s=1.0,
        consumer="test-learner",
        log_file=tmp_path / "learner.jsonl",
        device="cpu",
        seed=0,
    )
    kw.update(overrides)
    return LearnerConfig(**kw)


# --- synthetic groups ------------------------------------------------------------------------------
_fed = 0


def feed(
    client, tiny_dir, n_groups: int, versions: list[int] | None = None, seed: int = 0, temperature: float = 0.0
) -> list[dict]:
    """Register n problems, lease them, report one mixed group each, with behaviour log-probs at
    ``temperature`` (0: not sent, read as 1). Returns what was reported."""
    global _fed
    from prioreplay.learner.batch import token_logprobs
    from prioreplay.models import apply_chat_template, load_causal_lm, load_tokenizer

    tok, model = load_tokenizer(tiny_dir), load_causal_lm(tiny_dir)
    client.register(
        [pb.Problem(id=f"q{_fed + i}", prompt=f"what is {_fed + i} + 1?", answer=str(_fed + i + 1)) for i in range(n_groups)]
    )
    _fed += n_groups
    lease = client.sample(n_groups)
    assert len(lease.problems) == n_groups
    gen = torch.Generator().manual_seed(seed)
    outcomes, reported = [], []
    for k, lp in enumerate(lease.problems):
        prompt = apply_chat_template(tok, lp.problem.prompt)
        completions, rewards = [], [float((i + k) % 3 == 0) for i in range(G)]  # mixed: 1 or 2 of 4 correct
        for i in range(G):
            ids = torch.randint(5, len(tok), (COMPLETION_TOKENS,), generator=gen).tolist()
            full = torch.tensor([prompt + ids])
            with torch.no_grad():
                lps, _ = token_logprobs(model, full, torch.ones_like(full), temperature or 1.0)
            beh = lps[0, len(prompt) - 1 :].tolist()  # (L,) log-probs of the completion tokens
            completions.append(pb.Completion(reward=rewards[i], token_ids=ids, logprobs=beh))
        version = versions[k] if versions else 0
        outcomes.append(
            pb.ProblemOutcome(
                problem_id=lp.problem.id,
                policy_version=version,
                prompt_token_ids=prompt,
                completions=completions,
                sampling_temperature=temperature,
            )
        )
        reported.append({"prompt": prompt, "rewards": rewards, "version": version})
    resp = client.report(lease.lease_id, outcomes)
    assert resp.accepted and resp.groups_queued == n_groups
    return reported


def _params(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# --- tests -----------------------------------------------------------------------------------------
def test_step_trains_checkpoints_and_publishes_weights_a_worker_loads(server, client, tiny_dir, tmp_path):
    from prioreplay.learner.learner import Learner
    from prioreplay.learner.loss import group_advantages
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend

    reported = feed(client, tiny_dir, 2)
    learner = Learner(make_config(server, tiny_dir, tmp_path, advantage="drgrpo"))
    assert learner.resume() is None
    before = _params(learner.model)
    result = learner.step()
    assert result.trained and learner.step_count == 1
    r = result.record
    # behaviour log-probs came from the same weights: ratio 1 everywhere, so nothing is clipped and
    # the token-mean pg loss is −Σ A_b·L_b / Σ L_b (every completion has COMPLETION_TOKENS tokens)
    assert r["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    assert r["clip_frac_low"] == 0.0 and r["clip_frac_high"] == 0.0
    adv = torch.cat([group_advantages(torch.tensor([g["rewards"]]), "drgrpo")[0] for g in reported])
    assert r["pg_loss"] == pytest.approx(float(-adv.mean()), abs=1e-6)
    assert r["groups_used"] == 2 and r["sequences"] == 2 * G and r["completion_tokens"] == 2 * G * COMPLETION_TOKENS
    # the step names the groups it trained (what benchmarks/calibrate.py reads): problem, version, p̂
    assert sorted(x[2] for x in r["trained_groups"]) == sorted(sum(g["rewards"]) / G for g in reported)
    assert {x[1] for x in r["trained_groups"]} == {g["version"] for g in reported}
    changed = [k for k, v in learner.model.state_dict().items() if not torch.equal(v, before[k])]
    assert changed, "the optimizer step changed no weight"

    # checkpoint step-1 is complete and published as version 1; the groups are acknowledged
    path = tmp_path / "ckpt" / "step-1"
    assert checkpoints.latest_complete(tmp_path / "ckpt") == path
    assert ckpt.load_trainer_state(path)["step"] == 1
    stats = client.stats()
    published = tmp_path / "ckpt" / "published" / "v-1"  # the weights only, apart from the checkpoint
    assert (stats.policy_version, stats.weights_uri) == (1, str(published.resolve()))
    assert checkpoints.verify_weights(published)["tensors"] > 0 and not (published / "trainer_state.pt").exists()
    assert stats.groups_acked == 2 and stats.pending_groups == 0
    line = json.loads((tmp_path / "learner.jsonl").read_text().splitlines()[-1])
    assert line["step"] == 1 and line["policy_version"] == 1 and line["published"] is True

    # a worker's transformers backend loads the published version: identical logits
    backend = TransformersBackend(tiny_dir)
    ids = torch.tensor([reported[0]["prompt"]])
    assert not torch.equal(backend.model(ids).logits, learner.model(ids).logits)
    backend.load_weights(stats.weights_uri, stats.policy_version)
    assert backend.policy_version == 1
    with torch.no_grad():
        torch.testing.assert_close(backend.model(ids).logits, learner.model(ids).logits, rtol=0, atol=0)


def test_the_learner_computes_log_probs_at_each_groups_temperature_and_never_mixes_two(server, client, tiny_dir, tmp_path):
    """Groups carry their sampling temperature: behaviour log-probs at T = 0.7 give ratio 1 on the
    first step only if the learner divides by 0.7 too; groups of T = 1.5 pulled with them wait for
    a step of their own."""
    from prioreplay.learner.learner import Learner

    feed(client, tiny_dir, 2, temperature=0.7)
    feed(client, tiny_dir, 2, seed=1, temperature=1.5)
    learner = Learner(make_config(server, tiny_dir, tmp_path, batch_groups=4, checkpoint_every=2))
    learner.resume()
    first = learner.step().record
    assert (first["groups_used"], first["groups_deferred"]) == (2, 2)
    assert first["approx_kl"] == pytest.approx(0.0, abs=1e-6) and first["clip_frac_high"] == 0.0
    second = learner.step().record  # the deferred groups, alone, at their own temperature
    assert (second["groups_used"], second["groups_deferred"], second["groups_pulled"]) == (2, 0, 2)
    assert client.stats().groups_acked == 4  # all four trained, then acknowledged after step 2's checkpoint
    learner.client.close()


def test_stale_groups_are_dropped_counted_and_acked(server, client, tiny_dir, tmp_path):
    from prioreplay.learner.learner import Learner

    client.publish(3, str(tiny_dir))  # the server is at version 3 before this learner starts ...
    feed(client, tiny_dir, 3, versions=[0, 2, 3])  # staleness 3 (> max_staleness 2), 1 and 0
    cfg = make_config(server, tiny_dir, tmp_path, batch_groups=3)
    first = Learner(cfg)  # ... and the learner's checkpoint holds the weights of version 3
    first.step_count = first.version = 3
    first.checkpoint()
    first.client.close()
    learner = Learner(cfg)
    learner.resume()
    assert learner.current_version == 3  # never below the server's version
    result = learner.step()
    r = result.record
    assert (r["groups_stale"], r["groups_used"]) == (1, 2)
    assert r["staleness_max"] == 1 and r["sequences"] == 2 * G
    assert learner.metrics.groups.labels("stale")._value.get() == 1
    assert learner.metrics.groups.labels("used")._value.get() == 2
    assert r["groups_total"] == {"used": 2, "stale": 1, "zero_variance": 0, "invalid": 0, "skipped": 0}  # run so far
    stats = client.stats()
    assert stats.groups_acked == 3 and stats.pending_groups == 0  # the stale one too: never re-delivered
    assert stats.policy_version == 4  # the next version after the server's, not step 1


def test_publishing_less_often_than_max_staleness_still_trains_on_the_newest_version(server, client, tiny_dir, tmp_path):
    """--publish-every 8 --max-staleness 4: counted from the learner's unpublished steps, the groups of
    version 8 (the newest workers can load) were stale from step 14 on and no step could complete."""
    from prioreplay.learner.learner import Learner

    learner = Learner(
        make_config(
            server,
            tiny_dir,
            tmp_path,
            publish_every=8,
            max_staleness=4,
            batch_groups=1,
            checkpoint_every=100,
            batch_timeout_s=0.5,
        )
    )
    learner.resume()
    used = []
    for k in range(16):
        feed(client, tiny_dir, 1, versions=[learner.version], seed=20 + k)  # a worker at the newest version
        used.append(learner.step().record.get("groups_used", 0))
    assert used == [1] * 16 and learner.version == learner.step_count == 16
    assert learner.metrics.groups.labels("stale")._value.get() == 0
    learner.client.close()


def test_a_non_finite_gradient_skips_the_step_and_publishes_nothing(server, client, tiny_dir, tmp_path):
    """One inf gradient (a bf16 overflow) was applied and published: workers then loaded NaN weights."""
    from prioreplay.learner.learner import Learner

    learner = Learner(make_config(server, tiny_dir, tmp_path))
    learner.resume()
    before = _params(learner.model)
    overflow = next(learner.model.parameters()).register_hook(lambda g: g * float("inf"))
    feed(client, tiny_dir, 2, seed=30)
    result = learner.step()
    assert not result.trained and result.record["skipped"] == "non-finite"
    assert learner.step_count == 0 and all(torch.equal(before[k], v) for k, v in _params(learner.model).items())
    assert learner.metrics.skipped_steps._value.get() == 1
    assert (learner.metrics.totals["used"], learner.metrics.totals["skipped"]) == (0, 2)  # pulled, never applied
    assert learner.metrics.groups.labels("used")._value.get() == 0
    s = client.stats()
    assert (s.policy_version, s.groups_acked, s.pending_groups) == (0, 2, 0)  # nothing published; acked unused
    assert not (tmp_path / "ckpt" / "published").exists()
    overflow.remove()
    feed(client, tiny_dir, 2, seed=31)
    assert learner.step().trained and learner.step_count == 1  # the next finite step trains as usual
    assert all(torch.isfinite(v).all() for v in _params(learner.model).values())
    learner.client.close()


@pytest.mark.parametrize("lora", [False, True])
def test_the_kl_reference_is_the_initial_model_after_a_resume(server, client, tiny_dir, tmp_path, lora):
    """3 steps, stop, resume: with LoRA the checkpoint was merged into the base before wrapping, so
    disable_adapter() anchored the KL to the resumed weights, not the initial policy."""
    from prioreplay.learner import policy
    from prioreplay.learner.batch import token_logprobs
    from prioreplay.learner.learner import Learner
    from prioreplay.models import load_causal_lm

    cfg = make_config(server, tiny_dir, tmp_path, lora=lora, lora_rank=4, kl_coef=0.1, lr=5e-2)
    first = Learner(cfg)
    first.resume()
    for k in range(3):
        feed(client, tiny_dir, 2, seed=40 + k)
        assert first.step().trained
    first.client.close()  # stopped after its step-3 checkpoint

    second = Learner(cfg)
    assert second.resume() is not None and second.step_count == 3
    ids = torch.tensor([[1, 5, 9, 13, 17, 21, 25]])  # (1, 7)
    base = load_causal_lm(tiny_dir)
    with torch.no_grad(), policy.reference(second.model, second.ref_model) as ref:
        ref_lp, _ = token_logprobs(ref, ids, torch.ones_like(ids), 1.0)  # (1, 6)
        now_lp, _ = token_logprobs(second.model, ids, torch.ones_like(ids), 1.0)  # (1, 6)
        base_lp, _ = token_logprobs(base, ids, torch.ones_like(ids), 1.0)  # (1, 6)
    assert torch.allclose(ref_lp, base_lp, atol=1e-6)
    assert not torch.allclose(now_lp, base_lp, atol=1e-4)  # the resumed policy did move away from it
    second.client.close()


def test_run_stops_at_max_steps_and_writes_json_lines(server, client, tiny_dir, tmp_path):
    from prioreplay.learner.main import run

    feed(client, tiny_dir, 4, seed=3)
    cfg = make_config(server, tiny_dir, tmp_path, max_steps=2, publish_every=5, checkpoint_every=5, keep_checkpoints=1)
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        assert run(cfg) == 0
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    *lines, end = [json.loads(x) for x in (tmp_path / "learner.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    assert end["end"] and end["groups_total"]["used"] == 4 and end["step_count"] == 2  # the run's last line
    assert all(x["wait_s"] >= 0 and x["compute_s"] > 0 and x["tokens_per_s"] > 0 for x in lines)
    # publish_every / checkpoint_every = 5 were not reached: the final step is still checkpointed and
    # published, and only then are the 4 groups acknowledged
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["published", "step-2"]
    assert [p.name for p in (tmp_path / "ckpt" / "published").iterdir()] == ["v-2"]
    assert [x["groups_unacked"] for x in lines] == [2, 4]
    s = client.stats()
    assert (s.policy_version, s.groups_acked, s.pending_groups) == (2, 4, 0)


def test_run_with_report_to_tensorboard_writes_each_step_beside_the_checkpoints(server, client, tiny_dir, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from prioreplay.learner.main import run

    feed(client, tiny_dir, 4, seed=3)
    cfg = make_config(server, tiny_dir, tmp_path, max_steps=2, report_to=["tensorboard"])
    handlers = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    try:
        assert run(cfg) == 0
    finally:
        signal.signal(signal.SIGTERM, handlers[0])
        signal.signal(signal.SIGINT, handlers[1])
    lines = [x for x in map(json.loads, (tmp_path / "learner.jsonl").read_text().splitlines()) if "step" in x]
    acc = EventAccumulator(str(tmp_path / "ckpt" / "reports" / "tensorboard"))  # the default --report-dir
    acc.Reload()
    for key in ("loss", "grad_norm", "clip_frac_high", "kl", "tokens_per_s", "staleness_mean"):
        assert [(e.step, e.value) for e in acc.Scalars(f"learner/{key}")] == [
            (x["step"], pytest.approx(x[key], rel=1e-6)) for x in lines
        ], key


def test_an_unavailable_server_makes_the_learner_back_off_and_go_on_not_exit(server, client, tiny_dir, tmp_path):
    """A store outage (UNAVAILABLE after the client's retries) or INTERNAL at resume, pull or ack:
    the learner logs, backs off and retries; it trains its steps and exits 0 only at max_steps. It is
    not ready (/ready) until the resume went through, and ready when it pulls."""
    from prioreplay.errors import Internal, StoreUnavailable
    from prioreplay.learner.learner import Learner

    class Flaky:
        """The real client, but each named RPC fails the first time it is called."""

        def __init__(self, inner, failing):
            self.inner, self.failing = inner, dict(failing)

        def __getattr__(self, name):
            fn = getattr(self.inner, name)
            err = self.failing.pop(name, None)
            if err is None:
                return fn

            def fail(*a, **kw):
                ready_at_failure[name] = learner.metrics.readiness.state()[0]
                raise err(f"{name}: Redis at redis://127.0.0.1:1/0 is out of memory")

            return fail

    feed(client, tiny_dir, 4, seed=5)
    cfg = make_config(server, tiny_dir, tmp_path, max_steps=2, publish_every=1, max_retry_sleep_s=0.1)
    learner = Learner(cfg)
    ready_at_failure: dict[str, bool] = {}
    flaky = Flaky(learner.client, {"stats": StoreUnavailable, "pull": StoreUnavailable, "ack": Internal})
    learner.client = learner.feed.source = flaky  # the feed pulls and acks, the learner reads stats and publishes
    assert learner.run() == 0
    assert learner.step_count >= 2 and client.stats().policy_version >= 2
    assert learner.metrics.server_unavailable._value.get() == 3
    assert ready_at_failure == {"stats": False, "pull": True, "ack": True}  # stats: the resume's
    learner.client.inner.close()


def test_metrics_answer_while_the_model_loads(monkeypatch, tiny_dir, tmp_path):
    """`prioreplay learner` serves /metrics before loading the model (liveness probes and
    Prometheus scrape it during a slow CPU load), /ready answers 503 meanwhile (compose healthchecks
    and readiness probes: not ready), and the port is freed when the load fails."""
    import urllib.error
    import urllib.request

    from prioreplay.errors import InvalidArgument
    from prioreplay.learner import learner as learner_module
    from prioreplay.learner.main import run
    from tests.conftest import free_port

    port = free_port()
    seen = {}

    class Loading:
        def __init__(self, config, metrics=None, **kw):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                seen["body"] = resp.read().decode()
            with pytest.raises(urllib.error.HTTPError) as not_ready:  # alive, not ready: /ready is 503
                urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5)
            seen["ready"] = (not_ready.value.code, not_ready.value.read().decode())
            raise InvalidArgument("the model cannot be loaded")

    monkeypatch.setattr(learner_module, "Learner", Loading)
    cfg = LearnerConfig(
        server="127.0.0.1:1", model=str(tiny_dir), checkpoint_dir=tmp_path / "ckpt", metrics_port=port, device="cpu"
    )
    with pytest.raises(InvalidArgument, match="cannot be loaded"):
        run(cfg)
    assert "prioreplay_learner_step" in seen["body"]
    assert seen["ready"] == (503, "not ready: waiting for the model to load and the resume from the newest checkpoint\n")
    import socket

    with socket.socket() as s:  # released: the port can be bound again (as an HTTP server binds it:
        # SO_REUSEADDR, which a connection left in TIME_WAIT does not block but a listener still does)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("0.0.0.0", port))


# --- top-p (issue 13) -------------------------------------------------------------------------------


def test_learner_logprobs_match_behaviour_logprobs_under_top_p(tiny_dir):
    """Workers at top-p 0.9 report log-probs renormalised over the nucleus; the learner's
    teacher-forced log-probs at the same top-p equal them (ratio 1 at step 0), while plain
    log_softmax(logits / T) does not (issue 13: mean |ratio − 1| was 0.098)."""
    from prioreplay.learner.batch import collate, token_logprobs
    from prioreplay.models import apply_chat_template
    from prioreplay.rollout_worker.backends.base import SamplingParams
    from prioreplay.rollout_worker.backends.transformers_backend import TransformersBackend

    backend = TransformersBackend(tiny_dir)
    prompts = [apply_chat_template(backend.tokenizer, p) for p in ("What is 2+3?", "Hi", "Count to 4")]
    groups_out = backend.generate(prompts, 4, SamplingParams(temperature=0.8, top_p=0.9, max_new_tokens=16, seed=3))
    groups = [
        pb.TrajectoryGroup(
            prompt_token_ids=p, completions=[pb.Completion(reward=1.0, token_ids=c.token_ids, logprobs=c.logprobs) for c in g]
        )
        for p, g in zip(prompts, groups_out, strict=True)
    ]
    batch = collate(groups, [torch.zeros(4)] * 3, backend.tokenizer.pad_token_id)  # sampling not sent: T = 1, top-p = 1
    mask = batch.completion_mask
    with torch.no_grad():
        nucleus, entropy = token_logprobs(backend.model, batch.input_ids, batch.attention_mask, 0.8, top_p=0.9, with_entropy=True)
        plain, _ = token_logprobs(backend.model, batch.input_ids, batch.attention_mask, 0.8)
    ratio_nucleus = (nucleus - batch.behaviour_logprobs).exp()[mask]
    ratio_plain = (plain - batch.behaviour_logprobs).exp()[mask]
    assert (ratio_nucleus - 1).abs().mean().item() < 1e-4
    assert (ratio_plain - 1).abs().mean().item() > 1e-2
    assert torch.isfinite(entropy[mask]).all()
    assert torch.isfinite(nucleus[mask]).all()


# --- truncated completions (issue 13) -----------------------------------------------------------------


def _truncation_group():
    """The issue's case: a completion cut at max_new_tokens whose last number happens to be right
    (reward 1, truncated) next to a finished wrong one."""
    comps = [
        pb.Completion(reward=1.0, token_ids=[7, 8, 9], logprobs=[-1.0] * 3, truncated=True),
        pb.Completion(reward=0.0, token_ids=[7, 8], logprobs=[-1.0] * 2),
        pb.Completion(reward=0.0, token_ids=[9], logprobs=[-1.0]),
    ]
    return pb.TrajectoryGroup(group_id="g", problem_id="p", prompt_token_ids=[4, 5, 6], completions=comps)


def _learner(tiny_dir, tmp_path, **kw):
    from prioreplay.learner.learner import Learner

    return Learner(
        LearnerConfig(
            server="127.0.0.1:1", model=str(tiny_dir), checkpoint_dir=tmp_path / "ckpt", metrics_port=0, device="cpu", **kw
        )
    )


def _truncated_total(learner) -> float:
    return learner.metrics.registry.get_sample_value("prioreplay_learner_truncated_completions_total") or 0.0


def test_truncated_completions_are_masked_from_the_loss_by_default(tiny_dir, tmp_path):
    from prioreplay.learner.learner import collate

    learner = _learner(tiny_dir, tmp_path)
    assert learner.config.truncated == "mask"
    fates = learner._filter([_truncation_group()])
    assert fates.counts["used"] == 1 and _truncated_total(learner) == 1
    batch = collate(fates.used, [torch.tensor([1.0, -0.5, -0.5])], learner._pad_id, mask_truncated=True)
    assert batch.completion_mask[0].sum() == 0  # the truncated completion gives no gradient
    assert batch.completion_mask[1].sum() == 2 and batch.completion_mask[2].sum() == 1
    learner.client.close()


def test_truncated_completions_can_be_kept(tiny_dir, tmp_path):
    # scoring them zero is the workers' rule (--truncated-reward): tests/unit/worker/test_worker_loop.py
    learner = _learner(tiny_dir, tmp_path, truncated="keep")
    fates = learner._filter([_truncation_group()])
    assert fates.counts["used"] == 1 and fates.used[0].completions[0].reward == 1.0
    assert _truncated_total(learner) == 1
    learner.client.close()
    with pytest.raises(ValueError):
        LearnerConfig(server="127.0.0.1:1", model=str(tiny_dir), truncated="drop")


def test_the_run_ends_its_log_with_every_pulled_groups_fate(server, client, tiny_dir, tmp_path):
    """The log's last line charges every group this learner pulled: trained (used), dropped by fate,
    or still in its backlog; a run report adds the server's undelivered and pending groups."""
    from prioreplay.learner.learner import Learner

    feed(client, tiny_dir, 5, seed=50)  # 2 + 2 trained (max_steps 2), 1 prefetched or queued, never trained
    learner = Learner(make_config(server, tiny_dir, tmp_path, max_steps=2, prefetch=False))
    assert learner.run() == 0
    lines = [json.loads(x) for x in (tmp_path / "learner.jsonl").read_text().splitlines()]
    end = lines[-1]
    assert end["end"] is True and "step" not in end  # readers of step lines skip it
    assert end["groups_total"] == {"used": 4, "stale": 0, "zero_variance": 0, "invalid": 0, "skipped": 0}
    assert (end["step_count"], end["backlog"]) == (2, 0)
    assert [x["groups_total"]["used"] for x in lines[:-1]] == [2, 4]
    s = client.stats()
    assert (s.groups_acked, s.queue_depth + s.pending_groups) == (4, 1)  # the fifth: left untrained
    learner.client.close()


def test_a_step_of_zero_variance_groups_alone_still_steps_the_optimizer(server, tiny_dir, tmp_path):
    """Plain GRPO trains zero-variance groups (advantages 0): the learner leaves their sequences out
    of the forward/backward (no gradient without a KL term), and a batch of nothing else is a zero
    gradient, not a missing one, so AdamW still applies its momentum, as it would with them."""
    from prioreplay.learner.batch import Batch
    from prioreplay.learner.learner import Learner

    learner = Learner(make_config(server, tiny_dir, tmp_path, train_zero_variance=True))

    def batch(adv: list[float]) -> Batch:
        g = torch.Generator().manual_seed(len(adv))
        ids = torch.randint(5, 20, (len(adv), 12), generator=g)  # (B, T)
        mask = torch.zeros(len(adv), 11, dtype=torch.bool)  # (B, T-1)
        mask[:, 6:] = True
        a = torch.tensor(adv)  # (B,)
        return Batch(ids, torch.ones_like(ids), mask, -0.5 * mask.float(), a, (a > 0).float())

    assert learner._train(batch([0.5, -0.5, 0.5, -0.5]))[1]
    before = _params(learner.model)
    metrics, applied = learner._train(batch([0.0, 0.0, 0.0, 0.0]))
    assert applied and metrics["grad_norm"] == 0.0 and learner.step_count == 2
    assert metrics["loss"] == 0.0  # the step's record keeps its keys (its log line reads them)
    after = _params(learner.model)
    assert any(not torch.equal(before[k], after[k]) for k in before)  # the first step's momentum moved them
