#include "common/model/safetensors.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "common/model/llama_config.h"
#include "common/model/llama_model.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "common/backend/cpu/cpu_device.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;

fs::path TempDir(const std::string& name) {
  fs::path p = fs::temp_directory_path() / ("tandem_" + name + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}

TEST(SafetensorsTest, HalfAndBfloatConversion) {
  EXPECT_EQ(HalfToFloat(0x3c00), 1.0f);
  EXPECT_EQ(HalfToFloat(0xc000), -2.0f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));  // smallest subnormal
  EXPECT_EQ(Bf16ToFloat(0x3f80), 1.0f);
  EXPECT_EQ(Bf16ToFloat(0xc040), -3.0f);
}

// Writes a file with one F16 and one BF16 tensor by hand.
TEST(SafetensorsTest, ReadsF16AndBf16) {
  fs::path dir = TempDir("half");
  nlohmann::json h = {{"a", {{"dtype", "F16"}, {"shape", {2}}, {"data_offsets", {0, 4}}}},
                      {"b", {{"dtype", "BF16"}, {"shape", {2}}, {"data_offsets", {4, 8}}}}};
  std::string text = h.dump();
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  uint64_t len = text.size();
  out.write(reinterpret_cast<char*>(&len), 8);
  out << text;
  uint16_t data[4] = {0x3c00, 0x4000, 0x3f80, 0xbf80};
  out.write(reinterpret_cast<char*>(data), 8);
  out.close();
  auto ckpt = SafetensorsCheckpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  float a[2], b[2];
  ASSERT_TRUE(ckpt->ReadF32("a", {2}, a).ok());
  ASSERT_TRUE(ckpt->ReadF32("b", {2}, b).ok());
  EXPECT_EQ(a[0], 1.0f);
  EXPECT_EQ(a[1], 2.0f);
  EXPECT_EQ(b[0], 1.0f);
  EXPECT_EQ(b[1], -1.0f);
}

TEST(SafetensorsTest, ErrorsNameTensorAndFile) {
  fs::path dir = TempDir("errors");
  ASSERT_TRUE(WriteSafetensorsF32((dir / "model.safetensors").string(),
                                  {{"w", {{2, 3}, std::vector<float>(6, 1.f)}}})
                  .ok());
  auto ckpt = SafetensorsCheckpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok());
  float buf[6];
  absl::Status missing = ckpt->ReadF32("missing.weight", {2, 3}, buf);
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("missing.weight"), std::string::npos);
  absl::Status shape = ckpt->ReadF32("w", {3, 2}, buf);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("model.safetensors"), std::string::npos) << shape;
  EXPECT_NE(shape.message().find("[2, 3]"), std::string::npos) << shape;
  EXPECT_EQ(SafetensorsCheckpoint::Open((dir / "nope").string()).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(SafetensorsTest, ShardedCheckpointViaIndex) {
  fs::path dir = TempDir("sharded");
  ASSERT_TRUE(WriteSafetensorsF32((dir / "a.safetensors").string(),
                                  {{"x", {{2}, {1.f, 2.f}}}}).ok());
  ASSERT_TRUE(WriteSafetensorsF32((dir / "b.safetensors").string(),
                                  {{"y", {{1}, {3.f}}}}).ok());
  std::ofstream(dir / "model.safetensors.index.json")
      << R"({"weight_map": {"x": "a.safetensors", "y": "b.safetensors"}})";
  auto ckpt = SafetensorsCheckpoint::Open(dir.string());
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  float x[2], y[1];
  ASSERT_TRUE(ckpt->ReadF32("x", {2}, x).ok());
  ASSERT_TRUE(ckpt->ReadF32("y", {1}, y).ok());
  EXPECT_EQ(x[1], 2.f);
  EXPECT_EQ(y[0], 3.f);
}

TEST(SafetensorsTest, ModelLoadNamesMissingTensor) {
  // The fixture's config with an empty checkpoint: the first tensor is named.
  fs::path dir = TempDir("missing_model");
  fs::copy_file(std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tiny_llama/config.json",
                dir / "config.json");
  ASSERT_TRUE(WriteSafetensorsF32((dir / "model.safetensors").string(),
                                  {{"unrelated", {{1}, {0.f}}}}).ok());
  auto device = CreateCpuDevice();
  auto ops = CreateCpuOps(device.get(), 1).value();
  auto model = LlamaModel::Load(dir.string(), ops.get());
  ASSERT_FALSE(model.ok());
  EXPECT_NE(model.status().message().find("model.embed_tokens.weight"), std::string::npos)
      << model.status();
}

// Found by the safetensors fuzzer: a header field of the wrong JSON type threw
// out of the parser and killed the process.
TEST(SafetensorsTest, MalformedHeaderFieldsAreErrorsNotExceptions) {
  fs::path dir = TempDir("malformed_header");
  const std::string header = R"({"w": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}})";
  std::ofstream out(dir / "model.safetensors", std::ios::binary);
  const uint64_t len = header.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out << header << std::string(4, '\0');
  out.close();
  auto ckpt = SafetensorsCheckpoint::Open(dir.string());
  ASSERT_FALSE(ckpt.ok());
  EXPECT_NE(ckpt.status().message().find("tensor 'w' has a malformed entry"), std::string::npos)
      << ckpt.status();
  fs::remove(dir / "model.safetensors");
  std::ofstream(dir / "model.safetensors.index.json") << R"({"weight_map": {"w": 7}})";
  auto index = SafetensorsCheckpoint::Open(dir.string());
  ASSERT_FALSE(index.ok());
  EXPECT_NE(index.status().message().find("is not a file name"), std::string::npos);
}

TEST(LlamaConfigTest, ParsesLegacyRopeScaling) {
  auto c = ParseLlamaConfig(R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
      "rope_theta": 500000.0, "rope_scaling": {"rope_type": "llama3", "factor": 32.0,
      "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
      "eos_token_id": [5, 6]})", "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->head_dim, 4);
  EXPECT_EQ(c->rope_theta, 500000.0);
  EXPECT_EQ(c->rope_scaling.type, "llama3");
  EXPECT_EQ(c->rope_scaling.factor, 32.0);
  EXPECT_EQ(c->eos_token_ids, (std::vector<int32_t>{5, 6}));
  auto bad = ParseLlamaConfig(R"({"vocab_size": 10})", "cfg.json");
  EXPECT_NE(bad.status().message().find("cfg.json"), std::string::npos);
  EXPECT_NE(bad.status().message().find("hidden_size"), std::string::npos);
}

// Qwen's long-context setting (YaRN over 32768 trained positions, factor
// 4) and linear scaling: the frequencies and attention factor of
// transformers 5.24's ROPE_INIT_FUNCTIONS for the same configs, and the
// context vLLM derives (yarn: the original context times the factor).
TEST(LlamaConfigTest, YarnAndLinearRopeScalingAsTransformers) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 1024, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 8, "head_dim": 128, "model_type": "qwen3",
      "max_position_embeddings": 40960, )";
  auto yarn = ParseLlamaConfig("{" + base + R"("rope_parameters": {"rope_type": "yarn",
      "rope_theta": 1000000.0, "factor": 4.0, "original_max_position_embeddings": 32768}})",
                               "config.json");
  ASSERT_TRUE(yarn.ok()) << yarn.status();
  EXPECT_EQ(yarn->rope_scaling.type, "yarn");
  EXPECT_EQ(yarn->MaxContext(), 131072);
  EXPECT_EQ(yarn->DefaultMaxModelLen(), 8192);
  EXPECT_NEAR(yarn->RopeScoreFactor(), 1.138629436111989 * 1.138629436111989, 1e-12);
  EXPECT_FLOAT_EQ(yarn->AttentionScale(), static_cast<float>(1.138629436111989 * 1.138629436111989 / std::sqrt(128.0)));
  const std::vector<float> inv = RopeInverseFrequencies(*yarn);
  const std::pair<int, float> want[] = {{0, 1.0f},          {10, 0.115478203f},   {20, 0.0133352149f},
                                        {25, 0.0041317381f}, {30, 0.00106436096f}, {40, 4.44569851e-05f},
                                        {63, 3.10234441e-07f}};
  for (const auto& [i, f] : want) EXPECT_NEAR(inv[i], f, 2e-7f * f) << i;
  auto linear = ParseLlamaConfig("{" + base + R"("rope_scaling": {"type": "linear", "factor": 2.0},
      "rope_theta": 1000000.0})", "config.json");
  ASSERT_TRUE(linear.ok()) << linear.status();
  EXPECT_EQ(linear->MaxContext(), 81920);
  EXPECT_EQ(linear->RopeScoreFactor(), 1.0);
  EXPECT_EQ(linear->AttentionScale(), 1.0f / std::sqrt(128.0f));
  const std::vector<float> half = RopeInverseFrequencies(*linear);
  EXPECT_FLOAT_EQ(half[0], 0.5f);
  EXPECT_FLOAT_EQ(half[10], 0.0577391014f);
  EXPECT_FLOAT_EQ(half[63], 6.20468882e-07f);
  // The KV of a yarn model is not another's: the fingerprint says so.
  auto plain = ParseLlamaConfig("{" + base + R"("rope_theta": 1000000.0})", "config.json");
  ASSERT_TRUE(plain.ok());
  EXPECT_NE(plain->Fingerprint(), yarn->Fingerprint());
}

// Sliding windows per layer, read as transformers reads them.
TEST(LlamaConfigTest, SlidingWindowsPerLayer) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 4, "num_attention_heads": 2)";
  auto windows = [&](const std::string& extra) -> std::vector<int> {
    auto c = ParseLlamaConfig("{" + base + ", " + extra + "}", "config.json");
    EXPECT_TRUE(c.ok()) << extra << ": " << c.status();
    return c.ok() ? c->layer_windows : std::vector<int>{-1};
  };
  using V = std::vector<int>;
  // Mistral and Mixtral: every layer.
  EXPECT_EQ(windows(R"("model_type": "mistral", "sliding_window": 4096)"), V({4096, 4096, 4096, 4096}));
  EXPECT_EQ(windows(R"("model_type": "mistral", "sliding_window": null)"), V());
  // Llama has no window, whatever the field says.
  EXPECT_EQ(windows(R"("model_type": "llama", "sliding_window": 4096)"), V());
  // Qwen2/Qwen3: only when use_sliding_window, from max_window_layers on.
  EXPECT_EQ(windows(R"("model_type": "qwen2", "use_sliding_window": false, "sliding_window": 64)"), V());
  EXPECT_EQ(windows(R"("model_type": "qwen2", "use_sliding_window": true, "sliding_window": 64,
                       "max_window_layers": 2)"),
            V({0, 0, 64, 64}));
  EXPECT_EQ(windows(R"("model_type": "qwen3", "use_sliding_window": true, "sliding_window": 64,
                       "max_window_layers": 0)"),
            V({64, 64, 64, 64}));
  // layer_types, when given, decides.
  EXPECT_EQ(windows(R"("sliding_window": 8, "layer_types": ["sliding_attention", "full_attention",
                       "sliding_attention", "full_attention"])"),
            V({8, 0, 8, 0}));
  EXPECT_EQ(windows(R"("sliding_window": 8, "layer_types": ["full_attention", "full_attention",
                       "full_attention", "full_attention"])"),
            V());
  // The window is part of what prefill and decode workers must agree on.
  auto a = ParseLlamaConfig("{" + base + R"(, "model_type": "mistral", "sliding_window": 8})", "a");
  auto b = ParseLlamaConfig("{" + base + R"(, "model_type": "mistral", "sliding_window": 16})", "b");
  auto none = ParseLlamaConfig("{" + base + R"(, "model_type": "mistral"})", "c");
  ASSERT_TRUE(a.ok() && b.ok() && none.ok());
  EXPECT_NE(a->Fingerprint(), b->Fingerprint());
  EXPECT_NE(a->Fingerprint(), none->Fingerprint());
}

TEST(LlamaConfigTest, RefusesWhatTheEngineDoesNotImplement) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 1, "num_attention_heads": 2)";
  auto parse = [&](const std::string& extra) {
    return ParseLlamaConfig("{" + base + ", " + extra + "}", "config.json").status();
  };
  EXPECT_TRUE(parse(R"("architectures": ["LlamaForCausalLM"], "hidden_act": "silu")").ok());
  // The families of the table are taken, their parts named in the config.
  for (const char* arch : {"MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}) {
    auto c = ParseLlamaConfig(
        "{" + base + R"(, "architectures": [")" + arch + R"("]})", "config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(std::string(c->family->hf_architecture), arch);
    EXPECT_EQ(c->family->qkv_bias, std::string(arch) == "Qwen2ForCausalLM");
    EXPECT_EQ(c->family->qk_norm, std::string(arch) == "Qwen3ForCausalLM");
  }
  EXPECT_TRUE(parse(R"("model_type": "qwen2", "use_sliding_window": false,
                      "sliding_window": 4096, "layer_types": ["full_attention"])").ok());
  EXPECT_TRUE(parse(R"("model_type": "mistral", "sliding_window": null)").ok());
  absl::Status other = parse(R"("architectures": ["Gemma2ForCausalLM"])");
  EXPECT_NE(other.message().find(
                "architectures is \"Gemma2ForCausalLM\"; the engine implements LlamaForCausalLM, "
                "MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, MixtralForCausalLM, "
                "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM"),
            std::string::npos)
      << other;
  const std::pair<const char*, const char*> cases[] = {
      {R"("architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2")", "model_type"},
      {R"("architectures": ["LlamaForCausalLM"], "model_type": "qwen2")", "model_type"},
      {R"("model_type": "gemma")", "model_type"},
      {R"("model_type": "qwen2", "use_sliding_window": true)", "sliding_window is absent"},
      {R"("layer_types": ["sliding_attention"])", "sliding_window is absent"},
      {R"("layer_types": ["chunked_attention"], "sliding_window": 8)",
       "layer_types is \"chunked_attention\""},
      {R"("layer_types": ["full_attention", "full_attention"])", "layer_types has 2 entries for 1 layers"},
      {R"("model_type": "mistral", "sliding_window": 4096.5)", "sliding_window is 4096.5"},
      {R"("num_local_experts": 8)", "num_local_experts is 8"},
      {R"("model_type": "qwen3", "num_experts": 8)",
       "num_experts is 8; the engine implements experts in MixtralForCausalLM, "
       "Qwen2MoeForCausalLM, Qwen3MoeForCausalLM only"},
      {R"("model_type": "qwen3_moe", "num_experts_per_tok": 2)", "missing field 'num_experts'"},
      {R"("model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 9,
          "moe_intermediate_size": 4)", "num_experts_per_tok must be in 1..num_experts (8)"},
      {R"("model_type": "qwen3_moe", "num_experts": 8, "num_experts_per_tok": 2)",
       "moe_intermediate_size"},
      {R"("final_logit_softcapping": 30.0)", "final_logit_softcapping"},
      {R"("hidden_act": "gelu")", "hidden_act is \"gelu\""},
      {R"("attention_bias": true)", "attention_bias"},
      {R"("mlp_bias": true)", "mlp_bias"},
      {R"("partial_rotary_factor": 0.5)", "partial_rotary_factor"},
      {R"("rope_scaling": {"rope_type": "longrope", "factor": 4.0})", "'longrope' is not supported"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 0})", "factor must be > 0, got 0"},
      {R"("rope_scaling": {"rope_type": "yarn", "factor": 2, "beta_fast": -1})", "beta_fast"},
  };
  for (const auto& [extra, field] : cases) {
    absl::Status s = parse(extra);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_NE(s.message().find(field), std::string::npos) << s;
  }
}

// Qwen3-MoE: the experts' fields as its checkpoints write them, or as
// transformers 5 saves them (num_local_experts); which layers are sparse.
TEST(LlamaConfigTest, ParsesQwen3MoeExperts) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 16,
      "num_hidden_layers": 4, "num_attention_heads": 2, "architectures": ["Qwen3MoeForCausalLM"],
      "num_experts_per_tok": 2, "moe_intermediate_size": 4, "norm_topk_prob": true)";
  for (const char* experts : {R"("num_experts": 8)", R"("num_local_experts": 8)"}) {
    auto c = ParseLlamaConfig("{" + base + ", " + experts + "}", "config.json");
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->num_experts, 8);
    EXPECT_EQ(c->num_experts_per_tok, 2);
    EXPECT_EQ(c->moe_intermediate_size, 4);
    EXPECT_TRUE(c->norm_topk_prob);
    EXPECT_TRUE(c->family->qk_norm);
    for (int l = 0; l < 4; ++l) EXPECT_TRUE(c->IsSparseLayer(l)) << l;
  }
  auto c = ParseLlamaConfig("{" + base + R"(, "num_experts": 8, "decoder_sparse_step": 2,
                                             "mlp_only_layers": [3]})",
                            "config.json");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(std::vector<bool>({c->IsSparseLayer(0), c->IsSparseLayer(1), c->IsSparseLayer(2),
                               c->IsSparseLayer(3)}),
            std::vector<bool>({false, true, false, false}));
  // Qwen2-MoE's shared expert.
  auto shared = ParseLlamaConfig(
      "{" + base + R"(, "num_experts": 8, "shared_expert_intermediate_size": 12,
                    "architectures": ["Qwen2MoeForCausalLM"]})",
      "config.json");
  ASSERT_TRUE(shared.ok()) << shared.status();
  EXPECT_EQ(shared->shared_expert_intermediate_size, 12);
  EXPECT_TRUE(shared->family->qkv_bias);
  // Mixtral: experts intermediate_size wide, scores always renormalized.
  auto mixtral = ParseLlamaConfig(
      R"({"vocab_size": 10, "hidden_size": 8, "intermediate_size": 16, "num_hidden_layers": 2,
          "num_attention_heads": 2, "architectures": ["MixtralForCausalLM"],
          "num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": null})",
      "config.json");
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(mixtral->num_experts, 8);
  EXPECT_EQ(mixtral->moe_intermediate_size, 16);
  EXPECT_TRUE(mixtral->norm_topk_prob);
  EXPECT_EQ(std::string(mixtral->family->experts->gate), "w1");
  // The experts are part of the architecture two workers must agree on.
  auto dense = ParseLlamaConfig("{" + base + R"(, "num_experts": 8, "mlp_only_layers": [3]})",
                                "config.json");
  ASSERT_TRUE(dense.ok());
  EXPECT_NE(c->Fingerprint(), dense->Fingerprint());
}

// A field of another JSON type, or a number past its range, is the file's
// fault, named, not a crash (nor a float silently cut to an integer).
TEST(LlamaConfigTest, FieldsOfTheWrongTypeAreErrors) {
  const std::string base = R"("vocab_size": 10, "hidden_size": 8, "intermediate_size": 16)";
  const std::pair<std::string, std::string> cases[] = {
      {R"("num_attention_heads": 2, "num_hidden_layers": "2")",
       R"(num_hidden_layers is "2"; an integer in int32's range is expected)"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 2.5)", "num_hidden_layers is 2.5"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 1e30)", "num_hidden_layers is 1e+30"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 4294967298)",
       "num_hidden_layers is 4294967298"},
      {R"("num_attention_heads": 0, "num_hidden_layers": 2)",
       "num_attention_heads must be > 0, got 0"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 2, "rms_norm_eps": "x")",
       "config.json: a field has the wrong JSON type"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 2, "eos_token_id": ["a"])",
       R"(eos_token_id holds "a")"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 2,
          "rope_scaling": {"rope_type": "llama3", "original_max_position_embeddings": 1e40})",
       "original_max_position_embeddings is 1e+40"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 2,
          "architectures": ["Qwen3MoeForCausalLM"], "num_experts": "8")",
       R"(num_experts is "8")"},
      {R"("num_attention_heads": 2, "num_hidden_layers": 2,
          "architectures": ["Qwen3MoeForCausalLM"], "num_experts": 8, "num_experts_per_tok": 2,
          "moe_intermediate_size": 4, "mlp_only_layers": ["a"])",
       R"(mlp_only_layers holds "a")"},
  };
  for (const auto& [extra, message] : cases) {
    auto c = ParseLlamaConfig("{" + base + ", " + extra + "}", "config.json");
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << extra;
    EXPECT_NE(c.status().message().find(message), std::string::npos) << c.status();
  }
}

TEST(LlamaConfigTest, GenerationConfigEosReplacesConfigEos) {
  LlamaConfig c;
  c.eos_token_ids = {2};
  ASSERT_TRUE(ApplyGenerationConfig(R"({"eos_token_id": [2, 7]})", "g.json", &c).ok());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 7}));
  ASSERT_TRUE(ApplyGenerationConfig(R"({"do_sample": true})", "g.json", &c).ok());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 7}));
  EXPECT_FALSE(ApplyGenerationConfig("[", "g.json", &c).ok());
}

TEST(SafetensorsTest, ModelLoadRefusesTensorsItDoesNotUse) {
  // The fixture plus a bias the engine has no use for: refused, by name.
  fs::path dir = TempDir("extra_tensor_model");
  const std::string fixture = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/tiny_llama";
  fs::copy_file(fixture + "/config.json", dir / "config.json");
  auto ckpt = SafetensorsCheckpoint::Open(fixture);
  ASSERT_TRUE(ckpt.ok());
  std::map<std::string, std::pair<std::vector<int64_t>, std::vector<float>>> tensors;
  for (const auto& [name, e] : ckpt->entries()) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    std::vector<float> v(n);
    ASSERT_TRUE(ckpt->ReadF32(name, e.shape, v.data()).ok());
    tensors[name] = {e.shape, std::move(v)};
  }
  tensors["model.layers.0.self_attn.q_proj.bias"] = {{64}, std::vector<float>(64, 0.f)};
  ASSERT_TRUE(WriteSafetensorsF32((dir / "model.safetensors").string(), tensors).ok());
  auto device = CreateCpuDevice();
  auto ops = CreateCpuOps(device.get(), 1).value();
  auto model = LlamaModel::Load(dir.string(), ops.get());
  ASSERT_FALSE(model.ok());
  EXPECT_EQ(model.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(model.status().message().find("model.layers.0.self_attn.q_proj.bias"),
            std::string::npos)
      << model.status();
}

TEST(SyntheticModelTest, SameNameSameWeights) {
  auto device = CreateCpuDevice();
  auto ops = CreateCpuOps(device.get(), 1).value();
  auto a = LlamaModel::Load("synthetic", ops.get());
  auto b = LlamaModel::Load("synthetic", ops.get());
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_EQ((*a)->config().Fingerprint(), (*b)->config().Fingerprint());
  auto smol = SyntheticConfig("synthetic:smollm2-135m");
  ASSERT_TRUE(smol.ok());
  EXPECT_EQ(smol->hidden_size, 576);
  EXPECT_NE(smol->Fingerprint(), (*a)->config().Fingerprint());
  EXPECT_FALSE(SyntheticConfig("synthetic:gpt5").ok());
}

}  // namespace
}  // namespace tandem
