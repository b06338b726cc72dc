#!/usr/bin/env python3
"""Writes the GGUF seed corpus of fuzz/gguf_fuzzer (committed; rerun to change it).

Needs: pip install gguf numpy
"""
import os

import numpy as np
from gguf import GGMLQuantizationType, GGUFWriter

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "corpus", "gguf")


def shape(w):
    """One layer, hidden 32, 2 heads over 1 KV head: every seed's."""
    w.add_block_count(1)
    w.add_context_length(64)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)


def llama(path, tokenizer):
    w = GGUFWriter(path, "llama")
    shape(w)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    tokens = ["<unk>", "<s>", "</s>"] + [chr(c) for c in range(97, 123)] + ["ab", "abc", " a"]
    if tokenizer == "gpt2":
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_merges(["a b", "ab c"])
    else:
        w.add_tokenizer_model("llama")
        tokens += ["<0x%02X>" % b for b in range(256)]
        w.add_token_scores([0.0] * 3 + [-float(i) for i in range(len(tokens) - 3)])
    w.add_token_list(tokens)
    w.add_token_types([2, 3, 3] + [6 if t.startswith("<0x") else 1 for t in tokens[3:]])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    rng = np.random.default_rng(0)
    w.add_tensor("token_embd.weight", rng.standard_normal((len(tokens), 32), dtype=np.float32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    w.add_tensor("blk.0.attn_norm.weight", np.ones(32, dtype=np.float16))
    w.add_tensor("blk.0.attn_q.weight", rng.standard_normal((32, 32), dtype=np.float32))
    # Quantized blocks as raw bytes: Q8_0 (34 B / 32), Q4_0 (18 B), Q4_1 (20 B).
    w.add_tensor("blk.0.attn_k.weight", rng.integers(0, 255, (16, 34), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.Q8_0)
    w.add_tensor("blk.0.attn_v.weight", rng.integers(0, 255, (16, 18), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.Q4_0)
    w.add_tensor("blk.0.attn_output.weight", rng.integers(0, 255, (32, 20), dtype=np.uint8),
                 raw_dtype=GGMLQuantizationType.Q4_1)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def qwen3moe(path):
    """Experts stacked as llama.cpp writes them (Q8_0), their router, and a
    Q4_K, an IQ4_XS and an IQ4_NL tensor under dense names."""
    w = GGUFWriter(path, "qwen3moe")
    shape(w)
    w.add_key_length(16)
    w.add_value_length(16)
    w.add_expert_count(2)
    w.add_expert_used_count(1)
    w.add_expert_feed_forward_length(32)
    w.add_layer_norm_rms_eps(1e-6)
    rng = np.random.default_rng(1)
    f32 = lambda *shape: rng.standard_normal(shape, dtype=np.float32)
    raw = lambda rows, size, qtype: w.add_tensor(
        *qtype[:1], rng.integers(0, 255, (rows, size), dtype=np.uint8), raw_dtype=qtype[1])
    w.add_tensor("token_embd.weight", f32(16, 32))
    w.add_tensor("output.weight", f32(16, 32))
    w.add_tensor("output_norm.weight", np.ones(32, dtype=np.float32))
    for name in ("attn_norm", "ffn_norm"):
        w.add_tensor(f"blk.0.{name}.weight", np.ones(32, dtype=np.float32))
    for name in ("attn_q_norm", "attn_k_norm"):
        w.add_tensor(f"blk.0.{name}.weight", np.ones(16, dtype=np.float32))
    w.add_tensor("blk.0.attn_q.weight", f32(32, 32))
    w.add_tensor("blk.0.attn_k.weight", f32(16, 32))
    w.add_tensor("blk.0.attn_v.weight", f32(16, 32))
    raw(32, 18, ("blk.0.attn_output.weight", GGMLQuantizationType.IQ4_NL))
    w.add_tensor("blk.0.ffn_gate_inp.weight", f32(2, 32))
    # [experts, rows, 32 / 32 blocks of 34 bytes]
    for name, rows in (("ffn_gate_exps", 32), ("ffn_up_exps", 32), ("ffn_down_exps", 32)):
        w.add_tensor(f"blk.0.{name}.weight", rng.integers(0, 255, (2, rows, 34), dtype=np.uint8),
                     raw_dtype=GGMLQuantizationType.Q8_0)
    raw(1, 144, ("blk.0.ffn_up.weight", GGMLQuantizationType.Q4_K))
    raw(1, 136, ("blk.0.ffn_gate.weight", GGMLQuantizationType.IQ4_XS))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    os.makedirs(OUT, exist_ok=True)
    qwen3moe(os.path.join(OUT, "qwen3moe_experts.gguf"))
    llama(os.path.join(OUT, "llama_gpt2_vocab.gguf"), "gpt2")
    llama(os.path.join(OUT, "llama_spm_vocab.gguf"), "llama")
    with open(os.path.join(OUT, "llama_gpt2_vocab.gguf"), "rb") as f:
        data = f.read()
    with open(os.path.join(OUT, "truncated.gguf"), "wb") as f:
        f.write(data[: len(data) // 3])


if __name__ == "__main__":
    main()
