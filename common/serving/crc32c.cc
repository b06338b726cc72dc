#include "common/serving/crc32c.h"

#include <array>
#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#elif defined(__aarch64__)
#include <arm_acle.h>
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace tandem {
namespace {

// Slicing-by-8 tables for the reflected polynomial 0x82F63B78.
struct Tables {
  std::array<std::array<uint32_t, 256>, 8> t;
  Tables() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82F63B78u & (0u - (c & 1u)));
      t[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; ++i) {
      for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xff];
    }
  }
};

const Tables& GetTables() {
  static const Tables tables;
  return tables;
}

// The instructions update the register form of the CRC (not inverted), as
// the table loop does; one dependent chain of 8-byte steps. (Three chains
// merged by carry-less multiplication would run ~3x faster; one already
// checksums well above what a socket moves, so the simpler form is kept.)
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t HardwareUpdate(uint32_t c, const uint8_t* p,
                                                          size_t size) {
  uint64_t c64 = c;
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = _mm_crc32_u64(c64, v);
    p += 8;
    size -= 8;
  }
  c = static_cast<uint32_t>(c64);
  while (size-- > 0) c = _mm_crc32_u8(c, *p++);
  return c;
}
bool HasHardware() { return __builtin_cpu_supports("sse4.2"); }
constexpr const char* kHardwareName = "sse4.2";
#elif defined(__aarch64__)
__attribute__((target("+crc"))) uint32_t HardwareUpdate(uint32_t c, const uint8_t* p,
                                                        size_t size) {
  while (size >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = __crc32cd(c, v);
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = __crc32cb(c, *p++);
  return c;
}
bool HasHardware() { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
constexpr const char* kHardwareName = "arm-crc";
#else
uint32_t HardwareUpdate(uint32_t c, const uint8_t*, size_t) { return c; }
bool HasHardware() { return false; }
constexpr const char* kHardwareName = "tables";
#endif

bool UseHardware() {
  static const bool use = HasHardware();
  return use;
}

}  // namespace

uint32_t Crc32cPortable(uint32_t crc, const void* data, size_t size) {
  const auto& t = GetTables().t;
  const uint8_t* p = static_cast<const uint8_t*>(data);
  uint32_t c = ~crc;
  while (size >= 8) {
    const uint32_t lo = c ^ (uint32_t{p[0]} | uint32_t{p[1]} << 8 | uint32_t{p[2]} << 16 |
                             uint32_t{p[3]} << 24);
    const uint32_t hi = uint32_t{p[4]} | uint32_t{p[5]} << 8 | uint32_t{p[6]} << 16 |
                        uint32_t{p[7]} << 24;
    c = t[7][lo & 0xff] ^ t[6][(lo >> 8) & 0xff] ^ t[5][(lo >> 16) & 0xff] ^ t[4][lo >> 24] ^
        t[3][hi & 0xff] ^ t[2][(hi >> 8) & 0xff] ^ t[1][(hi >> 16) & 0xff] ^ t[0][hi >> 24];
    p += 8;
    size -= 8;
  }
  while (size-- > 0) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xff];
  return ~c;
}

uint32_t Crc32c(uint32_t crc, const void* data, size_t size) {
  if (!UseHardware()) return Crc32cPortable(crc, data, size);
  return ~HardwareUpdate(~crc, static_cast<const uint8_t*>(data), size);
}

const char* Crc32cImplementation() { return UseHardware() ? kHardwareName : "tables"; }

}  // namespace tandem
