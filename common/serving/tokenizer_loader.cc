#include "common/serving/tokenizer_loader.h"

#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "nlohmann/json.hpp"
#include "common/base/logging.h"
#include "common/base/status_macros.h"
#include "common/model/gguf_weights.h"
#include "common/model/llama_model.h"
#include "common/serving/gguf_vocab.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Tokenizer>> LoadTokenizer(const std::string& spec) {
  if (IsSyntheticSpec(spec)) return nullptr;
  const auto start = std::chrono::steady_clock::now();
  std::unique_ptr<Tokenizer> tok;
  if (IsGgufSpec(spec)) {
    ASSIGN_OR_RETURN(auto file, GgufFile::Open(spec));
    ASSIGN_OR_RETURN(GgufVocab vocab, ReadGgufVocab(*file));
    if (vocab.model.empty()) return nullptr;
    ASSIGN_OR_RETURN(tok, Tokenizer::FromGgufVocab(vocab, spec));
  } else {
    const std::string path = spec + "/tokenizer.json";
    std::ifstream in(path, std::ios::binary);
    if (!in) return nullptr;
    std::string text((std::istreambuf_iterator<char>(in)), {});
    ASSIGN_OR_RETURN(tok, Tokenizer::FromHuggingFaceJson(text, path));
  }
  TANDEM_LOG(INFO) << "tokenizer from " << tok->source() << ": " << tok->vocab_size()
                   << " tokens, loaded in "
                   << absl::StrFormat("%.2f", std::chrono::duration<double>(
                                                  std::chrono::steady_clock::now() - start)
                                                  .count())
                   << " s";
  return tok;
}

namespace {

absl::StatusOr<std::string> ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot be read"));
  return std::string((std::istreambuf_iterator<char>(in)), {});
}

// tokenizer_config.json's special tokens: a string, or {"content": ...}.
std::string SpecialToken(const nlohmann::json& config, const char* key) {
  if (!config.contains(key)) return "";
  const nlohmann::json& v = config[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"];
  return "";
}

}  // namespace

absl::StatusOr<ModelSpecialTokens> LoadSpecialTokens(const std::string& spec) {
  ModelSpecialTokens t;
  if (IsSyntheticSpec(spec)) return t;
  if (IsGgufSpec(spec)) {
    ASSIGN_OR_RETURN(auto file, GgufFile::Open(spec));
    ASSIGN_OR_RETURN(GgufVocab vocab, ReadGgufVocab(*file));
    auto token = [&](int32_t id) {
      return id >= 0 && id < static_cast<int32_t>(vocab.tokens.size()) ? vocab.tokens[id] : "";
    };
    t.bos = token(vocab.bos_id);
    t.eos = token(vocab.eos_id);
    return t;
  }
  auto config_text = ReadFile(spec + "/tokenizer_config.json");
  if (!config_text.ok()) return t;
  const nlohmann::json config = nlohmann::json::parse(*config_text, nullptr, false);
  if (config.is_discarded()) {
    return absl::InvalidArgumentError(absl::StrCat(spec, "/tokenizer_config.json is not valid JSON"));
  }
  t.bos = SpecialToken(config, "bos_token");
  t.eos = SpecialToken(config, "eos_token");
  return t;
}

absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(const std::string& spec,
                                                               const std::string& override_path,
                                                               const ModelSpecialTokens& special) {
  if (IsSyntheticSpec(spec) && override_path.empty()) return nullptr;
  std::string source, origin;
  if (IsGgufSpec(spec)) {
    ASSIGN_OR_RETURN(auto file, GgufFile::Open(spec));
    if (override_path.empty() && file->Find("tokenizer.chat_template") != nullptr) {
      ASSIGN_OR_RETURN(source, file->GetString("tokenizer.chat_template"));
      origin = spec + " (tokenizer.chat_template)";
    }
  } else if (!IsSyntheticSpec(spec)) {
    nlohmann::json config;
    if (auto config_text = ReadFile(spec + "/tokenizer_config.json"); config_text.ok()) {
      config = nlohmann::json::parse(*config_text, nullptr, false);
      if (config.is_discarded()) {
        return absl::InvalidArgumentError(absl::StrCat(spec, "/tokenizer_config.json is not valid JSON"));
      }
    }
    if (override_path.empty()) {
      if (auto jinja = ReadFile(spec + "/chat_template.jinja"); jinja.ok()) {
        source = *jinja;
        origin = spec + "/chat_template.jinja";
      } else if (config.is_object() && config.contains("chat_template")) {
        const nlohmann::json& t = config["chat_template"];
        if (t.is_string()) {
          source = t.get<std::string>();
        } else if (t.is_array()) {
          for (const nlohmann::json& named : t) {
            if (named.value("name", "") == "default" && named.contains("template")) source = named["template"];
          }
        }
        if (source.empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              spec, "/tokenizer_config.json: chat_template is neither a string nor a list holding "
                    "one named \"default\"; give --chat-template=FILE"));
        }
        origin = spec + "/tokenizer_config.json (chat_template)";
      }
    }
  }
  if (!override_path.empty()) {
    ASSIGN_OR_RETURN(source, ReadFile(override_path));
    origin = override_path;
  }
  if (source.empty()) return nullptr;
  ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Create(source, origin, special.bos, special.eos));
  // A plain conversation must render; a construct met only now is named here,
  // not at the first request. (A template may still refuse some conversations
  // by design: raise_exception is the template's own rule, not ours.)
  const nlohmann::ordered_json probe = nlohmann::ordered_json::parse(
      R"([{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "Hello"},
          {"role": "assistant", "content": "Hi."}, {"role": "user", "content": "Bye"}])");
  for (size_t first : {0, 1}) {
    nlohmann::ordered_json messages(probe.begin() + static_cast<long>(first), probe.end());
    absl::StatusOr<std::string> out = t.Render(messages, nullptr, true);
    if (!out.ok() && out.status().code() != absl::StatusCode::kInvalidArgument) {
      return absl::Status(out.status().code(), absl::StrCat(origin, ": ", out.status().message()));
    }
  }
  TANDEM_LOG(INFO) << "chat template from " << origin << " (" << source.size() << " bytes)";
  return std::make_unique<ChatTemplate>(std::move(t));
}

std::shared_ptr<const TokenVocabulary> TokenVocabularyOf(const Tokenizer& tokenizer) {
  const int32_t n = tokenizer.vocab_size();
  std::vector<std::string> bytes(n);
  std::vector<bool> never(n, false);
  for (int32_t id = 0; id < n; ++id) {
    never[id] = tokenizer.IsSpecial(id);
    if (!never[id]) bytes[id] = tokenizer.TokenBytes(id);
  }
  return std::make_shared<const TokenVocabulary>(std::move(bytes), never);
}

bool GenerationDefaults::empty() const {
  return !temperature && !top_p && !min_p && !repetition_penalty && !top_k && !max_tokens;
}

std::string GenerationDefaults::ToString() const {
  std::string out;
  const auto add = [&](const char* name, const auto& v) {
    if (v) absl::StrAppend(&out, out.empty() ? "" : " ", name, "=", *v);
  };
  add("temperature", temperature);
  add("top_p", top_p);
  add("top_k", top_k);
  add("min_p", min_p);
  add("repetition_penalty", repetition_penalty);
  add("max_tokens", max_tokens);
  return out.empty() ? "none" : out;
}

namespace {

// One recommendation: kept unless it is transformers' own default (vLLM
// reads the file through GenerationConfig.to_diff_dict); refused outside
// the range the API accepts.
absl::Status Recommend(double value, double hf_default, double lo, double hi, bool lo_open,
                       const std::string& source, const char* key, std::optional<double>* out) {
  if (!std::isfinite(value) || value > hi || (lo_open ? value <= lo : value < lo)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": ", key, " = ", value, " is outside ",
                                                   lo_open ? "(" : "[", lo, ", ", hi, "]"));
  }
  if (value != hf_default) *out = value;
  return absl::OkStatus();
}

absl::Status RecommendInt(double value, int64_t hf_default, int64_t lo, const std::string& source,
                          const char* key, std::optional<int64_t>* out) {
  if (!std::isfinite(value) || value != std::floor(value) || value < lo || value > (1 << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": ", key, " = ", value, " must be an integer >= ", lo));
  }
  if (static_cast<int64_t>(value) != hf_default) *out = static_cast<int64_t>(value);
  return absl::OkStatus();
}

// The recommendations both sources carry, by their key in each (nullptr: not
// in that source), with transformers' default and the range the API accepts.
struct RealKey {
  const char* json;
  const char* gguf;
  double hf_default, lo, hi;
  bool lo_open;
  std::optional<double> GenerationDefaults::*out;
};
constexpr RealKey kRealKeys[] = {
    {"temperature", "general.sampling.temp", 1, 0, 2, false, &GenerationDefaults::temperature},
    {"top_p", "general.sampling.top_p", 1, 0, 1, true, &GenerationDefaults::top_p},
    {"min_p", "general.sampling.min_p", -1, 0, 1, false, &GenerationDefaults::min_p},
    {"repetition_penalty", "general.sampling.penalty_repeat", 1, 0, 1e9, true,
     &GenerationDefaults::repetition_penalty},
};
struct IntKey {
  const char* json;
  const char* gguf;
  int64_t hf_default, lo;
  std::optional<int64_t> GenerationDefaults::*out;
};
constexpr IntKey kIntKeys[] = {
    {"top_k", "general.sampling.top_k", 50, 0, &GenerationDefaults::top_k},
    {"max_new_tokens", nullptr, -1, 1, &GenerationDefaults::max_tokens},
};

// `number(key)`: the source's value for key (nullopt: absent), as
// absl::StatusOr<std::optional<double>>.
template <typename Number>
absl::StatusOr<GenerationDefaults> Recommendations(const std::string& source, bool gguf,
                                                   const Number& number) {
  GenerationDefaults d;
  for (const RealKey& k : kRealKeys) {
    const char* key = gguf ? k.gguf : k.json;
    if (key == nullptr) continue;
    ASSIGN_OR_RETURN(std::optional<double> v, number(key));
    if (v) RETURN_IF_ERROR(Recommend(*v, k.hf_default, k.lo, k.hi, k.lo_open, source, key, &(d.*k.out)));
  }
  for (const IntKey& k : kIntKeys) {
    const char* key = gguf ? k.gguf : k.json;
    if (key == nullptr) continue;
    ASSIGN_OR_RETURN(std::optional<double> v, number(key));
    if (v) RETURN_IF_ERROR(RecommendInt(*v, k.hf_default, k.lo, source, key, &(d.*k.out)));
  }
  // transformers' top_k 0 is off, as vLLM's -1 (the API's default).
  if (d.top_k == 0) d.top_k = -1;
  return d;
}

absl::StatusOr<GenerationDefaults> FromGenerationConfigJson(const std::string& path) {
  auto text = ReadFile(path);
  if (!text.ok()) return GenerationDefaults();  // no file: no recommendation
  const nlohmann::json j = nlohmann::json::parse(*text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a JSON object"));
  }
  return Recommendations(path, /*gguf=*/false,
                         [&](const char* key) -> absl::StatusOr<std::optional<double>> {
                           if (!j.contains(key) || j[key].is_null()) return std::nullopt;
                           // Another type is refused as out of range.
                           if (!j[key].is_number()) return std::numeric_limits<double>::quiet_NaN();
                           return j[key].get<double>();
                         });
}

absl::StatusOr<GenerationDefaults> FromGgufSampling(const std::string& spec) {
  ASSIGN_OR_RETURN(auto file, GgufFile::Open(spec));
  return Recommendations(spec, /*gguf=*/true,
                         [&](const char* key) -> absl::StatusOr<std::optional<double>> {
                           if (file->Find(key) == nullptr) return std::nullopt;
                           ASSIGN_OR_RETURN(double v, file->GetFloat(key));
                           return v;
                         });
}

}  // namespace

absl::StatusOr<GenerationDefaults> LoadGenerationDefaults(const std::string& spec,
                                                          const std::string& mode) {
  if (mode == "vllm") return GenerationDefaults();
  if (mode != "auto") return FromGenerationConfigJson(mode + "/generation_config.json");
  if (IsSyntheticSpec(spec)) return GenerationDefaults();
  if (IsGgufSpec(spec)) return FromGgufSampling(spec);
  return FromGenerationConfigJson(spec + "/generation_config.json");
}

}  // namespace tandem
