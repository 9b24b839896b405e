"""Held-out accuracy: greedy decoding of a fixed slice of problems, scored by their verifiers.

Used by ``prioreplay demo`` before and after training. Greedy (temperature 0) so that the same
weights always give the same score.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def evaluate(model_dir: Path, problems: Sequence, **options: Any) -> float:
    """Fraction of ``problems`` a model answers correctly with greedy decoding: the mean of
    :func:`evaluate_each`, which takes the same arguments (``weights_dir``, ``max_new_tokens``,
    ``batch_size``, ``device``, ``stop``) and raises the same errors."""
    right = evaluate_each(model_dir, problems, **options)
    return sum(right) / len(right)


def evaluate_each(
    model_dir: Path,
    problems: Sequence,
    *,
    weights_dir: Path | None = None,
    max_new_tokens: int = 32,
    batch_size: int = 16,
    device: str = "cpu",
    stop: Sequence[str] = (),
    progress: str | None = None,
) -> list[bool]:
    """Whether a model answers each of ``problems`` correctly with greedy decoding.

    Args:
        model_dir: the base model directory (config, tokenizer, weights) from ``resolve_model``.
        problems: ``ProblemRecord``s with prompt, answer and verifier name.
        weights_dir: a published checkpoint (``step-N``) whose safetensors replace the base weights.
        max_new_tokens: tokens generated per problem at most.
        batch_size: prompts per forward batch (left-padded).
        stop: strings that end an answer, as the rollout workers' ``--stop`` (the text after the
            first one is not scored).
        progress: show a progress bar (problems scored) on stderr with this label; None: none.

    Returns:
        One bool per problem, in order (paired before/after: ``intervals.paired_difference``).

    Raises:
        InvalidArgument: an empty problem list, or a tampered/partial ``weights_dir``.
    """
    from prioreplay.errors import InvalidArgument

    if not problems:
        raise InvalidArgument("evaluate() needs at least one problem")
    from tqdm import tqdm

    tokenizer, model = _load(model_dir, weights_dir, device)
    right: list[bool] = []
    with tqdm(total=len(problems), desc=progress, unit="problem", dynamic_ncols=True, disable=progress is None) as bar:
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            texts = _greedy_answers(model, tokenizer, [p.prompt for p in chunk], max_new_tokens, device, stop)
            right += [_scores(p, text) for p, text in zip(chunk, texts, strict=True)]
            bar.update(len(chunk))
            bar.set_postfix_str(f"right={sum(right)}")
    return right


def _load(model_dir: Path, weights_dir: Path | None, device: str) -> tuple[Any, Any]:
    """(tokenizer, model in eval mode) of ``model_dir``, with ``weights_dir``'s weights when given."""
    from transformers.utils import logging as hf_logging

    from prioreplay.models import load_causal_lm, load_tokenizer, load_weights

    hf_logging.disable_progress_bar()
    tokenizer = load_tokenizer(model_dir)
    model = load_causal_lm(model_dir, device=device)
    if weights_dir is not None:
        load_weights(model, weights_dir)
    model.eval()
    return tokenizer, model


def _greedy_answers(
    model: Any, tokenizer: Any, prompts: Sequence[str], max_new_tokens: int, device: str, stop: Sequence[str]
) -> list[str]:
    """The greedy completion of each prompt (chat template applied, one left-padded batch), cut
    after the first of ``stop`` it holds."""
    import torch

    from prioreplay.models import apply_chat_template

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    ids = [apply_chat_template(tokenizer, prompt) for prompt in prompts]
    width = max(len(x) for x in ids)
    input_ids = torch.tensor([[pad] * (width - len(x)) + x for x in ids], device=device)  # (B, T) left-padded
    attention = torch.tensor([[0] * (width - len(x)) + [1] * len(x) for x in ids], device=device)  # (B, T)
    with torch.no_grad():
        extra = {"stop_strings": list(stop), "tokenizer": tokenizer} if stop else {}  # ends the batch early
        out = model.generate(
            input_ids=input_ids,
            attention_mask=attention,
            do_sample=False,
            max_new_tokens=max_new_tokens,
            pad_token_id=pad,
            **extra,
        )  # (B, T + new)
    texts = []
    for row in out[:, width:]:
        text = tokenizer.decode(row, skip_special_tokens=True)
        cuts = [text.find(s) + len(s) for s in stop if s in text]
        texts.append(text[: min(cuts)] if cuts else text)
    return texts


def _scores(problem: Any, text: str) -> bool:
    """Whether ``text`` is a right answer to ``problem`` by its verifier (reward 1)."""
    from prioreplay.verifiers import verify

    return verify(problem.verifier, text, problem.answer).reward == 1.0
