#!/usr/bin/env python3
"""Tandem against llama.cpp and transformers on the same weights, interleaved.

Every engine runs SmolLM2-135M-Instruct from one GGUF: the Q4_1 file that
scripts/fetch_model.sh downloads, turned into an f32 GGUF (and Q8_0 and BF16
ones) by llama.cpp's own quantizer, so llama.cpp, transformers (which
dequantizes the GGUF) and Tandem compute with identical float32 weights;
Tandem --weight-dtype=q8_0 and llama.cpp run the Q8_0 file, Tandem
--dtype=bf16 and llama.cpp the BF16 one, Tandem --weight-dtype=gguf and
llama.cpp the Q4_1 file itself. For each thread
count and round, each engine is timed in turn on
  decode:  a 16-token prompt, then 128 greedy tokens (tokens/s after the first);
  prefill: a 512-token prompt (tokens/s of the forward that yields the first token).
Medians over the rounds are printed with Tandem's ratio to each peer, and the
greedy tokens of the decode run are compared.

Usage (benchmarks/peers/run.sh sets up the virtualenv):
  peers.py --gguf Q4_1.gguf --tandem build/bin/tandem [--threads 1,2] [--rounds 3]
"""
import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time

TEXT = ("The history of the city begins with a small settlement on the river, where traders "
        "met to exchange grain, salt and cloth. Over the centuries the market grew into a town, "
        "the town into a city, and the city into the capital of a wide and busy region. ")


def quantize(src, path, ftype):
    """Writes `path` from the GGUF `src` with llama.cpp's quantizer (`ftype`:
    a llama_cpp.LLAMA_FTYPE_*), unless it exists."""
    import llama_cpp
    if os.path.exists(path):
        return
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True
    params.nthread = os.cpu_count() or 1
    rc = llama_cpp.llama_model_quantize(src.encode(), (path + ".tmp").encode(), params)
    if rc != 0:
        sys.exit(f"peers.py: llama.cpp could not write {path} from {src} (rc {rc})")
    os.rename(path + ".tmp", path)


def make_variants(src, cache_dir):
    """f32, Q8_0, BF16 and Q4_K_M GGUFs from `src` with llama.cpp's quantizer (cached)."""
    import llama_cpp
    out = {"q4_1": src}
    for name, ftype in (("f32", llama_cpp.LLAMA_FTYPE_ALL_F32), ("q8_0", llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0),
                        ("bf16", llama_cpp.LLAMA_FTYPE_MOSTLY_BF16),
                        ("q4_k_m", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)):
        out[name] = os.path.join(cache_dir, f"SmolLM2-135M-Instruct.{name}.gguf")
        quantize(src, out[name], ftype)
    return out


class LlamaCpp:
    def __init__(self, path, threads):
        from llama_cpp import Llama
        self.llm = Llama(model_path=path, n_threads=threads, n_threads_batch=threads, n_ctx=1024,
                         n_batch=512, n_ubatch=512, logits_all=False, verbose=False)

    def tokenize(self, text):
        return self.llm.tokenize(text.encode(), add_bos=False)

    def prefill(self, ids):
        self.llm.reset()
        t = time.perf_counter()
        self.llm.eval(ids)
        return len(ids) / (time.perf_counter() - t)

    def _argmax(self):
        # The last position's logits straight from the context (Llama.scores
        # stays zero without logits_all in this version).
        import llama_cpp
        import numpy as np
        logits = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.llm._ctx.ctx, -1),
                                       shape=(self.llm.n_vocab(),))
        return int(np.argmax(logits))

    def decode(self, ids, n):
        self.llm.reset()
        self.llm.eval(ids)
        out = [self._argmax()]
        t = time.perf_counter()
        for _ in range(n - 1):
            self.llm.eval([out[-1]])
            out.append(self._argmax())
        return (n - 1) / (time.perf_counter() - t), out


class Transformers:
    def __init__(self, path, threads):
        import torch
        from transformers import AutoModelForCausalLM
        self.torch = torch
        self.threads = threads
        self.model = AutoModelForCausalLM.from_pretrained(
            os.path.dirname(path), gguf_file=os.path.basename(path), torch_dtype=torch.float32)
        self.model.eval()

    def prefill(self, ids):
        torch = self.torch
        torch.set_num_threads(self.threads)
        with torch.no_grad():
            t = time.perf_counter()
            self.model(torch.tensor([ids]), use_cache=True)
            return len(ids) / (time.perf_counter() - t)

    def decode(self, ids, n):
        torch = self.torch
        torch.set_num_threads(self.threads)
        with torch.no_grad():
            r = self.model(torch.tensor([ids]), use_cache=True)
            past, out = r.past_key_values, [int(r.logits[0, -1].argmax())]
            t = time.perf_counter()
            for _ in range(n - 1):
                r = self.model(torch.tensor([[out[-1]]]), past_key_values=past, use_cache=True)
                past = r.past_key_values
                out.append(int(r.logits[0, -1].argmax()))
            return (n - 1) / (time.perf_counter() - t), out


class Tandem:
    SUMMARY = re.compile(r"ttft ([0-9.]+) ms \| ([0-9.]+) tokens/s")

    def __init__(self, binary, path, threads, weight_dtype="auto", dtype="auto"):
        self.cmd = [binary, "generate", "--local", f"--model={path}", f"--threads={threads}",
                    f"--weight-dtype={weight_dtype}", f"--dtype={dtype}", "--ignore-eos",
                    "--max-num-batched-tokens=1024"]

    def kernels(self):
        """The start-up log's description of the CPU kernels (the Highway target)."""
        p = subprocess.run(self.cmd + ["--prompt-token-ids=1", "--max-tokens=1"], capture_output=True, text=True)
        m = re.search(r"cpu backend: (.*)", p.stderr)
        return m.group(1) if m else "?"

    def _run(self, ids, n):
        p = subprocess.run(self.cmd + ["--prompt-token-ids=" + ",".join(map(str, ids)),
                                       f"--max-tokens={n}"], capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"peers.py: tandem failed:\n{p.stderr[-2000:]}")
        m = self.SUMMARY.search(p.stdout + p.stderr)
        if not m:
            sys.exit(f"peers.py: no summary line from tandem:\n{p.stdout[-1000:]}{p.stderr[-1000:]}")
        tokens = [int(x) for x in re.findall(r"-?\d+", p.stdout.split("steps:")[0])]
        return float(m.group(1)) / 1e3, float(m.group(2)), tokens

    def prefill(self, ids):
        ttft, _, _ = self._run(ids, 1)
        return len(ids) / ttft

    def decode(self, ids, n):
        ttft, rate, tokens = self._run(ids, n)
        total = n / rate
        return (n - 1) / (total - ttft), tokens[-n:]


def cpu_description():
    """'N CPUs: <model> (family F model M), flags ...' from /proc/cpuinfo."""
    with open("/proc/cpuinfo") as f:
        info = f.read()
    m = re.search(r"model name\s*:\s*(.*)", info)
    cpu = m.group(1) if m else platform.machine()
    fam = re.search(r"cpu family\s*:\s*(\d+)", info)
    mod = re.search(r"^model\s*:\s*(\d+)", info, re.M)
    if fam and mod:
        cpu += f" (family {fam.group(1)} model {mod.group(1)})"
    flags = " ".join(sorted(set(re.findall(r"\b(avx2|fma|f16c|avx512f|avx512_bf16|avx512_vnni|amx_tile|asimd|sve|sve2)\b", info))))
    return f"{os.cpu_count()} CPUs: {cpu}, flags {flags}"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gguf", required=True)
    ap.add_argument("--tandem", required=True)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--decode-tokens", type=int, default=128)
    ap.add_argument("--json", default="")
    ap.add_argument("--transformers", choices=("auto", "on", "off"), default="auto",
                    help="also time transformers (auto: where torch and transformers import)")
    args = ap.parse_args()
    with_transformers = args.transformers == "on"
    if args.transformers == "auto":
        try:
            import torch  # noqa: F401
            import transformers  # noqa: F401
            with_transformers = True
        except ImportError:
            print("peers.py: torch/transformers not installed: transformers is not timed, and "
                  "greedy tokens are compared with llama.cpp f32's", file=sys.stderr)
    cache = os.path.dirname(os.path.abspath(args.gguf))
    files = make_variants(args.gguf, cache)
    threads = [int(t) for t in args.threads.split(",")]
    engines = {}
    for t in threads:
        engines[("tandem f32", t)] = Tandem(args.tandem, files["f32"], t)
        engines[("tandem q8_0", t)] = Tandem(args.tandem, files["q8_0"], t, "q8_0")
        engines[("tandem bf16", t)] = Tandem(args.tandem, files["bf16"], t, dtype="bf16")
        engines[("tandem q4_1", t)] = Tandem(args.tandem, files["q4_1"], t, "gguf")
        engines[("tandem q4_k_m", t)] = Tandem(args.tandem, files["q4_k_m"], t, "gguf")
        engines[("llama.cpp f32", t)] = LlamaCpp(files["f32"], t)
        engines[("llama.cpp q8_0", t)] = LlamaCpp(files["q8_0"], t)
        engines[("llama.cpp bf16", t)] = LlamaCpp(files["bf16"], t)
        engines[("llama.cpp q4_1", t)] = LlamaCpp(files["q4_1"], t)
        engines[("llama.cpp q4_k_m", t)] = LlamaCpp(files["q4_k_m"], t)
        if with_transformers:
            engines[("transformers f32", t)] = Transformers(files["f32"], t)
    tok = engines[("llama.cpp f32", threads[0])]
    text_ids = tok.tokenize(TEXT * 40)
    short, long_ = text_ids[:16], text_ids[:512]
    decode, prefill, tokens = {}, {}, {}
    for r in range(args.rounds):
        for t in threads:
            for (name, et), e in engines.items():
                if et != t:
                    continue
                rate, out = e.decode(short, args.decode_tokens)
                decode.setdefault((name, t), []).append(rate)
                tokens[name] = out
                prefill.setdefault((name, t), []).append(e.prefill(long_))
                print(f"round {r + 1} threads {t} {name:18s} decode {rate:7.1f} tok/s  "
                      f"prefill {prefill[(name, t)][-1]:7.1f} tok/s", file=sys.stderr, flush=True)
    med = lambda d: {k: statistics.median(v) for k, v in d.items()}
    decode, prefill = med(decode), med(prefill)
    names = ["tandem f32", "tandem q8_0", "tandem bf16", "tandem q4_1", "tandem q4_k_m",
             "llama.cpp f32", "llama.cpp q8_0", "llama.cpp bf16", "llama.cpp q4_1", "llama.cpp q4_k_m"]
    if with_transformers:
        names.append("transformers f32")
    print(f"SmolLM2-135M-Instruct, {cpu_description()}; medians of {args.rounds} "
          f"interleaved rounds; decode: 16-token prompt + {args.decode_tokens} tokens; prefill: 512 tokens")
    print(f"Tandem's kernels: {engines[('tandem q4_1', threads[0])].kernels()}")
    print(f"{'engine':18s} " + " ".join(f"{'decode@' + str(t):>10s} {'prefill@' + str(t):>11s}" for t in threads))
    for n in names:
        print(f"{n:18s} " + " ".join(f"{decode[(n, t)]:10.1f} {prefill[(n, t)]:11.1f}" for t in threads))
    print("Tandem / peer of the same weights (>1: Tandem faster):")
    for ours, peer in (("tandem f32", "llama.cpp f32"), ("tandem f32", "transformers f32"),
                       ("tandem q8_0", "llama.cpp q8_0"), ("tandem bf16", "llama.cpp bf16"),
                       ("tandem q4_1", "llama.cpp q4_1"), ("tandem q4_k_m", "llama.cpp q4_k_m")):
        if peer not in names:
            continue
        print(f"  {ours:11s} vs {peer:16s} " + " ".join(
            f"decode@{t} {decode[(ours, t)] / decode[(peer, t)]:.2f}x  "
            f"prefill@{t} {prefill[(ours, t)] / prefill[(peer, t)]:.2f}x" for t in threads))
    ref_name = "transformers f32" if with_transformers else "llama.cpp f32"
    ref = tokens[ref_name]
    for n in names:
        same = sum(1 for a, b in zip(tokens[n], ref) if a == b)
        first = next((i for i, (a, b) in enumerate(zip(tokens[n], ref)) if a != b), len(ref))
        print(f"greedy tokens of {n:16s}: {same}/{len(ref)} equal to {ref_name}'s, first difference at {first}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"decode_tok_s": {f"{n}@{t}": v for (n, t), v in decode.items()},
                       "prefill_tok_s": {f"{n}@{t}": v for (n, t), v in prefill.items()},
                       "tokens": tokens}, f, indent=1)


if __name__ == "__main__":
    main()
