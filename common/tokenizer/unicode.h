// UTF-8 helpers the tokenizers need, written to match Hugging Face
// `tokenizers` (Rust) byte for byte:
//  - Utf8Lossy: Rust's String::from_utf8_lossy / Python's
//    bytes.decode("utf-8", "replace"): each maximal invalid subpart becomes
//    one U+FFFD;
//  - the GPT-2 byte <-> character table of the ByteLevel pre-tokenizer.
//
// Pure functions; thread-safe.
#ifndef TANDEM_COMMON_TOKENIZER_UNICODE_H_
#define TANDEM_COMMON_TOKENIZER_UNICODE_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "common/base/utf8.h"  // AppendUtf8

namespace tandem {

// `bytes` as valid UTF-8, invalid subparts replaced by U+FFFD.
std::string Utf8Lossy(absl::string_view bytes);

// Splits valid UTF-8 into its code points' byte lengths (1-4); an invalid
// byte counts as a length-1 unit.
std::vector<int> Utf8CharLengths(absl::string_view s);

// Whether `s` ends in the middle of a UTF-8 sequence that more bytes could
// complete (a valid lead byte followed by too few continuation bytes).
bool EndsWithIncompleteUtf8(absl::string_view s);

// GPT-2 bytes_to_unicode(): byte -> code point, and the reverse (-1 when a
// code point is not in the table).
uint32_t ByteToUnicode(uint8_t b);
int UnicodeToByte(uint32_t cp);

// The byte-level form of `s`: every byte replaced by its table character.
std::string ByteLevelEncode(absl::string_view s);

}  // namespace tandem

#endif  // TANDEM_COMMON_TOKENIZER_UNICODE_H_
