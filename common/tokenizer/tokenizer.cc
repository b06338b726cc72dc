#include "common/tokenizer/tokenizer.h"

#include "common/tokenizer/tokenizer_impl.h"

namespace tandem {

Tokenizer::Tokenizer(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {
  for (const DecStep& d : impl_->decoder) {
    impl_->byte_fallback_decoder |= d.kind == DecStep::kByteFallback;
  }
}
Tokenizer::~Tokenizer() = default;

std::vector<int32_t> Tokenizer::Encode(absl::string_view text, bool add_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<Piece> raw_split;
  t.SplitAdded({std::string(text), -1, true}, /*want_normalized=*/false, &raw_split);
  std::vector<int32_t> ids;
  if (add_special_tokens) ids = t.prefix;
  for (Piece& p : raw_split) {
    if (p.added_id >= 0) {
      ids.push_back(p.added_id);
      continue;
    }
    std::vector<Piece> norm_split;
    t.SplitAdded({t.Normalize(std::move(p.text)), -1, p.at_start}, /*want_normalized=*/true,
                 &norm_split);
    for (const Piece& q : norm_split) {
      if (q.added_id >= 0) {
        ids.push_back(q.added_id);
        continue;
      }
      for (const std::string& w : t.PreTokenize(q.text, q.at_start)) t.TokenizeWord(w, &ids);
    }
  }
  if (add_special_tokens) ids.insert(ids.end(), t.suffix.begin(), t.suffix.end());
  return ids;
}

std::string Tokenizer::Decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  const Impl& t = *impl_;
  std::vector<std::string> tokens;
  tokens.reserve(ids.size());
  for (int32_t id : ids) {
    if (t.unused_ids.contains(id)) continue;
    auto a = t.added_by_id.find(id);
    if (a != t.added_by_id.end()) {
      if (!(skip_special_tokens && t.added[a->second].special)) {
        tokens.push_back(t.added[a->second].content);
      }
      continue;
    }
    const std::string& s = t.bpe.IdToToken(id);
    if (!s.empty()) tokens.push_back(s);
  }
  if (t.decoder.empty()) return absl::StrJoin(tokens, " ");
  return absl::StrJoin(t.Decoded(std::move(tokens)), "");
}

std::string Tokenizer::TokenBytes(int32_t id) const {
  if (impl_->unused_ids.contains(id)) return "";
  if (auto a = impl_->added_by_id.find(id); a != impl_->added_by_id.end()) {
    return impl_->added[a->second].content;
  }
  const std::string& s = impl_->bpe.IdToToken(id);
  return s.empty() ? s : impl_->RawBytes(s);
}

std::string Tokenizer::IdToToken(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  if (a != impl_->added_by_id.end()) return impl_->added[a->second].content;
  return impl_->bpe.IdToToken(id);
}

int32_t Tokenizer::TokenToId(absl::string_view token) const {
  auto a = impl_->added_by_content.find(token);
  if (a != impl_->added_by_content.end()) return a->second;
  return impl_->bpe.TokenToId(token);
}

bool Tokenizer::IsByteFallbackToken(int32_t id) const {
  if (!impl_->byte_fallback_decoder) return false;
  const std::string& t = impl_->bpe.IdToToken(id);
  return t.size() == 6 && absl::StartsWith(t, "<0x") && t[5] == '>';
}

bool Tokenizer::IsSpecial(int32_t id) const {
  auto a = impl_->added_by_id.find(id);
  return a != impl_->added_by_id.end() && impl_->added[a->second].special;
}

int32_t Tokenizer::vocab_size() const { return impl_->vocab_size; }
const std::vector<int32_t>& Tokenizer::prefix_ids() const { return impl_->prefix; }
const std::vector<int32_t>& Tokenizer::suffix_ids() const { return impl_->suffix; }
const std::string& Tokenizer::source() const { return impl_->source; }

}  // namespace tandem
