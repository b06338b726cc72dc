#!/usr/bin/env python3
"""Writes a random Qwen3-MoE GGUF for the MoE benchmark (benchmarks/moe/run.sh).

Two layers of Qwen3-30B-A3B's shape (hidden 2048, 32/4 heads of 128, 128
experts of width 768, 8 routed to, scores renormalized), random bf16 weights
from transformers, the tiny fixture tokenizer (tests/fixtures/tiny_qwen3_moe),
converted to Q8_0 by llama.cpp's own convert_hf_to_gguf.py. A decode step
reads what one token of the real model reads in two of its 48 layers.

Needs torch, transformers and the llama.cpp tree (as
tests/fixtures/make_family_reference.py):
    LLAMA_CPP=.../vendor/llama.cpp python3 benchmarks/moe/make_model.py OUT_DIR
"""
import os
import shutil
import sys

import torch
from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

HERE = os.path.dirname(os.path.abspath(__file__))
FIXTURE = os.path.join(HERE, "..", "..", "tests", "fixtures", "tiny_qwen3_moe")
sys.path.insert(0, os.path.join(HERE, "..", "..", "tests", "fixtures"))
from make_family_reference import convert_to_gguf  # noqa: E402


def main():
    out = sys.argv[1]
    hf_dir = os.path.join(out, "qwen3-moe-2l-hf")
    gguf = os.path.join(out, "qwen3-moe-2l.q8_0.gguf")
    if os.path.exists(gguf):
        print(gguf)
        return
    os.makedirs(hf_dir, exist_ok=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        shutil.copy(os.path.join(FIXTURE, name), hf_dir)
    config = Qwen3MoeConfig(vocab_size=320, hidden_size=2048, intermediate_size=6144,
                            moe_intermediate_size=768, num_experts=128, num_experts_per_tok=8,
                            norm_topk_prob=True, num_hidden_layers=2, num_attention_heads=32,
                            num_key_value_heads=4, head_dim=128, max_position_embeddings=4096,
                            rms_norm_eps=1e-6, tie_word_embeddings=False, bos_token_id=None,
                            eos_token_id=2,
                            rope_parameters={"rope_type": "default", "rope_theta": 1000000.0})
    torch.manual_seed(0)
    model = Qwen3MoeForCausalLM(config).to(torch.bfloat16).eval()
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
