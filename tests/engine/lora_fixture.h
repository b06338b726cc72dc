// Random PEFT LoRA adapters for tests/fixtures/tiny_llama, written to temporary
// directories (the engine's and the pair's LoRA tests).
#ifndef TANDEM_TESTS_ENGINE_LORA_FIXTURE_H_
#define TANDEM_TESTS_ENGINE_LORA_FIXTURE_H_

#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/model/safetensors.h"
#include "gtest/gtest.h"

namespace tandem::lora_fixture {

namespace fs = std::filesystem;

inline const std::string kBase = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tiny_llama";
// tiny_llama: hidden 64, 4 heads and 2 KV heads of 16, MLP 128, 2 layers.
constexpr int kLayers = 2;

using Tensors = std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>>;

// The directories TempDir made, removed when the test program exits.
struct TempDirs {
  std::vector<fs::path> paths;
  ~TempDirs() {
    std::error_code ignored;
    for (const fs::path& p : paths) fs::remove_all(p, ignored);
  }
};
inline TempDirs temp_dirs;

inline fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("tandem_lora_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  temp_dirs.paths.push_back(p);
  return p;
}

struct Module {
  const char* block;  // self_attn or mlp
  const char* name;
  int64_t in, out;
};
inline const std::vector<Module> kModules = {
    {"self_attn", "q_proj", 64, 64},  {"self_attn", "k_proj", 64, 32},
    {"self_attn", "v_proj", 64, 32},  {"self_attn", "o_proj", 64, 64},
    {"mlp", "gate_proj", 64, 128},    {"mlp", "up_proj", 64, 128},
    {"mlp", "down_proj", 128, 64}};

// A PEFT adapter of rank `r` on the modules named in `targets` (all when
// empty), random matrices from `seed`, written into `dir`; returns its
// matrices by module weight name, for merging.
struct Adapter {
  fs::path dir;
  float scale = 1.f;
  Tensors tensors;  // PEFT names
};

inline Adapter MakeAdapter(const std::string& name, int r, double alpha, std::vector<std::string> targets,
                    uint32_t seed, const std::string& extra_config = "") {
  Adapter a;
  a.dir = TempDir(name);
  a.scale = static_cast<float>(alpha / r);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-0.3f, 0.3f);
  std::string names_json;
  for (int l = 0; l < kLayers; ++l) {
    for (const Module& m : kModules) {
      if (!targets.empty() && std::find(targets.begin(), targets.end(), m.name) == targets.end()) {
        continue;
      }
      const std::string p = "base_model.model.model.layers." + std::to_string(l) + "." + m.block +
                            "." + m.name;
      std::vector<float> av(r * m.in), bv(m.out * r);
      for (float& x : av) x = u(rng);
      for (float& x : bv) x = u(rng);
      a.tensors[p + ".lora_A.weight"] = {{r, m.in}, av};
      a.tensors[p + ".lora_B.weight"] = {{m.out, r}, bv};
    }
  }
  EXPECT_TRUE(WriteSafetensorsF32((a.dir / "adapter_model.safetensors").string(), a.tensors).ok());
  std::ofstream(a.dir / "adapter_config.json")
      << "{\"peft_type\": \"LORA\", \"r\": " << r << ", \"lora_alpha\": " << alpha
      << ", \"bias\": \"none\", \"use_dora\": false, \"modules_to_save\": null"
      << extra_config << "}";
  return a;
}

}  // namespace tandem::lora_fixture

#endif  // TANDEM_TESTS_ENGINE_LORA_FIXTURE_H_
