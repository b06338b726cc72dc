#!/usr/bin/env python3
"""Opens N concurrent streaming /v1/completions requests against a decode
worker's HTTP API (raw HTTP/1.1 over asyncio, no dependencies), reads each
SSE stream to `data: [DONE]`, and reports how many completed, the wall time,
time to first event (p50/p99) and the worker's thread count while all N were
open (from /proc, when the worker's pid is given).

    sse_streams.py --url=http://127.0.0.1:8000 --streams=1000 --max-tokens=32 [--pid=PID]
"""
import argparse
import asyncio
import json
import os
import statistics
import time
from urllib.parse import urlparse


async def one(host, port, body, started, t0):
    reader, writer = await asyncio.open_connection(host, port)
    payload = json.dumps(body).encode()
    writer.write(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    await writer.drain()
    started.append(1)
    first = None
    events = 0
    buf = b""
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            break
        if first is None and b"data: " in chunk:
            first = time.monotonic() - t0
        buf += chunk
        events = buf.count(b"data: ")
        if b"data: [DONE]" in buf:
            break
    writer.close()
    return first, events, b"data: [DONE]" in buf


def threads_of(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("Threads:"):
                return int(line.split()[1])
    return None


async def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--streams", type=int, default=1000)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--pid", type=int, default=0)
    a = ap.parse_args()
    u = urlparse(a.url)
    body = {"prompt": [1, 2, 3, 4, 5, 6, 7, 8], "max_tokens": a.max_tokens, "temperature": 0,
            "ignore_eos": True, "stream": True}
    started = []
    t0 = time.monotonic()
    threads_before = threads_of(a.pid) if a.pid else None
    tasks = [asyncio.create_task(one(u.hostname, u.port, body, started, t0)) for _ in range(a.streams)]
    peak_threads = threads_before
    while not all(t.done() for t in tasks):
        await asyncio.sleep(0.2)
        if a.pid:
            peak_threads = max(peak_threads, threads_of(a.pid))
    results = [t.result() for t in tasks]
    wall = time.monotonic() - t0
    firsts = sorted(r[0] for r in results if r[0] is not None)
    done = sum(1 for r in results if r[2])
    print(json.dumps({"streams": a.streams, "completed": done, "wall_s": round(wall, 2),
                      "first_event_p50_s": round(statistics.median(firsts), 3) if firsts else None,
                      "first_event_p99_s": round(firsts[int(len(firsts) * 0.99) - 1], 3) if firsts else None,
                      "events_per_stream_min": min(r[1] for r in results),
                      "worker_threads_before": threads_before, "worker_threads_peak": peak_threads}))


if __name__ == "__main__":
    asyncio.run(main())
