"""The generation backend interface: prompts in, groups of G sampled completions out.

A backend samples ``n`` completions per prompt and returns, for every completion, the sampled
token ids and their *behaviour* log-probabilities: the log-probability of each sampled token under
the distribution it was actually drawn from (logits / temperature, then top-p), which is what the
learner's importance ratio needs. Backends: ``transformers`` (CPU/GPU, this package) and ``vllm``
(GPU, optional extra ``prioreplay[gpu]``). :func:`prioreplay.rollout_worker.backends.create_backend`
builds one by name.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from prioreplay.errors import InvalidArgument


@dataclass(frozen=True)
class SamplingParams:
    """How completions are sampled.

    Attributes:
        temperature: logits are divided by it before softmax (> 0; 1 = the model's distribution).
        top_p: nucleus sampling mass in (0, 1]; 1 disables it.
        max_new_tokens: completion length limit, tokens (>= 1).
        stop: strings that end a completion (the completing token is kept; text after the stop
            string is dropped). Every EOS id of the model (the tokenizer's and those of its
            generation config, see :func:`eos_token_ids`) always ends a completion.
        seed: seeds the sampler; the same seed, prompts, params and weights reproduce the same
            completions. None: not reseeded.
        prompt_seeds: one seed per prompt of the ``generate`` call (the worker's per-problem seeds,
            :mod:`prioreplay.rollout_worker.seeds`); when given, they replace ``seed``: vLLM seeds
            prompt i's request with ``prompt_seeds[i]`` (child j: + j), the transformers backend
            seeds each decoded chunk with a hash of its prompts' seeds. Empty: ``seed`` applies.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 256
    stop: tuple[str, ...] = field(default_factory=tuple)
    seed: int | None = None
    prompt_seeds: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.temperature) and self.temperature > 0):
            raise InvalidArgument(f"temperature ({self.temperature}) must be a finite number > 0 (1.0 samples the model as is)")
        if not (0.0 < self.top_p <= 1.0):
            raise InvalidArgument(f"top_p ({self.top_p}) must be in (0, 1]; 1.0 disables nucleus sampling")
        if not (isinstance(self.max_new_tokens, int) and self.max_new_tokens >= 1):
            raise InvalidArgument(f"max_new_tokens ({self.max_new_tokens}) must be an integer >= 1")
        stop = tuple(self.stop)
        if any(not isinstance(s, str) or not s for s in stop):
            raise InvalidArgument(f"stop ({stop!r}) must be a list of non-empty strings")
        object.__setattr__(self, "stop", stop)
        if self.seed is not None and not (isinstance(self.seed, int) and 0 <= self.seed < 2**63):
            raise InvalidArgument(f"seed ({self.seed}) must be an integer in [0, 2**63) or None")
        seeds = tuple(self.prompt_seeds)
        bad = [s for s in seeds if not (isinstance(s, int) and 0 <= s < 2**63)]
        if bad:
            raise InvalidArgument(f"prompt_seeds ({bad[0]!r}, ...) must be integers in [0, 2**63), one per prompt")
        object.__setattr__(self, "prompt_seeds", seeds)

    def seeds_for(self, prompts: int) -> list[int | None]:
        """The seed of each of ``prompts`` prompts: ``prompt_seeds`` if given, else ``seed`` for all.

        Raises:
            InvalidArgument: ``prompt_seeds`` is given but does not hold one seed per prompt.
        """
        if not self.prompt_seeds:
            return [self.seed] * prompts
        if len(self.prompt_seeds) != prompts:
            raise InvalidArgument(
                f"prompt_seeds holds {len(self.prompt_seeds)} seeds for {prompts} prompts; "
                f"give one per prompt (or none, and seed)"
            )
        return list(self.prompt_seeds)


@dataclass(frozen=True)
class GeneratedCompletion:
    """One sampled completion.

    Attributes:
        token_ids: the generated token ids (L,), ending with EOS or with the token that completed a
            stop string when generation stopped there.
        logprobs: behaviour log-probability of each token in ``token_ids`` (L,), nats, <= 0.
        text: decoded completion without special tokens, cut after the first stop string.
        truncated: True when generation hit ``max_new_tokens`` before EOS or a stop string.
    """

    token_ids: list[int]
    logprobs: list[float]
    text: str
    truncated: bool

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise InvalidArgument(
                f"completion has {len(self.token_ids)} token ids but {len(self.logprobs)} log-probs; they must match"
            )


@runtime_checkable
class GenerationBackend(Protocol):
    """What the worker needs from an inference engine."""

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of the loaded model (from :func:`prioreplay.models.load_tokenizer`)."""

    @property
    def policy_version(self) -> int:
        """The policy version whose weights are loaded (0: the initial model)."""

    @property
    def max_context_tokens(self) -> int | None:
        """Prompt + completion tokens the model takes at most (None: unknown). The worker reports a
        problem whose prompt leaves no room for one generated token as unservable."""

    def generate(self, prompt_token_ids: list[list[int]], n: int, params: SamplingParams) -> list[list[GeneratedCompletion]]:
        """Sample ``n`` completions for each prompt.

        Args:
            prompt_token_ids: P prompts, each a non-empty list of token ids (after the chat template).
            n: completions per prompt (the group size G, >= 1).
            params: sampling parameters.

        Returns:
            P groups, in prompt order, each a list of ``n`` completions.

        Raises:
            InvalidArgument: empty prompt list or prompt, token id outside the vocabulary, n < 1.
        """

    def load_weights(self, uri: str, version: int) -> float:
        """Replace the weights in place with the safetensors checkpoint at ``uri``.

        All or nothing: a missing or mismatched checkpoint raises InvalidArgument and leaves the
        loaded weights and ``policy_version`` unchanged.

        Returns:
            Seconds taken.
        """


class LoadedPolicy:
    """State every backend keeps: the tokenizer and the version of the loaded weights.

    Backends set ``_tokenizer`` and ``_policy_version`` and get the two read-only properties of
    :class:`GenerationBackend`.
    """

    _tokenizer: Any
    _policy_version: int
    _max_context_tokens: int | None = None

    @property
    def tokenizer(self) -> Any:
        """The tokenizer of the loaded model (pad token set; the files the engine loaded)."""
        return self._tokenizer

    @property
    def policy_version(self) -> int:
        """The policy version whose weights are loaded (0: the initial model)."""
        return self._policy_version

    @property
    def max_context_tokens(self) -> int | None:
        """Prompt + completion tokens the model takes at most (None: unknown)."""
        return self._max_context_tokens


def context_limit(model_config: Any) -> int | None:
    """The context length (tokens) a Hugging Face model config declares: ``max_position_embeddings``,
    ``n_positions`` or ``seq_length`` (the first set); None when it declares none."""
    for name in ("max_position_embeddings", "n_positions", "seq_length"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def validate_prompts(prompt_token_ids: list[list[int]], n: int, vocab_size: int) -> None:
    """Check a generate() request.

    Raises:
        InvalidArgument: no prompts, an empty prompt, an id outside [0, vocab_size), or n < 1.
    """
    if not (isinstance(n, int) and n >= 1):
        raise InvalidArgument(f"n ({n}) must be an integer >= 1 (the group size G)")
    if not prompt_token_ids:
        raise InvalidArgument("prompt_token_ids is empty; pass at least one prompt")
    for i, ids in enumerate(prompt_token_ids):
        if len(ids) == 0:
            raise InvalidArgument(f"prompt #{i} has no tokens; apply the chat template to a non-empty prompt")
        lo, hi = min(ids), max(ids)
        if lo < 0 or hi >= vocab_size:
            bad = lo if lo < 0 else hi
            raise InvalidArgument(f"prompt #{i} has token id {bad} outside the vocabulary [0, {vocab_size})")


class PartialWeightsLoad(InvalidArgument):
    """Some but not all tensors of a version reached the engine: the loaded weights are a mix.

    The worker does not keep generating with them: it stops (exit code != 0) so that its
    supervisor restarts it from the base model and the current version.
    """


def verified_weights_dir(uri: str) -> tuple[Path, int | None]:
    """The directory of ``uri`` after checking it is complete (manifest written last, every file
    with its size and sha256; :func:`prioreplay.checkpoint_reader.verify_weights`).

    Returns:
        (directory, tensor count from the manifest, or None for a plain model directory).

    Raises:
        InvalidArgument: a bad URI; the directory vanished (pruned) or is partial or altered. The
            caller loads nothing then.
    """
    from prioreplay.checkpoint_reader import CheckpointError, verify_weights

    path = weights_path(uri)
    try:
        manifest = verify_weights(path)
    except CheckpointError as e:
        raise InvalidArgument(str(e)) from None
    tensors = manifest.get("tensors") if manifest else None
    return path, tensors if isinstance(tensors, int) else None


def weights_path(uri: str) -> Path:
    """The local directory of a weights URI (a path or ``file://`` URL).

    Raises:
        InvalidArgument: empty URI or an unsupported scheme.
    """
    if not uri:
        raise InvalidArgument("weights uri is empty; give the directory holding model.safetensors")
    if uri.startswith("file://"):
        uri = uri[len("file://") :]
    elif "://" in uri:
        raise InvalidArgument(
            f"weights uri {uri!r}: a backend loads local paths and file:// only; the worker fetches "
            "a remote URI into its weights cache first (prioreplay.weights_transport.WeightsFetcher)"
        )
    return Path(uri)


def eos_token_ids(tokenizer_eos: int | None, generation_config: Mapping[str, Any]) -> tuple[int, ...]:
    """Every id that ends a completion: the tokenizer's EOS and each ``eos_token_id`` of the
    model's generation config (an int or a list; chat models list their end-of-turn token there,
    e.g. gemma's ``<end_of_turn>`` or Phi's ``<|end|>``). Order kept, duplicates dropped.

    Example: ``eos_token_ids(1, {"eos_token_id": [1, 106]})`` → ``(1, 106)``.
    """
    listed = generation_config.get("eos_token_id")
    listed = [listed] if isinstance(listed, int) else list(listed or [])
    ids: list[int] = []
    for t in ([tokenizer_eos] if tokenizer_eos is not None else []) + listed:
        if isinstance(t, int) and t >= 0 and t not in ids:
            ids.append(t)
    return tuple(ids)


def model_eos_token_ids(model_dir: Path, tokenizer: Any) -> tuple[int, ...]:
    """:func:`eos_token_ids` of a model directory: its ``generation_config.json`` (else the
    ``eos_token_id`` of ``config.json``) and the tokenizer's EOS. Both backends stop on these."""
    for name in ("generation_config.json", "config.json"):
        path = Path(model_dir) / name
        if path.is_file():
            try:
                config = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            if isinstance(config, dict) and config.get("eos_token_id") is not None:
                return eos_token_ids(tokenizer.eos_token_id, config)
    return eos_token_ids(tokenizer.eos_token_id, {})
