"""Tiny random-weight causal LMs with a word-level or byte-level tokenizer, saved like a
real checkpoint.

No model hub is reachable here, so tests and bench/local_batching.py build
their models: a tokenizer trained on a few sentences (with a chat template),
a GPT-2, Llama or Qwen2 config of the size asked for, and random weights,
written with save_pretrained so the real loading code reads them back.
A server (vLLM, tests/harness/vllm_server.py) gets any text, so its model takes the
byte-level tokenizer: every byte is a token (no merges, no unknown token), and
every token decodes.
In the GPT-2 models the final layer norm's bias carries a fixed per-token
logit offset: special tokens are never generated, and `eos_bias` sets how
soon replies end (Llama and Qwen2 norms have no bias; their EOS comes when
the random weights say).
"""

import os

# No model hub here: every model is built and loaded from a local directory.
os.environ["HF_HUB_OFFLINE"] = "1"

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import (
    AutoModelForCausalLM,
    GPT2Config,
    LlamaConfig,
    PretrainedConfig,
    PreTrainedTokenizerFast,
    Qwen2Config,
)

SENTENCES = [
    "the tide comes in twice a day and goes out twice a day",
    "a question about the moon and the sea and the wind",
    "what is the weather like on the coast in winter",
    "tell me a short story about a lighthouse keeper",
    "how many boats are in the harbour this morning",
    "the quick brown fox jumps over the lazy dog",
    "summarise the report about river levels in one line",
    "user assistant system : ? . , number question answer",
]
SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>"]
CHAT_TEMPLATE = (
    "{{ '<bos>' }}{% for m in messages %}{{ m['role'] }} : {{ m['content'] }} . "
    "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")
# The dimension of the hidden state that carries the per-token logit offset.
BIAS_DIM = 0


def build_tokenizer(extra_words: int = 0) -> PreTrainedTokenizerFast:
    """A word-level tokenizer over SENTENCES (plus `extra_words` made-up words)."""
    words = [f"w{i}" for i in range(extra_words)]
    tokenizer = Tokenizer(models.WordLevel(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=SPECIALS)
    tokenizer.train_from_iterator([*SENTENCES, " ".join(words)], trainer)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>",
                                      unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def build_byte_tokenizer() -> PreTrainedTokenizerFast:
    """A byte-level BPE with an empty merge list: the special tokens, then the 256 bytes."""
    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {token: index for index, token in enumerate([*SPECIALS, *alphabet])}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(SPECIALS)
    wrapped = PreTrainedTokenizerFast(tokenizer_object=tokenizer, pad_token="<pad>",
                                      unk_token="<unk>", bos_token="<bos>", eos_token="<eos>")
    wrapped.chat_template = CHAT_TEMPLATE
    return wrapped


def model_config(arch: str, vocab_size: int, hidden: int, layers: int, heads: int,
                 kv_heads: int | None, intermediate: int, context: int,
                 special_ids: dict[str, int]) -> PretrainedConfig:
    if arch == "gpt2":
        return GPT2Config(vocab_size=vocab_size, n_embd=hidden, n_layer=layers, n_head=heads,
                          n_inner=intermediate, n_positions=context, tie_word_embeddings=False,
                          **special_ids)
    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[arch]
    return config_class(vocab_size=vocab_size, hidden_size=hidden, num_hidden_layers=layers,
                        num_attention_heads=heads, num_key_value_heads=kv_heads or heads,
                        intermediate_size=intermediate, max_position_embeddings=context,
                        tie_word_embeddings=False, **special_ids)


def save_tiny_model(path: Path, *, arch: str = "gpt2", hidden: int = 32, layers: int = 2,
                    heads: int = 2, kv_heads: int | None = None,
                    intermediate: int | None = None, context: int = 256,
                    vocab_size: int | None = None, eos_bias: float = -100.0, seed: int = 0,
                    extra_words: int = 0, byte_level: bool = False) -> Path:
    """Write tokenizer + random model to `path`; returns it. eos_bias -100: never EOS.
    byte_level: the byte-level tokenizer instead of the word-level one."""
    torch.manual_seed(seed)
    tokenizer = build_byte_tokenizer() if byte_level else build_tokenizer(extra_words)
    special = {"pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
               "eos_token_id": tokenizer.eos_token_id}
    vocab = vocab_size or len(tokenizer)
    config = model_config(arch, vocab, hidden, layers, heads, kv_heads,
                          intermediate or 4 * hidden, context, special)
    model = AutoModelForCausalLM.from_config(config)
    if arch == "gpt2":
        _offset_logits(model, tokenizer, eos_bias)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(path)
    model.save_pretrained(path)
    return path


def _offset_logits(model, tokenizer: PreTrainedTokenizerFast, eos_bias: float) -> None:
    """One hidden dimension is a constant 1 after ln_f, so lm_head's column for it is a
    per-token logit offset."""
    with torch.no_grad():
        model.transformer.ln_f.weight[BIAS_DIM] = 0.0
        model.transformer.ln_f.bias[BIAS_DIM] = 1.0
        offset = model.lm_head.weight[:, BIAS_DIM]
        offset.zero_()
        offset[len(tokenizer):] = -100.0
        for name in ("pad_token_id", "bos_token_id", "unk_token_id"):
            offset[getattr(tokenizer, name)] = -100.0
        offset[tokenizer.eos_token_id] = eos_bias
