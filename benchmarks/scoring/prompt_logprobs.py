#!/usr/bin/env python3
"""What scoring a prompt costs through the pair: lm-eval's loglikelihood
request (echo, logprobs=1, max_tokens=1: every prompt token's logprob)
against the same prompt with max_tokens=1 alone, for random token-id prompts
of 128, 512 and 2,048 tokens; medians of six (docs/benchmarks.md, "Scoring
prompts"). Needs a decode worker's HTTP API on 127.0.0.1:8000.
"""
import json
import random
import statistics
import time
import urllib.request


def post(body):
    req = urllib.request.Request("http://127.0.0.1:8000/v1/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    t = time.perf_counter()
    r = json.loads(urllib.request.urlopen(req, timeout=300).read())
    return time.perf_counter() - t, r


rng = random.Random(1)
for n in (128, 512, 2048):
    prompts = [[rng.randrange(100, 40000) for _ in range(n)] for _ in range(6)]
    rows = {}
    for name, extra in (("plain", {}), ("scored", {"echo": True, "logprobs": 1})):
        times = []
        for p in prompts:
            dt, r = post(dict(prompt=p, max_tokens=1, temperature=0, **extra))
            if extra:
                assert len(r["choices"][0]["logprobs"]["token_logprobs"]) == n + 1
            times.append(dt * 1000)
        rows[name] = statistics.median(times)
    print(f"{n} tokens: max_tokens=1 {rows['plain']:.1f} ms; echo+logprobs=1 {rows['scored']:.1f} ms; ratio {rows['scored']/rows['plain']:.2f}")
