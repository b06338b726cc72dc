// CRC32C (Castagnoli), table-driven; used to checksum KV chunks.
#ifndef TANDEM_COMMON_SERVING_CRC32C_H_
#define TANDEM_COMMON_SERVING_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace tandem {

// Extends `crc` (0 to start) over `size` bytes.
uint32_t Crc32c(uint32_t crc, const void* data, size_t size);

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_CRC32C_H_
