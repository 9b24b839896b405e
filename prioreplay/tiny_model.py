"""Test helpers: a tiny random Llama with a character-level tokenizer, built without any download.

``make_tiny_model(dir, seed)`` writes a complete model directory (``config.json``,
``model.safetensors``, tokenizer files with a chat template) that :func:`prioreplay.models.
resolve_model`, :func:`~prioreplay.models.load_tokenizer` and
:func:`~prioreplay.models.load_causal_lm` accept, in well under two seconds on a CPU.
"""

from __future__ import annotations

import string
from pathlib import Path

from prioreplay.errors import InvalidArgument

#: Characters the tiny tokenizer knows, one token each (others map to ``<unk>``).
DEFAULT_VOCAB = string.digits + string.ascii_letters + string.punctuation + " \n"

#: Special tokens, in id order: unk 0, pad 1, bos 2, eos 3 (``<|im_end|>``), then ``<|im_start|>``.
SPECIAL_TOKENS = ("<unk>", "<pad>", "<s>", "<|im_end|>", "<|im_start|>")

#: ChatML-style template, like SmolLM2's (without its default system turn).
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def make_tiny_tokenizer(vocab: str = DEFAULT_VOCAB):
    """A character-level ``PreTrainedTokenizerFast``: one token per character of ``vocab``.

    Special tokens ``<unk> <pad> <s> <|im_end|> <|im_start|>`` have ids 0–4; ``<|im_end|>`` is
    EOS (as in SmolLM2). Decoding concatenates characters. Carries :data:`CHAT_TEMPLATE`.

    Raises:
        InvalidArgument: ``vocab`` is empty or has repeated characters.
    """
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    if not vocab or len(set(vocab)) != len(vocab):
        raise InvalidArgument(f"vocab ({vocab!r}) must be a non-empty string of distinct characters")
    ids = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in vocab:
        ids[ch] = len(ids)
    tok = Tokenizer(models.WordLevel(vocab=ids, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        unk_token="<unk>",
        pad_token="<pad>",
        bos_token="<s>",
        eos_token="<|im_end|>",
        additional_special_tokens=["<|im_start|>"],
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )


def make_tiny_model(
    directory: str | Path,
    seed: int = 0,
    vocab: str = DEFAULT_VOCAB,
    hidden_size: int = 64,
    num_layers: int = 2,
    init_std: float = 0.2,
) -> Path:
    """Write a tiny random ``LlamaForCausalLM`` and its char-level tokenizer to ``directory``.

    Deterministic for a given ``seed`` (the global torch RNG is left untouched). Input and output
    embeddings are tied, as in SmolLM2, so weight I/O exercises tied tensors.

    Args:
        directory: created if missing; files in it are overwritten.
        seed: seeds the weight initialisation.
        vocab: characters of the tokenizer (see :func:`make_tiny_tokenizer`).
        hidden_size: model width (divisible by 4 attention heads).
        num_layers: decoder layers.
        init_std: std of the normal weight init; larger than the usual 0.02 so the random model
            has peaked, seed-dependent next-token distributions (EOS and stop strings do occur).

    Returns:
        The directory.

    Raises:
        InvalidArgument: hidden_size not a positive multiple of 4, or num_layers < 1.
    """
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    from prioreplay.models import save_weights

    if hidden_size < 4 or hidden_size % 4:
        raise InvalidArgument(f"hidden_size ({hidden_size}) must be a positive multiple of 4 (4 attention heads)")
    if num_layers < 1:
        raise InvalidArgument(f"num_layers ({num_layers}) must be >= 1")
    tokenizer = make_tiny_tokenizer(vocab)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        initializer_range=init_std,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config).eval()
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id
    )
    return save_weights(model, tokenizer, Path(directory))
