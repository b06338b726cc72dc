#include "common/tokenizer/tokenizer.h"

#include "common/tokenizer/tokenizer_impl.h"

namespace tandem {

namespace {

absl::Status ParseNormalizer(const Json& j, const std::string& source,
                             std::vector<NormStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const Json& n : j["normalizers"]) RETURN_IF_ERROR(ParseNormalizer(n, source, out));
  } else if (type == "Prepend") {
    out->push_back({NormStep::kPrepend, j.value("prepend", ""), ""});
  } else if (type == "Replace") {
    if (!j["pattern"].contains("String")) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": Replace normalizer with a regex pattern is not supported"));
    }
    out->push_back({NormStep::kReplace, j["pattern"]["String"].get<std::string>(),
                    j.value("content", "")});
  } else if (type == "NFC") {
    out->push_back({NormStep::kNfc, "", ""});
  } else if (type == "NFD") {
    out->push_back({NormStep::kNfd, "", ""});
  } else if (type == "NFKC") {
    out->push_back({NormStep::kNfkc, "", ""});
  } else if (type == "NFKD") {
    out->push_back({NormStep::kNfkd, "", ""});
  } else if (type == "Lowercase") {
    out->push_back({NormStep::kLowercase, "", ""});
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": normalizer '", type, "' is not supported"));
  }
  return absl::OkStatus();
}

absl::Status ParsePreTokenizer(const Json& j, const std::string& source,
                               std::vector<PreStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  PreStep p;
  if (type == "Sequence") {
    for (const Json& n : j["pretokenizers"]) RETURN_IF_ERROR(ParsePreTokenizer(n, source, out));
    return absl::OkStatus();
  }
  if (type == "Split") {
    p.kind = PreStep::kSplit;
    std::string pattern;
    if (j["pattern"].contains("Regex")) {
      pattern = j["pattern"]["Regex"].get<std::string>();
    } else {
      // A literal string: escape it for the regex engine.
      const std::string lit = j["pattern"]["String"].get<std::string>();
      pattern = absl::StrCat("\\Q", lit, "\\E");
    }
    ASSIGN_OR_RETURN(p.regex, CompileRegex(pattern, source));
    ASSIGN_OR_RETURN(p.behavior, ParseBehavior(j.value("behavior", "Isolated"), source));
    p.invert = j.value("invert", false);
  } else if (type == "Digits") {
    p.kind = PreStep::kSplit;
    ASSIGN_OR_RETURN(p.regex, CompileRegex("\\p{N}", source));
    p.behavior = j.value("individual_digits", false) ? SplitBehavior::kIsolated
                                                      : SplitBehavior::kContiguous;
  } else if (type == "ByteLevel") {
    p.kind = PreStep::kByteLevel;
    p.add_prefix_space = j.value("add_prefix_space", false);
    if (j.value("use_regex", true)) {
      ASSIGN_OR_RETURN(p.regex, CompileRegex(kGpt2Pattern, source));
    }
  } else if (type == "Metaspace") {
    p.kind = PreStep::kMetaspace;
    p.replacement = j.value("replacement", std::string(kMetaspaceChar));
    p.prepend_scheme = j.value("prepend_scheme",
                               j.value("add_prefix_space", true) ? "always" : "never");
    p.split = j.value("split", true);
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": pre-tokenizer '", type, "' is not supported"));
  }
  out->push_back(std::move(p));
  return absl::OkStatus();
}

absl::Status ParseDecoder(const Json& j, const std::string& source, std::vector<DecStep>* out) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  DecStep d;
  if (type == "Sequence") {
    for (const Json& n : j["decoders"]) RETURN_IF_ERROR(ParseDecoder(n, source, out));
    return absl::OkStatus();
  }
  if (type == "ByteLevel") {
    d.kind = DecStep::kByteLevel;
  } else if (type == "Replace") {
    if (!j["pattern"].contains("String")) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": Replace decoder with a regex pattern is not supported"));
    }
    d.kind = DecStep::kReplace;
    d.a = j["pattern"]["String"].get<std::string>();
    d.b = j.value("content", "");
  } else if (type == "ByteFallback") {
    d.kind = DecStep::kByteFallback;
  } else if (type == "Fuse") {
    d.kind = DecStep::kFuse;
  } else if (type == "Strip") {
    d.kind = DecStep::kStrip;
    d.a = j.value("content", " ");
    d.start = j.value("start", 0);
    d.stop = j.value("stop", 0);
  } else if (type == "Metaspace") {
    d.kind = DecStep::kMetaspace;
    d.a = j.value("replacement", std::string(kMetaspaceChar));
    d.prepend_scheme = j.value("prepend_scheme",
                               j.value("add_prefix_space", true) ? "always" : "never");
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": decoder '", type, "' is not supported"));
  }
  out->push_back(std::move(d));
  return absl::OkStatus();
}

// Appends the ids of the special token named `name` from a TemplateProcessing.
absl::Status TemplateIds(const Json& specials, const std::string& name, const std::string& source,
                         std::vector<int32_t>* out) {
  if (!specials.contains(name)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": post-processor template names unknown token '", name, "'"));
  }
  for (const Json& id : specials[name]["ids"]) out->push_back(id.get<int32_t>());
  return absl::OkStatus();
}

absl::Status ParsePostProcessor(const Json& j, const std::string& source,
                                const Tokenizer::Impl& impl, std::vector<int32_t>* prefix,
                                std::vector<int32_t>* suffix) {
  if (j.is_null()) return absl::OkStatus();
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const Json& p : j["processors"]) {
      RETURN_IF_ERROR(ParsePostProcessor(p, source, impl, prefix, suffix));
    }
  } else if (type == "ByteLevel") {
    // Offsets only; ids unchanged.
  } else if (type == "TemplateProcessing") {
    bool seen_a = false;
    for (const Json& item : j["single"]) {
      if (item.contains("Sequence")) {
        seen_a = true;
      } else if (item.contains("SpecialToken")) {
        RETURN_IF_ERROR(TemplateIds(j["special_tokens"],
                                    item["SpecialToken"]["id"].get<std::string>(), source,
                                    seen_a ? suffix : prefix));
      }
    }
  } else if (type == "BertProcessing" || type == "RobertaProcessing") {
    prefix->push_back(j["cls"][1].get<int32_t>());
    suffix->push_back(j["sep"][1].get<int32_t>());
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": post-processor '", type, "' is not supported"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromHuggingFaceJson(
    absl::string_view json_text, const std::string& source) {
  Json j = Json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object() || !j.contains("model")) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a tokenizer.json (no 'model')"));
  }
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  const Json& model = j["model"];
  const std::string type = model.value("type", "BPE");
  if (type != "BPE") {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": model type '", type, "' is not supported (BPE is)"));
  }
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    if (model.contains(key) && model[key].is_string() && !model[key].get<std::string>().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(source, ": BPE ", key, " is not supported"));
    }
  }
  try {
    BpeConfig bc;
    for (auto& [token, id] : model["vocab"].items()) bc.vocab.emplace_back(token, id.get<int32_t>());
    for (const Json& m : model["merges"]) {
      if (m.is_string()) {  // "a b"
        const std::string s = m.get<std::string>();
        const size_t sp = s.find(' ', 1);
        if (sp == std::string::npos) continue;
        bc.merges.emplace_back(s.substr(0, sp), s.substr(sp + 1));
      } else {  // ["a", "b"]
        bc.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
      }
    }
    bc.byte_fallback = model.value("byte_fallback", false);
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      bc.unk_token = model["unk_token"].get<std::string>();
    }
    bc.fuse_unk = model.value("fuse_unk", false);
    bc.ignore_merges = model.value("ignore_merges", false);
    ASSIGN_OR_RETURN(impl->bpe, BpeModel::Create(bc));
    impl->vocab_size = impl->bpe.max_id() + 1;
    if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
      for (const Json& a : j["added_tokens"]) {
        AddedToken t;
        t.id = a["id"].get<int32_t>();
        t.content = a["content"].get<std::string>();
        t.special = a.value("special", false);
        t.lstrip = a.value("lstrip", false);
        t.rstrip = a.value("rstrip", false);
        t.single_word = a.value("single_word", false);
        t.normalized = a.value("normalized", !t.special);
        impl->AddAdded(std::move(t));
      }
    }
    RETURN_IF_ERROR(ParseNormalizer(j.value("normalizer", Json()), source, &impl->normalizer));
    RETURN_IF_ERROR(ParsePreTokenizer(j.value("pre_tokenizer", Json()), source, &impl->pre));
    RETURN_IF_ERROR(ParseDecoder(j.value("decoder", Json()), source, &impl->decoder));
    RETURN_IF_ERROR(ParsePostProcessor(j.value("post_processor", Json()), source, *impl,
                                       &impl->prefix, &impl->suffix));
  } catch (const Json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": malformed tokenizer.json: ", e.what()));
  }
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

}  // namespace tandem
