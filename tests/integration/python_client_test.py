#!/usr/bin/python3
"""A client not written in C++: Debian's python3-grpcio against the pair.

Stubs are generated from proto/tandem/v1/tandem.proto at test time with
grpc_tools. Starts a prefill and a decode worker on loopback ports the kernel
picks (pair.py) with SmolLM2 (the GGUF of scripts/fetch_model.sh), sends a chat question as text
and reads the answer as text, streams a greedy generation from token ids and
checks it against `tandem generate --local` with --cudagraph-mode=NONE,
checks an INVALID_ARGUMENT, and stops both workers with SIGTERM (exit code 0).

    /usr/bin/python3 tests/integration/python_client_test.py BIN_DIR SOURCE_DIR MODEL.gguf
"""
import os
import subprocess
import sys
import tempfile

from pair import Pair


def main():
    bin_dir, source_dir, model = sys.argv[1], sys.argv[2], sys.argv[3]
    from grpc_tools import protoc
    import grpc

    out = tempfile.mkdtemp(prefix="tandem_py_")
    # The well-known types (google/protobuf/wrappers.proto) ship with grpc_tools.
    wkt = os.path.join(os.path.dirname(protoc.__file__), "_proto")
    rc = protoc.main(["protoc", f"-I{source_dir}/proto", f"-I{wkt}", f"--python_out={out}",
                      f"--grpc_python_out={out}", "tandem/v1/tandem.proto"])
    assert rc == 0, "protoc failed"
    sys.path.insert(0, out)
    from tandem.v1 import tandem_pb2, tandem_pb2_grpc

    pair = Pair(bin_dir, model, out)
    try:
        for port in (pair.prefill_port, pair.decode_port):  # both SERVING (graphs captured)
            pair.wait(lambda: subprocess.run([f"{bin_dir}/tandem", "health",
                                              f"--address=127.0.0.1:{port}"],
                                             capture_output=True).returncode == 0,
                      f"the worker on port {port} never became SERVING")
        dp = pair.decode_port
        channel = grpc.insecure_channel(f"127.0.0.1:{dp}")
        stub = tandem_pb2_grpc.DecodeStub(channel)
        question = ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                    "Hugging Face<|im_end|>\n<|im_start|>user\nWhat is the capital of France?"
                    "<|im_end|>\n<|im_start|>assistant\n")
        text_request = tandem_pb2.GenerateRequest(
            request_id="python-text", prompt=question,
            sampling=tandem_pb2.SamplingParams(max_tokens=64))
        answer = "".join(r.text for r in stub.Generate(text_request, timeout=60))
        assert answer == "The capital of France is Paris.", answer

        prompt = [504, 3575, 282, 4649, 314]
        request = tandem_pb2.GenerateRequest(
            request_id="python-1", prompt_token_ids=prompt,
            sampling=tandem_pb2.SamplingParams(max_tokens=10, ignore_eos=True))
        tokens, last = [], None
        for response in stub.Generate(request, timeout=60):
            tokens.extend(response.token_ids)
            last = response
        assert last.finish_reason == tandem_pb2.FINISH_REASON_LENGTH, last
        assert last.usage.prompt_tokens == len(prompt) and last.usage.completion_tokens == 10, last

        local = subprocess.run([f"{bin_dir}/tandem", "generate", "--local", f"--model={model}",
                                "--cudagraph-mode=NONE",
                                "--ignore-eos", "--max-tokens=10",
                                "--prompt-token-ids=" + ",".join(map(str, prompt))],
                               capture_output=True, text=True, check=True)
        expected = [int(t) for t in local.stdout.splitlines()[0].split(",")]
        assert tokens == expected, (tokens, expected)

        bad = tandem_pb2.GenerateRequest(request_id="python-2", prompt_token_ids=[],
                                         sampling=tandem_pb2.SamplingParams(max_tokens=4))
        try:
            list(stub.Generate(bad, timeout=10))
            raise AssertionError("empty prompt was accepted")
        except grpc.RpcError as e:
            assert e.code() == grpc.StatusCode.INVALID_ARGUMENT, e
            assert "prompt_token_ids" in e.details(), e.details()
        print("python client: answer", repr(answer), "tokens", tokens)
    finally:
        codes = pair.stop(timeout=30)
    assert codes == [0, 0], f"workers exited with {codes}"
    print("1 passed, 0 failed")


if __name__ == "__main__":
    main()
