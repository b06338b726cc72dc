#include "common/base/crc32c.h"

#include <algorithm>
#include <cstdint>
#include <iostream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tandem {
namespace {

using Crc = uint32_t (*)(uint32_t, const void*, size_t);

// Runs fn once per form of Crc32c this CPU has (carry-less folds, the CRC
// instruction, the tables), with Crc32c switched to it; then back to the best.
template <typename Fn>
void OnEveryForm(Fn fn) {
  const std::vector<std::string> forms = Crc32cImplementations();
  ASSERT_FALSE(forms.empty());
  EXPECT_EQ(forms.back(), "tables");
  for (const std::string& form : forms) {
    ASSERT_TRUE(UseCrc32cImplementation(form)) << form;
    SCOPED_TRACE(form);
    EXPECT_EQ(Crc32cImplementation(), form);
    fn();
  }
  ASSERT_TRUE(UseCrc32cImplementation(""));
  EXPECT_EQ(Crc32cImplementation(), forms.front());
  EXPECT_FALSE(UseCrc32cImplementation("no-such-form"));
  std::cout << "CRC32C forms here:";
  for (const std::string& form : forms) std::cout << " " << form;
  std::cout << std::endl;
}

// RFC 3720's check values, for the instruction form and the tables alike.
TEST(Crc32cTest, KnownVectors) {
  OnEveryForm([] {
  for (Crc crc : {&Crc32c, &Crc32cPortable}) {
    EXPECT_EQ(crc(0, "123456789", 9), 0xE3069283u);
    EXPECT_EQ(crc(0, "", 0), 0u);
    const std::string zeros(32, '\0'), ones(32, '\xff');
    EXPECT_EQ(crc(0, zeros.data(), zeros.size()), 0x8A9136AAu);
    EXPECT_EQ(crc(0, ones.data(), ones.size()), 0x62A8AB43u);
    std::string ascending(32, '\0');
    for (int i = 0; i < 32; ++i) ascending[i] = static_cast<char>(i);
    EXPECT_EQ(crc(0, ascending.data(), ascending.size()), 0x46DD794Eu);
    // Extending equals one pass.
    EXPECT_EQ(crc(crc(0, "1234", 4), "56789", 5), 0xE3069283u);
  }
  });
}

// Every length and alignment (the 8-byte steps and the byte tail; from 256
// bytes on, the carry-less folds' 64- and 16-byte steps where the CPU has
// them), and extension at every split, give the tables' result.
TEST(Crc32cTest, InstructionsEqualTablesAtEveryLengthAndOffset) {
  std::vector<uint8_t> data(1100);
  uint32_t x = 12345;
  for (uint8_t& b : data) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  OnEveryForm([&] {
    for (size_t offset = 0; offset < 8; ++offset) {
      for (size_t n = 0; n + offset <= 1090; n += (n < 64 ? 1 : 37)) {
        const uint8_t* p = data.data() + offset;
        const uint32_t want = Crc32cPortable(0, p, n);
        ASSERT_EQ(Crc32c(0, p, n), want) << "offset " << offset << " length " << n;
        const size_t split = n / 3;
        ASSERT_EQ(Crc32c(Crc32c(0, p, split), p + split, n - split), want) << n;
      }
    }
  });
}

// Long inputs run as three interleaved chains (spans of 8192 and 256 bytes)
// joined by zero-appending tables: every length around the spans' multiples,
// at odd offsets, gives the tables' result.
TEST(Crc32cTest, InterleavedChainsEqualTablesOnLongInputs) {
  std::vector<uint8_t> data(3 * 8192 * 2 + 3 * 256 * 3 + 64);
  uint32_t x = 777;
  for (uint8_t& b : data) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  OnEveryForm([&] {
    for (size_t base : {size_t{3 * 256}, size_t{3 * 8192}, size_t{3 * 8192 + 3 * 256},
                        size_t{2 * 3 * 8192 + 2 * 3 * 256}}) {
      for (size_t n = base - 9; n <= base + 17; ++n) {
        for (size_t offset : {size_t{0}, size_t{3}}) {
          const uint8_t* p = data.data() + offset;
          ASSERT_EQ(Crc32c(0x1234567u, p, n), Crc32cPortable(0x1234567u, p, n))
              << "offset " << offset << " length " << n;
        }
      }
    }
  });
}

// The carry-less folds around their step sizes: 128 and 256 bytes (the four
// accumulators' first load), each 32-, 64- and 16-byte step and the byte tail
// after them, from several initial registers.
TEST(Crc32cTest, FoldsEqualTablesAroundTheirSteps) {
  std::vector<uint8_t> data(4096 + 64);
  uint32_t x = 4242;
  for (uint8_t& b : data) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  OnEveryForm([&] {
    for (size_t base : {size_t{128}, size_t{256}, size_t{512}, size_t{576}, size_t{1024},
                        size_t{4096}}) {
      for (size_t n = base - 17; n <= base + 33; ++n) {
        for (uint32_t init : {0u, 0xFFFFFFFFu, 0x89ABCDEFu}) {
          const uint8_t* p = data.data() + n % 7;
          ASSERT_EQ(Crc32c(init, p, n), Crc32cPortable(init, p, n)) << "length " << n;
        }
      }
    }
  });
}

// Copying while checksumming: the destination equals the source and the
// result equals the tables', for lengths around the spans' multiples and every
// offset of source and destination; no byte past the destination is written.
TEST(Crc32cTest, CopyingEqualsMemcpyThenCrc) {
  std::vector<uint8_t> data(3 * 8192 + 3 * 256 + 64);
  uint32_t x = 99;
  for (uint8_t& b : data) b = static_cast<uint8_t>((x = x * 1103515245u + 12345u) >> 24);
  OnEveryForm([&] {
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{9}, size_t{3 * 256 - 1},
                   size_t{3 * 256 + 5}, size_t{3 * 8192}, size_t{3 * 8192 + 3 * 256 + 13}}) {
    for (size_t from : {size_t{0}, size_t{5}}) {
      for (size_t to : {size_t{0}, size_t{3}}) {
        std::vector<uint8_t> out(n + to + 16, 0xAB);
        const uint8_t* src = data.data() + from;
        ASSERT_EQ(Crc32cCopy(0x5u, out.data() + to, src, n), Crc32cPortable(0x5u, src, n))
            << "length " << n << " offsets " << from << ", " << to;
        ASSERT_TRUE(std::equal(src, src + n, out.begin() + to)) << "length " << n;
        for (size_t i = 0; i < to; ++i) ASSERT_EQ(out[i], 0xAB) << i;
        for (size_t i = n + to; i < out.size(); ++i) ASSERT_EQ(out[i], 0xAB) << i;
      }
    }
  }
  });
}

}  // namespace
}  // namespace tandem
