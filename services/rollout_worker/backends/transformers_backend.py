"""Generation with Hugging Face transformers (CPU or one GPU): batched, left-padded, KV cache.

G completions per prompt are produced by repeating each prompt G times in one left-padded batch
and sampling with ``model.generate(do_sample=True)``. The prompt is run through the model once per
prompt, not once per completion: its KV cache (all prompt tokens but the last) is computed for
the distinct prompts and repeated G times before decoding (``share_prompt_cache``), which on a
CPU removes most of the work when prompts are longer than completions. Behaviour log-probs: temperature and top-p
are applied by a logits processor of ours (built from transformers' own ``TemperatureLogitsWarper``
and ``TopPLogitsWarper``) that is the last processor before sampling, so the scores it returns
are the ones sampled from; it keeps the log-softmax of one step and gathers the sampled token at
the next. This is ``log_softmax`` of the processed scores, as with ``output_scores=True``, but
holds one (N, V) tensor instead of all T of them (T × N × V floats would be gigabytes for a
49k vocabulary).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList
from transformers.generation.logits_process import TemperatureLogitsWarper, TopPLogitsWarper

from prioreplay import models
from prioreplay.errors import InvalidArgument

from ..seeds import mix_seed
from .base import (
    GeneratedCompletion,
    LoadedPolicy,
    SamplingParams,
    context_limit,
    model_eos_token_ids,
    validate_prompts,
    verified_weights_dir,
)

log = logging.getLogger(__name__)


class BehaviourLogprobs(LogitsProcessor):
    """Applies temperature and top-p, and records the log-prob of each sampled token.

    Must be the last logits processor (generate() is given temperature 1, top_p 1, top_k 0 so
    it adds no warper of its own). At step t it stores log_softmax(processed scores) (N, V); at
    step t + 1 the sampled token of step t is ``input_ids[:, -1]`` and its log-prob is gathered.
    :meth:`finish` gathers the last step's tokens.
    """

    def __init__(self, temperature: float, top_p: float):
        self.warpers = LogitsProcessorList()
        if temperature != 1.0:
            self.warpers.append(TemperatureLogitsWarper(temperature))
        if top_p < 1.0:
            self.warpers.append(TopPLogitsWarper(top_p))
        self._last: torch.Tensor | None = None  # (N, V) log-probs of the latest step
        self.steps: list[torch.Tensor] = []  # each (N,)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self._last is not None:
            self.steps.append(self._last.gather(1, input_ids[:, -1:]).squeeze(1))  # (N,)
        scores = self.warpers(input_ids, scores)  # type: ignore[assignment]  # transformers annotates FloatTensor; torch returns Tensor; (N, V)
        self._last = torch.log_softmax(scores.float(), dim=-1)  # (N, V)
        return scores

    def finish(self, sequences: torch.LongTensor) -> torch.Tensor:
        """Log-probs of all generated tokens, (N, T_gen), given the final sequences (N, T)."""
        if self._last is not None:
            self.steps.append(self._last.gather(1, sequences[:, -1:]).squeeze(1))
            self._last = None
        if not self.steps:
            return torch.zeros(sequences.shape[0], 0)
        return torch.stack(self.steps, dim=1).cpu()  # (N, T_gen)


class StopOnStrings(StoppingCriteria):
    """Per-sequence stop when the generated text contains one of ``stops``.

    Decodes only the last few tokens (enough to hold the longest stop string) of each sequence at
    each step, and remembers the first step at which each sequence hit a stop: ``first_hit[i]`` is
    the number of generated tokens up to and including the completing token (0: never).
    """

    def __init__(self, tokenizer: Any, stops: tuple[str, ...], prompt_len: int, n_sequences: int):
        self.tokenizer = tokenizer
        self.stops = stops
        self.prompt_len = prompt_len
        self.window = max(len(s) for s in stops) + 4
        self.first_hit = [0] * n_sequences

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        n_gen = input_ids.shape[1] - self.prompt_len
        start = max(self.prompt_len, input_ids.shape[1] - self.window)
        texts = self.tokenizer.batch_decode(input_ids[:, start:].tolist(), skip_special_tokens=True)
        hit = [any(s in t for s in self.stops) for t in texts]
        for i, h in enumerate(hit):
            if h and not self.first_hit[i]:
                self.first_hit[i] = n_gen
        return torch.tensor(hit, dtype=torch.bool, device=input_ids.device)  # type: ignore[return-value]  # transformers annotates BoolTensor; torch returns Tensor


class TransformersBackend(LoadedPolicy):
    """A :class:`~prioreplay.rollout_worker.backends.base.GenerationBackend` on transformers.

    Args:
        model_dir: a model directory (see :func:`prioreplay.models.resolve_model`).
        device: torch device ("cpu", "cuda", "cuda:1").
        dtype: parameter dtype; default float32 (bfloat16 is reasonable on GPU).
        max_batch_sequences: most sequences (prompts × n) decoded together; larger requests run
            in chunks (memory bound: KV cache and one (N, V) log-prob tensor).
        policy_version: version of the weights in ``model_dir``.
        share_prompt_cache: compute each distinct prompt's KV cache once for its n completions.
    """

    def __init__(
        self,
        model_dir: Path,
        device: str = "cpu",
        dtype: torch.dtype | None = None,
        max_batch_sequences: int = 256,
        policy_version: int = 0,
        share_prompt_cache: bool = True,
    ):
        if max_batch_sequences < 1:
            raise InvalidArgument(f"max_batch_sequences ({max_batch_sequences}) must be >= 1")
        self.model_dir = Path(model_dir)
        self.device = torch.device(device)
        self._tokenizer = models.load_tokenizer(self.model_dir)
        self.model = models.load_causal_lm(self.model_dir, dtype=dtype or torch.float32, device=str(self.device))
        tok = self._tokenizer
        #: Ids that end a completion: the tokenizer's EOS and the generation config's end-of-turn ids.
        self.eos_token_ids = model_eos_token_ids(self.model_dir, tok)
        # A clean generation config: nothing from the checkpoint may add a logits processor
        # after ours (the behaviour log-probs must describe the distribution actually sampled).
        self.model.generation_config = GenerationConfig(
            bos_token_id=tok.bos_token_id, eos_token_id=list(self.eos_token_ids), pad_token_id=tok.pad_token_id
        )
        self.max_batch_sequences = max_batch_sequences
        self.share_prompt_cache = share_prompt_cache
        self._policy_version = int(policy_version)
        self.vocab_size = int(self.model.get_input_embeddings().weight.shape[0])
        self._max_context_tokens = context_limit(self.model.config)

    # -- weights ------------------------------------------------------------------------------
    def load_weights(self, uri: str, version: int) -> float:
        """Load ``uri``'s model.safetensors in place (validated first); returns seconds taken.

        Raises:
            InvalidArgument: negative version; missing (pruned) or partial directory, a file that
                does not match the manifest, missing key, wrong shape (the weights and version
                stay as they were).
        """
        if not isinstance(version, int) or version < 0:
            raise InvalidArgument(f"policy version ({version}) must be an integer >= 0")
        t0 = time.perf_counter()
        path, expected = verified_weights_dir(uri)
        n = models.load_weights(self.model, path)  # all or nothing: every tensor of the model, checked first
        if expected is not None and n != expected:  # pragma: no cover - load_weights refuses a mismatch first
            raise InvalidArgument(f"{path}: {n} tensors applied, the manifest lists {expected}")
        self._policy_version = version
        return time.perf_counter() - t0

    # -- generation ---------------------------------------------------------------------------
    def generate(self, prompt_token_ids: list[list[int]], n: int, params: SamplingParams) -> list[list[GeneratedCompletion]]:
        """Sample ``n`` completions per prompt; see ``GenerationBackend.generate``.

        Sequences are ordered prompt-major (prompt 0's n completions first) and decoded in chunks
        of at most ``max_batch_sequences``. With ``params.prompt_seeds``, each chunk is seeded with
        a hash of its sequences' prompt seeds (one sampler per chunk: torch's generate draws a whole
        batch from one RNG); else with ``params.seed`` set, the torch RNG is seeded once per call.
        Either way inside a forked RNG state, so the global RNG is left untouched.

        Raises:
            InvalidArgument: see :func:`~prioreplay.rollout_worker.backends.base.validate_prompts`.
        """
        validate_prompts(prompt_token_ids, n, self.vocab_size)
        seqs = [list(p) for p in prompt_token_ids for _ in range(n)]
        devices = [self.device] if self.device.type == "cuda" else []
        out: list[GeneratedCompletion] = []
        seeds = [s for s in params.seeds_for(len(prompt_token_ids)) for _ in range(n)]  # (P·n,) prompt-major
        with torch.random.fork_rng(devices=devices, enabled=params.seed is not None or bool(params.prompt_seeds)):
            if params.seed is not None and not params.prompt_seeds:
                torch.manual_seed(params.seed)
            for start in range(0, len(seqs), self.max_batch_sequences):
                end = start + self.max_batch_sequences
                if params.prompt_seeds:
                    torch.manual_seed(mix_seed("chunk", start, *seeds[start:end]))
                out.extend(self._generate_chunk(seqs[start:end], params))
        return [out[i * n : (i + 1) * n] for i in range(len(prompt_token_ids))]

    def _left_pad(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        pad = self._tokenizer.pad_token_id
        input_ids = torch.full((len(seqs), width), pad, dtype=torch.long)  # (N, T)
        attention_mask = torch.zeros((len(seqs), width), dtype=torch.long)  # (N, T)
        for i, s in enumerate(seqs):
            input_ids[i, width - len(s) :] = torch.tensor(s, dtype=torch.long)
            attention_mask[i, width - len(s) :] = 1
        return input_ids.to(self.device), attention_mask.to(self.device)

    @torch.inference_mode()
    def _generate_chunk(self, seqs: list[list[int]], params: SamplingParams) -> list[GeneratedCompletion]:
        input_ids, attention_mask = self._left_pad(seqs)  # (N, T_prompt)
        prompt_len = input_ids.shape[1]
        recorder = BehaviourLogprobs(params.temperature, params.top_p)
        stops = StopOnStrings(self._tokenizer, params.stop, prompt_len, len(seqs)) if params.stop else None
        gen_config = GenerationConfig(
            do_sample=True,
            temperature=1.0,
            top_p=1.0,
            top_k=0,
            max_new_tokens=self._room(prompt_len, params),
            eos_token_id=list(self.eos_token_ids),
            pad_token_id=self._tokenizer.pad_token_id,
            bos_token_id=self._tokenizer.bos_token_id,
            use_cache=True,
        )
        cache = self._shared_prompt_cache(seqs, input_ids, attention_mask) if self.share_prompt_cache else None
        sequences = self.model.generate(
            input_ids=input_ids,
            attention_mask=attention_mask,
            generation_config=gen_config,
            **({"cache": cache} if cache is not None else {}),  # transformers 5.24 renamed past_key_values
            logits_processor=LogitsProcessorList([recorder]),
            stopping_criteria=StoppingCriteriaList([stops]) if stops else None,
        )  # (N, T_prompt + T_gen)
        logprobs = recorder.finish(sequences)  # (N, T_gen)
        generated = sequences[:, prompt_len:].cpu()  # (N, T_gen)
        return [
            self._completion(generated[i].tolist(), logprobs[i].tolist(), stops.first_hit[i] if stops else 0, params)
            for i in range(len(seqs))
        ]

    def _room(self, prompt_len: int, params: SamplingParams) -> int:
        """``params.max_new_tokens`` capped at the model's context minus the chunk's longest prompt
        (tokens), so generation never runs past the positions the model has; a completion cut there
        is reported truncated. The worker has already refused prompts that leave no room at all."""
        limit = self._max_context_tokens
        return params.max_new_tokens if limit is None else max(1, min(params.max_new_tokens, limit - prompt_len))

    def _shared_prompt_cache(self, seqs: list[list[int]], input_ids: torch.Tensor, attention_mask: torch.Tensor):
        """The KV cache of ``input_ids[:, :-1]`` (N, T−1), computed once per distinct prompt and
        repeated, when the chunk is runs of r > 1 equal prompts (prompt-major); else None."""
        r = 1
        while r < len(seqs) and seqs[r] == seqs[0]:
            r += 1
        if r == 1 or input_ids.shape[1] < 2 or len(seqs) % r or any(seqs[i] != seqs[i - i % r] for i in range(len(seqs))):
            return None
        ids, mask = input_ids[::r, :-1], attention_mask[::r, :-1]  # (N/r, T−1)
        position_ids = (mask.cumsum(-1) - 1).clamp(min=0)  # as generate() derives them for left padding
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids, use_cache=True)
        cache = out.cache  # transformers 5.24: `past_key_values` is a deprecated alias of it
        cache.batch_repeat_interleave(r)
        return cache

    def _completion(self, tokens: list[int], logprobs: list[float], stop_hit: int, params: SamplingParams) -> GeneratedCompletion:
        """Cut one generated row at its first EOS id or stop string (whichever comes first)."""
        end = len(tokens)
        finished = False
        first_eos = next((i for i, t in enumerate(tokens) if t in self.eos_token_ids), None)
        if first_eos is not None:
            end, finished = first_eos + 1, True
        if stop_hit and stop_hit <= end:
            end, finished = stop_hit, True
        tokens, logprobs = tokens[:end], logprobs[:end]
        text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        cuts = [text.find(s) + len(s) for s in params.stop if s in text]
        if cuts:
            text = text[: min(cuts)]
        return GeneratedCompletion(token_ids=tokens, logprobs=logprobs, text=text, truncated=not finished)
