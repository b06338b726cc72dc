// FNV-1a, 64 bits, over bytes: a hash that is the same in every process and
// build (absl::Hash is seeded per process), for fingerprints two workers
// compare and for the synthetic weights' seeds.
#ifndef TANDEM_COMMON_BASE_FNV1A_H_
#define TANDEM_COMMON_BASE_FNV1A_H_

#include <cstdint>

#include "absl/strings/string_view.h"

namespace tandem {

inline uint64_t Fnv1a64(absl::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_FNV1A_H_
