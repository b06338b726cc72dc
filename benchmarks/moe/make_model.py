#!/usr/bin/env python3
"""Writes a random GGUF of a real model's layer shape for benchmarks/moe/run.sh.

SHAPE (default qwen3-moe-2l):
  qwen3-moe-2l: two layers of Qwen3-30B-A3B's shape (hidden 2048, 32/4 heads
    of 128, 128 experts of width 768, 8 routed to, scores renormalized); a
    decode step reads what one token of the real model reads in two of its
    48 layers.
  llama-1b-4l: four layers of Llama-3.2-1B's shape (hidden 2048, 32/8 heads
    of 64, MLP width 8192), dense: four of its 16 layers.
Random bf16 weights from transformers, the tiny fixture tokenizer (vocabulary
320: the output layer is negligible), converted to Q8_0 by llama.cpp's own
convert_hf_to_gguf.py into OUT_DIR/SHAPE.q8_0.gguf.

Needs torch, transformers and the llama.cpp tree (as
tests/fixtures/make_family_reference.py):
    LLAMA_CPP=.../vendor/llama.cpp python3 benchmarks/moe/make_model.py OUT_DIR [SHAPE]
"""
import os
import shutil
import sys

import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "tests", "fixtures", "tiny_qwen3_moe")
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
from make_family_reference import convert_to_gguf  # noqa: E402


def model_for(shape):
    rope = {"rope_type": "default", "rope_theta": 1000000.0}
    if shape == "qwen3-moe-2l":
        return Qwen3MoeForCausalLM(Qwen3MoeConfig(
            vocab_size=320, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
            num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, num_hidden_layers=2,
            num_attention_heads=32, num_key_value_heads=4, head_dim=128,
            max_position_embeddings=4096, rms_norm_eps=1e-6, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=2, rope_parameters=rope))
    if shape == "llama-1b-4l":
        return LlamaForCausalLM(LlamaConfig(
            vocab_size=320, hidden_size=2048, intermediate_size=8192, num_hidden_layers=4,
            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
            max_position_embeddings=4096, rms_norm_eps=1e-5, tie_word_embeddings=False,
            bos_token_id=None, eos_token_id=2, rope_parameters=rope))
    sys.exit(f"make_model.py: unknown shape {shape!r}")


def main():
    out = sys.argv[1]
    shape = sys.argv[2] if len(sys.argv) > 2 else "qwen3-moe-2l"
    hf_dir = os.path.join(out, shape + "-hf")
    gguf = os.path.join(out, shape + ".q8_0.gguf")
    if os.path.exists(gguf):
        print(gguf)
        return
    os.makedirs(hf_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(FIXTURE, name), hf_dir)
    torch.manual_seed(0)
    model = model_for(shape).to(torch.bfloat16).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() >= 2:
                p.normal_(0.0, 0.02)
            else:
                p.uniform_(0.5, 1.5)
    model.save_pretrained(hf_dir, safe_serialization=True)
    del model
    convert_to_gguf(hf_dir, "q8_0", gguf + ".tmp")
    os.rename(gguf + ".tmp", gguf)
    shutil.rmtree(hf_dir)
    print(gguf)


if __name__ == "__main__":
    main()
