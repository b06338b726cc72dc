#!/usr/bin/env python3
"""The official `openai` Python client against the pair's HTTP API.

Starts a prefill and a decode worker (SmolLM2, the GGUF of
scripts/fetch_model.sh) on loopback ports the kernel picks (pair.py), the
decode worker with --http-address, and checks through openai.OpenAI(base_url=.../v1):
/v1/models; chat through the model's own chat template, whole and streamed
(with usage), equal to each other and to the answer the gRPC test expects;
completions from token ids equal to `tandem generate --local`; stop strings;
n samples (seeded: each the single request with seed + j) and batches of prompts;
an API key (401 without it on /v1/, /health open); --reasoning-parser (a second pair);
a LoRA adapter served beside the model (--lora-modules, a third pair), and
another loaded and unloaded while it serves (/v1/load_lora_adapter);
structured outputs (a JSON schema, any object, a choice) and forced tool calls;
errors (400 naming the field, 404 for another model, 503-free health;
malformed bodies refused without harm to the worker); a
client that disconnects mid-stream frees its KV blocks at once; 24
concurrent streams all complete. Stops both workers with SIGTERM (exit 0).

    python tests/integration/openai_client_test.py BIN_DIR MODEL.gguf
(python: a venv with `openai`, made by scripts/test.sh as build/openai-venv)
"""
import json
import math
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

import openai

from pair import Pair

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "fixtures"))
from make_lora_adapter import write_lora_adapter  # noqa: E402


def http_get(url, timeout=5):
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except OSError:
        return None, ""


def http_post(url, body, timeout=30, key="key-two"):
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = "Bearer " + key
    req = urllib.request.Request(url, data=body.encode(), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def metric(metrics_port, name):
    _, text = http_get(f"http://127.0.0.1:{metrics_port}/metrics")
    for line in text.splitlines():
        if line.startswith(name + " ") or line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def expect_error(kind, fn, needle):
    try:
        fn()
    except kind as e:
        assert needle in str(e), (needle, str(e))
        return e
    raise AssertionError(f"expected {kind.__name__} naming {needle!r}")


def main():
    bin_dir, model = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp(prefix="tandem_openai_")
    # Every /v1/ request below carries an API key: the second of two the
    # decode worker takes from $TANDEM_API_KEY.
    os.environ["TANDEM_API_KEY"] = "key-one,key-two"
    # --max-logprobs on both workers (the prefill worker samples the first
    # token with its logprobs).
    pair = Pair(bin_dir, model, out, ["--served-model-name=smollm2,smollm2-alias", "--max-logprobs=32"],
                ["--max-logprobs=32"])
    dm = pair.metrics_port
    passed = 0
    try:
        base = f"http://127.0.0.1:{pair.http_port}"
        # SERVING: the engine is up and a prefill worker usable.
        pair.wait(lambda: http_get(base + "/health")[0] == 200,
                  "the decode worker's /health never answered 200")
        client = openai.OpenAI(base_url=base + "/v1", api_key="key-two", max_retries=0, timeout=60)
        # Without the key, or with another, /v1/, /tokenize and /detokenize
        # are refused (as vLLM's --api-key); /health and /metrics stay open.
        stranger = openai.OpenAI(base_url=base + "/v1", api_key="key-three", max_retries=0, timeout=60)
        expect_error(openai.AuthenticationError, lambda: stranger.models.list(), "API key")
        expect_error(openai.AuthenticationError, lambda: openai.OpenAI(
            base_url=base + "/v1", api_key="key-t", max_retries=0).models.list(), "API key")
        status, text = http_post(base + "/v1/completions", '{"prompt": "hi"}', key=None)
        assert status == 401 and json.loads(text)["error"]["type"] == "authentication_error", (status, text)
        assert http_post(base + "/tokenize", '{"prompt": "hi"}', key=None)[0] == 401
        assert http_post(base + "/tokenize", '{"prompt": "hi"}')[0] == 200
        # /metrics on the API port too (as vLLM's): the inference gateway's
        # endpoint picker scrapes the InferencePool's target port.
        status, text = http_get(base + "/metrics")
        assert status == 200 and 'vllm:num_requests_waiting{model_name="smollm2"}' in text, (status, text[:300])

        models = client.models.list().data
        assert [m.id for m in models] == ["smollm2", "smollm2-alias"], models
        # A second served name is a name requests may give; the reply names it.
        aliased = client.chat.completions.create(model="smollm2-alias", max_tokens=2,
                                                 messages=[{"role": "user", "content": "Hi"}])
        assert aliased.model == "smollm2-alias", aliased
        extra = models[0].model_extra
        assert extra["max_model_len"] > 0 and extra["vocab_size"] == 49152, extra
        passed += 1

        question = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model="smollm2", messages=question,
                                               temperature=0, max_tokens=64)
        answer = whole.choices[0].message.content
        assert answer == "The capital of France is Paris.", answer
        assert whole.choices[0].finish_reason == "stop", whole
        assert whole.usage.prompt_tokens == 37 and whole.usage.completion_tokens == 8, whole.usage
        # vLLM's continue_final_message: the reply continues a prefilled start.
        cont = client.chat.completions.create(
            model="smollm2", temperature=0, max_tokens=64,
            messages=question + [{"role": "assistant", "content": "The capital of France"}],
            extra_body={"continue_final_message": True, "add_generation_prompt": False})
        assert cont.choices[0].message.content == " is Paris.", cont
        parts, usage, finish = [], None, None
        for chunk in client.chat.completions.create(model="smollm2", messages=question,
                                                    temperature=0, max_tokens=64, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                parts.append(choice.delta.content or "")
                finish = choice.finish_reason or finish
        assert "".join(parts) == answer and finish == "stop", (parts, finish)
        assert usage.total_tokens == 45, usage
        # The same prompt again: its full blocks came from the prefix cache.
        assert 0 < usage.prompt_tokens_details.cached_tokens < usage.prompt_tokens, usage
        # vLLM's cache_salt: a salted request shares cached blocks only with
        # requests of its salt, on both workers (the prefill worker's cache
        # holds the unsalted prompt too); the answer is the same.
        def salted(salt):
            return client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                                  max_tokens=64, extra_body={"cache_salt": salt})
        for salt in ("tenant-a", "tenant-b"):
            hits = metric(pair.prefill_metrics_port, "tandem_prefix_cache_hits_total")
            first = salted(salt)
            assert first.usage.prompt_tokens_details.cached_tokens == 0, (salt, first.usage)
            assert metric(pair.prefill_metrics_port, "tandem_prefix_cache_hits_total") == hits, salt
            assert first.choices[0].message.content == answer, first
            again = salted(salt)
            assert 0 < again.usage.prompt_tokens_details.cached_tokens, (salt, again.usage)
            assert again.choices[0].message.content == answer, again
        expect_error(openai.BadRequestError, lambda: salted(""),
                     "Parameter 'cache_salt' must be a non-empty string if provided.")
        passed += 1

        # The Responses API: the same answer as a response object, whole and
        # as its events (created, the text's deltas, completed with usage).
        response = client.responses.create(model="smollm2", input="What is the capital of France?",
                                           temperature=0, max_output_tokens=64)
        assert response.id.startswith("resp_") and response.status == "completed", response
        assert response.output_text == answer, response
        assert response.usage.input_tokens == 37 and response.usage.output_tokens == 8, response.usage
        events = list(client.responses.create(model="smollm2", input=question, temperature=0,
                                              max_output_tokens=64, stream=True))
        types = [e.type for e in events]
        assert types[:2] == ["response.created", "response.in_progress"], types
        assert types[-1] == "response.completed", types
        assert [e.sequence_number for e in events] == list(range(len(events))), events
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert len(deltas) > 1 and "".join(deltas) == answer, deltas
        assert events[-1].response.output_text == answer and events[-1].response.usage.total_tokens == 45
        cut = client.responses.create(model="smollm2", input=question, temperature=0, max_output_tokens=3)
        assert cut.status == "incomplete" and cut.incomplete_details.reason == "max_output_tokens", cut
        expect_error(openai.BadRequestError, lambda: client.responses.create(
            model="smollm2", input="hi", previous_response_id="resp_x"), "stores no responses")
        passed += 1

        # Completions from token ids: the tokens `tandem generate --local` makes.
        prompt = [504, 3575, 282, 4649, 314]
        local = subprocess.run([f"{bin_dir}/tandem", "generate", "--local", f"--model={model}",
                                "--cudagraph-mode=NONE", "--ignore-eos", "--max-tokens=10",
                                "--prompt-token-ids=" + ",".join(map(str, prompt))],
                               capture_output=True, text=True, check=True)
        expected_ids = [int(t) for t in local.stdout.splitlines()[0].split(",")]
        req = urllib.request.Request(base + "/detokenize", data=json.dumps({"tokens": expected_ids}).encode(),
                                     headers={"Authorization": "Bearer key-two"})
        expected_text = json.load(urllib.request.urlopen(req))["prompt"]
        comp = client.completions.create(model="smollm2", prompt=prompt, max_tokens=10, temperature=0,
                                         extra_body={"ignore_eos": True})
        assert comp.choices[0].text == expected_text, (comp.choices[0].text, expected_text)
        assert comp.choices[0].finish_reason == "length" and comp.usage.completion_tokens == 10, comp
        streamed = "".join(c.choices[0].text for c in client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=10, temperature=0, stream=True,
            extra_body={"ignore_eos": True}) if c.choices)
        assert streamed == expected_text, (streamed, expected_text)
        passed += 1

        stopped = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                                 max_tokens=64, stop=[" Paris"])
        assert stopped.choices[0].message.content == "The capital of France is", stopped
        assert stopped.choices[0].finish_reason == "stop", stopped
        kept = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                              max_tokens=64, stop=[" Paris"],
                                              extra_body={"include_stop_str_in_output": True})
        assert kept.choices[0].message.content == "The capital of France is Paris", kept
        # vLLM's stop_reason: the stop string, a stop id other than the
        # tokenizer's eos token, or null (that eos token, the length limit).
        assert stopped.choices[0].model_extra["stop_reason"] == " Paris", stopped
        plain = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                               max_tokens=64, extra_body={"return_token_ids": True})
        ids, eos = plain.choices[0].model_extra["token_ids"], plain.choices[0].model_extra["token_ids"][-1]
        assert plain.choices[0].model_extra["stop_reason"] is None, plain
        by_id = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                               max_tokens=64, extra_body={"stop_token_ids": [ids[3]]})
        assert by_id.choices[0].model_extra["stop_reason"] == ids[3], by_id
        assert by_id.usage.completion_tokens == 4, by_id
        # The eos token among stop_token_ids with ignore_eos: a stop id then.
        as_stop = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                                 max_tokens=64, extra_body={"ignore_eos": True,
                                                                            "stop_token_ids": [eos]})
        assert as_stop.choices[0].model_extra["stop_reason"] == eos, as_stop
        cut = client.completions.create(model="smollm2", prompt=prompt, max_tokens=3, temperature=0,
                                        extra_body={"ignore_eos": True})
        assert cut.choices[0].finish_reason == "length", cut
        assert cut.choices[0].model_extra["stop_reason"] is None, cut
        last = [c for c in client.chat.completions.create(
            model="smollm2", messages=question, temperature=0, max_tokens=64, stop=[" Paris"],
            stream=True) if c.choices][-1].choices[0]
        assert last.finish_reason == "stop" and last.model_extra["stop_reason"] == " Paris", last
        # min_tokens: the stop string inside the first 8 tokens' text and the
        # EOS at the 8th are passed over.
        longer = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                                max_tokens=24, stop=[" Paris"],
                                                extra_body={"min_tokens": 8})
        assert longer.usage.completion_tokens >= 8, longer
        assert longer.choices[0].message.content.startswith(answer), longer
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, max_tokens=4, extra_body={"min_tokens": 5}),
            "min_tokens (5) must be at most max_tokens (4)")
        passed += 1

        # vLLM's sampling extensions, through the pair (the prefill worker
        # samples the first token, so it must get them too). A +100 bias
        # makes every token the biased one, the first included.
        biased = client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=5, temperature=0, logit_bias={"504": 100},
            extra_body={"ignore_eos": True, "return_token_ids": True})
        assert biased.choices[0].model_extra["token_ids"] == [504] * 5, biased
        # allowed_token_ids: only those, the first token (the prefill
        # worker's) included, whatever the bias says of another.
        allowed = client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=8, temperature=1.0, seed=3, logit_bias={"29": 100},
            extra_body={"allowed_token_ids": [504, 3575, 282], "ignore_eos": True, "return_token_ids": True})
        got = allowed.choices[0].model_extra["token_ids"]
        assert len(got) == 8 and set(got) <= {504, 3575, 282}, allowed
        # bad_words (vLLM's): the greedy answer's word never comes, its first
        # token (the prefill worker's) included.
        free = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=0)
        assert "Paris" in free.choices[0].text, free
        banned = client.completions.create(model="smollm2", prompt=prompt, max_tokens=12, temperature=0,
                                           extra_body={"bad_words": ["Paris"]})
        assert "Paris" not in banned.choices[0].text and banned.choices[0].text, banned
        # min_p = 1 keeps only the most likely token: sampling is greedy.
        top_only = client.chat.completions.create(model="smollm2", messages=question, max_tokens=64,
                                                  temperature=1.0, seed=5, extra_body={"min_p": 1.0})
        assert top_only.choices[0].message.content == answer, top_only
        # Seed 0 is a seed: the same sampled text twice, through the pair.
        zero = [client.completions.create(model="smollm2", prompt=prompt, max_tokens=24, temperature=1.0,
                                          seed=0).choices[0].text for _ in range(2)]
        assert zero[0] == zero[1], zero
        # A strong penalty on repeats changes a greedy answer that repeats.
        count = [{"role": "user", "content": "Count from 1 to 20, separated by commas."}]
        free = client.chat.completions.create(model="smollm2", messages=count, temperature=0,
                                              max_tokens=40)
        for penalty in ({"frequency_penalty": 2.0}, {"extra_body": {"repetition_penalty": 2.0}}):
            penalized = client.chat.completions.create(model="smollm2", messages=count,
                                                       temperature=0, max_tokens=40, **penalty)
            assert penalized.choices[0].message.content != free.choices[0].message.content, penalty
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, frequency_penalty=2.5),
            "frequency_penalty must be in [-2, 2], got 2.5")
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, extra_body={"repetition_penalty": 0}),
            "repetition_penalty must be a number > 0")
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, logit_bias={"99999999": 1}),
            "logit_bias names token 99999999, outside the vocabulary [0, 49152)")
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, extra_body={"guided_grammar": "root ::= root \"a\" | \"a\""}),
            'rule "root" is left-recursive')
        # vLLM's priority, refused by a pair scheduling first come, first served.
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, extra_body={"priority": 1}),
            "priority is 1, but priority scheduling is not enabled")
        passed += 1

        # Structured outputs through the pair (the prefill worker samples the
        # first token under the same grammar): a JSON schema, whole and
        # streamed; any object, sampled, n times; a choice; a schema refused.
        person = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                  "age": {"type": "integer"}, "city": {"enum": ["Paris", "Lyon"]}},
                  "required": ["name", "age", "city"]}
        ask = [{"role": "user", "content": "Describe a person who lives in France, as JSON."}]
        fmt = {"type": "json_schema", "json_schema": {"name": "person", "schema": person}}
        # Once first, so that the two compared below both find the prompt's
        # full blocks in the prefix cache and compute the same rest: greedy
        # tokens are not promised equal between a prompt computed whole and
        # one computed after a cache hit (different row counts take different
        # kernels, whose roundings differ; vLLM is not batch-invariant either).
        client.chat.completions.create(model="smollm2", messages=ask, temperature=0,
                                       max_tokens=80, response_format=fmt)
        made = client.chat.completions.create(model="smollm2", messages=ask, temperature=0,
                                              max_tokens=80, response_format=fmt)
        assert made.choices[0].finish_reason == "stop", made
        value = json.loads(made.choices[0].message.content)
        assert set(value) == {"name", "age", "city"} and isinstance(value["age"], int), value
        assert isinstance(value["name"], str) and len(value["name"]) <= 20, value
        assert value["city"] in ("Paris", "Lyon"), value
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="smollm2", messages=ask, temperature=0, max_tokens=80, response_format=fmt,
            stream=True) if c.choices)
        assert streamed == made.choices[0].message.content, (streamed, made)
        # Sampled at 0.7: at 1.0 this 135M model's objects ran past the token
        # budget for some seeds and kernels (all three cut at 120 tokens under
        # one build, none under another).
        objects = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "List three colors."}],
            temperature=0.7, seed=11, max_tokens=160, n=3, response_format={"type": "json_object"})
        for choice in objects.choices:
            if choice.finish_reason == "stop":
                assert isinstance(json.loads(choice.message.content), dict), choice
        assert any(c.finish_reason == "stop" for c in objects.choices), objects
        yes_no = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Is Paris in France?"}],
            temperature=1.0, seed=2, max_tokens=10, extra_body={"structured_outputs": {"choice": ["yes", "no"]}})
        assert yes_no.choices[0].message.content in ("yes", "no"), yes_no
        # A regex (vLLM's guided_regex / structured_outputs.regex), sampled:
        # the whole text fully matches it, its first token (the prefill
        # worker's) included; a schema's pattern holds a string's text.
        for body in ({"guided_regex": r"\d{3}-\d{4}"}, {"structured_outputs": {"regex": r"\d{3}-\d{4}"}}):
            phone = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "A phone number?"}], temperature=1.0,
                seed=5, max_tokens=20, extra_body=body)
            assert phone.choices[0].finish_reason == "stop", phone
            assert re.fullmatch(r"\d{3}-\d{4}", phone.choices[0].message.content), phone
        # A context-free grammar (vLLM's guided_grammar /
        # structured_outputs.grammar, GBNF), sampled and streamed: the whole
        # text is a sentence of it, its first token (the prefill worker's)
        # included.
        cities = 'root ::= city (", " city){0,2}\ncity ::= "Paris" | "Lyon" | "Nice" | "Lille"  # French\n'
        sentence = r"(Paris|Lyon|Nice|Lille)(, (Paris|Lyon|Nice|Lille)){0,2}"
        for body in ({"guided_grammar": cities}, {"structured_outputs": {"grammar": cities}}):
            listed = client.chat.completions.create(
                model="smollm2", messages=[{"role": "user", "content": "Name French cities."}],
                temperature=1.0, seed=4, max_tokens=30, extra_body=body)
            assert listed.choices[0].finish_reason == "stop", listed
            assert re.fullmatch(sentence, listed.choices[0].message.content), listed
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Name French cities."}], temperature=1.0,
            seed=6, max_tokens=30, stream=True, extra_body={"guided_grammar": cities}) if chunk.choices)
        assert re.fullmatch(sentence, streamed), streamed
        dated = client.chat.completions.create(
            model="smollm2", messages=ask, temperature=1.0, seed=9, max_tokens=40,
            response_format={"type": "json_schema", "json_schema": {"name": "d", "schema": {
                "type": "object", "properties": {"date": {"type": "string", "pattern": r"^\d{4}-\d{2}-\d{2}$"}},
                "required": ["date"]}}})
        if dated.choices[0].finish_reason == "stop":
            assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", json.loads(dated.choices[0].message.content)["date"]), dated
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=ask, response_format={"type": "json_schema", "json_schema": {
                "name": "p", "schema": {"type": "string", "pattern": "(?<=a)b"}}}),
            "regex a (?...) group other than (?:...) and (?P<name>...) at offset 1 is not supported")
        # Forced tool calls (vLLM's named and required tool_choice): the reply
        # is held to the tools' schemas and comes back as the calls.
        weather = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"]}}}, {"type": "function", "function": {"name": "get_time"}}]
        where = [{"role": "user", "content": "What is the weather in Paris?"}]
        named = client.chat.completions.create(
            model="smollm2", messages=where, tools=weather, temperature=0, max_tokens=60,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
        calls = named.choices[0].message.tool_calls
        assert len(calls) == 1 and calls[0].function.name == "get_weather", named
        assert isinstance(json.loads(calls[0].function.arguments)["city"], str), named
        required = client.chat.completions.create(model="smollm2", messages=where, tools=weather,
                                                  temperature=0, max_tokens=120, tool_choice="required")
        calls = required.choices[0].message.tool_calls
        assert calls and all(c.function.name in ("get_weather", "get_time") for c in calls), required
        for c in calls:
            assert isinstance(json.loads(c.function.arguments), dict), required
        # Streamed, the required calls go out as they are generated too.
        pieces = [t for c in client.chat.completions.create(
            model="smollm2", messages=where, tools=weather, temperature=0, max_tokens=120, stream=True,
            tool_choice="required") for t in (c.choices[0].delta.tool_calls or [] if c.choices else [])]
        assert len(pieces) > len(calls), pieces
        assert [(t.index, t.function.name) for t in pieces if t.id] == [
            (i, c.function.name) for i, c in enumerate(calls)], (pieces, required)
        for i, c in enumerate(calls):
            assert "".join(t.function.arguments for t in pieces if t.index == i) == c.function.arguments, pieces
        streamed = [d for c in client.chat.completions.create(
            model="smollm2", messages=where, tools=weather, temperature=0, max_tokens=60, stream=True,
            tool_choice={"type": "function", "function": {"name": "get_weather"}})
            for d in (c.choices[0].delta.tool_calls or [] if c.choices else [])]
        # Streamed, a forced call's arguments come piece by piece (as vLLM's):
        # the first chunk names the call, each carries its index.
        assert len(streamed) > 1 and {d.index for d in streamed} == {0}, streamed
        assert streamed[0].function.name == "get_weather" and streamed[0].id, streamed
        assert all(d.id is None and d.function.name is None for d in streamed[1:]), streamed
        assert "".join(d.function.arguments for d in streamed) == \
            named.choices[0].message.tool_calls[0].function.arguments, streamed
        # The same call through the Responses API (its tools flat), whole and
        # streamed, then its output sent back as the next turn's input.
        flat = [{"type": "function", **t["function"]} for t in weather]
        called = client.responses.create(model="smollm2", input=where[0]["content"], tools=flat,
                                         temperature=0, max_output_tokens=60,
                                         tool_choice={"type": "function", "name": "get_weather"})
        fc = [o for o in called.output if o.type == "function_call"]
        assert len(fc) == 1 and fc[0].name == "get_weather", called
        assert fc[0].arguments == named.choices[0].message.tool_calls[0].function.arguments, called
        events = list(client.responses.create(model="smollm2", input=where[0]["content"], tools=flat,
                                              temperature=0, max_output_tokens=60, stream=True,
                                              tool_choice={"type": "function", "name": "get_weather"}))
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(done) == 1 and done[0].arguments == fc[0].arguments, events
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        assert len(deltas) > 1 and "".join(deltas) == fc[0].arguments, deltas
        assert events[-1].type == "response.completed", events
        turn = client.responses.create(model="smollm2", tools=flat, temperature=0, max_output_tokens=16,
                                       input=[{"role": "user", "content": where[0]["content"]},
                                              {"type": "function_call", "call_id": fc[0].call_id,
                                               "name": "get_weather", "arguments": fc[0].arguments},
                                              {"type": "function_call_output", "call_id": fc[0].call_id,
                                               "output": "sunny, 21 C"}])
        assert turn.status in ("completed", "incomplete") and turn.output, turn
        # With tools offered and left to the model (tool_choice auto), a reply
        # streams as it comes: held only from where a call may begin.
        offered = dict(model="smollm2", messages=question, tools=weather, temperature=0, max_tokens=32)
        whole = client.chat.completions.create(**offered)
        deltas = [c.choices[0].delta for c in client.chat.completions.create(stream=True, **offered) if c.choices]
        if whole.choices[0].message.tool_calls:
            calls = [t for d in deltas for t in (d.tool_calls or [])]
            assert [(t.index, t.function.name) for t in calls] == [
                (i, t.function.name) for i, t in enumerate(whole.choices[0].message.tool_calls)], (calls, whole)
        else:
            pieces = [d.content for d in deltas if d.content]
            assert len(pieces) > 1 and "".join(pieces) == whole.choices[0].message.content, (pieces, whole)
        # A call the model makes (tool_choice auto; the reply held here by a
        # regex to a Hermes block, then to a Mistral list) streams as it is
        # generated, as vLLM's parsers stream it: a first piece with its
        # index, id and name, then pieces of arguments that make the whole
        # reply's.
        for regex in (r'<tool_call>\n\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,11}"\}\}\n</tool_call>',
                      r'\[\{"name": "get_weather", "arguments": \{"city": "[A-Z][a-z]{1,11}"\}\}\]'):
            held = dict(offered, max_tokens=60, extra_body={"structured_outputs": {"regex": regex}})
            whole = client.chat.completions.create(**held)
            assert whole.choices[0].finish_reason == "tool_calls", whole
            call = whole.choices[0].message.tool_calls[0]
            assert call.function.name == "get_weather" and json.loads(call.function.arguments)["city"], whole
            chunks = [c.choices[0] for c in client.chat.completions.create(stream=True, **held) if c.choices]
            pieces = [t for c in chunks for t in (c.delta.tool_calls or [])]
            assert len(pieces) > 2 and {t.index for t in pieces} == {0}, pieces
            assert pieces[0].id and pieces[0].function.name == "get_weather", pieces
            assert all(t.id is None and t.function.name is None for t in pieces[1:]), pieces
            assert "".join(t.function.arguments for t in pieces) == call.function.arguments, (pieces, whole)
            assert chunks[-1].finish_reason == "tool_calls", chunks[-1]
        # parallel_tool_calls false keeps a reply's first call only (as
        # vLLM's), whole and streamed.
        two = dict(offered, max_tokens=200, parallel_tool_calls=False, extra_body={"structured_outputs": {
            "regex": r'(<tool_call>\n\{"name": "get_(weather|time)", "arguments": \{\}\}\n</tool_call>\n){2}'}})
        whole = client.chat.completions.create(**two)
        assert whole.choices[0].message.tool_calls and len(whole.choices[0].message.tool_calls) == 1, whole
        pieces = [t for c in client.chat.completions.create(stream=True, **two) if c.choices
                  for t in (c.choices[0].delta.tool_calls or [])]
        assert pieces and {t.index for t in pieces} == {0}, pieces
        assert "".join(t.function.arguments for t in pieces) == "{}", pieces
        # The Responses API streams it as a function_call item's argument
        # deltas (the reply held here to a bare Llama-style JSON call).
        bare = {"type": "object", "additionalProperties": False, "required": ["name", "parameters"],
                "properties": {"name": {"const": "get_weather"}, "parameters": {
                    "type": "object", "additionalProperties": False, "required": ["city"],
                    "properties": {"city": {"type": "string", "maxLength": 12}}}}}
        ask_bare = dict(model="smollm2", input=where[0]["content"], tools=flat, temperature=0,
                        max_output_tokens=60, text={"format": {"type": "json_schema", "name": "call",
                                                               "schema": bare}})
        whole = client.responses.create(**ask_bare)
        fc = [o for o in whole.output if o.type == "function_call"]
        assert len(fc) == 1 and fc[0].name == "get_weather", whole
        events = list(client.responses.create(stream=True, **ask_bare))
        deltas = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
        done = [e for e in events if e.type == "response.function_call_arguments.done"]
        assert len(deltas) > 1 and "".join(deltas) == fc[0].arguments, (deltas, whole)
        assert len(done) == 1 and done[0].arguments == fc[0].arguments, events
        assert events[-1].type == "response.completed", events
        passed += 1

        # Log-probabilities (vLLM's raw ones), the first token's from the
        # prefill worker. Greedy: each token is its position's most likely.
        scored = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                                max_tokens=64, logprobs=True, top_logprobs=3)
        content = scored.choices[0].logprobs.content
        assert len(content) == scored.usage.completion_tokens, (len(content), scored.usage)
        assert scored.choices[0].message.content == answer, scored
        assert "".join(e.token for e in content[:-1]) == answer, content  # then <|im_end|>
        for e in content:
            top = e.top_logprobs
            assert len(top) == 3 and top[0].token == e.token and top[0].logprob == e.logprob, e
            assert top[0].logprob >= top[1].logprob >= top[2].logprob, e
            assert sum(math.exp(t.logprob) for t in top) <= 1 + 1e-4, e
            assert bytes(e.bytes) == e.token.encode(), e
        streamed = []
        for chunk in client.chat.completions.create(model="smollm2", messages=question,
                                                    temperature=0, max_tokens=64, stream=True,
                                                    logprobs=True):
            for choice in chunk.choices:
                if choice.logprobs is not None:
                    streamed += choice.logprobs.content
        assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
        # vLLM's return_tokens_as_token_ids: the same entries, each token
        # named "token_id:N" (its bytes that string's); the reply's text as it was.
        as_ids = client.chat.completions.create(
            model="smollm2", messages=question, temperature=0, max_tokens=64, logprobs=True,
            top_logprobs=3, extra_body={"return_tokens_as_token_ids": True, "return_token_ids": True})
        assert as_ids.choices[0].message.content == answer, as_ids
        named = as_ids.choices[0].logprobs.content
        ids_out = as_ids.choices[0].model_extra["token_ids"]
        assert [e.token for e in named] == [f"token_id:{i}" for i in ids_out], (named, ids_out)
        assert [e.logprob for e in named] == [e.logprob for e in content], named
        for e in named:
            assert bytes(e.bytes) == e.token.encode(), e
            assert all(re.fullmatch(r"token_id:\d+", t.token) for t in e.top_logprobs), e
        comp = client.completions.create(model="smollm2", prompt=prompt, max_tokens=10,
                                         temperature=0, logprobs=2, extra_body={"ignore_eos": True})
        lp = comp.choices[0].logprobs
        assert "".join(lp.tokens) == comp.choices[0].text and len(lp.token_logprobs) == 10, lp
        for i, token in enumerate(lp.tokens):
            assert token in lp.top_logprobs[i] and len(lp.top_logprobs[i]) <= 3, lp
            assert lp.top_logprobs[i][token] == max(lp.top_logprobs[i].values()), lp
            if i > 0:
                assert lp.text_offset[i] == lp.text_offset[i - 1] + len(lp.tokens[i - 1]), lp
        as_ids = client.completions.create(
            model="smollm2", prompt=prompt, max_tokens=10, temperature=0, logprobs=2,
            extra_body={"ignore_eos": True, "return_tokens_as_token_ids": True,
                        "return_token_ids": True})
        named = as_ids.choices[0].logprobs
        assert as_ids.choices[0].text == comp.choices[0].text, as_ids
        assert named.tokens == [f"token_id:{i}" for i in as_ids.choices[0].model_extra["token_ids"]]
        assert named.token_logprobs == lp.token_logprobs, (named, lp)
        for i, token in enumerate(named.tokens):
            assert named.top_logprobs[i][token] == named.token_logprobs[i], named
            if i > 0:
                assert named.text_offset[i] == named.text_offset[i - 1] + len(named.tokens[i - 1])
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, top_logprobs=2), "top_logprobs needs logprobs=true")
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, logprobs=True, top_logprobs=33),
            "top_logprobs must be in [0, 32], got 33")
        # Up to --max-logprobs of them (vLLM's), the first token's from the
        # prefill worker, which has the flag too.
        wide = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                              max_tokens=3, logprobs=True, top_logprobs=32)
        assert [len(e.top_logprobs) for e in wide.choices[0].logprobs.content] == [32] * 3, wide
        # The prompt's logprobs, as lm-eval's loglikelihood requests read them:
        # a batch of token-id prompts with echo, logprobs=1 and max_tokens=1;
        # token_logprobs covers the prompt (its first token none) and then the
        # output, and the prompt's last entry is the logprob of that token
        # forced after the prompt cut before it (through the prefill worker).
        ids = [[504, 3575, 282, 4649, 314], [19556, 905, 28, 549]]
        scored = client.completions.create(model="smollm2", prompt=ids, max_tokens=1, temperature=0,
                                           logprobs=1, echo=True, seed=1234)
        assert len(scored.choices) == 2, scored
        for choice, p in zip(sorted(scored.choices, key=lambda c: c.index), ids):
            lp = choice.logprobs
            assert len(lp.token_logprobs) == len(p) + 1 and len(lp.tokens) == len(p) + 1, lp
            assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None, lp
            assert all(x is not None and x <= 0 for x in lp.token_logprobs[1:]), lp
            for i in range(1, len(p) + 1):
                assert lp.top_logprobs[i][lp.tokens[i]] == lp.token_logprobs[i], lp
                assert len(lp.top_logprobs[i]) <= 2, lp
            assert "".join(lp.tokens) == choice.text, (lp.tokens, choice.text)
            vllm = choice.model_extra["prompt_logprobs"]
            assert vllm[0] is None and len(vllm) == len(p), vllm
            for i in range(1, len(p)):
                entry = vllm[i][str(p[i])]
                assert entry["logprob"] == lp.token_logprobs[i] and entry["rank"] >= 1, vllm
            forced = client.completions.create(model="smollm2", prompt=p[:-1], max_tokens=1,
                                               temperature=0, logprobs=0, logit_bias={str(p[-1]): 100})
            assert abs(forced.choices[0].logprobs.token_logprobs[0] - lp.token_logprobs[len(p) - 1]) < 1e-3, \
                (forced.choices[0].logprobs, lp)
        # max_tokens 0 with echo (vLLM's; older harnesses score prompts so):
        # the prompt alone, whole and streamed.
        alone = client.completions.create(model="smollm2", prompt=ids[0], max_tokens=0, logprobs=1, echo=True)
        lp = alone.choices[0].logprobs
        assert lp.tokens == scored.choices[0].logprobs.tokens[:len(ids[0])], (lp, scored)
        assert lp.token_logprobs[0] is None and all(
            abs(a - b) < 1e-4 for a, b in zip(lp.token_logprobs[1:], scored.choices[0].logprobs.token_logprobs[1:])), \
            (lp, scored)
        assert len(lp.token_logprobs) == len(ids[0]), lp
        assert alone.choices[0].text == "".join(lp.tokens) and alone.usage.completion_tokens == 0, alone
        streamed = [c for c in client.completions.create(model="smollm2", prompt=ids[0], max_tokens=0, echo=True,
                                                         stream=True) if c.choices]
        assert "".join(c.choices[0].text for c in streamed) == alone.choices[0].text, streamed
        # vLLM's prompt_logprobs for chat, beside the choices; not with stream.
        chat_scored = client.chat.completions.create(model="smollm2", messages=question, max_tokens=2,
                                                     extra_body={"prompt_logprobs": 2})
        prompt_lps = chat_scored.model_extra["prompt_logprobs"]
        assert prompt_lps[0] is None and len(prompt_lps) == chat_scored.usage.prompt_tokens, prompt_lps
        assert all(1 <= len(e) <= 3 for e in prompt_lps[1:]), prompt_lps
        expect_error(openai.BadRequestError, lambda: client.completions.create(
            model="smollm2", prompt="hi", stream=True, extra_body={"prompt_logprobs": 1}),
            "prompt_logprobs are not available with stream=true")
        expect_error(openai.BadRequestError, lambda: client.completions.create(
            model="smollm2", prompt="hi", extra_body={"prompt_logprobs": 33}),
            "prompt_logprobs must be in [0, 32], got 33")
        # They are computed by the decode worker itself.
        _, text = http_get(f"http://127.0.0.1:{dm}/metrics")
        local = [line for line in text.splitlines()
                 if line.startswith("tandem_prefill_local_total{") and 'reason="prompt_logprobs"' in line]
        assert local and float(local[0].rsplit(" ", 1)[1]) >= 3, local
        passed += 1

        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, temperature=-1), "temperature")
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=question, n=129), "n must be in [1, 128], got 129")
        expect_error(openai.BadRequestError, lambda: client.chat.completions.create(
            model="smollm2", messages=[]), "messages")
        expect_error(openai.BadRequestError, lambda: client.completions.create(
            model="smollm2", prompt="hi", max_tokens=10**7), "max_tokens")
        expect_error(openai.NotFoundError, lambda: client.chat.completions.create(
            model="gpt-4o", messages=question), "The model `gpt-4o` does not exist")
        passed += 1

        # Bodies no SDK sends, each of which once ended the decode worker (an
        # exception out of the handler, or a stack overflow): a 400 naming
        # the field, and the worker serves on.
        deep = "[" * 100000 + "]" * 100000
        for path, body, needle in [
                ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "response_format": 5}',
                 "response_format must be an object"),
                ("/v1/chat/completions", '{"messages": [{"role": "user", "content": [{"type": 5, "text": "x"}]}]}',
                 "only text parts"),
                ("/v1/chat/completions", '{"messages": [{"role": "user", "content": "hi"}], "tools": [5]}',
                 "tools[0] must be an object"),
                ("/v1/completions", '{"prompt": "hi", "temperature": ' + deep + '}', "nest more than 128 deep"),
                ("/v1/completions", '{"prompt": [1, 4294967297]}', "prompt[1] must be a token id"),
                ("/detokenize", '{"tokens": [-1]}', "tokens[0] must be a token id")]:
            status, text = http_post(base + path, body)
            assert status == 400 and needle in json.loads(text)["error"]["message"], (body[:80], status, text)
        assert http_get(base + "/health")[0] == 200, "the decode worker did not survive a malformed body"
        passed += 1

        # n samples (vLLM's parallel sampling): sample j draws with seed + j,
        # so it is the single request with that seed; the prompt counts once.
        story = [{"role": "user", "content": "Tell me a story about a fox"}]
        # Once first, so that every request compared below finds the prompt's
        # full blocks in the prefix cache and computes the same rest (see the
        # structured outputs above: a prompt computed whole takes other
        # kernels than its rest after a cache hit, and a sampled token can
        # flip between them). The three samples' rests, prefilled together,
        # stay within the row count whose results are the same bits whatever
        # the batch (16, cpu::BlocksIntegerMaxRows() on AVX-512).
        warm = client.chat.completions.create(model="smollm2", messages=story, max_tokens=1).usage
        again = client.chat.completions.create(model="smollm2", messages=story, max_tokens=1).usage
        rest = again.prompt_tokens - again.prompt_tokens_details.cached_tokens
        assert 0 < rest and 3 * rest <= 16, (warm, again)
        three = client.chat.completions.create(model="smollm2", messages=story, temperature=0.8,
                                               seed=7, max_tokens=12, n=3)
        assert [c.index for c in three.choices] == [0, 1, 2], three
        texts = [c.message.content for c in three.choices]
        singles = [client.chat.completions.create(model="smollm2", messages=story, temperature=0.8,
                                                  seed=7 + j, max_tokens=12) for j in range(3)]
        assert texts == [one.choices[0].message.content for one in singles], (texts, singles)
        assert len(set(texts)) > 1, texts
        assert three.usage.prompt_tokens == singles[0].usage.prompt_tokens, three.usage
        assert three.usage.completion_tokens == sum(o.usage.completion_tokens for o in singles), three.usage
        parts, finishes, usage = {}, {}, None
        for chunk in client.chat.completions.create(model="smollm2", messages=story, temperature=0.8,
                                                    seed=7, max_tokens=12, n=3, stream=True,
                                                    stream_options={"include_usage": True}):
            if chunk.usage is not None:
                usage = chunk.usage
            for choice in chunk.choices:
                parts[choice.index] = parts.get(choice.index, "") + (choice.delta.content or "")
                if choice.finish_reason:
                    finishes[choice.index] = choice.finish_reason
        assert [parts[j] for j in range(3)] == texts and sorted(finishes) == [0, 1, 2], (parts, finishes)
        assert usage.total_tokens == three.usage.total_tokens, usage
        # A batch of prompts (as lm-eval sends them): one choice per prompt, in order.
        other = [504, 3575, 282, 4649, 314, 253]
        batch = client.completions.create(model="smollm2", prompt=[prompt, other], max_tokens=10,
                                          temperature=0, extra_body={"ignore_eos": True})
        alone = client.completions.create(model="smollm2", prompt=other, max_tokens=10, temperature=0,
                                          extra_body={"ignore_eos": True})
        assert [c.index for c in batch.choices] == [0, 1], batch
        assert [c.text for c in batch.choices] == [expected_text, alone.choices[0].text], batch
        assert batch.usage.prompt_tokens == len(prompt) + len(other), batch.usage
        assert metric(dm, "tandem_kv_cache_blocks_in_use") == 0
        passed += 1

        # A client that goes away mid-stream: its request (both of its
        # samples) is cancelled and every KV block it held is free at once.
        stream = client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": "Count from 1 to 500."}],
            temperature=0.8, seed=3, max_tokens=1500, stream=True, n=2,
            extra_body={"ignore_eos": True})
        seen = 0
        for chunk in stream:
            seen += 1
            if seen == 4:
                assert metric(dm, "tandem_kv_cache_blocks_in_use") > 0
                break
        stream.close()
        end = time.time() + 10
        while time.time() < end and metric(dm, "tandem_kv_cache_blocks_in_use") != 0:
            time.sleep(0.05)
        assert metric(dm, "tandem_kv_cache_blocks_in_use") == 0, "KV blocks still held after a disconnect"
        passed += 1

        # What the Gateway API Inference Extension's endpoint picker scrapes.
        _, text = http_get(f"http://127.0.0.1:{dm}/metrics")
        for name in ("vllm:num_requests_waiting", "vllm:num_requests_running",
                     "vllm:kv_cache_usage_perc", "vllm:gpu_cache_usage_perc"):
            assert re.search(rf'^{name}{{model_name="smollm2"}} 0(\.0+)?$', text, re.M), (name, text)
        assert re.search(r'^vllm:cache_config_info{.*block_size="\d+".*} 1$', text, re.M), text
        passed += 1

        # Concurrent streams: every one completes with its own tokens.
        results = [None] * 24
        def run(i):
            text = "".join(c.choices[0].text for c in client.completions.create(
                model="smollm2", prompt=f"Story {i}:", max_tokens=16, temperature=0.7, seed=i,
                stream=True, extra_body={"ignore_eos": True}) if c.choices)
            results[i] = text
        threads = [threading.Thread(target=run, args=(i,)) for i in range(len(results))]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert all(r for r in results), results
        passed += 1
        print("openai client: answer", repr(answer), "completion", repr(expected_text))
    finally:
        codes = pair.stop(timeout=60)
    assert codes == [0, 0], f"workers exited with {codes}; logs in {out}"
    passed += reasoning(bin_dir, model, answer)
    passed += lora(bin_dir, model, answer)
    print(f"{passed} passed, 0 failed")


def lora(bin_dir, model, answer):
    """A pair with a LoRA adapter on both workers (--lora-modules): /v1/models
    lists it with the served model as parent; a chat naming it as its model is
    answered under its name, differently from the base model, whose answer is
    unchanged, whole and streamed alike; its completion from token ids equals
    `tandem generate --local` with the same adapter; the decode worker reports
    the adapters it runs (vllm:lora_requests_info, for the gateway). With
    --allow-runtime-lora-updating, /v1/load_lora_adapter and
    /v1/unload_lora_adapter answer as vLLM's: an adapter loaded under a second
    name answers as the first (the prefill worker has it too), is listed,
    then refused once unloaded."""
    out = tempfile.mkdtemp(prefix="tandem_lora_")
    adapter = os.path.join(out, "adapter")
    write_lora_adapter(adapter)
    flags = [f"--lora-modules=sql-lora={adapter}", "--allow-runtime-lora-updating", "--max-loras=2"]
    pair = Pair(bin_dir, model, out, ["--served-model-name=smollm2"] + flags, flags)
    try:
        base = f"http://127.0.0.1:{pair.http_port}"
        pair.wait(lambda: http_get(base + "/health")[0] == 200,
                  "the decode worker's /health never answered 200")
        client = openai.OpenAI(base_url=base + "/v1", api_key="key-two", max_retries=0, timeout=60)
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"smollm2", "sql-lora"}, models
        assert models["sql-lora"].model_extra["parent"] == "smollm2", models["sql-lora"]
        question = [{"role": "user", "content": "What is the capital of France?"}]
        plain = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                               max_tokens=64)
        assert plain.choices[0].message.content == answer, plain
        tuned = client.chat.completions.create(model="sql-lora", messages=question, temperature=0,
                                               max_tokens=24)
        assert tuned.model == "sql-lora", tuned
        text = tuned.choices[0].message.content
        assert text and not answer.startswith(text), tuned
        streamed = ""
        for chunk in client.chat.completions.create(model="sql-lora", messages=question, temperature=0,
                                                    max_tokens=24, stream=True):
            for choice in chunk.choices:
                streamed += choice.delta.content or ""
        assert streamed == text, (streamed, text)
        ids = [1, 504, 3458, 282, 4649, 314]
        local = subprocess.run([f"{bin_dir}/tandem", "generate", "--local", f"--model={model}", *flags,
                                "--lora-name=sql-lora", "--cudagraph-mode=NONE", "--ignore-eos",
                                "--max-tokens=8", "--prompt-token-ids=" + ",".join(map(str, ids))],
                               capture_output=True, text=True, check=True)
        local_ids = [int(t) for t in local.stdout.splitlines()[0].split(",")]
        req = urllib.request.Request(base + "/detokenize", data=json.dumps({"tokens": local_ids}).encode(),
                                     headers={"Authorization": "Bearer key-two"})
        local_text = json.load(urllib.request.urlopen(req))["prompt"]
        completion = client.completions.create(model="sql-lora", prompt=ids, max_tokens=8, temperature=0,
                                               extra_body={"ignore_eos": True})
        assert completion.model == "sql-lora", completion
        assert completion.choices[0].text == local_text, (completion, local_text)
        plain_completion = client.completions.create(model="smollm2", prompt=ids, max_tokens=8, temperature=0,
                                                     extra_body={"ignore_eos": True})
        assert plain_completion.choices[0].text != local_text, plain_completion
        expect_error(openai.NotFoundError, lambda: client.chat.completions.create(
            model="other-lora", messages=question, max_tokens=4), "sql-lora")
        metrics = http_get(f"http://127.0.0.1:{pair.metrics_port}/metrics")[1]
        assert 'vllm:lora_requests_info{' in metrics and 'max_lora="2"' in metrics, metrics

        def post(path, body):
            return http_post(base + path, json.dumps(body))
        status, body = post("/v1/load_lora_adapter", {"lora_name": "sql-copy", "lora_path": adapter})
        assert (status, body) == (200, "Success: LoRA adapter 'sql-copy' added successfully."), (status, body)
        models = {m.id: m for m in client.models.list().data}
        assert set(models) == {"smollm2", "sql-lora", "sql-copy"}, models
        assert models["sql-copy"].model_extra["parent"] == "smollm2", models["sql-copy"]
        copy = client.chat.completions.create(model="sql-copy", messages=question, temperature=0,
                                              max_tokens=24)
        assert copy.model == "sql-copy" and copy.choices[0].message.content == text, (copy, text)
        status, body = post("/v1/load_lora_adapter", {"lora_name": "sql-copy", "lora_path": adapter})
        assert status == 409 and "has already been loaded" in body, (status, body)
        status, body = post("/v1/load_lora_adapter", {"lora_name": "third", "lora_path": adapter})
        assert status == 429 and "--max-loras" in body, (status, body)
        status, body = post("/v1/load_lora_adapter", {"lora_name": "third"})
        assert status == 400 and "Both 'lora_name' and 'lora_path' must be provided." in body, (status, body)
        status, body = post("/v1/load_lora_adapter", {"lora_name": "third", "lora_path": out + "/none"})
        assert status == 404 and "adapter_config.json" in body, (status, body)
        status, body = post("/v1/unload_lora_adapter", {"lora_name": "sql-copy"})
        assert (status, body) == (200, "Success: LoRA adapter 'sql-copy' removed successfully."), (status, body)
        assert {m.id for m in client.models.list().data} == {"smollm2", "sql-lora"}
        expect_error(openai.NotFoundError, lambda: client.chat.completions.create(
            model="sql-copy", messages=question, max_tokens=4), "sql-copy")
        status, body = post("/v1/unload_lora_adapter", {"lora_name": "sql-copy"})
        assert status == 404 and "cannot be found" in body, (status, body)
    finally:
        codes = pair.stop(timeout=60)
    assert codes == [0, 0], f"workers exited with {codes}; logs in {out}"
    return 1


def reasoning(bin_dir, model, answer):
    """A pair with --reasoning-parser: SmolLM2 never closes a <think>, so a
    whole reply is reasoning (as a reply cut by max_tokens would be), in
    `reasoning` and `reasoning_content`, whole and streamed; with thinking
    turned off it is content again. The same pair's decode worker takes its
    default sampling from a generation_config.json (--generation-config=DIR,
    temperature 0): requests that give no temperature are greedy."""
    out = tempfile.mkdtemp(prefix="tandem_reasoning_")
    config_dir = os.path.join(out, "generation_config")
    os.makedirs(config_dir)
    with open(os.path.join(config_dir, "generation_config.json"), "w") as f:
        json.dump({"temperature": 0.0, "top_k": 50}, f)
    pair = Pair(bin_dir, model, out, ["--served-model-name=smollm2", "--reasoning-parser=deepseek_r1",
                                      f"--generation-config={config_dir}"])
    try:
        base = f"http://127.0.0.1:{pair.http_port}"
        pair.wait(lambda: http_get(base + "/health")[0] == 200,
                  "the decode worker's /health never answered 200")
        assert "default sampling from the model's generation config: temperature=0 (" in pair.log("decode"), \
            pair.log("decode")
        poem = [{"role": "user", "content": "Write a short poem about the sea."}]
        plain = openai.OpenAI(base_url=base + "/v1", api_key="key-two", max_retries=0, timeout=60)
        greedy = plain.chat.completions.create(model="smollm2", messages=poem, temperature=0, max_tokens=32)
        for _ in range(2):  # no temperature: the file's 0, not the API's 1
            again = plain.chat.completions.create(model="smollm2", messages=poem, max_tokens=32)
            assert again.choices[0].message.model_extra["reasoning"] == \
                greedy.choices[0].message.model_extra["reasoning"], (again, greedy)
        client = openai.OpenAI(base_url=base + "/v1", api_key="key-two", max_retries=0, timeout=60)
        question = [{"role": "user", "content": "What is the capital of France?"}]
        whole = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                               max_tokens=64)
        message = whole.choices[0].message
        assert message.content is None, message
        assert message.model_extra["reasoning"] == answer, message
        assert message.model_extra["reasoning_content"] == answer, message
        streamed = ""
        for chunk in client.chat.completions.create(model="smollm2", messages=question,
                                                    temperature=0, max_tokens=64, stream=True):
            for choice in chunk.choices:
                assert not choice.delta.content, chunk
                streamed += (choice.delta.model_extra or {}).get("reasoning") or ""
        assert streamed == answer, streamed
        off = client.chat.completions.create(model="smollm2", messages=question, temperature=0,
                                             max_tokens=64,
                                             extra_body={"chat_template_kwargs": {"enable_thinking": False}})
        assert off.choices[0].message.content == answer, off
        assert "reasoning" not in (off.choices[0].message.model_extra or {}), off
    finally:
        codes = pair.stop(timeout=60)
    assert codes == [0, 0], f"workers exited with {codes}; logs in {out}"
    return 1


if __name__ == "__main__":
    main()
