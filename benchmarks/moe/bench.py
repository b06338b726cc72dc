#!/usr/bin/env python3
"""Tandem against llama.cpp on one GGUF (benchmarks/moe/run.sh).

Both engines run the same Q8_0 file (benchmarks/moe/make_model.py), timed in
turn for each round as benchmarks/peers/peers.py times them: decode (a
16-token prompt, then N greedy tokens: tokens/s after the first) and prefill
(a P-token prompt: tokens/s of the forward that yields the first token).
Medians are printed with Tandem's ratio, and the greedy tokens compared.

  bench.py --gguf FILE --tandem build/bin/tandem [--threads 2] [--rounds 3]
"""
import argparse
import os
import random
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "peers"))
from peers import LlamaCpp, Tandem, cpu_description  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=64)
    ap.add_argument("--prefill-tokens", type=int, default=256)
    args = ap.parse_args()
    rng = random.Random(1)
    ids = [rng.randrange(3, 300) for _ in range(args.prefill_tokens)]
    short = ids[:16]
    engines = {"tandem": Tandem(args.tandem, args.gguf, args.threads),
               "llama.cpp": LlamaCpp(args.gguf, args.threads)}
    decode, prefill, tokens = {}, {}, {}
    for r in range(args.rounds):
        for name, e in engines.items():
            rate, out = e.decode(short, args.decode_tokens)
            decode.setdefault(name, []).append(rate)
            tokens[name] = out
            prefill.setdefault(name, []).append(e.prefill(ids))
            print(f"round {r + 1} {name:10s} decode {rate:7.1f} tok/s  prefill "
                  f"{prefill[name][-1]:7.1f} tok/s", file=sys.stderr, flush=True)
    decode = {k: statistics.median(v) for k, v in decode.items()}
    prefill = {k: statistics.median(v) for k, v in prefill.items()}
    print(f"{os.path.basename(args.gguf)}, {args.threads} threads, {cpu_description()}; medians "
          f"of {args.rounds} interleaved rounds; decode: 16-token prompt + {args.decode_tokens} "
          f"tokens; prefill: {args.prefill_tokens} tokens")
    print(f"{'engine':10s} {'decode tok/s':>13s} {'prefill tok/s':>14s}")
    for name in engines:
        print(f"{name:10s} {decode[name]:13.1f} {prefill[name]:14.1f}")
    print(f"tandem / llama.cpp: decode {decode['tandem'] / decode['llama.cpp']:.2f}x, prefill "
          f"{prefill['tandem'] / prefill['llama.cpp']:.2f}x")
    same = sum(1 for a, b in zip(tokens["tandem"], tokens["llama.cpp"]) if a == b)
    print(f"greedy tokens equal: {same}/{len(tokens['llama.cpp'])}")


if __name__ == "__main__":
    main()
