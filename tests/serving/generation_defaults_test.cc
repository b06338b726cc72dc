// The model's recommended sampling (--generation-config), from a Hugging Face
// directory's generation_config.json and from a GGUF's general.sampling.*
// keys, as vLLM reads it.
#include <filesystem>
#include <fstream>
#include <string>

#include "common/model/gguf.h"
#include "common/serving/tokenizer_loader.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// A fresh directory holding generation_config.json with `json`.
std::string ModelDir(const std::string& name, const std::string& json) {
  const std::string dir = ::testing::TempDir() + "/generation_defaults_" + name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/generation_config.json") << json;
  return dir;
}

TEST(GenerationDefaultsTest, AHuggingFaceDirectorysRecommendations) {
  // Llama 3.1's file: transformers' own defaults (top_k 50, repetition_penalty
  // 1) are no recommendation, as vLLM's to_diff_dict reads them.
  const std::string dir = ModelDir("llama", R"({"bos_token_id": 128000, "do_sample": true,
      "eos_token_id": [128001, 128009], "temperature": 0.6, "top_p": 0.9, "top_k": 50,
      "repetition_penalty": 1.0, "max_new_tokens": 2048, "transformers_version": "4.42.3"})");
  const absl::StatusOr<GenerationDefaults> d = LoadGenerationDefaults(dir, "auto");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->temperature, 0.6);
  EXPECT_EQ(d->top_p, 0.9);
  EXPECT_FALSE(d->top_k.has_value());
  EXPECT_FALSE(d->repetition_penalty.has_value());
  EXPECT_FALSE(d->min_p.has_value());
  EXPECT_EQ(d->max_tokens, 2048);
  EXPECT_EQ(d->ToString(), "temperature=0.6 top_p=0.9 max_tokens=2048");
  // vllm: the API's neutral defaults; a directory: its file.
  EXPECT_TRUE(LoadGenerationDefaults(dir, "vllm")->empty());
  const std::string other = ModelDir("qwen", R"({"temperature": 0.7, "top_k": 20, "top_p": 0.8,
      "repetition_penalty": 1.05, "min_p": 0})");
  const absl::StatusOr<GenerationDefaults> q = LoadGenerationDefaults(dir, other);
  ASSERT_TRUE(q.ok()) << q.status();
  EXPECT_EQ(q->ToString(), "temperature=0.7 top_p=0.8 top_k=20 min_p=0 repetition_penalty=1.05");
  // transformers' top_k 0 (off) is vLLM's -1.
  EXPECT_EQ(LoadGenerationDefaults(ModelDir("k0", R"({"top_k": 0})"), "auto")->top_k, -1);
  // No file: none.
  EXPECT_TRUE(LoadGenerationDefaults(::testing::TempDir(), "auto")->empty());
  EXPECT_TRUE(LoadGenerationDefaults("synthetic", "auto")->empty());
}

TEST(GenerationDefaultsTest, ValuesOutOfRangeAreRefusedNamingFileAndKey) {
  const std::string dir = ModelDir("bad", R"({"temperature": 3})");
  const absl::Status s = LoadGenerationDefaults(dir, "auto").status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(), dir + "/generation_config.json: temperature = 3 is outside [0, 2]");
  EXPECT_NE(LoadGenerationDefaults(ModelDir("p", R"({"top_p": 0})"), "auto").status().message().find(
                "top_p = 0 is outside (0, 1]"),
            std::string::npos);
  EXPECT_NE(LoadGenerationDefaults(ModelDir("k", R"({"top_k": 2.5})"), "auto").status().message().find(
                "top_k = 2.5 must be an integer >= 0"),
            std::string::npos);
  EXPECT_FALSE(LoadGenerationDefaults(ModelDir("t", R"({"temperature": "hot"})"), "auto").ok());
  EXPECT_FALSE(LoadGenerationDefaults(ModelDir("j", "[1]"), "auto").ok());
}

TEST(GenerationDefaultsTest, AGgufsSamplingKeys) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddF32("general.sampling.temp", 0.6f);
  w.AddF32("general.sampling.top_p", 0.95f);
  w.AddU32("general.sampling.top_k", 20);
  w.AddF32("general.sampling.penalty_repeat", 1.f);  // transformers' default: none
  const std::string path = ::testing::TempDir() + "/generation_defaults.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  const absl::StatusOr<GenerationDefaults> d = LoadGenerationDefaults(path, "auto");
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_FLOAT_EQ(static_cast<float>(*d->temperature), 0.6f);
  EXPECT_FLOAT_EQ(static_cast<float>(*d->top_p), 0.95f);
  EXPECT_EQ(d->top_k, 20);
  EXPECT_FALSE(d->repetition_penalty.has_value());
  EXPECT_FALSE(d->max_tokens.has_value());
  GgufWriter bad;
  bad.AddString("general.architecture", "llama");
  bad.AddF32("general.sampling.temp", -1.f);
  ASSERT_TRUE(bad.WriteFile(path).ok());
  EXPECT_NE(LoadGenerationDefaults(path, "auto").status().message().find(
                "general.sampling.temp = -1 is outside [0, 2]"),
            std::string::npos);
}

// The tokenizer's bos and eos tokens (the OpenAI API's stop_reason is null
// for a stop on that eos, vLLM's request eos): tokenizer_config.json's, a
// string or {"content": ...}, or a GGUF's ids into its vocabulary.
TEST(GenerationDefaultsTest, TheTokenizersSpecialTokens) {
  const std::string dir = ModelDir("special", "{}");
  std::ofstream(dir + "/tokenizer_config.json")
      << R"({"bos_token": "<|begin_of_text|>", "eos_token": {"content": "<|eot_id|>", "lstrip": false}})";
  absl::StatusOr<ModelSpecialTokens> t = LoadSpecialTokens(dir);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos, "<|begin_of_text|>");
  EXPECT_EQ(t->eos, "<|eot_id|>");
  std::ofstream(dir + "/tokenizer_config.json") << "{";
  EXPECT_EQ(LoadSpecialTokens(dir).status().message(), dir + "/tokenizer_config.json is not valid JSON");
  EXPECT_EQ(LoadSpecialTokens(ModelDir("none", "{}"))->eos, "");
  EXPECT_EQ(LoadSpecialTokens("synthetic")->eos, "");

  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("tokenizer.ggml.model", "gpt2");
  w.AddStringArray("tokenizer.ggml.tokens", {"<s>", "</s>", "a"});
  w.AddU32("tokenizer.ggml.bos_token_id", 0);
  w.AddU32("tokenizer.ggml.eos_token_id", 1);
  const std::string path = ::testing::TempDir() + "/special_tokens.gguf";
  ASSERT_TRUE(w.WriteFile(path).ok());
  t = LoadSpecialTokens(path);
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(t->bos, "<s>");
  EXPECT_EQ(t->eos, "</s>");
}

}  // namespace
}  // namespace tandem
