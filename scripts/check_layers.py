#!/usr/bin/env python3
"""Fails when an #include crosses the layers the design allows.

graph <- backend <- kernels <- model <- engine <- serving <- workers/tools,
with base under everything, the tokenizer and chat templates beside the
model, and structured outputs' grammars under the engine; the two workers never include each other (they meet only over gRPC); the model sees
the kernel interface (ops.h), never a concrete backend; the generic backend
and kernel files never include the cpu/ or cuda/ ones.

Usage: scripts/check_layers.py [SOURCE_ROOT]
"""
import os
import re
import sys

BASE = {"common/base"}
ALLOWED = {
    "common/base": BASE,
    "common/graph": BASE | {"common/graph"},
    "common/backend": BASE | {"common/graph", "common/backend"},
    "common/kernels": BASE | {"common/graph", "common/backend", "common/kernels"},
    "common/tokenizer": BASE | {"common/tokenizer"},
    "common/chat": BASE | {"common/chat"},
    "common/structured": BASE | {"common/structured"},
    "common/model": BASE | {"common/graph", "common/backend", "common/kernels/ops.h", "common/model"},
    "common/engine": BASE | {"common/graph", "common/backend", "common/kernels", "common/model",
                             "common/structured", "common/engine"},
    "common/serving": {"common", "proto"},
    "prefill_worker": {"common", "proto", "prefill_worker"},
    "decode_worker": {"common", "proto", "decode_worker"},
    "tools": {"common", "proto", "tools"},
}
# Generic files of these folders must not reach into their backend subfolders.
GENERIC = {"common/backend": ("cpu/", "cuda/"), "common/kernels": ("cpu/", "cuda/")}
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def layer_of(path):
    for layer in sorted(ALLOWED, key=len, reverse=True):
        if path.startswith(layer + "/"):
            return layer
    return None


def allowed(layer, header):
    return any(header == a or header.startswith(a + "/") for a in ALLOWED[layer])


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    errors = []
    checked = 0
    for top in ("common", "prefill_worker", "decode_worker", "tools"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for name in files:
                if not name.endswith((".h", ".cc", ".cu")):
                    continue
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, root).replace(os.sep, "/")
                layer = layer_of(rel)
                if layer is None:
                    continue
                checked += 1
                sub = rel[len(layer) + 1:]
                for n, line in enumerate(open(full, encoding="utf-8"), 1):
                    m = INCLUDE.match(line)
                    if not m:
                        continue
                    header = m.group(1)
                    if not header.startswith(("common/", "proto/", "prefill_worker/",
                                              "decode_worker/", "tools/")):
                        continue  # third-party, generated relative, or system
                    if not allowed(layer, header):
                        errors.append(f"{rel}:{n}: {layer} may not include {header}")
                    for bad in GENERIC.get(layer, ()):
                        if "/" not in sub and header.startswith(f"{layer}/{bad}"):
                            errors.append(f"{rel}:{n}: generic {layer} code includes {header}")
    for e in errors:
        print(e)
    print(f"check_layers: {checked} files, {len(errors)} violations")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
