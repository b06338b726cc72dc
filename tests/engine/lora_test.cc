// LoRA adapters at run time: a request with an adapter equals the model whose
// weights have the adapter merged in (W + scale B A, written here as a
// checkpoint of its own), in every graph mode and in batches mixing adapters
// and the base model; the prefix cache keeps adapters apart; what an adapter
// asks that the engine does not apply is refused at start-up.
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>

#include "common/backend/tensor.h"
#include "common/engine/engine.h"
#include "common/model/lora.h"
#include "common/model/safetensors.h"
#include "common/serving/engine_flags.h"
#include "gtest/gtest.h"
#include "tests/engine/lora_fixture.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using M = CudaGraphMode;
using lora_fixture::Adapter;
using lora_fixture::kBase;
using lora_fixture::MakeAdapter;
using lora_fixture::Tensors;
using lora_fixture::TempDir;

// `v` as the engine keeps an adapter's values: rounded to bf16.
float Bf16(float v) {
  uint16_t bits;
  ConvertFromF32(&v, DType::kBF16, &bits, 1);
  float out;
  ConvertToF32(&bits, DType::kBF16, &out, 1);
  return out;
}

// tiny_llama with `adapter` merged into its weights, as a checkpoint of its
// own: W + bf16(scale B) bf16(A), the matrices as the engine keeps them.
fs::path Merged(const Adapter& adapter, const std::string& name) {
  const fs::path dir = TempDir(name);
  fs::copy_file(kBase + "/config.json", dir / "config.json");
  fs::copy_file(kBase + "/generation_config.json", dir / "generation_config.json");
  auto base = SafetensorsCheckpoint::Open(kBase);
  EXPECT_TRUE(base.ok()) << base.status();
  Tensors out;
  for (const auto& [tensor, entry] : base->entries()) {
    int64_t numel = 1;
    for (int64_t d : entry.shape) numel *= d;
    std::vector<float> w(numel);
    EXPECT_TRUE(base->ReadF32(tensor, entry.shape, w.data()).ok());
    const std::string peft = "base_model.model." + tensor.substr(0, tensor.size() - 7);  // ".weight"
    auto a = adapter.tensors.find(peft + ".lora_A.weight");
    if (a != adapter.tensors.end()) {
      const auto& b = adapter.tensors.at(peft + ".lora_B.weight");
      const int64_t r = a->second.first[0], in = a->second.first[1], o = b.first[0];
      for (int64_t i = 0; i < o; ++i) {
        for (int64_t j = 0; j < in; ++j) {
          double acc = 0;
          for (int64_t t = 0; t < r; ++t) {
            acc += double{Bf16(adapter.scale * b.second[i * r + t])} * Bf16(a->second.second[t * in + j]);
          }
          w[i * in + j] += static_cast<float>(acc);
        }
      }
    }
    out[tensor] = {entry.shape, std::move(w)};
  }
  EXPECT_TRUE(WriteSafetensorsF32((dir / "model.safetensors").string(), out).ok());
  return dir;
}

absl::StatusOr<std::unique_ptr<LlmEngine>> Engine(const std::string& model, M mode,
                                                  std::vector<LoraModuleSpec> loras = {},
                                                  int max_lora_rank = 16, int runtime_slots = 0) {
  EngineConfig c;
  c.model = model;
  c.runner.graph.requested_mode = mode;
  c.runner.max_num_batched_tokens = 64;
  c.runner.max_num_seqs = 8;
  c.runner.max_model_len = 256;
  c.lora_modules = std::move(loras);
  c.max_lora_rank = max_lora_rank;
  c.runtime_lora_slots = runtime_slots;
  return LlmEngine::Create(c);
}

struct Output {
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  int cached = 0;
};

// Runs every request to its end.
std::map<std::string, Output> RunAll(LlmEngine* e) {
  std::map<std::string, Output> out;
  for (int guard = 0; e->HasWork() && guard < 10000; ++guard) {
    auto step = e->Step();
    EXPECT_TRUE(step.ok()) << step.status();
    if (!step.ok()) break;
    for (const RequestOutput& o : *step) {
      EXPECT_TRUE(o.status.ok()) << o.status;
      Output& r = out[o.id];
      r.tokens.insert(r.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      for (const TokenLogprobs& lp : o.logprobs) r.logprobs.push_back(lp.logprob);
      r.cached = std::max(r.cached, o.cached_tokens);
    }
  }
  return out;
}

SamplingParams Greedy(const std::string& lora, uint32_t max_tokens = 10) {
  SamplingParams p;
  p.max_tokens = max_tokens;
  p.ignore_eos = true;
  p.logprobs = 0;
  p.lora_name = lora;
  return p;
}

std::vector<int32_t> Prompt(int n, int seed) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (seed * 37 + i * 11) % 250 + 3;
  return t;
}

void ExpectSame(const Output& got, const Output& want) {
  EXPECT_EQ(got.tokens, want.tokens);
  ASSERT_EQ(got.logprobs.size(), want.logprobs.size());
  for (size_t i = 0; i < got.logprobs.size(); ++i) {
    EXPECT_NEAR(got.logprobs[i], want.logprobs[i], 2e-4) << "token " << i;
  }
}

// What one request gives alone on `model` (the merged or the base checkpoint).
Output Alone(const std::string& model, const std::vector<int32_t>& prompt, uint32_t max_tokens = 10) {
  auto e = Engine(model, M::kNone);
  EXPECT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE((*e)->AddRequest("x", prompt, Greedy("", max_tokens)).ok());
  return RunAll(e->get())["x"];
}

TEST(LoraTest, AdapterEqualsItsMergedWeightsInEveryMode) {
  const Adapter a = MakeAdapter("all", 4, 8.0, {}, 1);
  const fs::path merged = Merged(a, "all_merged");
  const std::vector<int32_t> prompt = Prompt(21, 1);
  const Output want = Alone(merged.string(), prompt);
  // The adapter changes the output, or the comparison shows nothing.
  const Output base = Alone(kBase, prompt);
  EXPECT_NE(base.tokens, want.tokens);
  for (M mode : {M::kNone, M::kPiecewise, M::kFull, M::kFullDecodeOnly, M::kFullAndPiecewise}) {
    SCOPED_TRACE(mode.name());
    auto e = Engine(kBase, mode, {{"a", a.dir.string()}});
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE((*e)->AddRequest("with", prompt, Greedy("a")).ok());
    ASSERT_TRUE((*e)->AddRequest("without", prompt, Greedy("")).ok());
    auto out = RunAll(e->get());
    ExpectSame(out["with"], want);
    ExpectSame(out["without"], base);
  }
}

TEST(LoraTest, BatchMixesAdaptersAndTheBaseModel) {
  // One adapter on attention only (rslora), one on the MLP only.
  const Adapter attn = MakeAdapter("attn", 8, 16.0, {"q_proj", "v_proj", "o_proj"}, 2,
                                   ", \"use_rslora\": true");
  Adapter attn_scaled = attn;
  attn_scaled.scale = static_cast<float>(16.0 / std::sqrt(8.0));
  const Adapter mlp = MakeAdapter("mlp", 2, 4.0, {"gate_proj", "up_proj", "down_proj"}, 3);
  const fs::path attn_merged = Merged(attn_scaled, "attn_merged");
  const fs::path mlp_merged = Merged(mlp, "mlp_merged");
  for (M mode : {M::kFullAndPiecewise, M::kNone}) {
    SCOPED_TRACE(mode.name());
    auto e = Engine(kBase, mode, {{"attn", attn.dir.string()}, {"mlp", mlp.dir.string()}});
    ASSERT_TRUE(e.ok()) << e.status();
    const std::vector<std::string> loras = {"attn", "", "mlp", "attn", "mlp", ""};
    for (size_t i = 0; i < loras.size(); ++i) {
      ASSERT_TRUE((*e)->AddRequest("r" + std::to_string(i), Prompt(5 + 7 * i, i), Greedy(loras[i])).ok());
    }
    auto out = RunAll(e->get());
    for (size_t i = 0; i < loras.size(); ++i) {
      SCOPED_TRACE(i);
      const std::string model = loras[i] == "attn"  ? attn_merged.string()
                                : loras[i] == "mlp" ? mlp_merged.string()
                                                    : kBase;
      ExpectSame(out["r" + std::to_string(i)], Alone(model, Prompt(5 + 7 * i, i)));
    }
  }
}

TEST(LoraTest, PrefixCacheKeepsAdaptersApart) {
  const Adapter a = MakeAdapter("cache", 4, 8.0, {"q_proj", "k_proj", "v_proj"}, 4);
  auto e = Engine(kBase, M::kFullAndPiecewise, {{"a", a.dir.string()}});
  ASSERT_TRUE(e.ok()) << e.status();
  const std::vector<int32_t> prompt = Prompt(40, 5);
  ASSERT_TRUE((*e)->AddRequest("first", prompt, Greedy("a")).ok());
  auto first = RunAll(e->get());
  // The same prompt without the adapter finds none of its KV...
  ASSERT_TRUE((*e)->AddRequest("base", prompt, Greedy("")).ok());
  auto base = RunAll(e->get());
  EXPECT_EQ(base["base"].cached, 0);
  ExpectSame(base["base"], Alone(kBase, prompt));
  // ... and with it, finds it.
  ASSERT_TRUE((*e)->AddRequest("again", prompt, Greedy("a")).ok());
  auto again = RunAll(e->get());
  EXPECT_EQ(again["again"].cached, 32);
  ExpectSame(again["again"], first["first"]);
  EXPECT_EQ((*e)->kv_cache().pool().num_used(), 0);
}

TEST(LoraTest, UnknownAdapterIsNotFound) {
  const Adapter a = MakeAdapter("known", 2, 2.0, {"q_proj"}, 6);
  auto e = Engine(kBase, M::kNone, {{"a", a.dir.string()}});
  ASSERT_TRUE(e.ok()) << e.status();
  absl::Status s = (*e)->AddRequest("x", Prompt(4, 1), Greedy("b"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'b' is not loaded (loaded: a)"), std::string::npos) << s;
  auto plain = Engine(kBase, M::kNone);
  ASSERT_TRUE(plain.ok());
  s = (*plain)->AddRequest("x", Prompt(4, 1), Greedy("a"));
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("no --lora-modules"), std::string::npos) << s;
}

TEST(LoraTest, WhatIsNotAppliedIsRefusedAtStartUp) {
  auto refused = [](const Adapter& a, int max_rank, const std::string& expect) {
    auto e = Engine(kBase, M::kNone, {{"x", a.dir.string()}}, max_rank);
    ASSERT_FALSE(e.ok());
    EXPECT_NE(e.status().message().find(expect), std::string::npos) << e.status();
  };
  refused(MakeAdapter("rank", 8, 8.0, {"q_proj"}, 7), 4, "rank r = 8 exceeds --max-lora-rank=4");
  refused(MakeAdapter("dora", 2, 2.0, {"q_proj"}, 8, ", \"use_dora\": true"), 16,
          "use_dora = true is not implemented");
  refused(MakeAdapter("save", 2, 2.0, {"q_proj"}, 9, ", \"modules_to_save\": [\"lm_head\"]"), 16,
          "modules_to_save");
  Adapter extra = MakeAdapter("extra", 2, 2.0, {"q_proj"}, 10);
  extra.tensors["base_model.model.lm_head.lora_A.weight"] = {{2, 64}, std::vector<float>(128)};
  ASSERT_TRUE(
      WriteSafetensorsF32((extra.dir / "adapter_model.safetensors").string(), extra.tensors).ok());
  refused(extra, 16, "tensor 'base_model.model.lm_head.lora_A.weight' is not a LoRA matrix");
  Adapter wrong = MakeAdapter("shape", 2, 2.0, {"q_proj"}, 11);
  wrong.tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"] = {
      {32, 2}, std::vector<float>(64)};
  ASSERT_TRUE(
      WriteSafetensorsF32((wrong.dir / "adapter_model.safetensors").string(), wrong.tensors).ok());
  refused(wrong, 16, "q_proj.lora_B.weight");
  const fs::path missing = TempDir("missing");
  auto e = Engine(kBase, M::kNone, {{"x", missing.string()}});
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("adapter_config.json"), std::string::npos) << e.status();
}

// Reads the adapter at `dir` and puts it into a slot of `e` (runtime updating).
absl::StatusOr<int> LoadAtRunTime(LlmEngine* e, const std::string& name, const fs::path& dir) {
  auto image = e->lora().Prepare({name, dir.string()});
  if (!image.ok()) return image.status();
  return e->LoadLora(**image);
}

TEST(LoraTest, AdapterLoadedAtRunTimeEqualsItsMergedWeights) {
  // Rank 4 in stacks of rank 8 on every weight, the adapter on attention only.
  const Adapter a = MakeAdapter("runtime", 4, 8.0, {"q_proj", "k_proj", "v_proj", "o_proj"}, 31);
  const fs::path merged = Merged(a, "runtime_merged");
  const std::vector<int32_t> prompt = Prompt(21, 3);
  const Output want = Alone(merged.string(), prompt);
  const Output base = Alone(kBase, prompt);
  EXPECT_NE(base.tokens, want.tokens);
  for (M mode : {M::kFullAndPiecewise, M::kNone}) {
    SCOPED_TRACE(mode.name());
    auto e = Engine(kBase, mode, {}, 8, /*runtime_slots=*/2);
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_EQ((*e)->lora().capacity(), 2);
    EXPECT_TRUE((*e)->lora().names().empty());
    // Graphs for batches with adapters exist before any adapter does.
    if (mode == M::kFullAndPiecewise) {
      bool lora_keys = false;
      for (const BatchDescriptor& d : (*e)->runner().dispatcher().keys(M::kFull)) {
        lora_keys = lora_keys || d.has_lora;
      }
      EXPECT_TRUE(lora_keys);
    }
    ASSERT_EQ(LoadAtRunTime(e->get(), "a", a.dir).value_or(-1), 1);
    EXPECT_EQ((*e)->lora().names(), std::vector<std::string>{"a"});
    ASSERT_TRUE((*e)->AddRequest("with", prompt, Greedy("a")).ok());
    ASSERT_TRUE((*e)->AddRequest("without", prompt, Greedy("")).ok());
    auto out = RunAll(e->get());
    ExpectSame(out["with"], want);
    ExpectSame(out["without"], base);
    // A second load of the name, loaded, is refused, as vLLM refuses it.
    absl::StatusOr<int> again = LoadAtRunTime(e->get(), "a", a.dir);
    EXPECT_EQ(again.status().code(), absl::StatusCode::kAlreadyExists) << again.status();
  }
}

TEST(LoraTest, UnloadedAdapterDrainsBeforeItsSlotIsReused) {
  const Adapter a = MakeAdapter("drain_a", 4, 8.0, {}, 32);
  const Adapter b = MakeAdapter("drain_b", 2, 4.0, {"gate_proj", "up_proj", "down_proj"}, 33);
  const std::vector<int32_t> prompt = Prompt(30, 4);
  const Output want_a = Alone(Merged(a, "drain_a_merged").string(), prompt, 16);
  const Output want_b = Alone(Merged(b, "drain_b_merged").string(), prompt, 16);
  auto e = Engine(kBase, M::kFullAndPiecewise, {}, 16, /*runtime_slots=*/1);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(LoadAtRunTime(e->get(), "a", a.dir).ok());
  const uint64_t fingerprint_a = (*e)->lora().Find("a")->fingerprint;
  ASSERT_TRUE((*e)->AddRequest("running", prompt, Greedy("a", 16)).ok());
  Output running;
  for (int i = 0; i < 3; ++i) {
    auto step = (*e)->Step();
    ASSERT_TRUE(step.ok()) << step.status();
    for (const RequestOutput& o : *step) {
      running.tokens.insert(running.tokens.end(), o.new_tokens.begin(), o.new_tokens.end());
      for (const TokenLogprobs& lp : o.logprobs) running.logprobs.push_back(lp.logprob);
    }
  }
  ASSERT_FALSE(running.tokens.empty());
  ASSERT_TRUE((*e)->UnloadLora("a").ok());
  // New requests can no longer name it; the one slot is still the running
  // request's, so another adapter waits for it to end.
  EXPECT_EQ((*e)->AddRequest("late", prompt, Greedy("a")).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*e)->UnloadLora("a").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(LoadAtRunTime(e->get(), "b", b.dir).status().code(),
            absl::StatusCode::kResourceExhausted);
  std::vector<std::string> run, wait;
  (*e)->LorasInUse(&run, &wait);
  EXPECT_EQ(run, std::vector<std::string>{"a"});  // the gateway still sees it run
  EXPECT_EQ((*e)->lora().Fingerprint(1), fingerprint_a);
  auto rest = RunAll(e->get());
  running.tokens.insert(running.tokens.end(), rest["running"].tokens.begin(), rest["running"].tokens.end());
  running.logprobs.insert(running.logprobs.end(), rest["running"].logprobs.begin(),
                          rest["running"].logprobs.end());
  ExpectSame(running, want_a);
  // Drained: the slot takes b, whose requests get b's weights, not a's.
  ASSERT_EQ(LoadAtRunTime(e->get(), "b", b.dir).value_or(-1), 1);
  EXPECT_NE((*e)->lora().Fingerprint(1), fingerprint_a);
  ASSERT_TRUE((*e)->AddRequest("b", prompt, Greedy("b", 16)).ok());
  ExpectSame(RunAll(e->get())["b"], want_b);
  // A request that looked a up before it was replaced is refused, not run
  // with b's weights.
  SamplingParams stale = Greedy("b");
  stale.lora_fingerprint = fingerprint_a;
  EXPECT_EQ((*e)->AddRequest("stale", prompt, stale).code(), absl::StatusCode::kAborted);
  EXPECT_EQ((*e)->kv_cache().pool().num_used(), 0);
}

TEST(LoraTest, RuntimeLoadingIsRefusedWithoutItsSlots) {
  const Adapter a = MakeAdapter("fixed", 2, 2.0, {"q_proj"}, 34);
  auto e = Engine(kBase, M::kNone, {{"a", a.dir.string()}});
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_FALSE((*e)->lora().updatable());
  auto image = (*e)->lora().Prepare({"b", a.dir.string()});
  EXPECT_EQ(image.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(image.status().message().find("--allow-runtime-lora-updating"), std::string::npos);
  // With slots: what start-up refuses is refused at run time too, by name.
  auto updatable = Engine(kBase, M::kNone, {}, 4, /*runtime_slots=*/1);
  ASSERT_TRUE(updatable.ok()) << updatable.status();
  const Adapter big = MakeAdapter("big", 8, 8.0, {"q_proj"}, 35);
  EXPECT_NE(LoadAtRunTime(updatable->get(), "big", big.dir)
                .status()
                .message()
                .find("rank r = 8 exceeds --max-lora-rank=4"),
            std::string::npos);
  EXPECT_EQ(LoadAtRunTime(updatable->get(), "missing", TempDir("none")).status().code(),
            absl::StatusCode::kNotFound);
  absl::Status none = (*updatable)->AddRequest("x", Prompt(4, 1), Greedy("a"));
  EXPECT_NE(none.message().find("'a' is not loaded (no adapter is loaded)"), std::string::npos)
      << none;
}

TEST(LoraTest, ParsesLoraModules) {
  auto m = ParseLoraModules("a=/x,b=/y/z");
  ASSERT_TRUE(m.ok());
  ASSERT_EQ(m->size(), 2u);
  EXPECT_EQ((*m)[1].name, "b");
  EXPECT_EQ((*m)[1].path, "/y/z");
  EXPECT_TRUE(ParseLoraModules("")->empty());
  EXPECT_FALSE(ParseLoraModules("a").ok());
  EXPECT_FALSE(ParseLoraModules("a=/x,a=/y").ok());
  EXPECT_FALSE(ParseLoraModules("=/x").ok());
}

}  // namespace
}  // namespace tandem
