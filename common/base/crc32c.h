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

namespace tandem {

// Extends `crc` (0 to start) over `size` bytes.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);
// Copies `size` bytes from src to dst (not overlapping) and extends `crc` over
// them, reading each byte once: the same result as memcpy, then Crc32c.
uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t size);

// The forms Crc32c chooses among, whatever the CPU (tests and benchmarks
// compare them): the table-driven one, and the CRC instruction's (the tables
// where the CPU has none) without the carry-less multiplication Crc32c folds
// long inputs with where the CPU has AVX-512's VPCLMULQDQ.
uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size);
uint32_t Crc32cByInstruction(uint32_t crc, const void* data, size_t size);
// "avx512-vpclmulqdq" (inputs of 256 bytes and more; shorter ones by the
// instruction), "sse4.2", "arm-crc" or "tables": what Crc32c uses here.
const char* Crc32cImplementation();

}  // namespace tandem

#endif  // TANDEM_COMMON_BASE_CRC32C_H_
