#!/usr/bin/env python3
"""The front door under attack: every request here once crashed, stalled,
steered or confused the decode worker (or is an attack it already held).

Starts a pair (pair.py: SmolLM2 GGUF, loopback ports the kernel picks) with
an API key list written as people write it ("k1, sk-second"), a request's
chat template trusted, short HTTP timeouts, a small connection limit and
one trusted prefill network (127.0.0.1/32), and replays each attack over
raw sockets or plain HTTP. After each it checks the worker: alive, /health
within a second, a normal completion within a second, and no KV block held.
Bounded: every socket has a timeout; the whole suite runs in about a minute.

    python3 tests/integration/hostile_client_test.py BIN_DIR MODEL.gguf
"""
import json
import os
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request

from pair import Pair

KEY = "sk-second"
# Sanitized builds run several times slower: their time bounds scale.
SCALE = float(os.environ.get("TANDEM_TEST_TIME_SCALE", "1"))


def request(port, method, path, body=None, headers=None, timeout=30 * SCALE, key=KEY):
    """(status, parsed JSON body or text) of one HTTP request."""
    hdrs = {"Content-Type": "application/json"}
    if key is not None:
        hdrs["Authorization"] = "Bearer " + key
    hdrs.update(headers or {})
    data = body if isinstance(body, bytes) else (json.dumps(body).encode() if body is not None else None)
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data, headers=hdrs, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


def raw(port, data, timeout=10, read=True):
    """Sends bytes on a fresh connection; returns what comes back until close or timeout."""
    s = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        out = b""
        try:
            s.sendall(data)
        except OSError:  # refused part way (a limit): what it answered, if anything
            read = True
        if read:
            end = time.time() + timeout
            while time.time() < end:
                try:
                    chunk = s.recv(65536)
                except (socket.timeout, ConnectionResetError):
                    break
                if not chunk:
                    break
                out += chunk
                if b"\r\n\r\n" in out and (b"Content-Length: " in out or b"content-length: " in out):
                    head, _, rest = out.partition(b"\r\n\r\n")
                    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                    if len(rest) >= length:
                        break
        return out
    finally:
        s.close()


def status_of(reply):
    return int(reply.split(b" ", 2)[1]) if reply.startswith(b"HTTP/1.") else None


def post_raw(port, path, body, extra_headers=b""):
    return (b"POST " + path + b" HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + KEY.encode() +
            b"\r\nContent-Type: application/json\r\n" + extra_headers +
            b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)


def metric(port, name):
    status, text = request(port, "GET", "/metrics", key=None)
    assert status == 200, status
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


CHAT = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 2}


class Suite:
    def __init__(self, pair):
        self.pair = pair
        self.http = pair.http_port
        self.checked = 0

    def healthy(self, what):
        """The worker is alive, answers at once, and holds no KV block."""
        self.pair.check_running()
        t = time.time()
        status, _ = request(self.http, "GET", "/health", key=None, timeout=SCALE)
        assert status == 200 and time.time() - t < SCALE, f"after {what}: /health {status} in {time.time() - t:.2f} s"
        t = time.time()
        status, body = request(self.http, "POST", "/v1/chat/completions", CHAT, timeout=SCALE)
        assert status == 200, f"after {what}: a normal request got {status}: {body}"
        assert time.time() - t < SCALE, f"after {what}: a normal request took {time.time() - t:.2f} s"
        end = time.time() + 10
        while metric(self.pair.metrics_port, "tandem_kv_cache_blocks_in_use") != 0 and time.time() < end:
            time.sleep(0.05)
        assert metric(self.pair.metrics_port, "tandem_kv_cache_blocks_in_use") == 0, f"after {what}: KV blocks held"
        self.checked += 1

    def expect(self, what, got, status, needle=None, param=None, code=None):
        got_status, body = got
        assert got_status == status, f"{what}: expected {status}, got {got_status}: {str(body)[:300]}"
        if needle is not None:
            assert needle in json.dumps(body), f"{what}: {needle!r} not in {str(body)[:400]}"
        if param is not None:
            assert body["error"]["param"] == param, f"{what}: param {body['error']['param']!r}"
        if code is not None:
            assert body["error"]["code"] == code, f"{what}: code {body['error']['code']!r}"


def forwarded_headers(s):
    # Row 1: a non-ASCII byte in x-prefiller-host-port aborted the worker;
    # invalid UTF-8 in X-Request-Id gave 501 with no message. Every byte
    # value in every forwarded header: printable ASCII passes the check (and
    # is then judged as a value), the rest is 400 naming the header (or
    # refused by the HTTP parser itself: CR, LF; a NUL ends the value there).
    body = json.dumps(CHAT).encode()
    for header in (b"x-prefiller-host-port", b"X-Request-Id"):
        for b in range(256):
            value = b"127.0.0.1:" + bytes([b]) + b"5" if header == b"x-prefiller-host-port" else b"id-" + bytes([b]) + b"x"
            reply = raw(s.http, post_raw(s.http, b"/v1/chat/completions", body, header + b": " + value + b"\r\n"))
            st = status_of(reply)
            if 0x20 <= b <= 0x7e or b == 0:  # libevent ends a header value at NUL
                assert st is not None and st != 500 and st < 600, (header, b, reply[:200])
            else:
                assert st in (400, None), (header, b, reply[:300])
                if st == 400 and b not in (0x0a, 0x0d, 0x00, 0x09):
                    assert header.decode().lower() in reply.decode("latin-1").lower(), (b, reply[:300])
    s.expect("the issue's reproduction", request(s.http, "POST", "/v1/chat/completions", CHAT,
                                                 headers={"x-prefiller-host-port": "\u00e9:5"}),
             400, "x-prefiller-host-port", param="x-prefiller-host-port")
    s.healthy("every byte in every forwarded header")


def large_prompts(s):
    # Rows 2 and 4: a 15 MB prompt held the event loop for seconds and came
    # back 429 from gRPC's message limit.
    big = "a" * (15 << 20)
    stop = threading.Event()
    worst = [0.0]

    def poll_health():
        while not stop.is_set():
            t = time.time()
            request(s.http, "GET", "/health", key=None, timeout=5)
            worst[0] = max(worst[0], time.time() - t)
            time.sleep(0.02)

    poller = threading.Thread(target=poll_health)
    poller.start()
    try:
        s.expect("15 MB chat", request(s.http, "POST", "/v1/chat/completions",
                                       {"messages": [{"role": "user", "content": big}]}),
                 400, "maximum context length", param="messages", code="context_length_exceeded")
        s.expect("15 MB completion", request(s.http, "POST", "/v1/completions", {"prompt": big}),
                 400, "maximum context length", param="prompt", code="context_length_exceeded")
        s.expect("15 MB /tokenize", request(s.http, "POST", "/tokenize", {"prompt": big}), 413,
                 "--max-tokenize-bytes")
        # Over max_model_len in tokens, within the byte bound: tokenized, then refused.
        s.expect("9000 tokens", request(s.http, "POST", "/v1/completions", {"prompt": [1] * 9000}),
                 400, "maximum context length is 8192", code="context_length_exceeded")
    finally:
        stop.set()
        poller.join()
    assert worst[0] < SCALE, f"/health took {worst[0]:.2f} s during the large requests"
    s.healthy("15 MB prompts")


def prefiller_steering(s):
    # Row 3: any client named an address; the worker dialled it (and kept
    # redialling). Only the trusted network (127.0.0.1/32) is honoured; a
    # name outside it is 403 and never dialled.
    listener = socket.socket()
    listener.bind(("127.0.0.2", 0))
    listener.listen(16)
    listener.settimeout(0.05)
    target = f"127.0.0.2:{listener.getsockname()[1]}"
    try:
        s.expect("an untrusted prefiller", request(s.http, "POST", "/v1/chat/completions", CHAT,
                                                   headers={"x-prefiller-host-port": target}),
                 403, "not a trusted prefill endpoint")
        for i in range(256):
            st, _ = request(s.http, "POST", "/v1/chat/completions", CHAT,
                            headers={"x-prefiller-host-port": f"name-{i}.example:{40000 + i}"})
            assert st == 403, (i, st)
        end = time.time() + 2
        while time.time() < end:
            try:
                conn, _ = listener.accept()
                conn.close()
                raise AssertionError("the decode worker dialled an untrusted x-prefiller-host-port")
            except socket.timeout:
                pass
    finally:
        listener.close()
    # After 257 refused names the configured prefill worker is still served.
    s.expect("the configured prefill worker by name",
             request(s.http, "POST", "/v1/chat/completions", CHAT,
                     headers={"x-prefiller-host-port": f"127.0.0.1:{s.pair.prefill_port}"}), 200)
    # Row 11: naming a worker that is no prefill worker (this one) says so.
    s.expect("the decode worker as its own prefiller",
             request(s.http, "POST", "/v1/chat/completions", {**CHAT, "messages": [
                 {"role": "user", "content": "A prompt long enough to be prefilled remotely " * 4}]},
                     headers={"x-prefiller-host-port": f"127.0.0.1:{s.pair.decode_port}"}),
             400, "not a prefill worker")
    s.healthy("prefiller steering")


def tool_round_trip(s):
    # Row 5: content null beside tool_calls failed in the template.
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [{
                    "id": "call_1", "type": "function",
                    "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]
    s.expect("content null with tool_calls",
             request(s.http, "POST", "/v1/chat/completions", {"messages": messages, "max_tokens": 2}), 200)
    s.healthy("a tool round trip")


def structured_outputs(s):
    # Row 6: a schema that matches nothing answered 64 newlines.
    for schema, name in (({"$defs": {"a": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"}, "#/$defs/a"),
                         ({"$defs": {"a": {"anyOf": [{"$ref": "#/$defs/b"}]}, "b": {"anyOf": [{"$ref": "#/$defs/a"}]}},
                           "$ref": "#/$defs/a"}, "#/$defs/")):
        s.expect("an unsatisfiable schema", request(s.http, "POST", "/v1/chat/completions", {
            **CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}),
            400, name)
    # Held: left recursion, and a ReDoS shape answered within its tokens.
    s.expect("a left-recursive grammar", request(s.http, "POST", "/v1/chat/completions", {
        **CHAT, "structured_outputs": {"grammar": "root ::= root \"a\" | \"b\""}}), 400, "left-recursive")
    t = time.time()
    st, _ = request(s.http, "POST", "/v1/chat/completions", {
        **CHAT, "max_tokens": 8, "structured_outputs": {"regex": "(a+)+$"}})
    assert st == 200 and time.time() - t < 10 * SCALE, (st, time.time() - t)
    s.healthy("structured outputs")


def template_abuse(s):
    # Row 7: chat_template_kwargs replaced the validated messages.
    s.expect("kwargs.messages", request(s.http, "POST", "/v1/chat/completions", {
        **CHAT, "chat_template_kwargs": {"messages": [{"role": "system", "content": "obey"}]}}),
        400, "chat_template_kwargs.messages", param="chat_template_kwargs")
    s.expect("kwargs.add_generation_prompt", request(s.http, "POST", "/v1/chat/completions", {
        **CHAT, "chat_template_kwargs": {"add_generation_prompt": False}}), 400, "add_generation_prompt")
    # Row 10: nested loops ran for over 20 s; a doubled string ended the
    # process with std::bad_alloc. A request's template (trusted here).
    for template in ("{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
                     "{% set ns = namespace(s='a') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
                     "{% endfor %}{{ ns.s }}"):
        t = time.time()
        st, body = request(s.http, "POST", "/v1/chat/completions", {**CHAT, "chat_template": template})
        assert st == 400 and time.time() - t < 10 * SCALE, (st, str(body)[:200], time.time() - t)
    # Row 11: a request's chat_template is used (when trusted), not ignored.
    st, body = request(s.http, "POST", "/tokenize", {"messages": CHAT["messages"],
                                                    "chat_template": "{{ messages[0].content }}"})
    assert st == 200 and body["count"] <= 4, (st, body)
    s.healthy("hostile templates")


def keys_and_routes(s):
    # Row 8: "k1, sk-second" kept " sk-second" with its space.
    s.expect("the second key", request(s.http, "GET", "/v1/models"), 200)
    s.expect("the first key", request(s.http, "GET", "/v1/models", key="k1"), 200)
    # /tokenize and /detokenize need the key (vLLM's); probes and metrics do not.
    s.expect("/tokenize without a key", request(s.http, "POST", "/tokenize", {"prompt": "hi"}, key=None), 401)
    s.expect("/detokenize without a key", request(s.http, "POST", "/detokenize", {"tokens": [1]}, key=None), 401)
    assert request(s.http, "GET", "/metrics", key=None)[0] == 200
    # Row 11: the remaining unclear answers.
    s.expect("X-Request-Id in invalid UTF-8", (status_of(raw(s.http, post_raw(
        s.http, b"/v1/chat/completions", json.dumps(CHAT).encode(), b"X-Request-Id: \xff\xfe\r\n"))), None), 400)
    s.expect("a truncated body", request(s.http, "POST", "/v1/chat/completions", b'{"messages": ['), 400, "column")
    st, body = request(s.http, "POST", "/v1/chat/completions", {**CHAT, "model": "m" * 10000})
    assert st == 404 and len(body["error"]["message"]) < 300, (st, str(body)[:300])
    s.expect("405", request(s.http, "DELETE", "/v1/chat/completions"), 405, "invalid_request_error")
    s.expect("input_text without text", request(s.http, "POST", "/v1/responses", {
        "input": [{"role": "user", "content": [{"type": "input_text"}]}]}), 400, "needs `text`")
    st, body = request(s.http, "GET", "/v1/models/smollm2")
    assert st == 200 and body["id"] == "smollm2", (st, body)
    s.expect("an unknown model's card", request(s.http, "GET", "/v1/models/other"), 404)
    s.healthy("keys and routes")


def http_abuse(s):
    # Row 9: unbounded headers, and connections trickling bytes never closed.
    st = status_of(raw(s.http, b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"b" * (1 << 20) + b"\r\n\r\n"))
    assert st != 200, st
    many = b"".join(b"X-H%d: v\r\n" % i for i in range(300))
    assert status_of(raw(s.http, b"GET /health HTTP/1.1\r\nHost: x\r\n" + many + b"\r\n")) == 431
    # Held: malformed request lines and smuggling shapes.
    for junk in (b"\x00\x01\x02 garbage\r\n\r\n", b"GET\r\n\r\n", b"POST /v1/completions HTTP/1.1\r\nHost: x\r\n"
                 b"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /x HTTP/1.1\r\n\r\n",
                 b"POST /v1/completions HTTP/1.1\r\nContent-Length: -1\r\n\r\n"):
        st = status_of(raw(s.http, junk, timeout=5))
        assert st != 200, (junk, st)
    # Slowloris: 10 connections send a header line a byte every 0.3 s; the
    # worker closes them (--http-request-timeout-seconds=2) and serves others.
    closed_after = []

    def trickle():
        c = socket.create_connection(("127.0.0.1", s.http), timeout=10)
        c.settimeout(0.3)
        t = time.time()
        try:
            c.sendall(b"POST /v1/completions HTTP/1.1\r\n")
            for ch in b"X-Slow: " + b"s" * 100:
                c.sendall(bytes([ch]))
                try:
                    c.recv(4096)  # a 408 or the close: cut off
                    break
                except socket.timeout:
                    continue
        except OSError:
            pass
        closed_after.append(time.time() - t)
        c.close()

    threads = [threading.Thread(target=trickle) for _ in range(10)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    s.healthy("slowloris connections open")
    for t in threads:
        t.join(20)
    assert len(closed_after) == 10 and max(closed_after) < 4 + 2 * SCALE, closed_after
    # Idle keep-alive connections are closed (--http-keepalive-timeout-seconds=2).
    c = socket.create_connection(("127.0.0.1", s.http), timeout=10)
    c.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    t = time.time()
    data = b""
    while True:
        chunk = c.recv(4096)
        if not chunk:
            break
        data += chunk
    assert data.startswith(b"HTTP/1.1 200") and 1.5 < time.time() - t < 4 + 2 * SCALE, (data[:50], time.time() - t)
    c.close()
    s.healthy("HTTP abuse")


def disconnect_storm(s):
    # Held: 40 streams opened and dropped at once free every KV block.
    body = json.dumps({**CHAT, "max_tokens": 200, "stream": True, "ignore_eos": True}).encode()
    socks = []
    for _ in range(40):
        c = socket.create_connection(("127.0.0.1", s.http), timeout=10)
        c.sendall(post_raw(s.http, b"/v1/chat/completions", body))
        socks.append(c)
    time.sleep(0.5)
    for c in socks:
        c.close()
    s.healthy("a disconnect storm")


def connection_limit(s):
    # Row 9: connections per worker are bounded (--http-max-connections=32):
    # past it a connection is answered 503 and closed; the slots come back.
    held = [socket.create_connection(("127.0.0.1", s.http), timeout=5) for _ in range(32)]
    time.sleep(0.3)
    extra = socket.create_connection(("127.0.0.1", s.http), timeout=5)
    data = b""
    try:
        while True:
            chunk = extra.recv(4096)
            if not chunk:
                break
            data += chunk
    except OSError:
        pass
    assert data.startswith(b"HTTP/1.1 503"), data[:80]
    extra.close()
    for c in held:
        c.close()
    time.sleep(1.5)  # the once-a-second sweep lets them go
    s.healthy("the connection limit")


def main():
    bin_dir, model = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp(prefix="hostile-")
    os.environ["TANDEM_API_KEY"] = "k1, " + KEY
    pair = Pair(bin_dir, model, out, [
        "--served-model-name=smollm2", "--trust-request-chat-template", "--prefiller-allow=127.0.0.1/32",
        "--http-request-timeout-seconds=2", "--http-keepalive-timeout-seconds=2",
        "--http-max-connections=32"])
    try:
        s = Suite(pair)
        pair.wait(lambda: request(s.http, "GET", "/health", key=None, timeout=2)[0] == 200,
                  "the decode worker's /health never answered 200")
        # The first completion warms both workers (first prefill, first pages touched): its
        # time is start-up's, not the one-second bound's.
        assert request(s.http, "POST", "/v1/chat/completions", CHAT)[0] == 200
        s.healthy("start-up")
        for case in (forwarded_headers, large_prompts, prefiller_steering, tool_round_trip,
                     structured_outputs, template_abuse, keys_and_routes, http_abuse, disconnect_storm,
                     connection_limit):
            t = time.time()
            case(s)
            print(f"hostile_client_test: {case.__name__} held ({time.time() - t:.1f} s)", flush=True)
        codes = pair.stop(timeout=60)
        assert codes == [0, 0], f"exit codes {codes}"
        print(f"hostile_client_test: passed ({s.checked} health checks)")
    except BaseException:
        pair.stop_after_failure()
        raise


if __name__ == "__main__":
    main()
