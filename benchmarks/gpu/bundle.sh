#!/usr/bin/env bash
# Packs what the GPU figures need into one folder that runs on a GPU host
# without this build's Debian packages: the tandem CLI, the workers, the CUDA
# module, the CUDA tests (and backend_test, for its device tests), and every
# shared library they load except glibc's and CUDA's own (the GPU host brings
# those with its driver and toolkit).
#   benchmarks/gpu/bundle.sh [build dir] [out dir]   (defaults: build .gpu)
# It is packed as <out dir>.tar.xz (the libraries are over 100 MB unpacked).
# Then, on the GPU host: benchmarks/gpu/run.sh [out dir] (unpacks it).
set -euo pipefail
cd "$(dirname "$0")/../.."
build="${1:-build}"
out="${2:-.gpu}"
rm -rf "$out"
mkdir -p "$out/bin" "$out/lib"
bins=("$build/bin/tandem" "$build/bin/backend_test" "$build/bin/cuda_ops_test" "$build/bin/cuda_worker_test"
      "$build/bin/prefill_worker" "$build/bin/decode_worker")
for b in "${bins[@]}"; do
  [[ -x "$b" ]] || { echo "bundle: $b is missing: build first" >&2; exit 1; }
  cp "$b" "$out/bin/"
done
cp "$build/lib/libtandem_cuda.so" "$out/lib/"
# Libraries outside glibc and CUDA, resolved as this machine resolves them.
for f in "$out"/bin/* "$out"/lib/libtandem_cuda.so; do
  ldd "$f" | awk '/=> \//{print $3}'
done | sort -u | grep -Ev '/(libc|libm|libdl|libpthread|librt|ld-linux[^/]*|libcuda|libcudart|libcublas[^/]*|libnvidia[^/]*)\.so' |
  while read -r lib; do cp -L "$lib" "$out/lib/"; done
strip --strip-debug "$out"/bin/* "$out"/lib/*.so* 2>/dev/null || true
tar -C "$(dirname "$out")" -cf - "$(basename "$out")" | xz -T0 -6 > "$out.tar.xz"
rm -rf "$out"
mkdir -p "$out"
mv "$out.tar.xz" "$out/bundle.tar.xz"
du -sh "$out/bundle.tar.xz"
