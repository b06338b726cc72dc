#!/usr/bin/python3
"""Soak: the pair at saturation for N minutes with mixed lengths, cancels and
deadlines. Reports requests, errors by code, RSS of both workers after
warm-up and at the end, and KV blocks in use once idle; exits 1 when RSS grew
2% or more after warm-up, blocks are left in use, or an unexpected error
occurred (OK, CANCELLED by this client and DEADLINE_EXCEEDED for its short
deadlines are expected).

    /usr/bin/python3 tests/soak/soak.py BIN_DIR SOURCE_DIR [--minutes=10] [--concurrency=16]
"""
import argparse
import json
import os
import random
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1))


def metric(port, name):
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            total += float(line.rsplit(" ", 1)[1])
    return total


def start(cmd, log):
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    ports = {}
    for _ in range(600):
        text = open(log.name).read()
        for key, marker in (("grpc", "gRPC listening on "), ("metrics", "metrics on http://")):
            m = re.search(re.escape(marker) + r"[\d.]+:(\d+)", text)
            if m:
                ports[key] = int(m.group(1))
        if "SERVING" in text.replace("NOT_SERVING", "") and len(ports) == 2:
            return proc, ports
        time.sleep(0.1)
    raise RuntimeError(f"{cmd[0]} did not start; log {log.name}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("bin_dir")
    ap.add_argument("source_dir")
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--concurrency", type=int, default=16)
    ap.add_argument("--json", default="")
    # Short runs (CI: 1 minute) are dominated by allocator warm-up: they check
    # errors and blocks, with a looser bound on growth.
    ap.add_argument("--max-rss-growth", type=float, default=0.02)
    a = ap.parse_args()

    from grpc_tools import protoc
    import grpc
    out = tempfile.mkdtemp(prefix="tandem_soak_")
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    assert protoc.main(["protoc", f"-I{a.source_dir}/proto", f"-I{wkt}", f"--python_out={out}",
                        f"--grpc_python_out={out}", "tandem/v1/tandem.proto"]) == 0
    sys.path.insert(0, out)
    from tandem.v1 import tandem_pb2, tandem_pb2_grpc
    from google.protobuf import wrappers_pb2

    logs = [open(os.path.join(out, n), "w") for n in ("prefill.log", "decode.log")]
    prefill, pp = start([f"{a.bin_dir}/prefill_worker", "--grpc-address=127.0.0.1:0",
                         "--metrics-address=127.0.0.1:0"], logs[0])
    decode, dp = start([f"{a.bin_dir}/decode_worker", "--grpc-address=127.0.0.1:0",
                        "--metrics-address=127.0.0.1:0", "--http-address=127.0.0.1:0",
                        "--num-kv-blocks=256",
                        f"--prefill-address=127.0.0.1:{pp['grpc']}"], logs[1])
    stub = tandem_pb2_grpc.DecodeStub(grpc.insecure_channel(f"127.0.0.1:{dp['grpc']}"))
    codes, lock = {}, threading.Lock()
    expected = {"OK", "CANCELLED", "DEADLINE_EXCEEDED"}
    stop_at = time.time() + a.minutes * 60

    def client(seed):
        # A client that breaks is a failure of the soak, not fewer requests.
        try:
            requests(seed)
        except Exception as e:  # noqa: BLE001
            with lock:
                name = f"CLIENT_ERROR {type(e).__name__}: {e}"
                codes[name] = codes.get(name, 0) + 1

    def requests(seed):
        rng = random.Random(seed)
        n = 0
        while time.time() < stop_at:
            n += 1
            kind = rng.random()
            prompt = [rng.randrange(3, 500) for _ in range(rng.choice([4, 16, 64, 200, 600]))]
            req = tandem_pb2.GenerateRequest(
                request_id=f"soak-{seed}-{n}", prompt_token_ids=prompt,
                sampling=tandem_pb2.SamplingParams(max_tokens=rng.choice([1, 8, 32, 128]),
                                                   ignore_eos=True,
                                                   temperature=rng.choice([0.0, 0.8]),
                                                   seed=wrappers_pb2.UInt64Value(value=n)))
            timeout = 0.05 if kind < 0.1 else 60
            code = "OK"
            try:
                call = stub.Generate(req, timeout=timeout)
                for i, _ in enumerate(call):
                    if 0.1 <= kind < 0.2 and i >= 2:  # cancel mid-stream
                        call.cancel()
                        break
                if 0.1 <= kind < 0.2:
                    code = "CANCELLED"
            except grpc.RpcError as e:
                code = e.code().name
            with lock:
                codes[code] = codes.get(code, 0) + 1

    threads = [threading.Thread(target=client, args=(s,)) for s in range(a.concurrency)]
    for t in threads:
        t.start()
    warm = min(60, a.minutes * 60 * 0.34)
    time.sleep(warm)
    rss_start = {"prefill": rss_kb(prefill.pid), "decode": rss_kb(decode.pid)}
    for t in threads:
        t.join()
    time.sleep(2)
    rss_end = {"prefill": rss_kb(prefill.pid), "decode": rss_kb(decode.pid)}
    blocks = {"prefill": metric(pp["metrics"], "tandem_kv_cache_blocks_in_use"),
              "decode": metric(dp["metrics"], "tandem_kv_cache_blocks_in_use")}
    for proc in (decode, prefill):
        proc.send_signal(signal.SIGTERM)
    exits = [decode.wait(timeout=60), prefill.wait(timeout=60)]
    growth = {k: (rss_end[k] - rss_start[k]) / rss_start[k] for k in rss_start}
    report = {"minutes": a.minutes, "concurrency": a.concurrency,
              "requests": sum(codes.values()), "codes": codes,
              "rss_kb_after_warmup": rss_start, "rss_kb_end": rss_end,
              "rss_growth": {k: round(v, 4) for k, v in growth.items()},
              "blocks_in_use_idle": blocks, "exit_codes": exits}
    print(json.dumps(report, indent=1))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(report, f, indent=1)
    bad = [c for c in codes if c not in expected]
    ok = not bad and codes.get("OK", 0) > 0 and all(g < a.max_rss_growth for g in growth.values()) \
        and not any(blocks.values()) and exits == [0, 0]
    print("soak:", "PASS" if ok else f"FAIL (unexpected codes {bad}, {codes.get('OK', 0)} OK)")
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
