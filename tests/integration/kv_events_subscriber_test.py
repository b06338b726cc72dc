#!/usr/bin/env python3
"""Both workers' KV events, read by a subscriber written for vLLM.

Starts a pair (pair.py) with --kv-events-config on both workers (ZeroMQ
PUB and replay sockets on loopback ports the kernel picks, read from the
logs), a prefill KV cache small enough that blocks are evicted, and sends
prompts as token ids through the OpenAI API: groups sharing a system
prefix, so blocks are stored, hit, and removed. A subscriber per worker
decodes every batch with vLLM's own struct definitions (msgspec,
array-like and tagged, as vllm.distributed.kv_events declares them) and:

- joins late on purpose and also drops a range of sequence numbers on
  purpose, then fills both gaps from the replay socket;
- rebuilds the set of cached block hashes from the events alone, checking
  that every removal names a held block, every stored run continues a
  held block or starts a chain, and every stored block's tokens are a
  block-aligned slice of a sequence this test sent (the prompt, or for the
  decode worker prompt plus generated text);
- ends with exactly as many blocks as the worker's own gauge
  tandem_kv_cache_blocks_cached says it holds.

The same payloads also decode with the older definitions of vLLM's example
subscriber (examples/online_serving/kv_events_subscriber.py, no lora_name).

    python tests/integration/kv_events_subscriber_test.py BIN_DIR MODEL.gguf
(python: the venv of scripts/openai_venv.sh, which has pyzmq and msgspec)
"""
import json
import random
import re
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

import msgspec
import zmq

from pair import Pair


# vLLM's definitions (vllm/distributed/kv_events.py).
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: int | None = None


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    """Base class for all KV cache-related events"""


class BlockStored(KVCacheEvent):
    block_hashes: list[int | bytes]
    parent_block_hash: int | bytes | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None
    lora_name: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int | bytes]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


# The example subscriber's older copy: BlockStored without lora_name.
class OldBlockStored(KVCacheEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class OldKVEventBatch(EventBatch):
    events: list[OldBlockStored | BlockRemoved | AllBlocksCleared]


DROP = range(4, 7)  # sequence numbers the subscriber ignores on purpose
BLOCK = 16


class Subscriber:
    """Collects one worker's batches by sequence number from its PUB socket."""

    def __init__(self, ctx, endpoint, replay_endpoint, topic):
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, topic)
        self.sub.connect(endpoint)
        self.replay_endpoint = replay_endpoint
        self.ctx = ctx
        self.batches = {}  # seq -> payload
        self.dropped = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        while not self.stop.is_set():
            if self.sub.poll(50):
                topic, seq, payload = self.sub.recv_multipart()
                seq = int.from_bytes(seq, "big")
                if seq in DROP:
                    self.dropped.append(seq)
                    continue
                self.batches[seq] = payload

    def close(self):
        self.stop.set()
        self.thread.join()
        self.sub.close(linger=0)

    def fill_gaps(self):
        """Asks the replay socket for everything from the first missing seq.

        A DEALER socket, not the example's REQ: the publisher answers one
        request with one message per batch and an end marker, and a REQ
        socket takes only the first of them."""
        last = max(self.batches)
        missing = [s for s in range(last + 1) if s not in self.batches]
        if not missing:
            return 0
        dealer = self.ctx.socket(zmq.DEALER)
        dealer.connect(self.replay_endpoint)
        dealer.send_multipart([b"", missing[0].to_bytes(8, "big")])
        got = 0
        while dealer.poll(5000):
            _, seq, payload = dealer.recv_multipart()
            if seq == (-1).to_bytes(8, "big", signed=True):
                assert payload == b"", "the end marker's payload is empty"
                break
            seq = int.from_bytes(seq, "big")
            if seq not in self.batches:
                self.batches[seq] = payload
                got += 1
        else:
            raise AssertionError("no end marker from the replay socket within 5 s")
        dealer.close(linger=0)
        return got


def rebuild(batches, prompts, role):
    """Applies the batches in order; returns the held hashes and counts."""
    decoder = msgspec.msgpack.Decoder(KVEventBatch)
    old_decoder = msgspec.msgpack.Decoder(OldKVEventBatch)
    # Every block-aligned slice of the prompts sent, and their first blocks.
    chunks = {tuple(p[s:s + BLOCK]) for p in prompts for s in range(0, len(p) - BLOCK + 1, BLOCK)}
    firsts = {tuple(p[:BLOCK]) for p in prompts}
    held, stored, removed, cleared, from_prompts = set(), 0, 0, 0, 0
    last_ts = 0.0
    for seq in sorted(batches):
        batch = decoder.decode(batches[seq])
        old = old_decoder.decode(batches[seq])
        assert len(old.events) == len(batch.events)
        assert batch.ts >= last_ts - 1.0, f"{role}: batch {seq} goes back in time"
        last_ts = batch.ts
        for event in batch.events:
            if isinstance(event, AllBlocksCleared):
                held.clear()
                cleared += 1
            elif isinstance(event, BlockStored):
                assert event.block_size == BLOCK and event.medium == "GPU", event
                assert len(event.token_ids) == BLOCK * len(event.block_hashes), event
                if event.parent_block_hash is None:
                    assert tuple(event.token_ids[:BLOCK]) in firsts, \
                        f"{role}: a chain starts with tokens no prompt starts with: {event}"
                else:
                    assert event.parent_block_hash in held, f"{role}: unknown parent {event}"
                for i, h in enumerate(event.block_hashes):
                    assert h not in held, f"{role}: block {h} stored twice"
                    chunk = tuple(event.token_ids[i * BLOCK:(i + 1) * BLOCK])
                    if chunk in chunks:
                        from_prompts += 1
                    else:
                        # The decode worker also caches blocks its replies filled.
                        assert role == "decode", \
                            f"{role}: stored tokens {chunk} are no block of a prompt sent"
                    held.add(h)
                    stored += 1
            elif isinstance(event, BlockRemoved):
                for h in event.block_hashes:
                    assert h in held, f"{role}: removed block {h} was not held"
                    held.discard(h)
                    removed += 1
    assert from_prompts > 0, f"{role}: no stored block holds a prompt's tokens"
    return held, stored, removed, cleared


def metric(port, name, role):
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf'^{name}\{{[^}}]*role="{role}"[^}}]*\}} (\S+)$', text, re.M)
    assert m, f"{name} missing from the {role} worker's metrics"
    return float(m.group(1))


def http_status(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/completions",
                                 data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=120) as r:
        return json.loads(r.read())


def main():
    bin_dir, model = sys.argv[1], sys.argv[2]
    config = json.dumps({"enable_kv_cache_events": True, "publisher": "zmq",
                         "endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*",
                         "topic": "kv-events", "buffer_steps": 10000})
    common = [f"--kv-events-config={config}", f"--block-size={BLOCK}"]
    with tempfile.TemporaryDirectory() as out:
        # 12 prefill blocks: the workload below needs more, so some go.
        pair = Pair(bin_dir, model, out, decode_flags=common,
                    prefill_flags=common + ["--num-kv-blocks=12"])
        ok = False
        ctx = zmq.Context()
        subs = {}
        try:
            endpoints = {}
            for role in ("prefill", "decode"):
                pair.wait(lambda: "KV events on" in pair.log(role), f"the {role} worker's KV events")
                m = re.search(r"KV events on (\S+) \(replay on (\S+)\)", pair.log(role))
                endpoints[role] = m.groups()
            pair.wait(lambda: http_status(f"http://127.0.0.1:{pair.http_port}/health") == 200,
                      "the decode worker's /health answering 200")
            # Joins after the workers announced their empty caches: those
            # first batches come from the replay socket.
            time.sleep(0.5)
            for role, (endpoint, replay) in endpoints.items():
                subs[role] = Subscriber(ctx, endpoint, replay, "kv-events")
            time.sleep(0.3)  # the SUB sockets' joining

            with urllib.request.urlopen(f"http://127.0.0.1:{pair.http_port}/v1/models",
                                        timeout=5) as r:
                model_id = json.loads(r.read())["data"][0]["id"]
            rng = random.Random(5)
            systems = [[rng.randrange(1000, 20000) for _ in range(3 * BLOCK + 5)]
                       for _ in range(3)]
            prompts = []
            for i in range(18):
                prompt = systems[i % 3] + [rng.randrange(1000, 20000)
                                           for _ in range(rng.randrange(1, 3 * BLOCK))]
                reply = post(pair.http_port, {"model": model_id, "prompt": prompt, "max_tokens": 20,
                                              "temperature": 0, "ignore_eos": True})
                assert reply["usage"]["completion_tokens"] == 20, reply
                prompts.append(prompt)
            time.sleep(1.0)  # idle workers publish within ~50 ms; the sockets deliver

            for role, sub in subs.items():
                sub.close()
                assert sub.dropped, f"{role}: the test's deliberate gap never happened"
                replayed = sub.fill_gaps()
                assert sorted(sub.batches) == list(range(len(sub.batches))), \
                    f"{role}: sequence numbers still have gaps after the replay"
                held, stored, removed, cleared = rebuild(sub.batches, prompts, role)
                gauge = metric(pair.metrics_port if role == "decode" else pair.prefill_metrics_port,
                               "tandem_kv_cache_blocks_cached", role)
                print(f"{role}: {len(sub.batches)} batches ({replayed} from the replay socket), "
                      f"{stored} blocks stored, {removed} removed, {cleared} cleared; "
                      f"{len(held)} held, the worker's gauge says {gauge:g}")
                assert cleared >= 1, f"{role}: the first batch announces an empty cache"
                assert stored > 0, f"{role}: no block was stored"
                assert len(held) == gauge, f"{role}: rebuilt {len(held)} blocks, worker holds {gauge}"
                if role == "prefill":
                    assert removed > 0, "prefill: the small cache never evicted a block"
            codes = pair.stop(timeout=60)
            assert codes == [0, 0], f"exit codes {codes}"
            ok = True
        finally:
            for sub in subs.values():
                if not sub.stop.is_set():
                    sub.close()
            ctx.term()
            if not ok:
                pair.stop_after_failure()
    print("kv_events_subscriber_test: OK")


if __name__ == "__main__":
    main()
