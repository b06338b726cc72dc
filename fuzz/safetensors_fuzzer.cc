// Safetensors files as --model=DIR meets them: the input is written as a
// model.safetensors (first byte 0) or, with a valid one-tensor shard beside
// it, as model.safetensors.index.json (first byte 1); the checkpoint is
// opened and every tensor read. Any input must end in a Status.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "common/model/safetensors.h"

namespace {

const std::filesystem::path& Dir() {
  static const std::filesystem::path dir = [] {
    auto d = std::filesystem::temp_directory_path() /
             ("tandem_safetensors_fuzz_" + std::to_string(getpid()));
    std::filesystem::create_directories(d);
    return d;
  }();
  return dir;
}

void Write(const std::filesystem::path& p, const uint8_t* data, size_t size) {
  std::ofstream(p, std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const auto& dir = Dir();
  std::filesystem::remove(dir / "model.safetensors");
  std::filesystem::remove(dir / "model.safetensors.index.json");
  if (data[0] == 1) {
    (void)tandem::WriteSafetensorsF32((dir / "shard.safetensors").string(),
                                      {{"w", {{2}, {1.f, 2.f}}}});
    Write(dir / "model.safetensors.index.json", data + 1, size - 1);
  } else {
    Write(dir / "model.safetensors", data + 1, size - 1);
  }
  auto ckpt = tandem::SafetensorsCheckpoint::Open(dir.string());
  if (!ckpt.ok()) return 0;
  std::vector<float> buf;
  for (const auto& [name, e] : ckpt->entries()) {
    int64_t n = 1;
    bool small = true;
    for (int64_t d : e.shape) {
      if (d < 0 || d > (1 << 20) || n * d > (1 << 20)) small = false;
      if (small) n *= d;
    }
    if (!small) continue;
    buf.resize(n);
    (void)ckpt->ReadF32(name, e.shape, buf.data());
  }
  return 0;
}
