#!/usr/bin/env python3
"""Does one client's large request stall the others? Against a decode
worker's HTTP API: opens a streaming chat completion, then sends --large
requests of --body-mb MB at once (to /tokenize, /v1/chat/completions or
/v1/completions) while polling /health every 20 ms, and reports the /health
latencies and the stream's gaps between events while the large requests
ran, with each large request's status and time. The stream, each large
request and the /health poller run in processes of their own, so that no
client thread waits on another's interpreter lock (building a 15 MB body
holds it for ~80 ms). Standard library only.

    large_request_stall.py --url=http://127.0.0.1:8000 --route=tokenize --body-mb=15 --large=3

Exits 1 when --max-health-ms or --max-gap-ratio (longest gap over the
median gap) is given and exceeded.
"""
import argparse
import http.client
import json
import os
import multiprocessing
import statistics
import sys
import time
from urllib.parse import urlparse


def conn(url, timeout=120):
    u = urlparse(url)
    return http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)


def large_body(route, mb):
    text = "hello " * ((mb << 20) // 6)
    if route == "tokenize" or route == "completions":
        return {"prompt": text, "max_tokens": 1}
    return {"messages": [{"role": "user", "content": text}], "max_tokens": 1}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--url", required=True)
    ap.add_argument("--route", choices=["tokenize", "chat", "completions"], default="tokenize")
    ap.add_argument("--body-mb", type=int, default=15)
    ap.add_argument("--large", type=int, default=1,
                    help="large requests sent at once (0: none, the baseline for --window-seconds)")
    ap.add_argument("--window-seconds", type=float, default=5.0,
                    help="with --large=0, how long the window is")
    ap.add_argument("--stream-tokens", type=int, default=400)
    ap.add_argument("--max-health-ms", type=float)
    ap.add_argument("--max-gap-ratio", type=float)
    args = ap.parse_args()
    path = {"tokenize": "/tokenize", "chat": "/v1/chat/completions",
            "completions": "/v1/completions"}[args.route]
    payload = json.dumps(large_body(args.route, args.body_mb)).encode()

    ctx = multiprocessing.get_context("fork")
    events = ctx.Manager().list()  # monotonic time of each SSE event
    results = ctx.Manager().list()

    def stream():
        c = conn(args.url)
        body = json.dumps({"messages": [{"role": "user", "content": "Tell me a long story."}],
                           "max_tokens": args.stream_tokens, "ignore_eos": True, "stream": True})
        c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
        r = c.getresponse()
        local = []
        while True:
            line = r.readline()
            if not line:
                break
            if line.startswith(b"data: "):
                local.append(time.monotonic())
                if len(local) % 10 == 0:
                    events.extend(local[len(events):])
                if line.startswith(b"data: [DONE]"):
                    break
        events.extend(local[len(events):])

    def large(go):
        # Sending and reading megabytes costs this machine's CPU too: at the
        # lowest priority it is not the client that delays the stream (as it
        # would not be from another machine). SCHED_IDLE, not nice 19: a
        # nice-19 task still runs its whole slice (3 ms and more) once the
        # scheduler picks it, and three of them waking at once took ~10 ms of
        # one core from the engine (perf sched timehist).
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
        except (AttributeError, OSError):
            os.nice(19)
        # Connected and the request built (a 15 MB copy) before the start:
        # from then on the client only sends and reads.
        c = conn(args.url)
        c.connect()
        head = (f"POST {path} HTTP/1.1\r\nHost: {urlparse(args.url).netloc}\r\n"
                f"Content-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n")
        message = head.encode() + payload
        go.wait()
        t = time.monotonic()
        c.sock.sendall(message)
        sent = time.monotonic()
        r = http.client.HTTPResponse(c.sock)
        r.begin()
        r.read()
        results.append((r.status, time.monotonic() - t, sent - t))

    streamer = ctx.Process(target=stream)
    streamer.start()
    while len(events) < 20 and streamer.is_alive():
        time.sleep(0.01)
    go = ctx.Event()
    senders = [ctx.Process(target=large, args=(go,)) for _ in range(args.large)]
    for s in senders:
        s.start()
    time.sleep(0.5)  # each sender's body is built (forked with it)
    window_start = time.monotonic()
    go.set()
    health = []
    hc = conn(args.url, timeout=30)
    while (any(s.is_alive() for s in senders) or
           (not senders and time.monotonic() - window_start < args.window_seconds)):
        t = time.monotonic()
        hc.request("GET", "/health")
        hc.getresponse().read()
        health.append((time.monotonic() - t) * 1000)
        time.sleep(0.02)
    window_end = time.monotonic()
    for s in senders:
        s.join()
    streamer.join(120)
    events = list(events)

    gaps = [(b - a) * 1000 for a, b in zip(events, events[1:])]
    during_at = [((b - a) * 1000, a - window_start) for a, b in zip(events, events[1:])
                 if b >= window_start and a <= window_end]
    during = [g for g, _ in during_at]
    median_gap = statistics.median(gaps) if gaps else 0
    print(f"large requests: {args.large} x {len(payload) / 2**20:.1f} MB to {path}: " +
          ", ".join(f"{s} in {t:.2f} s (sent in {sent:.2f} s)" for s, t, sent in sorted(results)))
    print(f"window: {window_end - window_start:.2f} s")
    if health:
        print(f"/health during it: {len(health)} polls, median {statistics.median(health):.1f} ms, "
              f"max {max(health):.1f} ms")
    print(f"stream: {len(events)} events, median gap {median_gap:.1f} ms (whole stream); "
          f"during the window {len(during)} gaps, longest {max(during) if during else 0:.1f} ms "
          f"({(max(during) / median_gap) if during and median_gap else 0:.2f}x the median)")
    if during_at:
        print("longest gaps (ms, starting at s into the window): " +
              ", ".join(f"{g:.1f} at {at:.2f}" for g, at in sorted(during_at, reverse=True)[:5]))
    failed = False
    if args.max_health_ms is not None and health and max(health) > args.max_health_ms:
        print(f"FAIL: /health took {max(health):.1f} ms > {args.max_health_ms} ms")
        failed = True
    if args.max_gap_ratio is not None and during and median_gap and max(during) / median_gap > args.max_gap_ratio:
        print(f"FAIL: a stream gap of {max(during):.1f} ms is over {args.max_gap_ratio}x the median")
        failed = True
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
