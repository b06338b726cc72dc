#!/usr/bin/env python3
"""Milliseconds per completion token through the OpenAI API of a running pair
(http://127.0.0.1:8000), free text against a JSON schema of one long string,
five seeded requests each (docs/benchmarks.md, "Structured outputs")."""
import json, time, urllib.request
def post(body):
    req = urllib.request.Request("http://127.0.0.1:8000/v1/chat/completions", data=json.dumps(body).encode())
    t = time.time(); r = json.load(urllib.request.urlopen(req)); return time.time() - t, r
msgs = [{"role": "user", "content": "Write a long story about a fox, as JSON."}]
schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
for name, extra in [("free", {"ignore_eos": True}), ("schema", {"response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}, "ignore_eos": False})]:
    times = []
    for i in range(5):
        dt, r = post(dict(messages=msgs, temperature=0.8, seed=i, max_tokens=128, **extra))
        times.append(dt / r["usage"]["completion_tokens"] * 1000)
    times.sort()
    print(name, "ms/token median", round(times[2], 2), "all", [round(t, 2) for t in times], r["usage"]["completion_tokens"])
