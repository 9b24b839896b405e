"""Generation with vLLM (GPU), the ``gpu`` extra: ``pip install 'prioreplay[gpu]'``.

Written against vLLM's documented offline API: ``LLM(model=dir, logprobs_mode="processed_logprobs",
worker_extension_cls=...)``, ``SamplingParams(n=G, temperature, top_p, max_tokens, stop, seed,
logprobs=0)`` (``logprobs=0`` returns the sampled token's log-prob; ``processed_logprobs`` makes it
the log-prob after temperature and top-p, i.e. the behaviour distribution), and
``llm.generate([TokensPrompt(prompt_token_ids=...)])``.

Weights are reloaded in place, without restarting the engine, through a worker extension (the
pattern of vLLM's RLHF examples): ``llm.collective_rpc("prioreplay_reload_weights", args=(dir,))``
runs :meth:`WeightReloadExtension.prioreplay_reload_weights` in every engine worker, which streams
the safetensors tensors into ``model_runner.model.load_weights``. vLLM is imported only here, and
only when a :class:`VLLMBackend` is built.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any

from prioreplay import models
from prioreplay.errors import InvalidArgument

from .base import (
    GeneratedCompletion,
    LoadedPolicy,
    PartialWeightsLoad,
    SamplingParams,
    model_eos_token_ids,
    validate_prompts,
    verified_weights_dir,
)

log = logging.getLogger(__name__)

EXTENSION_CLS = "prioreplay.rollout_worker.backends.vllm_backend.WeightReloadExtension"


def _import_vllm():
    try:
        import vllm
        from vllm.inputs import TokensPrompt
    except ImportError as e:
        raise InvalidArgument(
            f"the vllm backend needs vLLM, which is not installed ({e}); install it with "
            "pip install 'prioreplay[gpu]', or use --backend transformers"
        ) from None
    return vllm, TokensPrompt


def checkpoint_signature(directory: Path) -> dict[str, tuple[list[int], str]]:
    """{tensor name: (shape, dtype)} of a safetensors checkpoint, read from the file headers only.

    Raises:
        InvalidArgument: no weights file, or a file that is not safetensors.
    """
    from safetensors import SafetensorError, safe_open

    directory = Path(directory)
    single = directory / models.WEIGHTS_FILE
    index = directory / models.WEIGHTS_INDEX_FILE
    if single.is_file():
        files = [single]
    elif index.is_file():
        files = [directory / f for f in sorted(set(json.loads(index.read_text())["weight_map"].values()))]
    else:
        raise InvalidArgument(f"no {models.WEIGHTS_FILE} in {str(directory)!r}; publish a directory written by save_weights")
    sig: dict[str, tuple[list[int], str]] = {}
    for f in files:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for name in fh.keys():
                    sl = fh.get_slice(name)
                    sig[name] = (list(sl.get_shape()), str(sl.get_dtype()))
        except (SafetensorError, OSError) as e:
            raise InvalidArgument(f"weights file {str(f)!r} is not a readable safetensors file: {e}") from e
    return sig


#: The output head's tensor, which a model with tied embeddings shares with ``model.embed_tokens.weight``.
TIED_HEAD = "lm_head.weight"


def ties_embeddings(model_dir: Path) -> bool:
    """Whether the model's ``config.json`` ties its output head to its input embeddings
    (``tie_word_embeddings``, also under ``text_config``); False when it says nothing."""
    try:
        config = json.loads((Path(model_dir) / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    if not isinstance(config, dict):
        return False
    text = config.get("text_config")
    text = text if isinstance(text, dict) else {}
    return bool(config.get("tie_word_embeddings", text.get("tie_word_embeddings", False)))


def engine_view(signature: dict[str, tuple[list[int], str]], tied: bool) -> dict[str, tuple[list[int], str]]:
    """The tensors of a checkpoint the engine loads: with tied embeddings, the output head
    (``lm_head.weight``) is dropped, whether the checkpoint stores it or not.

    A tied model's head *is* its embedding matrix; vLLM skips a stored ``lm_head.weight`` then.
    Hugging Face's ``save_pretrained`` and :func:`prioreplay.models.save_weights` store the shared
    tensor once, other writers store both names, so two checkpoints of one model may differ by that
    one name. Comparing them as the engine sees them accepts either form (vllm PR #51665 is the same
    fix upstream); without it every reload after a first checkpoint of the other form was refused.
    """
    if not tied:
        return dict(signature)
    return {name: v for name, v in signature.items() if not name.endswith(TIED_HEAD)}


def vllm_stop_token_ids(eos_ids: tuple[int, ...]) -> list[int]:
    """``vllm.SamplingParams.stop_token_ids`` for the model's EOS ids (see
    :func:`~prioreplay.rollout_worker.backends.base.eos_token_ids`): all of them, so vLLM stops
    on the same set as the transformers backend whatever its own generation-config handling."""
    return [int(t) for t in eos_ids]


def check_applied(path: Path, counts: Any, expected: int) -> None:
    """Every engine worker applied exactly ``expected`` tensors (the model's count).

    Raises:
        InvalidArgument: no worker applied any tensor (nothing changed: the directory vanished).
        PartialWeightsLoad: some workers or tensors were applied, not all.
    """
    counts = [int(c) for c in (counts if isinstance(counts, (list, tuple)) else [counts])]
    if counts and all(c == expected for c in counts):
        return
    if not any(counts):
        raise InvalidArgument(
            f"{path}: 0 of the model's {expected} tensors were loaded (the directory vanished "
            "or was pruned while loading); keeping the loaded weights"
        )
    raise PartialWeightsLoad(
        f"{path}: the engine workers applied {counts} tensors, the model has {expected}: "
        "the weights are mixed; restart the worker"
    )


class WeightReloadExtension:
    """Mixed into vLLM's GPU worker (``worker_extension_cls``); ``self`` is the engine worker."""

    def prioreplay_reload_weights(self, directory: str, skip: tuple[str, ...] = ()) -> int:
        """Stream the safetensors tensors of ``directory`` into the worker's model, leaving out the
        names in ``skip`` (a tied model's ``lm_head.weight``); returns how many tensors were applied
        (0 when the directory vanished: the caller compares the count)."""
        import torch
        from safetensors import safe_open

        d = Path(directory)
        files = [d / models.WEIGHTS_FILE] if (d / models.WEIGHTS_FILE).is_file() else sorted(d.glob("*.safetensors"))

        def tensors():
            for f in files:
                with safe_open(str(f), framework="pt", device="cpu") as fh:
                    for name in fh.keys():
                        if name not in skip:
                            yield name, fh.get_tensor(name)

        count = 0

        def counted():
            nonlocal count
            for item in tensors():
                count += 1
                yield item

        runner = self.model_runner  # type: ignore[attr-defined]
        _quiet_expected_reload_warnings(tied=bool(tied_heads(runner.model)))
        with torch.no_grad():
            if hasattr(runner, "reload_weights"):  # vLLM's in-place reload: restores the checkpoint-format
                # parameters, loads, then processes them again (the CPU build repacks linear weights after
                # loading, so a bare model.load_weights meets emptied parameters there)
                runner.reload_weights(weights_iterator=counted(), is_checkpoint_format=True)
            else:
                runner.model.load_weights(weights=counted())
            reprocess_tied_heads(runner.model)
        return count


def tied_heads(model: Any) -> list[Any]:
    """The output heads (vLLM's ``ParallelLMHead``) of ``model`` that share their weight with an
    input embedding (``tie_word_embeddings``); none where vLLM is not installed (no model then has one)."""
    try:
        from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, VocabParallelEmbedding
    except ImportError:
        return []

    modules = list(model.modules())
    embeddings = [m for m in modules if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)]
    return [
        head
        for head in modules
        if isinstance(head, ParallelLMHead)
        and any(head.weight is e.weight or head.weight.data_ptr() == e.weight.data_ptr() for e in embeddings)
    ]


def reprocess_tied_heads(model: Any) -> int:
    """Process each tied output head again after a reload; returns how many.

    A tied head loads nothing of its own (vLLM skips ``lm_head.*`` when the embeddings are tied),
    so the in-place reload leaves it unprocessed and logs "ParallelLMHead: Failed to load weights".
    Its weight is the embedding's, updated; but vLLM's CPU build computes the logits with a copy
    packed for its GEMM kernels when the model loaded (``dispatch_cpu_unquantized_gemm``), which
    then stays the first version's: the logits came from the old head while everything else was
    new (a reload that changed the embeddings gave log-prob gaps of 9 nats against an engine
    started on the new weights). Processing the head again packs its current weight (on GPUs
    processing it is a no-op)."""
    heads = tied_heads(model)
    for head in heads:
        head.quant_method.process_weights_after_loading(head)
    return len(heads)


class _ExpectedReloadWarnings(logging.Filter):
    """Drops the two warnings every in-place reload of a tied Llama logs and that say nothing to act
    on: "RotaryEmbedding: Failed to load weights" (its cos/sin cache is computed, never loaded) and
    "ParallelLMHead: Failed to load weights" of a tied head (:func:`reprocess_tied_heads` handles it).
    Any other layer that loads nothing is still logged, and an untied head too."""

    def __init__(self, tied: bool):
        super().__init__()
        self.expected = ("RotaryEmbedding", "ParallelLMHead") if tied else ("RotaryEmbedding",)

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not (message.endswith(": Failed to load weights") and message.partition(":")[0] in self.expected)


def _quiet_expected_reload_warnings(tied: bool) -> None:
    """Install :class:`_ExpectedReloadWarnings` on vLLM's reload logger (in the engine's worker
    process, once)."""
    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, _ExpectedReloadWarnings) for f in reload_log.filters):
        reload_log.addFilter(_ExpectedReloadWarnings(tied))


#: How often, and how many seconds apart, :func:`reset_prefix_cache` asks the engine before giving up.
PREFIX_RESET_ATTEMPTS, PREFIX_RESET_WAIT_S = 20, 0.25


def reset_prefix_cache(llm: Any, path: Path, attempts: int = PREFIX_RESET_ATTEMPTS, wait_s: float = PREFIX_RESET_WAIT_S) -> int:
    """Empty the engine's prefix cache after a weight reload; returns the attempts it took.

    Cached KV blocks were computed with the old weights, and the engine reuses a block for any
    prompt that starts with the same tokens (a block is 128 tokens on the CPU build, 16 on GPUs): a
    prompt longer than a block would be continued from the old policy's keys and values, and its
    behaviour log-probs would be neither policy's. ``llm.reset_prefix_cache()`` answers False, and
    resets nothing, while requests still hold blocks (vLLM's ``Scheduler.reset_prefix_cache``); the
    offline engine finishes every request inside ``generate``, so that is a request still draining.
    It is asked again every ``wait_s`` seconds, ``attempts`` times at most.

    Raises:
        PartialWeightsLoad: the cache was still not reset after ``attempts`` tries: the new weights
            are loaded but old KV would be served, so the worker must not generate (it stops and
            its supervisor restarts it, as for a partly applied version).
    """
    for attempt in range(1, attempts + 1):
        if llm.reset_prefix_cache() is not False:  # None from an engine that returns nothing: done
            return attempt
        if attempt < attempts:
            time.sleep(wait_s)
    raise PartialWeightsLoad(
        f"{path}: the weights were loaded but the engine refused to reset its prefix cache "
        f"{attempts} times over {(attempts - 1) * wait_s:.1f} s (requests still running hold cached blocks): "
        "generating now would reuse KV computed with the old weights; restart the worker"
    )


#: The KV cache the CPU build gets when none is given: 512 MiB, about 11,600 tokens of SmolLM2-135M in
#: float32 (46 KB a token), so one request of its whole 8,192-token context fits (vLLM refuses to start
#: otherwise; 256 MiB did only in bfloat16).
CPU_KV_CACHE_BYTES = 512 * 2**20


def _cpu_defaults(kv_cache_memory_bytes: int | None, engine_kwargs: dict[str, Any]) -> dict[str, Any]:
    """``engine_kwargs`` plus ``kv_cache_memory_bytes`` (given, or :data:`CPU_KV_CACHE_BYTES` on vLLM's
    CPU build) and, on the CPU build, ``enforce_eager`` unless given (no torch.compile warm-up: start-up
    about 35 s instead of 130 s for SmolLM2-135M on 2 cores)."""
    from vllm.platforms import current_platform

    kwargs = dict(engine_kwargs)
    cpu = current_platform.is_cpu()
    if kv_cache_memory_bytes is None and cpu:
        kv_cache_memory_bytes = CPU_KV_CACHE_BYTES
    if kv_cache_memory_bytes is not None:
        kwargs["kv_cache_memory_bytes"] = int(kv_cache_memory_bytes)
    if cpu:
        kwargs.setdefault("enforce_eager", True)
    return kwargs


class VLLMBackend(LoadedPolicy):
    """A :class:`~prioreplay.rollout_worker.backends.base.GenerationBackend` on vLLM.

    Args:
        model_dir: a model directory (see :func:`prioreplay.models.resolve_model`).
        policy_version: version of the weights in ``model_dir``.
        gpu_memory_utilization: share of GPU memory vLLM may take (0, 1].
        max_model_len: prompt + completion tokens at most (None: the model's limit).
        dtype: "auto", "bfloat16", "float16" or "float32".
        kv_cache_memory_bytes: KV cache size, bytes (None: vLLM sizes it from
            ``gpu_memory_utilization``). On vLLM's CPU build the default is
            :data:`CPU_KV_CACHE_BYTES`: there ``gpu_memory_utilization`` is the share of *host* memory
            reserved, which fails when other processes hold memory; an explicit size also skips the
            compile warm-up.
        engine_kwargs: more ``vllm.LLM`` keyword arguments.

    Raises:
        InvalidArgument: vllm is not installed (``pip install 'prioreplay[gpu]'``).
    """

    def __init__(
        self,
        model_dir: Path,
        policy_version: int = 0,
        gpu_memory_utilization: float = 0.85,
        max_model_len: int | None = None,
        dtype: str = "auto",
        kv_cache_memory_bytes: int | None = None,
        **engine_kwargs: Any,
    ):
        vllm, self._TokensPrompt = _import_vllm()
        self._vllm = vllm
        self.model_dir = Path(model_dir)
        self._tokenizer = models.load_tokenizer(self.model_dir)
        #: tied input/output embeddings: ``lm_head.weight`` is left out of every comparison and reload
        self.tied_embeddings = ties_embeddings(self.model_dir)
        self._signature = engine_view(checkpoint_signature(self.model_dir), self.tied_embeddings)
        #: Ids that end a completion: the tokenizer's EOS and the generation config's end-of-turn ids.
        self.eos_token_ids = model_eos_token_ids(self.model_dir, self._tokenizer)
        self.llm = vllm.LLM(
            model=str(self.model_dir),
            tokenizer=str(self.model_dir),
            dtype=dtype,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=max_model_len,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION_CLS,
            **_cpu_defaults(kv_cache_memory_bytes, engine_kwargs),
        )
        self._policy_version = int(policy_version)
        self.vocab_size = len(self._tokenizer)
        try:  # the engine's limit: --max-model-len, or the model's own
            self._max_context_tokens = int(self.llm.llm_engine.model_config.max_model_len)
        except AttributeError:
            self._max_context_tokens = max_model_len

    def load_weights(self, uri: str, version: int) -> float:
        """Reload the engine's weights from ``uri`` in place; returns seconds taken.

        The directory is verified first (manifest, sizes, hashes:
        :func:`~prioreplay.rollout_worker.backends.base.verified_weights_dir`), and the
        checkpoint's tensor names and shapes are compared with the initial checkpoint's (file
        headers only) before anything is sent to the engine, so a partial or mismatched checkpoint
        is refused whole. Every engine worker then reports how many tensors it applied; anything
        but the model's count is refused (a directory pruned while loading).

        Raises:
            InvalidArgument: negative version; missing (pruned), partial or mismatched checkpoint;
                a NaN or infinite tensor; no engine worker applied a tensor (the weights stay as they were).
            PartialWeightsLoad: some but not all tensors were applied (the weights are mixed), or
                the prefix cache could not be reset (:func:`reset_prefix_cache`).
        """
        if not isinstance(version, int) or version < 0:
            raise InvalidArgument(f"policy version ({version}) must be an integer >= 0")
        t0 = time.perf_counter()
        path, expected = verified_weights_dir(uri)
        stored = checkpoint_signature(path)
        if expected is not None and expected != len(stored):
            raise InvalidArgument(f"{path}: the manifest lists {expected} tensors, the weights file holds {len(stored)}")
        sig = engine_view(stored, self.tied_embeddings)
        missing = sorted(set(self._signature) - set(sig))
        extra = sorted(set(sig) - set(self._signature))
        if missing or extra:
            raise InvalidArgument(f"{path}: checkpoint does not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
        for name, (shape, _dtype) in sig.items():
            if shape != self._signature[name][0]:
                raise InvalidArgument(f"{path}: tensor {name!r} has shape {shape}, the model expects {self._signature[name][0]}")
        models.check_finite_weights(path)  # the engine applies tensors as it reads them: check them all first
        skip = tuple(sorted(set(stored) - set(sig)))  # a tied model's stored head: the engine's view leaves it out
        counts = self.llm.collective_rpc("prioreplay_reload_weights", args=(str(path.resolve()), skip))
        check_applied(path, counts, len(self._signature))
        reset_prefix_cache(self.llm, path)  # cached KV blocks were computed with the old weights
        self._policy_version = version
        return time.perf_counter() - t0

    def generate(self, prompt_token_ids: list[list[int]], n: int, params: SamplingParams) -> list[list[GeneratedCompletion]]:
        """Sample ``n`` completions per prompt with one ``llm.generate`` call (see the protocol).

        Raises:
            InvalidArgument: see :func:`~prioreplay.rollout_worker.backends.base.validate_prompts`.
        """
        validate_prompts(prompt_token_ids, n, self.vocab_size)
        limit = self._max_context_tokens
        for i, p in enumerate(prompt_token_ids):
            if limit is not None and len(p) >= limit:
                raise InvalidArgument(
                    f"prompt #{i} has {len(p)} tokens; the engine takes {limit} tokens at most (max_model_len), "
                    "prompt and completion together: shorten the prompt or raise max_model_len"
                )
        sp = [
            self._vllm.SamplingParams(
                n=n,
                temperature=params.temperature,
                top_p=params.top_p,
                max_tokens=params.max_new_tokens,
                stop=list(params.stop) or None,
                seed=seed,
                logprobs=0,
                include_stop_str_in_output=True,
                stop_token_ids=vllm_stop_token_ids(self.eos_token_ids),
            )
            for seed in params.seeds_for(len(prompt_token_ids))
        ]  # one per prompt: its own seed
        prompts = [self._TokensPrompt(prompt_token_ids=list(p)) for p in prompt_token_ids]
        outputs = self.llm.generate(prompts, sp, use_tqdm=False)
        groups = []
        for out in outputs:
            group = []
            for c in out.outputs:
                ids = list(c.token_ids)
                lps = [
                    float(step[tok].logprob) for tok, step in zip(ids, c.logprobs or [], strict=False)
                ]  # strict=False: no logprobs asked for: an empty list
                group.append(GeneratedCompletion(token_ids=ids, logprobs=lps, text=c.text, truncated=c.finish_reason == "length"))
            groups.append(group)
        return groups
