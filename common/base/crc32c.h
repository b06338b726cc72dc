// CRC32C (Castagnoli), used to checksum KV chunks: the CPU's CRC32C
// instruction where it has one (SSE4.2 on x86-64, the CRC extension on
// AArch64, detected at run time), with carry-less multiplication for long
// inputs on x86 CPUs with AVX-512 and VPCLMULQDQ, else slicing-by-8 tables.
// Written here because Debian 12 packages neither Google's crc32c library nor
// Abseil's absl/crc (Abseil 20220623 predates it).
#ifndef TANDEM_COMMON_BASE_CRC32C_H_
#define TANDEM_COMMON_BASE_CRC32C_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace tandem {

// Extends `crc` (0 to start) over `size` bytes.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);
// Copies `size` bytes from src to dst (not overlapping) and extends `crc` over
// them, reading each byte once: the same result as memcpy, then Crc32c.
uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t size);

// The table-driven form, whatever the CPU (tests compare the others to it).
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);

// What Crc32c and Crc32cCopy use: "avx512-vpclmulqdq" or "avx2-vpclmulqdq"
// (carry-less folds for inputs of 256 or 128 bytes and more, shorter ones by
// the instruction), "sse4.2" or "arm-crc" (the CRC instruction), "tables".
const char* Crc32cImplementation();
// The forms this CPU runs, best first; the best is used unless
// UseCrc32cImplementation names another ("" restores the best), for tests
// and benchmarks. False (nothing changed) for a form this CPU lacks.
std::vector<std::string> Crc32cImplementations();
bool UseCrc32cImplementation(std::string_view name);

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_CRC32C_H_
