"""Starts a prefill and a decode worker for the Python integration tests.

Every port is 0: each worker binds what the kernel gives it and logs it, and
the ports are read from the logs (as tests/integration/harness.cc does), so
tests that run in parallel never race for a port that a probe socket
released. A worker that exits during start-up fails the test at once with
its log.
"""
import os
import re
import signal
import subprocess
import sys
import time

START_UP_S = 180  # graph capture on a loaded 2-core CI machine, sanitizers off


class Pair:
    def __init__(self, bin_dir, model, out, decode_flags=(), prefill_flags=()):
        self.out = out
        self.prefill = self.decode = None
        try:
            self._start_both(bin_dir, model, decode_flags, prefill_flags)
        except BaseException:
            for proc in (self.decode, self.prefill):
                if proc is not None and proc.poll() is None:
                    proc.kill()
                    proc.wait()
            raise

    def _start_both(self, bin_dir, model, decode_flags, prefill_flags):
        self.prefill = self._start("prefill", [f"{bin_dir}/prefill_worker", f"--model={model}",
                                               *prefill_flags])
        ports = self._ports(self.prefill, "prefill", {
            "grpc": r"gRPC listening on [^ ]*:(\d+)",
            "metrics": r"metrics on http://[^ ]*:(\d+)/"})
        self.prefill_port, self.prefill_metrics_port = ports["grpc"], ports["metrics"]
        self.decode = self._start("decode", [
            f"{bin_dir}/decode_worker", f"--model={model}", "--http-address=127.0.0.1:0",
            f"--prefill-address=127.0.0.1:{self.prefill_port}", *decode_flags])
        ports = self._ports(self.decode, "decode", {
            "grpc": r"gRPC listening on [^ ]*:(\d+)",
            "metrics": r"metrics on http://[^ ]*:(\d+)/",
            "http": r"OpenAI API on http://[^ ]*:(\d+)/"})
        self.decode_port, self.metrics_port, self.http_port = (
            ports["grpc"], ports["metrics"], ports["http"])

    def _start(self, role, argv):
        log = open(os.path.join(self.out, role + ".log"), "w")
        argv += ["--grpc-address=127.0.0.1:0", "--metrics-address=127.0.0.1:0"]
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)

    def log(self, role):
        with open(os.path.join(self.out, role + ".log")) as f:
            return f.read()

    def stop_after_failure(self):
        """Prints both logs' tails (stderr), then stops both workers."""
        for role in ("decode", "prefill"):
            print(f"--- {role} log (tail) ---\n" + self.log(role)[-4000:], file=sys.stderr)
        self.stop(timeout=30)

    def check_running(self):
        for role, proc in (("prefill", self.prefill), ("decode", self.decode)):
            if proc is not None and proc.poll() is not None:
                raise RuntimeError(f"the {role} worker exited with {proc.returncode}; "
                                   f"its log:\n{self.log(role)}")

    def _ports(self, proc, role, patterns):
        end = time.time() + START_UP_S
        while time.time() < end:
            self.check_running()
            text = self.log(role)
            found = {k: re.search(p, text) for k, p in patterns.items()}
            if all(found.values()):
                return {k: int(m.group(1)) for k, m in found.items()}
            time.sleep(0.05)
        raise RuntimeError(f"the {role} worker never logged its ports; its log:\n{self.log(role)}")

    def wait(self, ready, what):
        """Polls ready() until it is true; fails with both logs after START_UP_S."""
        end = time.time() + START_UP_S
        while time.time() < end:
            self.check_running()
            if ready():
                return
            time.sleep(0.1)
        raise RuntimeError(f"{what} within {START_UP_S} s; prefill log:\n{self.log('prefill')}\n"
                           f"decode log:\n{self.log('decode')}")

    def stop(self, timeout):
        """SIGTERM to both (decode first); returns their exit codes."""
        codes = []
        for proc in (self.decode, self.prefill):
            if proc is None:
                continue
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
            codes.append(proc.wait(timeout=timeout))
        return codes
