#include "common/tokenizer/tokenizer.h"

#include "common/tokenizer/tokenizer_impl.h"

namespace tandem {

absl::StatusOr<std::unique_ptr<Tokenizer>> Tokenizer::FromGgufVocab(const GgufVocab& v,
                                                                    const std::string& source) {
  auto impl = std::make_unique<Impl>();
  impl->source = source;
  if (!v.token_types.empty() && v.token_types.size() != v.tokens.size()) {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": tokenizer.ggml.token_type has ", v.token_types.size(), " entries for ",
        v.tokens.size(), " tokens"));
  }
  auto type_of = [&](size_t i) { return v.token_types.empty() ? 1 : v.token_types[i]; };
  BpeConfig bc;
  // Every token is in the model's vocabulary (as in a converted
  // tokenizer.json); unknown, control and user-defined ones are added tokens
  // too, below.
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    bc.vocab.emplace_back(v.tokens[i], static_cast<int32_t>(i));
  }
  if (v.model == "gpt2") {
    for (const std::string& m : v.merges) {
      const size_t sp = m.find(' ', 1);
      if (sp != std::string::npos) bc.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
    }
    const std::string pre = v.pre.empty() ? "default" : v.pre;
    PreStep split, byte_level;
    split.kind = PreStep::kSplit;
    byte_level.kind = PreStep::kByteLevel;
    if (pre == "default" || pre == "gpt2" || pre == "gpt-2") {
      ASSIGN_OR_RETURN(byte_level.regex, CompileRegex(kGpt2Pattern, source));
    } else if (pre == "smollm" || pre == "starcoder") {
      ASSIGN_OR_RETURN(split.regex, CompileRegex("\\p{N}", source));
      impl->pre.push_back(split);
      ASSIGN_OR_RETURN(byte_level.regex, CompileRegex(kGpt2Pattern, source));
    } else if (pre == "llama-bpe" || pre == "llama3" || pre == "llama-v3" || pre == "qwen2" ||
               pre == "deepseek-r1-qwen") {
      // DeepSeek-R1's Qwen distills keep Qwen2's pre-tokenizer (llama.cpp
      // reads both names alike).
      const bool qwen = pre == "qwen2" || pre == "deepseek-r1-qwen";
      ASSIGN_OR_RETURN(split.regex, CompileRegex(qwen ? kQwen2Pattern : kLlama3Pattern, source));
      impl->pre.push_back(split);
      bc.ignore_merges = !qwen;
      // Qwen's tokenizer.json normalizes to NFC first; a GGUF keeps no
      // normalizer (llama.cpp skips it), so it is restored here to encode as
      // transformers does.
      if (qwen) impl->normalizer.push_back({NormStep::kNfc, "", ""});
    } else if (pre == "tekken") {  // Mistral Nemo, Small 3 (llama.cpp: ignore_merges too)
      ASSIGN_OR_RETURN(split.regex, CompileRegex(kTekkenPattern, source));
      impl->pre.push_back(split);
      bc.ignore_merges = true;
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          source, ": tokenizer.ggml.pre '", pre,
          "' is not supported (default, gpt2, smollm, starcoder, llama-bpe, qwen2, deepseek-r1-qwen, "
          "tekken)"));
    }
    impl->pre.push_back(byte_level);
    impl->decoder.push_back({DecStep::kByteLevel});
  } else if (v.model == "llama") {
    // SentencePiece BPE: merges derived from the scores as transformers'
    // SentencePieceExtractor does, so the result equals the tokenizer.json
    // that transformers converts from the same vocabulary.
    if (v.scores.size() != v.tokens.size()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": tokenizer.ggml.scores has ",
                                                     v.scores.size(), " entries for ",
                                                     v.tokens.size(), " tokens"));
    }
    absl::flat_hash_map<std::string, int32_t> ids;
    for (size_t i = 0; i < v.tokens.size(); ++i) ids.emplace(v.tokens[i], static_cast<int32_t>(i));
    struct Merge {
      int32_t l, r;
      float score;
    };
    std::vector<Merge> merges;
    for (size_t i = 0; i < v.tokens.size(); ++i) {
      const std::string& t = v.tokens[i];
      std::vector<Merge> local;
      size_t pos = 0;
      const std::vector<int> lens = Utf8CharLengths(t);
      for (size_t k = 0; k + 1 < lens.size(); ++k) {
        pos += lens[k];
        auto l = ids.find(t.substr(0, pos)), r = ids.find(t.substr(pos));
        if (l != ids.end() && r != ids.end()) local.push_back({l->second, r->second, v.scores[i]});
      }
      std::sort(local.begin(), local.end(), [](const Merge& a, const Merge& b) {
        return a.l != b.l ? a.l < b.l : a.r < b.r;
      });
      merges.insert(merges.end(), local.begin(), local.end());
    }
    std::stable_sort(merges.begin(), merges.end(),
                     [](const Merge& a, const Merge& b) { return a.score > b.score; });
    for (const Merge& m : merges) bc.merges.emplace_back(v.tokens[m.l], v.tokens[m.r]);
    bc.byte_fallback = true;
    bc.fuse_unk = true;
    if (v.unk_id >= 0 && v.unk_id < static_cast<int32_t>(v.tokens.size())) {
      bc.unk_token = v.tokens[v.unk_id];
    }
    if (v.add_space_prefix) impl->normalizer.push_back({NormStep::kPrepend, kMetaspaceChar, ""});
    impl->normalizer.push_back({NormStep::kReplace, " ", kMetaspaceChar});
    impl->decoder.push_back({DecStep::kReplace, kMetaspaceChar, " "});
    impl->decoder.push_back({DecStep::kByteFallback});
    impl->decoder.push_back({DecStep::kFuse});
    if (v.add_space_prefix) {
      DecStep strip{DecStep::kStrip, " ", ""};
      strip.start = 1;
      impl->decoder.push_back(strip);
    }
  } else {
    return absl::InvalidArgumentError(absl::StrCat(
        source, ": tokenizer.ggml.model '", v.model, "' is not supported (gpt2, llama)"));
  }
  ASSIGN_OR_RETURN(impl->bpe, BpeModel::Create(bc));
  impl->vocab_size = static_cast<int32_t>(v.tokens.size());
  for (size_t i = 0; i < v.tokens.size(); ++i) {
    if (type_of(i) == 5) impl->unused_ids.insert(static_cast<int32_t>(i));
    if (type_of(i) != 2 && type_of(i) != 3 && type_of(i) != 4) continue;
    AddedToken t;
    t.id = static_cast<int32_t>(i);
    t.content = v.tokens[i];
    t.special = type_of(i) != 4;
    t.normalized = !t.special;
    impl->AddAdded(std::move(t));
  }
  if (v.add_bos && v.bos_id >= 0) impl->prefix.push_back(v.bos_id);
  if (v.add_eos && v.eos_id >= 0) impl->suffix.push_back(v.eos_id);
  return std::unique_ptr<Tokenizer>(new Tokenizer(std::move(impl)));
}

}  // namespace tandem
