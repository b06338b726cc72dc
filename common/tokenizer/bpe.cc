#include "common/tokenizer/bpe.h"

#include <queue>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/tokenizer/unicode.h"

namespace tandem {
namespace {

uint64_t PairKey(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

}  // namespace

absl::StatusOr<BpeModel> BpeModel::Create(const BpeConfig& config) {
  BpeModel m;
  int32_t max_id = -1;
  for (const auto& [token, id] : config.vocab) {
    if (id < 0) return absl::InvalidArgumentError(absl::StrCat("vocab: negative id ", id));
    max_id = std::max(max_id, id);
  }
  m.id_to_token_.resize(max_id + 1);
  for (const auto& [token, id] : config.vocab) {
    if (!m.id_to_token_[id].empty()) {
      return absl::InvalidArgumentError(absl::StrCat("vocab: id ", id, " is given twice"));
    }
    m.id_to_token_[id] = token;
    m.token_to_id_.emplace(token, id);
  }
  int32_t rank = 0;
  for (const auto& [a, b] : config.merges) {
    const int32_t ia = m.TokenToId(a), ib = m.TokenToId(b), ic = m.TokenToId(a + b);
    if (ia >= 0 && ib >= 0 && ic >= 0) m.merges_.emplace(PairKey(ia, ib), std::make_pair(rank, ic));
    ++rank;
  }
  for (int b = 0; b < 256; ++b) m.byte_ids_[b] = m.TokenToId(absl::StrFormat("<0x%02X>", b));
  m.byte_fallback_ = config.byte_fallback;
  if (!config.unk_token.empty()) {
    m.unk_id_ = m.TokenToId(config.unk_token);
    if (m.unk_id_ < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("unk_token '", config.unk_token, "' is not in the vocabulary"));
    }
  }
  m.fuse_unk_ = config.fuse_unk;
  m.ignore_merges_ = config.ignore_merges;
  return m;
}

int32_t BpeModel::TokenToId(absl::string_view token) const {
  auto it = token_to_id_.find(token);
  return it == token_to_id_.end() ? -1 : it->second;
}

const std::string& BpeModel::IdToToken(int32_t id) const {
  static const std::string kEmpty;
  return id >= 0 && id < static_cast<int32_t>(id_to_token_.size()) ? id_to_token_[id] : kEmpty;
}

void BpeModel::Tokenize(absl::string_view word, std::vector<int32_t>* out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    if (int32_t id = TokenToId(word); id >= 0) {
      out->push_back(id);
      return;
    }
  }
  struct Symbol {
    int32_t id;
    int prev, next;
    bool alive;
  };
  std::vector<Symbol> sym;
  sym.reserve(word.size());
  bool last_unk = false;
  size_t pos = 0;
  for (int len : Utf8CharLengths(word)) {
    const absl::string_view c = word.substr(pos, len);
    pos += len;
    const int32_t id = TokenToId(c);
    if (id >= 0) {
      sym.push_back({id, 0, 0, true});
      last_unk = false;
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (char b : c) all = all && byte_ids_[static_cast<uint8_t>(b)] >= 0;
      if (all) {
        for (char b : c) sym.push_back({byte_ids_[static_cast<uint8_t>(b)], 0, 0, true});
        last_unk = false;
        continue;
      }
    }
    if (unk_id_ >= 0) {
      if (!(fuse_unk_ && last_unk)) sym.push_back({unk_id_, 0, 0, true});
      last_unk = true;
    }
  }
  const int n = static_cast<int>(sym.size());
  for (int i = 0; i < n; ++i) {
    sym[i].prev = i - 1;
    sym[i].next = i + 1 < n ? i + 1 : -1;
  }
  // (rank, left position, merged id): lowest rank first, then leftmost.
  using Candidate = std::tuple<int32_t, int, int32_t>;
  std::priority_queue<Candidate, std::vector<Candidate>, std::greater<>> heap;
  auto push = [&](int left) {
    if (left < 0 || sym[left].next < 0) return;
    auto it = merges_.find(PairKey(sym[left].id, sym[sym[left].next].id));
    if (it != merges_.end()) heap.emplace(it->second.first, left, it->second.second);
  };
  for (int i = 0; i + 1 < n; ++i) push(i);
  while (!heap.empty()) {
    const auto [rank, left, merged] = heap.top();
    heap.pop();
    Symbol& a = sym[left];
    if (!a.alive || a.next < 0) continue;
    auto it = merges_.find(PairKey(a.id, sym[a.next].id));
    if (it == merges_.end() || it->second.first != rank || it->second.second != merged) continue;
    Symbol& b = sym[a.next];
    a.id = merged;
    b.alive = false;
    a.next = b.next;
    if (b.next >= 0) sym[b.next].prev = left;
    push(a.prev);
    push(left);
  }
  for (int i = 0; i < n; i = sym[i].next) {
    out->push_back(sym[i].id);
    if (sym[i].next < 0) break;
  }
}

}  // namespace tandem
