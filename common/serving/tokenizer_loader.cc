#include "common/serving/tokenizer_loader.h"

#include <chrono>
#include <fstream>

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

absl::StatusOr<std::unique_ptr<ChatTemplate>> LoadChatTemplate(const std::string& spec,
                                                               const std::string& override_path) {
  if (IsSyntheticSpec(spec) && override_path.empty()) return nullptr;
  std::string source, origin, bos, eos;
  if (IsGgufSpec(spec)) {
    ASSIGN_OR_RETURN(auto file, GgufFile::Open(spec));
    ASSIGN_OR_RETURN(GgufVocab vocab, ReadGgufVocab(*file));
    auto token = [&](int32_t id) {
      return id >= 0 && id < static_cast<int32_t>(vocab.tokens.size()) ? vocab.tokens[id] : "";
    };
    bos = token(vocab.bos_id);
    eos = token(vocab.eos_id);
    if (override_path.empty() && file->Find("tokenizer.chat_template") != nullptr) {
      ASSIGN_OR_RETURN(source, file->GetString("tokenizer.chat_template"));
      origin = spec + " (tokenizer.chat_template)";
    }
  } else if (!IsSyntheticSpec(spec)) {
    auto config_text = ReadFile(spec + "/tokenizer_config.json");
    nlohmann::json config;
    if (config_text.ok()) {
      config = nlohmann::json::parse(*config_text, nullptr, false);
      if (config.is_discarded()) {
        return absl::InvalidArgumentError(absl::StrCat(spec, "/tokenizer_config.json is not valid JSON"));
      }
      bos = SpecialToken(config, "bos_token");
      eos = SpecialToken(config, "eos_token");
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
  ASSIGN_OR_RETURN(ChatTemplate t, ChatTemplate::Create(source, origin, bos, eos));
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

}  // namespace tandem
