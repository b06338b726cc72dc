#!/usr/bin/env python3
"""The PyTorch peer of `tandem bench step` on the same GPU, and the GPU's limits.

Builds the same Llama-shaped model in Hugging Face transformers (random bf16
weights of the synthetic preset's shapes: timing does not depend on the
values), then times, as `tandem bench step` does (inputs in, forward, the
sampled rows' logits out, synchronized):
  - decode: one token per request at a cached context, batch 1/8/32, through
    generate() with a StaticCache and torch.compile(mode="reduce-overhead")
    (CUDA graphs), and eagerly; per token, by the difference of two lengths;
  - prefill: one prompt of N tokens, torch.compile (inductor, no graphs:
    shapes this large are not launch-bound), SDPA attention.
And the limits, measured in the same process: the read bandwidth (a sum over a
buffer much larger than L2), a device-to-device copy (bytes read + written),
and a large bf16 GEMM.

    python3 benchmarks/gpu/torch_peer.py --model=llama-3.2-1b --batch-sizes=1,8,32 \
        --prefill-tokens=512,2048 --context=256 --iters=50 --json=out.json
"""
import argparse
import json
import statistics
import sys
import time

import torch

PRESETS = {
    # The shapes of common/model/llama_model.cc's SyntheticConfig.
    "smollm2-135m": dict(vocab_size=49152, hidden_size=576, intermediate_size=1536,
                         num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3,
                         head_dim=64, rope_theta=100000.0, tie_word_embeddings=True),
    "llama-3.2-1b": dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192,
                         num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                         head_dim=64, rope_theta=500000.0, tie_word_embeddings=True),
}


def median_ms(fn, iters, warmup=3):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def limits(iters):
    """Read and copy bandwidth (GB/s) and the bf16 GEMM rate (TFLOP/s)."""
    n = 1 << 30  # 2 GiB of bf16 per buffer: far past the 50 MB L2
    a = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = torch.empty_like(a)
    read_ms = median_ms(lambda: a.sum(dtype=torch.float32), iters)
    copy_ms = median_ms(lambda: b.copy_(a), iters)
    del a, b
    m = 8192
    x = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    z = torch.empty(m, m, device="cuda", dtype=torch.bfloat16)
    gemm_ms = median_ms(lambda: torch.matmul(x, y, out=z), iters)
    return {
        "read_gbps": 2 * n / read_ms / 1e6,
        "copy_gbps": 2 * 2 * n / copy_ms / 1e6,
        "gemm_tflops": 2 * m ** 3 / gemm_ms / 1e9,
    }


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="llama-3.2-1b", choices=sorted(PRESETS))
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("--prefill-tokens", default="512,2048")
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--iters", type=int, default=50)
    p.add_argument("--limits", action="store_true", help="also measure the GPU's limits")
    p.add_argument("--json", default="")
    args = p.parse_args()

    import transformers
    from transformers import CompileConfig, LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(**PRESETS[args.model], max_position_embeddings=8192,
                         rms_norm_eps=1e-5, attention_bias=False, mlp_bias=False)
    config._attn_implementation = "sdpa"
    with torch.device("cuda"):
        model = LlamaForCausalLM(config).to(torch.bfloat16).eval()
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    gpu = torch.cuda.get_device_name()
    print(f"peer: torch {torch.__version__}, transformers {transformers.__version__}, {gpu}, "
          f"{args.model} bf16, {weight_bytes / 1e9:.3f} GB of weights", flush=True)
    result = {"gpu": gpu, "torch": torch.__version__, "transformers": transformers.__version__,
              "model": args.model, "weight_bytes": weight_bytes, "rows": []}
    if args.limits:
        lim = limits(max(args.iters // 2, 10))
        result["limits"] = lim
        print(f"limits: read {lim['read_gbps']:.0f} GB/s, copy {lim['copy_gbps']:.0f} GB/s "
              f"(read + written), bf16 GEMM 8192^3 {lim['gemm_tflops']:.0f} TFLOP/s; "
              f"reading the weights once: {weight_bytes / lim['read_gbps'] / 1e6:.3f} ms",
              flush=True)

    vocab = config.vocab_size
    with torch.inference_mode():
        for batch in [int(b) for b in args.batch_sizes.split(",") if b]:
            # transformers' own decode path: generate() with a StaticCache, whose
            # forward it compiles with mode="reduce-overhead" (CUDA graphs). The
            # time per token is the difference of two generation lengths over
            # the extra tokens, so the prompt's prefill cancels out.
            ids = torch.randint(0, vocab, (batch, args.context), device="cuda")

            def generate(new_tokens, compiled):
                kwargs = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                              do_sample=False, cache_implementation="static", pad_token_id=0)
                if compiled:
                    kwargs["compile_config"] = CompileConfig(fullgraph=True, dynamic=False,
                                                             mode="reduce-overhead")
                else:
                    kwargs["disable_compile"] = True
                start = time.perf_counter()
                model.generate(ids, attention_mask=torch.ones_like(ids), **kwargs)
                torch.cuda.synchronize()
                return time.perf_counter() - start

            short, long = 8, 8 + args.iters
            per_token = {}
            for compiled in (False, True):
                t0 = time.perf_counter()
                generate(long, compiled)  # warm-up (and compilation)
                warm_s = time.perf_counter() - t0
                a = statistics.median(generate(short, compiled) for _ in range(3))
                b = statistics.median(generate(long, compiled) for _ in range(3))
                per_token[compiled] = (b - a) / (long - short) * 1e3
                if compiled:
                    compile_s = warm_s
            row = {"step": "decode", "tokens": batch, "batch": batch,
                   "compiled_ms": per_token[True], "eager_ms": per_token[False],
                   "compile_s": compile_s}
            result["rows"].append(row)
            print(f"decode  batch {batch:3d}: compiled (reduce-overhead) {per_token[True]:8.3f} ms, "
                  f"eager {per_token[False]:8.3f} ms per token (first compiled call {compile_s:.0f} s)",
                  flush=True)
            torch._dynamo.reset()
        for n in [int(t) for t in args.prefill_tokens.split(",") if t]:
            ids = torch.randint(0, vocab, (1, n), device="cuda")

            def prefill(fn):
                fn(input_ids=ids, use_cache=False, logits_to_keep=1).logits.float().cpu()

            eager_ms = median_ms(lambda: prefill(model), max(args.iters // 2, 10))
            compiled = torch.compile(model, fullgraph=True, dynamic=False)
            prefill(compiled)
            compiled_ms = median_ms(lambda: prefill(compiled), max(args.iters // 2, 10))
            row = {"step": "prefill", "tokens": n, "batch": 1, "compiled_ms": compiled_ms,
                   "eager_ms": eager_ms}
            result["rows"].append(row)
            print(f"prefill {n:5d} tokens: compiled {compiled_ms:8.3f} ms, eager {eager_ms:8.3f} ms",
                  flush=True)
            del compiled
            torch._dynamo.reset()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
