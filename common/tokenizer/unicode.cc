#include "common/tokenizer/unicode.h"

#include <array>

namespace tandem {
namespace {

struct ByteTables {
  std::array<uint32_t, 256> to_cp{};
  std::array<int, 324> to_byte{};  // code points used are below 324
  ByteTables() {
    to_byte.fill(-1);
    std::array<bool, 256> printable{};
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      to_cp[b] = printable[b] ? static_cast<uint32_t>(b) : static_cast<uint32_t>(256 + n++);
      to_byte[to_cp[b]] = b;
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables t;
  return t;
}

// Length of the valid prefix of a multi-byte sequence starting at s[0] (the
// lead byte included), and the full length it needs. Rust's and Unicode's
// "maximal subpart": the second byte's range depends on the lead byte.
void Utf8Prefix(absl::string_view s, size_t* valid, size_t* needed) {
  const uint8_t b = static_cast<uint8_t>(s[0]);
  uint8_t lo = 0x80, hi = 0xBF;
  if (b < 0x80) { *valid = *needed = 1; return; }
  if (b >= 0xC2 && b <= 0xDF) {
    *needed = 2;
  } else if (b >= 0xE0 && b <= 0xEF) {
    *needed = 3;
    if (b == 0xE0) lo = 0xA0;
    if (b == 0xED) hi = 0x9F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    *needed = 4;
    if (b == 0xF0) lo = 0x90;
    if (b == 0xF4) hi = 0x8F;
  } else {
    *valid = 0;
    *needed = 1;
    return;
  }
  size_t k = 1;
  for (; k < *needed && k < s.size(); ++k) {
    const uint8_t c = static_cast<uint8_t>(s[k]);
    const uint8_t l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (c < l || c > h) break;
  }
  *valid = k;
}

}  // namespace

std::string Utf8Lossy(absl::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t valid = 0, needed = 0;
    Utf8Prefix(s.substr(i), &valid, &needed);
    if (valid == needed) {
      out.append(s.data() + i, needed);
      i += needed;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD
      i += valid == 0 ? 1 : valid;
    }
  }
  return out;
}

std::vector<int> Utf8CharLengths(absl::string_view s) {
  std::vector<int> lens;
  size_t i = 0;
  while (i < s.size()) {
    size_t valid = 0, needed = 0;
    Utf8Prefix(s.substr(i), &valid, &needed);
    const size_t n = valid == needed ? needed : 1;
    lens.push_back(static_cast<int>(n));
    i += n;
  }
  return lens;
}

bool EndsWithIncompleteUtf8(absl::string_view s) {
  // Look at most 3 bytes back for a lead byte whose sequence is cut short.
  for (size_t back = 1; back <= 3 && back <= s.size(); ++back) {
    const absl::string_view tail = s.substr(s.size() - back);
    const uint8_t b = static_cast<uint8_t>(tail[0]);
    if ((b & 0xC0) == 0x80) continue;  // a continuation byte: keep looking
    size_t valid = 0, needed = 0;
    Utf8Prefix(tail, &valid, &needed);
    return valid == back && needed > back;
  }
  return false;
}

uint32_t ByteToUnicode(uint8_t b) { return Tables().to_cp[b]; }

int UnicodeToByte(uint32_t cp) {
  return cp < Tables().to_byte.size() ? Tables().to_byte[cp] : -1;
}

std::string ByteLevelEncode(absl::string_view s) {
  std::string out;
  out.reserve(s.size() * 2);
  for (char c : s) AppendUtf8(ByteToUnicode(static_cast<uint8_t>(c)), &out);
  return out;
}

}  // namespace tandem
