#!/usr/bin/env python3
"""LangChain's tool loop (PyPI langchain-openai) against the pair's OpenAI API.

The standard round trip: the model is asked with a tool bound (its choice
forced, so a 135M model calls it), LangChain runs the tool and sends the
conversation back: the assistant turn as LangChain writes it (content null
beside tool_calls) and the tool's answer. That second request once failed
in the chat template ('str' + 'NoneType': 400). Every request body
LangChain sends is captured, so the test also proves the shape it sent.

    python tests/integration/langchain_tool_loop_test.py BIN_DIR MODEL.gguf
(python: the venv of scripts/openai_venv.sh)
"""
import json
import sys
import tempfile
import time
import urllib.request

import httpx
from langchain_core.messages import HumanMessage, ToolMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI

from pair import Pair


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


def main():
    bin_dir, model = sys.argv[1], sys.argv[2]
    out = tempfile.mkdtemp(prefix="langchain-")
    pair = Pair(bin_dir, model, out, ["--served-model-name=smollm2"])
    try:
        base = f"http://127.0.0.1:{pair.http_port}"

        def healthy():
            try:
                return urllib.request.urlopen(base + "/health", timeout=2).status == 200
            except OSError:
                return False

        pair.wait(healthy, "the decode worker's /health never answered 200")
        sent = []
        http_client = httpx.Client(event_hooks={"request": [lambda r: sent.append(json.loads(r.read()))]},
                                   timeout=60)
        llm = ChatOpenAI(base_url=base + "/v1", api_key="none", model="smollm2", temperature=0,
                         max_tokens=64, max_retries=0, http_client=http_client)
        messages = [HumanMessage("What is the weather in Paris?")]
        ai = llm.bind_tools([get_weather], tool_choice="get_weather").invoke(messages)
        assert ai.tool_calls and ai.tool_calls[0]["name"] == "get_weather", ai
        messages.append(ai)
        for call in ai.tool_calls:
            messages.append(ToolMessage(get_weather.invoke(call["args"]), tool_call_id=call["id"]))
        t = time.time()
        final = llm.bind_tools([get_weather]).invoke(messages)
        assert isinstance(final.content, str), final
        # What LangChain sent back: the assistant's turn with content null
        # and its tool call, then the tool's answer with the call's id.
        turn = sent[-1]["messages"]
        assert turn[1]["role"] == "assistant" and turn[1]["content"] is None, turn[1]
        assert turn[1]["tool_calls"][0]["id"] == turn[2]["tool_call_id"], turn
        assert turn[2]["role"] == "tool" and turn[2]["content"].startswith("sunny in"), turn[2]
        print(f"langchain_tool_loop_test: passed (call {ai.tool_calls[0]['args']}, "
              f"answer in {time.time() - t:.2f} s: {final.content[:60]!r})")
        codes = pair.stop(timeout=60)
        assert codes == [0, 0], f"exit codes {codes}"
    except BaseException:
        pair.stop_after_failure()
        raise


if __name__ == "__main__":
    main()
