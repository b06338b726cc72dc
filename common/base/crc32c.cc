#include "common/base/crc32c.h"

#include <array>
#include <atomic>
#include <cstring>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
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

// Three chains at once. The CRC instruction has a latency of 3 cycles and a
// throughput of 1, so one dependent chain of 8-byte steps runs at a third of
// what the unit can do (10.4 GB/s on a Zen 5 core; a KV stream checksums
// every byte on both workers). The data is cut into three equal spans whose
// chains run interleaved, then joined: the register after spans A, B, C is
// Z(Z(a) ^ b) ^ c, where a, b, c are the spans' registers (B's and C's from
// 0) and Z appends one span's length of zero bytes, a linear map over
// GF(2) applied by four table lookups (ZeroTable).

constexpr uint32_t kPoly = 0x82F63B78u;  // reflected

// A linear map on the 32-bit register: column i is the image of bit i.
using Gf2Map = std::array<uint32_t, 32>;

uint32_t Apply(const Gf2Map& m, uint32_t v) {
  uint32_t r = 0;
  for (int i = 0; v != 0; ++i, v >>= 1) {
    if (v & 1u) r ^= m[i];
  }
  return r;
}

Gf2Map Compose(const Gf2Map& outer, const Gf2Map& inner) {
  Gf2Map r;
  for (int i = 0; i < 32; ++i) r[i] = Apply(outer, inner[i]);
  return r;
}

// Appending `bytes` zero bytes to the register, as four byte-indexed tables.
struct ZeroTable {
  std::array<std::array<uint32_t, 256>, 4> t;
  explicit ZeroTable(size_t bytes) {
    Gf2Map bit;  // one zero bit: c = (c >> 1) ^ (c & 1 ? kPoly : 0)
    bit[0] = kPoly;
    for (int i = 1; i < 32; ++i) bit[i] = 1u << (i - 1);
    Gf2Map op;  // identity, then bit^(8 * bytes) by squaring
    for (int i = 0; i < 32; ++i) op[i] = 1u << i;
    for (size_t n = 8 * bytes; n != 0; n >>= 1) {
      if (n & 1u) op = Compose(bit, op);
      bit = Compose(bit, bit);
    }
    for (uint32_t b = 0; b < 256; ++b) {
      for (int k = 0; k < 4; ++k) t[k][b] = Apply(op, b << (8 * k));
    }
  }
  uint32_t operator()(uint32_t c) const {
    return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
  }
};

// Span lengths: long spans for the bulk (the join costs two table shifts per
// 24 KiB), short ones for what is left.
constexpr size_t kLongSpan = 8192;
constexpr size_t kShortSpan = 256;

const ZeroTable& LongZeros() {
  static const ZeroTable t(kLongSpan);
  return t;
}
const ZeroTable& ShortZeros() {
  static const ZeroTable t(kShortSpan);
  return t;
}

inline uint64_t Load64(const uint8_t* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  return v;
}

// An 8-byte word of p at i, also stored at d + i when copying (d: nullptr
// otherwise, and kCopy false so that the store is compiled out).
template <bool kCopy>
__attribute__((always_inline)) inline uint64_t Take64(const uint8_t* p, uint8_t* d, size_t i) {
  const uint64_t v = Load64(p + i);
  if constexpr (kCopy) std::memcpy(d + i, &v, 8);
  return v;
}

// The register c extended over p[0, size) with Step (one 8-byte step of the
// CPU's CRC instruction) and Byte (one byte), three chains at a time; with
// kCopy each word is also stored to d as it is read, so a copy costs no
// second pass over the bytes (the KV exporter's rows: read once from the
// cache). Inlined into each target-specific caller so the instructions
// inline too.
template <bool kCopy, uint64_t (*Step)(uint64_t, uint64_t), uint32_t (*Byte)(uint32_t, uint8_t)>
__attribute__((always_inline)) inline uint32_t Interleaved(uint32_t c, const uint8_t* p,
                                                           uint8_t* d, size_t size) {
  uint64_t c0 = c;
  for (const auto& [span, zeros] :
       {std::pair<size_t, const ZeroTable*>{kLongSpan, &LongZeros()},
        std::pair<size_t, const ZeroTable*>{kShortSpan, &ShortZeros()}}) {
    while (size >= 3 * span) {
      uint64_t c1 = 0, c2 = 0;
      for (size_t i = 0; i < span; i += 8) {
        c0 = Step(c0, Take64<kCopy>(p, d, i));
        c1 = Step(c1, Take64<kCopy>(p, d, span + i));
        c2 = Step(c2, Take64<kCopy>(p, d, 2 * span + i));
      }
      c0 = (*zeros)(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c1);
      c0 = (*zeros)(static_cast<uint32_t>(c0)) ^ static_cast<uint32_t>(c2);
      p += 3 * span;
      if constexpr (kCopy) d += 3 * span;
      size -= 3 * span;
    }
  }
  for (; size >= 8; p += 8, size -= 8) {
    c0 = Step(c0, Take64<kCopy>(p, d, 0));
    if constexpr (kCopy) d += 8;
  }
  c = static_cast<uint32_t>(c0);
  while (size-- > 0) {
    if constexpr (kCopy) *d++ = *p;
    c = Byte(c, *p++);
  }
  return c;
}

// The instructions update the register form of the CRC (not inverted), as
// the table loop does.
#if defined(__x86_64__)
__attribute__((target("sse4.2"))) inline uint64_t Step(uint64_t c, uint64_t v) {
  return _mm_crc32_u64(c, v);
}
__attribute__((target("sse4.2"))) inline uint32_t Byte(uint32_t c, uint8_t b) {
  return _mm_crc32_u8(c, b);
}
__attribute__((target("sse4.2"))) uint32_t HardwareUpdate(uint32_t c, const uint8_t* p,
                                                          size_t size) {
  return Interleaved<false, Step, Byte>(c, p, nullptr, size);
}
__attribute__((target("sse4.2"))) uint32_t HardwareCopy(uint32_t c, const uint8_t* p, uint8_t* d,
                                                        size_t size) {
  return Interleaved<true, Step, Byte>(c, p, d, size);
}
bool HasHardware() { return __builtin_cpu_supports("sse4.2"); }
constexpr const char* kHardwareName = "sse4.2";

// Carry-less multiplication (VPCLMULQDQ: AVX-512 on Ice Lake and later
// Xeons and Zen 4 on; 256-bit on Zen 3 and Intel's cores from Alder Lake on).
// The CRC instruction issues on one port, 8 bytes a cycle at best (three
// chains above); folding takes 64 (or 32) bytes in two multiplies and an xor,
// so 1 MiB is checksummed at 3x the rate with AVX-512 (crc32c_benchmark:
// docs/benchmarking.md). The message is folded into 128 bits congruent to it
// modulo the polynomial, as Intel's "Fast CRC Computation for Generic
// Polynomials Using PCLMULQDQ" describes (the Linux kernel's crc32-pclmul
// does the same), and the CRC instruction reduces those 16 bytes.

// x^e mod P, bit-reflected and shifted left by one: a folding constant as
// the reflected carry-less multiply wants it. With CRC32's polynomial this
// gives the kernel's published constants (0x154442bd4 for e = 4 * 128 + 32).
uint64_t FoldConstant(int e) {
  constexpr uint64_t kPolyNormal = 0x11EDC6F41u;  // CRC32C, x^32 included
  uint64_t r = 1;
  for (int i = 0; i < e; ++i) {
    r <<= 1;
    if (r & (uint64_t{1} << 32)) r ^= kPolyNormal;
  }
  uint64_t reflected = 0;
  for (int i = 0; i < 32; ++i) reflected |= ((r >> i) & 1) << (31 - i);
  return reflected << 1;
}

// A 128-bit lane's constants for folding it `bits` ahead: its low half times
// x^(bits + 32), its high half times x^(bits - 32).
struct FoldKeys {
  long long lo, hi;
  explicit FoldKeys(int bits)
      : lo(static_cast<long long>(FoldConstant(bits + 32))),
        hi(static_cast<long long>(FoldConstant(bits - 32))) {}
};
template <int kBits>
const FoldKeys& Keys() {
  static const FoldKeys k(kBits);
  return k;
}

#define TANDEM_FOLD128 __attribute__((target("pclmul,sse4.2")))
#define TANDEM_FOLD256 __attribute__((target("avx2,vpclmulqdq,pclmul,sse4.2")))
#define TANDEM_FOLD512 __attribute__((target("avx512f,vpclmulqdq,pclmul,sse4.2")))

TANDEM_FOLD128 inline __m128i Fold128(__m128i x, __m128i keys, __m128i next) {
  return _mm_xor_si128(_mm_xor_si128(_mm_clmulepi64_si128(x, keys, 0x00),
                                     _mm_clmulepi64_si128(x, keys, 0x11)),
                       next);
}
// The 16 (32, 64) bytes of p at i, also stored at d + i when copying (d:
// nullptr otherwise, never offset).
template <bool kCopy>
TANDEM_FOLD128 inline __m128i Take128(const uint8_t* p, uint8_t* d, size_t i) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i));
  if constexpr (kCopy) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), v);
  return v;
}

// The folds' end: `lanes` 128-bit lanes (in message order) folded into one,
// then 16 bytes at a time from p + at; the CRC instruction reduces the last
// 128 bits and takes the tail.
template <bool kCopy>
TANDEM_FOLD128 inline uint32_t FinishFolds(const __m128i* lanes, int count, const uint8_t* p,
                                           uint8_t* d, size_t at, size_t size) {
  const __m128i k128 = _mm_set_epi64x(Keys<128>().hi, Keys<128>().lo);
  __m128i x = lanes[0];
  for (int i = 1; i < count; ++i) x = Fold128(x, k128, lanes[i]);
  for (; at + 16 <= size; at += 16) x = Fold128(x, k128, Take128<kCopy>(p, d, at));
  uint64_t r = _mm_crc32_u64(0, static_cast<uint64_t>(_mm_cvtsi128_si64(x)));
  r = _mm_crc32_u64(r, static_cast<uint64_t>(_mm_extract_epi64(x, 1)));
  return Interleaved<kCopy, Step, Byte>(static_cast<uint32_t>(r), p + at,
                                        kCopy ? d + at : nullptr, size - at);
}

// (Sets, and lanes through memory, not GCC 12's broadcast, cast and extract
// intrinsics: those warn of an uninitialized operand in its header.)
TANDEM_FOLD512 inline __m512i Fold512(__m512i x, __m512i keys, __m512i next) {
  return _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x, keys, 0x00),
                                   _mm512_clmulepi64_epi128(x, keys, 0x11), next, 0x96);
}
template <bool kCopy>
TANDEM_FOLD512 inline __m512i Take512(const uint8_t* p, uint8_t* d, size_t i) {
  const __m512i v = _mm512_loadu_si512(p + i);
  if constexpr (kCopy) _mm512_storeu_si512(d + i, v);
  return v;
}
TANDEM_FOLD512 inline __m512i Keys512(const FoldKeys& k) {
  return _mm512_set_epi64(k.hi, k.lo, k.hi, k.lo, k.hi, k.lo, k.hi, k.lo);
}

// The register c extended over p[0, size), size >= 256 (and copied to d
// with kCopy): four 64-byte accumulators 256 bytes apart, then one.
template <bool kCopy>
TANDEM_FOLD512 uint32_t Folds512(uint32_t c, const uint8_t* p, uint8_t* d, size_t size) {
  __m512i k2048 = Keys512(Keys<2048>()), k512 = Keys512(Keys<512>());
  // In registers: GCC otherwise left the constants where it built them, on
  // the stack, as memory operands of every fold (37 against 60 GB/s).
  asm("" : "+v"(k2048), "+v"(k512));
  // The register enters as the message's first 4 bytes xored with it.
  __m512i z0 = _mm512_xor_si512(Take512<kCopy>(p, d, 0),
                                _mm512_set_epi64(0, 0, 0, 0, 0, 0, 0, c));
  __m512i z1 = Take512<kCopy>(p, d, 64), z2 = Take512<kCopy>(p, d, 128),
          z3 = Take512<kCopy>(p, d, 192);
  size_t at = 256;
  for (; at + 256 <= size; at += 256) {
    z0 = Fold512(z0, k2048, Take512<kCopy>(p, d, at));
    z1 = Fold512(z1, k2048, Take512<kCopy>(p, d, at + 64));
    z2 = Fold512(z2, k2048, Take512<kCopy>(p, d, at + 128));
    z3 = Fold512(z3, k2048, Take512<kCopy>(p, d, at + 192));
  }
  z3 = Fold512(Fold512(Fold512(z0, k512, z1), k512, z2), k512, z3);
  for (; at + 64 <= size; at += 64) z3 = Fold512(z3, k512, Take512<kCopy>(p, d, at));
  alignas(64) __m128i lanes[4];
  _mm512_store_si512(lanes, z3);
  return FinishFolds<kCopy>(lanes, 4, p, d, at, size);
}

TANDEM_FOLD256 inline __m256i Fold256(__m256i x, __m256i keys, __m256i next) {
  return _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x, keys, 0x00),
                                           _mm256_clmulepi64_epi128(x, keys, 0x11)),
                          next);
}
template <bool kCopy>
TANDEM_FOLD256 inline __m256i Take256(const uint8_t* p, uint8_t* d, size_t i) {
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i));
  if constexpr (kCopy) _mm256_storeu_si256(reinterpret_cast<__m256i*>(d + i), v);
  return v;
}
TANDEM_FOLD256 inline __m256i Keys256(const FoldKeys& k) {
  return _mm256_set_epi64x(k.hi, k.lo, k.hi, k.lo);
}

// As Folds512 with 32-byte accumulators, 128 bytes apart (size >= 128).
template <bool kCopy>
TANDEM_FOLD256 uint32_t Folds256(uint32_t c, const uint8_t* p, uint8_t* d, size_t size) {
  __m256i k1024 = Keys256(Keys<1024>()), k256 = Keys256(Keys<256>());
  asm("" : "+x"(k1024), "+x"(k256));  // in registers, as above
  __m256i y0 = _mm256_xor_si256(Take256<kCopy>(p, d, 0), _mm256_set_epi64x(0, 0, 0, c));
  __m256i y1 = Take256<kCopy>(p, d, 32), y2 = Take256<kCopy>(p, d, 64),
          y3 = Take256<kCopy>(p, d, 96);
  size_t at = 128;
  for (; at + 128 <= size; at += 128) {
    y0 = Fold256(y0, k1024, Take256<kCopy>(p, d, at));
    y1 = Fold256(y1, k1024, Take256<kCopy>(p, d, at + 32));
    y2 = Fold256(y2, k1024, Take256<kCopy>(p, d, at + 64));
    y3 = Fold256(y3, k1024, Take256<kCopy>(p, d, at + 96));
  }
  y3 = Fold256(Fold256(Fold256(y0, k256, y1), k256, y2), k256, y3);
  for (; at + 32 <= size; at += 32) y3 = Fold256(y3, k256, Take256<kCopy>(p, d, at));
  alignas(32) __m128i lanes[2];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), y3);
  return FinishFolds<kCopy>(lanes, 2, p, d, at, size);
}

bool HasVpclmulqdq() {
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  return __get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) && ((ecx >> 10) & 1) != 0;
}
bool HasFolds256() { return __builtin_cpu_supports("avx2") && HasVpclmulqdq(); }
bool HasFolds512() { return __builtin_cpu_supports("avx512f") && HasVpclmulqdq(); }
#elif defined(__aarch64__)
__attribute__((target("+crc"))) inline uint64_t Step(uint64_t c, uint64_t v) {
  return __crc32cd(static_cast<uint32_t>(c), v);
}
__attribute__((target("+crc"))) inline uint32_t Byte(uint32_t c, uint8_t b) {
  return __crc32cb(c, b);
}
__attribute__((target("+crc"))) uint32_t HardwareUpdate(uint32_t c, const uint8_t* p,
                                                        size_t size) {
  return Interleaved<false, Step, Byte>(c, p, nullptr, size);
}
__attribute__((target("+crc"))) uint32_t HardwareCopy(uint32_t c, const uint8_t* p, uint8_t* d,
                                                      size_t size) {
  return Interleaved<true, Step, Byte>(c, p, d, size);
}
bool HasHardware() { return (getauxval(AT_HWCAP) & HWCAP_CRC32) != 0; }
constexpr const char* kHardwareName = "arm-crc";
#else
uint32_t HardwareUpdate(uint32_t c, const uint8_t*, size_t) { return c; }
uint32_t HardwareCopy(uint32_t c, const uint8_t*, uint8_t*, size_t) { return c; }
bool HasHardware() { return false; }
constexpr const char* kHardwareName = "tables";
#endif

#if !defined(__x86_64__)
template <bool kCopy>
uint32_t Folds512(uint32_t c, const uint8_t*, uint8_t*, size_t) {
  return c;
}
template <bool kCopy>
uint32_t Folds256(uint32_t c, const uint8_t*, uint8_t*, size_t) {
  return c;
}
bool HasFolds256() { return false; }
bool HasFolds512() { return false; }
#endif

// The forms, best first, and which one Crc32c runs (the best this CPU has,
// unless UseCrc32cImplementation chose another).
enum Form : int { kFolds512, kFolds256, kInstruction, kTables };
constexpr const char* kFormNames[] = {"avx512-vpclmulqdq", "avx2-vpclmulqdq", kHardwareName,
                                      "tables"};
// Inputs shorter than a form's first load take the CRC instruction.
constexpr size_t kFoldsMin[] = {256, 128};

std::vector<int> Forms() {
  std::vector<int> forms;
  if (HasHardware()) {
    if (HasFolds512()) forms.push_back(kFolds512);
    if (HasFolds256()) forms.push_back(kFolds256);
    forms.push_back(kInstruction);
  }
  forms.push_back(kTables);
  return forms;
}

std::atomic<int>& Chosen() {
  static std::atomic<int> form{Forms().front()};
  return form;
}

template <bool kCopy>
uint32_t Update(uint32_t crc, const uint8_t* p, uint8_t* d, size_t size) {
  const int form = Chosen().load(std::memory_order_relaxed);
  if (form == kTables) {
    if constexpr (kCopy) {
      std::memcpy(d, p, size);
      return Crc32cPortable(crc, d, size);
    }
    return Crc32cPortable(crc, p, size);
  }
  if (form == kFolds512 && size >= kFoldsMin[kFolds512]) return ~Folds512<kCopy>(~crc, p, d, size);
  if (form == kFolds256 && size >= kFoldsMin[kFolds256]) return ~Folds256<kCopy>(~crc, p, d, size);
  if constexpr (kCopy) return ~HardwareCopy(~crc, p, d, size);
  return ~HardwareUpdate(~crc, p, size);
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
  return Update<false>(crc, static_cast<const uint8_t*>(data), nullptr, size);
}

uint32_t Crc32cCopy(uint32_t crc, void* dst, const void* src, size_t size) {
  return Update<true>(crc, static_cast<const uint8_t*>(src), static_cast<uint8_t*>(dst), size);
}

const char* Crc32cImplementation() { return kFormNames[Chosen().load()]; }

std::vector<std::string> Crc32cImplementations() {
  std::vector<std::string> names;
  for (int form : Forms()) names.emplace_back(kFormNames[form]);
  return names;
}

bool UseCrc32cImplementation(std::string_view name) {
  for (int form : Forms()) {
    if (name.empty() || name == kFormNames[form]) {
      Chosen().store(form);
      return true;
    }
  }
  return false;
}

}  // namespace tandem
