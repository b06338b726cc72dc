#include "common/model/gguf.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/thread_pool.h"
#include "common/model/gguf_weights.h"
#include "common/model/safetensors.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

using ::testing::HasSubstr;

std::string Bytes(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }
std::string U16(uint16_t v) { return Bytes(&v, 2); }

// One block of each quantized type with known values.
std::string Q8Block(uint16_t d_half, int first) {
  std::string b = U16(d_half);
  for (int j = 0; j < 32; ++j) b.push_back(static_cast<char>(static_cast<int8_t>(first + j)));
  return b;
}
std::string Q4Block(const std::vector<uint16_t>& halves) {
  std::string b;
  for (uint16_t h : halves) b += U16(h);
  for (int j = 0; j < 16; ++j) b.push_back(static_cast<char>(j | ((15 - j) << 4)));
  return b;
}

std::string WriteTemp(const std::string& name, const std::string& bytes) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            (name + "_" + std::to_string(::getpid()) + ".gguf"))
                               .string();
  std::ofstream(path, std::ios::binary).write(bytes.data(), bytes.size());
  return path;
}

TEST(GgufTest, EveryTensorTypeRoundTrips) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddU32("llama.block_count", 2);
  w.AddF32("llama.rope.freq_base", 500000.0f);
  w.AddBool("tokenizer.ggml.add_bos_token", true);
  w.AddStringArray("tokenizer.ggml.tokens", {"a", "b", ""});
  w.AddI32Array("tokenizer.ggml.token_type", {1, 3, 6});
  const std::vector<float> f32 = {1.5f, -2.25f, 0.0f, 3.0f};
  w.AddTensor("f32", {4}, GgmlType::kF32, Bytes(f32.data(), 16));
  w.AddTensor("f16", {2}, GgmlType::kF16, U16(0x3E00) + U16(0xC000));    // 1.5, -2
  w.AddTensor("bf16", {2}, GgmlType::kBF16, U16(0x3F80) + U16(0xC040));  // 1, -3
  w.AddTensor("q8_0", {32}, GgmlType::kQ8_0, Q8Block(0x3800, -16));      // d = 0.5
  w.AddTensor("q4_0", {32}, GgmlType::kQ4_0, Q4Block({0x3C00}));         // d = 1
  w.AddTensor("q4_1", {32, 2}, GgmlType::kQ4_1,
              Q4Block({0x3800, 0xBC00}) + Q4Block({0x3C00, 0x0000}));   // (0.5, -1), (1, 0)
  const std::string path = WriteTemp("roundtrip", w.Serialize());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->version(), 3u);
  EXPECT_EQ(*(*f)->GetString("general.architecture"), "llama");
  EXPECT_EQ(*(*f)->GetInt("llama.block_count"), 2);
  EXPECT_EQ(*(*f)->GetFloat("llama.rope.freq_base"), 500000.0);
  EXPECT_TRUE(*(*f)->GetBool("tokenizer.ggml.add_bos_token"));
  EXPECT_THAT((*f)->Find("tokenizer.ggml.tokens")->strings, testing::ElementsAre("a", "b", ""));
  EXPECT_THAT((*f)->Find("tokenizer.ggml.token_type")->ints, testing::ElementsAre(1, 3, 6));
  EXPECT_EQ((*f)->GetInt("general.architecture").status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*f)->GetInt("no.such.key").status().code(), absl::StatusCode::kNotFound);

  auto read = [&](const char* name) {
    const GgufTensorInfo* t = (*f)->FindTensor(name);
    EXPECT_NE(t, nullptr) << name;
    std::vector<float> out(t->numel());
    EXPECT_TRUE((*f)->ReadF32(*t, out.data()).ok());
    return out;
  };
  EXPECT_EQ(read("f32"), f32);
  EXPECT_THAT(read("f16"), testing::ElementsAre(1.5f, -2.0f));
  EXPECT_THAT(read("bf16"), testing::ElementsAre(1.0f, -3.0f));
  std::vector<float> q8 = read("q8_0");
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q8[j], 0.5f * (j - 16)) << j;
  std::vector<float> q40 = read("q4_0");
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q40[j], static_cast<float>(j - 8)) << j;             // low nibbles first
    EXPECT_EQ(q40[j + 16], static_cast<float>(15 - j - 8)) << j;   // then high nibbles
  }
  std::vector<float> q41 = read("q4_1");
  ASSERT_EQ(q41.size(), 64u);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(q41[j], 0.5f * j - 1.0f) << j;
    EXPECT_EQ(q41[j + 16], 0.5f * (15 - j) - 1.0f) << j;
    EXPECT_EQ(q41[32 + j], static_cast<float>(j)) << j;
  }
  std::filesystem::remove(path);
}

TEST(GgufTest, UnsupportedTypeNamesTheTensor) {
  GgufWriter w;
  w.AddTensor("blk.0.ffn_up.weight", {32}, static_cast<GgmlType>(9), std::string(36, '\0'));
  const std::string bytes = w.Serialize();
  auto f = ParseGgufBytes(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "q8_1");
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<float> out(32);
  absl::Status s = (*f)->ReadF32((*f)->tensors()[0], out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("blk.0.ffn_up.weight"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("Q8_1"));
  // The message lists what is supported; the refused i-quants are named.
  EXPECT_THAT(std::string(s.message()), HasSubstr("Q6_K, IQ4_NL, IQ4_XS, BF16)"));
  EXPECT_EQ(GgmlTypeName(18), "IQ3_XXS");
  EXPECT_EQ(GgmlTypeName(39), "MXFP4");
  EXPECT_EQ(GgmlTypeName(30), "BF16");
  EXPECT_EQ(GgmlTypeName(99), "type 99");
}

// Q5_0, Q5_1, the K-quants (Q4_K_M and Q5_K_M files are Q4_K/Q5_K with
// Q6_K) and IQ4_NL / IQ4_XS decode as llama.cpp's gguf-py does, on blocks of random bytes
// (tests/fixtures/make_ggml_block_fixtures.py): equal up to one rounding.
TEST(GgufTest, KQuantsAndQ5DecodeAsGgufPy) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/ggml_blocks/";
  auto read = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    EXPECT_TRUE(in) << path;
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  for (const auto& [type, name] : std::vector<std::pair<GgmlType, std::string>>{
           {GgmlType::kQ5_0, "q5_0"}, {GgmlType::kQ5_1, "q5_1"}, {GgmlType::kQ2_K, "q2_k"},
           {GgmlType::kQ3_K, "q3_k"}, {GgmlType::kQ4_K, "q4_k"}, {GgmlType::kQ5_K, "q5_k"},
           {GgmlType::kQ6_K, "q6_k"}, {GgmlType::kIQ4_NL, "iq4_nl"},
           {GgmlType::kIQ4_XS, "iq4_xs"}}) {
    SCOPED_TRACE(name);
    const std::string blocks = read(dir + name + ".blocks");
    const std::string values = read(dir + name + ".f32");
    std::vector<float> want(values.size() / 4);
    std::memcpy(want.data(), values.data(), values.size());
    int64_t elems = 0, bytes = 0;
    ASSERT_TRUE(GgmlBlockLayout(static_cast<uint32_t>(type), &elems, &bytes));
    ASSERT_EQ(static_cast<int64_t>(blocks.size()) / bytes * elems,
              static_cast<int64_t>(want.size()));
    // Through a file, as the engine reads it.
    GgufWriter w;
    w.AddTensor("t", {static_cast<int64_t>(want.size())}, type, blocks);
    const std::string file = w.Serialize();
    auto f = ParseGgufBytes(reinterpret_cast<const uint8_t*>(file.data()), file.size(), name);
    ASSERT_TRUE(f.ok()) << f.status();
    std::vector<float> got(want.size());
    ASSERT_TRUE((*f)->ReadF32((*f)->tensors()[0], got.data()).ok());
    for (size_t i = 0; i < want.size(); ++i) {
      ASSERT_NEAR(got[i], want[i], 1e-6f * std::max(1.f, std::fabs(want[i]))) << i;
    }
    EXPECT_EQ(GgmlTypeName(static_cast<uint32_t>(type)), absl::AsciiStrToUpper(name));
  }
}

TEST(GgufTest, MalformedFilesAreCleanErrors) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  const std::vector<float> v(64, 1.0f);
  w.AddTensor("t", {64}, GgmlType::kF32, Bytes(v.data(), v.size() * 4));
  const std::string good = w.Serialize();
  auto parse = [](const std::string& b) {
    return ParseGgufBytes(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "test.gguf")
        .status();
  };
  ASSERT_TRUE(parse(good).ok());
  // Every truncation is an error, never a crash.
  for (size_t n = 0; n < good.size(); n += 7) {
    EXPECT_FALSE(parse(good.substr(0, n)).ok()) << n;
  }
  std::string bad_magic = good;
  bad_magic[0] = 'X';
  EXPECT_THAT(std::string(parse(bad_magic).message()), HasSubstr("bad magic"));
  std::string bad_version = good;
  bad_version[4] = 9;
  EXPECT_THAT(std::string(parse(bad_version).message()), HasSubstr("version 9"));
  // Absurd counts: tensor count (bytes 8..15) and metadata count (16..23).
  std::string many = good;
  std::memset(&many[8], 0x7f, 8);
  EXPECT_THAT(std::string(parse(many).message()), HasSubstr("absurd tensor count"));
  many = good;
  std::memset(&many[16], 0x7f, 8);
  EXPECT_THAT(std::string(parse(many).message()), HasSubstr("absurd metadata count"));
  // A string length past the end of the file (the first key's length).
  std::string long_key = good;
  std::memset(&long_key[24], 0xff, 7);
  EXPECT_THAT(std::string(parse(long_key).message()), HasSubstr("truncated"));
  // A tensor offset past the data section. The tensor info of "t" is its
  // name (8-byte length + 1 byte), rank (4), one dim (8), type (4), offset (8).
  const size_t name_pos = good.find(std::string("\x01\0\0\0\0\0\0\0t", 9));
  ASSERT_NE(name_pos, std::string::npos);
  std::string far = good;
  far[name_pos + 9 + 4 + 8 + 4 + 1] = 0x40;  // offset 0x4000
  EXPECT_THAT(std::string(parse(far).message()), HasSubstr("outside the data section"));
  EXPECT_EQ(GgufFile::Open("/nonexistent/model.gguf").status().code(),
            absl::StatusCode::kNotFound);
}

// A file without tensors (llama.cpp's vocab-only ggml-vocab-*.gguf) may end
// at its metadata, without the padding to a data section.
TEST(GgufTest, AVocabOnlyFileMayEndAtItsMetadata) {
  GgufWriter w;
  w.AddString("general.architecture", "llama");
  w.AddString("tokenizer.ggml.model", "gpt2");
  std::string vocab = w.Serialize();
  while (!vocab.empty() && vocab.back() == '\0') vocab.pop_back();
  ASSERT_NE(vocab.size() % 32, 0u);  // unpadded
  auto f = ParseGgufBytes(reinterpret_cast<const uint8_t*>(vocab.data()), vocab.size(), "vocab.gguf");
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ((*f)->Find("tokenizer.ggml.model")->s, "gpt2");
}

// The block types quantize as GGML does: blocks its quantizer makes (the
// largest magnitude at the end of the range), widened, come back as the same
// bytes.
TEST(GgufTest, BlocksRequantizeToThemselves) {
  std::string q8 = U16(0x3800);  // d = 0.5, q = -127, -119, ..., 121
  for (int j = 0; j < 32; ++j) q8.push_back(static_cast<char>(static_cast<int8_t>(-127 + 8 * j)));
  for (auto [type, block] :
       {std::pair{DType::kQ4_0, Q4Block({0x3C00})}, std::pair{DType::kQ4_1, Q4Block({0x3800, 0xBC00})},
        std::pair{DType::kQ8_0, q8}}) {
    std::vector<float> x(32);
    ConvertToF32(block.data(), type, x.data(), 32);
    std::string again(block.size(), '\0');
    ConvertFromF32(x.data(), type, again.data(), 32);
    EXPECT_EQ(again, block) << DTypeName(type);
  }
}

// ReadBlocks gives a Q4_1 tensor's blocks as stored, q/k rows un-permuted
// like ReadF32's; other types have no blocks to give.
TEST(GgufWeightsTest, ReadBlocksKeepsBlocksAndUnpermutesQk) {
  GgufWriter w;
  std::string rows;
  for (int r = 0; r < 4; ++r) rows += Q4Block({static_cast<uint16_t>(0x3C00 + r), 0x0000});
  w.AddTensor("blk.0.attn_q.weight", {32, 4}, GgmlType::kQ4_1, rows);
  const std::vector<float> f32(32 * 4, 1.f);
  w.AddTensor("blk.0.ffn_up.weight", {32, 4}, GgmlType::kF32, Bytes(f32.data(), f32.size() * 4));
  const std::string path = WriteTemp("blocks", w.Serialize());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  LlamaConfig c;
  c.num_attention_heads = 1;  // one head of 4 rows: stored order 0, 2, 1, 3
  GgufWeights weights(f->get(), c);
  const std::string q = "model.layers.0.self_attn.q_proj.weight";
  EXPECT_EQ(weights.BlockType(q), DType::kQ4_1);
  EXPECT_EQ(weights.BlockType("model.layers.0.mlp.up_proj.weight"), std::nullopt);
  std::string blocks(4 * 20, '\0');
  ASSERT_TRUE(weights.ReadBlocks(q, {4, 32}, blocks.data()).ok());
  std::vector<float> widened(4 * 32), direct(4 * 32);
  ConvertToF32(blocks.data(), DType::kQ4_1, widened.data(), 4 * 32);
  ASSERT_TRUE(weights.ReadF32(q, {4, 32}, direct.data()).ok());
  EXPECT_EQ(widened, direct);
  EXPECT_EQ(blocks.substr(20, 20), rows.substr(40, 20));  // row 1 was stored third
  EXPECT_EQ(weights.ReadBlocks(q, {4, 64}, blocks.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(weights.ReadBlocks("model.layers.0.mlp.up_proj.weight", {4, 32},
                                             blocks.data()).message()),
              HasSubstr("not rows of whole blocks"));
  std::filesystem::remove(path);
}

// A tensor of `type` written as one layer's k_proj of `rows` x `cols` (one
// head: its rows un-permuted on read), read as the engine keeps it (blocks of
// `kept_type`, widened) and as f32.
struct KeptAndRead {
  bool ok = false;
  std::string blocks;
  std::vector<float> kept, direct;
};
KeptAndRead ReadKeptAndF32(GgmlType type, const std::string& data, int64_t rows, int64_t cols,
                           DType kept_type) {
  KeptAndRead r;
  GgufWriter w;
  w.AddTensor("blk.0.attn_k.weight", {cols, rows}, type, data);
  const std::string path = WriteTemp("kept", w.Serialize());
  auto f = GgufFile::Open(path);
  EXPECT_TRUE(f.ok()) << f.status();
  if (!f.ok()) return r;
  LlamaConfig c;
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  GgufWeights weights(f->get(), c);
  const std::string k = "model.layers.0.self_attn.k_proj.weight";
  EXPECT_EQ(weights.BlockType(k), kept_type);
  r.blocks.assign(DTypeBytes(kept_type, rows * cols), '\0');
  r.kept.resize(rows * cols);
  r.direct.resize(rows * cols);
  const absl::Status kept = weights.ReadBlocks(k, {rows, cols}, r.blocks.data());
  const absl::Status direct = weights.ReadF32(k, {rows, cols}, r.direct.data());
  EXPECT_TRUE(kept.ok()) << kept;
  EXPECT_TRUE(direct.ok()) << direct;
  ConvertToF32(r.blocks.data(), kept_type, r.kept.data(), rows * cols);
  std::filesystem::remove(path);
  r.ok = kept.ok() && direct.ok() && weights.BlockType(k) == kept_type;
  return r;
}

// A Q5_0 tensor (most of a Q4_K_M file of a model whose rows are not
// multiples of 256) and an IQ4_NL one (the same in an IQ4_XS file) are kept
// as Q8_0 with exactly their values, every quant (and Q5_0's fifth bit)
// included, q/k rows un-permuted as ReadF32's.
TEST(GgufWeightsTest, Q5_0AndIq4NlAreKeptAsQ8_0Exactly) {
  for (const auto& [type, block_bytes] :
       std::vector<std::pair<GgmlType, size_t>>{{GgmlType::kQ5_0, 22}, {GgmlType::kIQ4_NL, 18}}) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(type)));
    std::mt19937 rng(7);
    const int rows = 4, cols = 64;  // two blocks a row
    std::string data(rows * cols / 32 * block_bytes, '\0');
    for (char& c : data) c = static_cast<char>(rng() & 0xff);
    for (size_t at = 0; at < data.size(); at += block_bytes) {  // finite f16 scales of either sign
      const uint16_t d = static_cast<uint16_t>(0x2000 + (rng() & 0x0fff)) | ((rng() & 1) << 15);
      std::memcpy(&data[at], &d, 2);
    }
    const KeptAndRead r = ReadKeptAndF32(type, data, rows, cols, DType::kQ8_0);
    ASSERT_TRUE(r.ok);
    EXPECT_EQ(r.kept, r.direct);
    std::set<float> distinct(r.direct.begin(), r.direct.end());
    EXPECT_GT(distinct.size(), 100u);  // the random quants, not a constant
  }
}

// Q4_K (most of a Q4_K_M file) is kept as Q4_1 blocks of its 32-element
// sub-blocks: the same quants, each sub-block's scale and minimum rounded
// to f16, so each value within 2^-11 of that rounding's reach; q/k rows
// un-permuted as ReadF32's.
TEST(GgufWeightsTest, Q4KIsKeptAsQ4_1SubBlocks) {
  const std::string dir = std::string(TANDEM_SOURCE_DIR) + "/tests/fixtures/ggml_blocks/";
  std::ifstream in(dir + "q4_k.blocks", std::ios::binary);
  ASSERT_TRUE(in);
  const std::string data(std::istreambuf_iterator<char>(in), {});
  const int64_t rows = 6, cols = 256;  // the fixture's six blocks, one a row
  ASSERT_EQ(data.size(), static_cast<size_t>(rows * 144));
  const KeptAndRead r = ReadKeptAndF32(GgmlType::kQ4_K, data, rows, cols, DType::kQ4_1);
  ASSERT_TRUE(r.ok);
  const std::string& blocks = r.blocks;
  const std::vector<float>& kept = r.kept;
  const std::vector<float>& direct = r.direct;
  for (int64_t b = 0; b < rows * cols / 32; ++b) {
    uint16_t dh, mh;
    std::memcpy(&dh, &blocks[b * 20], 2);
    std::memcpy(&mh, &blocks[b * 20 + 2], 2);
    const float reach = 15 * std::fabs(F16ToF32(dh)) + std::fabs(F16ToF32(mh));
    for (int i = 0; i < 32; ++i) {
      ASSERT_LE(std::fabs(kept[b * 32 + i] - direct[b * 32 + i]), reach / 2048 * 1.01f + 1e-30f)
          << "block " << b << " element " << i;
    }
  }
  std::set<float> distinct(direct.begin(), direct.end());
  EXPECT_GT(distinct.size(), 500u);  // the random quants, not a constant
}

// Reads split by rows over a pool's threads (the loader's) give the bytes
// one thread gives: blocks kept as stored (Q8_0), repacked (Q4_K as Q4_1),
// requantized (Q6_K as Q8_0), and every type decoded to f32; ranges of rows
// land where the rows belong.
TEST(GgufWeightsTest, ReadsSplitOverAPoolEqualOneThread) {
  std::mt19937 rng(11);
  const int64_t rows = 1024, cols = 256;  // several 64 KiB ranges of output
  struct Case {
    GgmlType type;
    size_t block_bytes;
    std::vector<size_t> scales;  // where each block's f16 scales are
  };
  for (const Case& tc : {Case{GgmlType::kQ8_0, 34, {0}}, Case{GgmlType::kQ4_K, 144, {0, 2}},
                         Case{GgmlType::kQ6_K, 210, {208}}}) {
    SCOPED_TRACE(GgmlTypeName(static_cast<uint32_t>(tc.type)));
    const size_t per_row = cols / (tc.type == GgmlType::kQ8_0 ? 32 : 256);
    std::string data(rows * per_row * tc.block_bytes, '\0');
    for (char& c : data) c = static_cast<char>(rng() & 0xff);
    for (size_t at = 0; at < data.size(); at += tc.block_bytes) {  // finite scales
      for (size_t s : tc.scales) {
        const uint16_t d = static_cast<uint16_t>(0x2000 + (rng() & 0x0fff));
        std::memcpy(&data[at + s], &d, 2);
      }
    }
    GgufWriter w;
    w.AddTensor("blk.0.ffn_up.weight", {cols, rows}, tc.type, data);
    const std::string path = WriteTemp("pool", w.Serialize());
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f.ok()) << f.status();
    const std::string name = "model.layers.0.mlp.up_proj.weight";
    GgufWeights alone(f->get(), LlamaConfig());
    GgufWeights split(f->get(), LlamaConfig());
    ThreadPool pool(3);
    split.set_pool(&pool);
    const std::optional<DType> kept = alone.BlockType(name);
    ASSERT_TRUE(kept.has_value());
    std::string a(DTypeBytes(*kept, rows * cols), '\0'), b(a.size(), '\1');
    ASSERT_TRUE(alone.ReadBlocks(name, {rows, cols}, a.data()).ok());
    ASSERT_TRUE(split.ReadBlocks(name, {rows, cols}, b.data()).ok());
    EXPECT_TRUE(a == b);
    std::vector<float> fa(rows * cols), fb(rows * cols, -1.f);
    ASSERT_TRUE(alone.ReadF32(name, {rows, cols}, fa.data()).ok());
    ASSERT_TRUE(split.ReadF32(name, {rows, cols}, fb.data()).ok());
    EXPECT_EQ(0, std::memcmp(fa.data(), fb.data(), fa.size() * sizeof(float)));
    std::set<float> distinct(fa.begin(), fa.end());
    EXPECT_GT(distinct.size(), 1000u);  // the random quants, not a constant
    std::filesystem::remove(path);
  }
}

// Experts stacked in one GGUF tensor [experts, rows, cols] (llama.cpp's
// ffn_*_exps) read as each expert's Hugging Face tensor: its slice, as f32
// and as its blocks; the listing names every expert; a missing expert or a
// wrong shape is refused by name.
TEST(GgufWeightsTest, StackedExpertsReadAsEachExpertsTensor) {
  std::mt19937 rng(3);
  const int64_t experts = 3, rows = 4, cols = 64;
  const int64_t block_count = experts * rows * cols / 32;
  std::string data(block_count * 34, '\0');
  for (char& c : data) c = static_cast<char>(rng() & 0xff);
  for (int64_t b = 0; b < block_count; ++b) {  // finite f16 scales
    const uint16_t d = static_cast<uint16_t>(0x2000 + (rng() & 0x0fff));
    std::memcpy(&data[b * 34], &d, 2);
  }
  GgufWriter w;
  w.AddTensor("blk.0.ffn_gate_exps.weight", {cols, rows, experts}, GgmlType::kQ8_0, data);
  const std::string path = WriteTemp("experts", w.Serialize());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  std::vector<float> all(experts * rows * cols);
  ASSERT_TRUE((*f)->ReadF32((*f)->tensors()[0], all.data()).ok());
  LlamaConfig c;
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  c.num_experts = experts;
  GgufWeights weights(f->get(), c);
  const size_t slice_bytes = DTypeBytes(DType::kQ8_0, rows * cols);
  for (int e = 0; e < experts; ++e) {
    SCOPED_TRACE(e);
    const std::string name = absl::StrCat("model.layers.0.mlp.experts.", e, ".gate_proj.weight");
    EXPECT_EQ(GgufWeights::GgufName(name), "blk.0.ffn_gate_exps.weight");
    EXPECT_TRUE(weights.Has(name));
    EXPECT_EQ(weights.BlockType(name), DType::kQ8_0);
    std::vector<float> got(rows * cols);
    ASSERT_TRUE(weights.ReadF32(name, {rows, cols}, got.data()).ok());
    EXPECT_TRUE(std::equal(got.begin(), got.end(), all.begin() + e * rows * cols));
    std::string blocks(slice_bytes, '\0');
    ASSERT_TRUE(weights.ReadBlocks(name, {rows, cols}, blocks.data()).ok());
    EXPECT_EQ(blocks, data.substr(e * slice_bytes, slice_bytes));
  }
  EXPECT_FALSE(weights.Has("model.layers.0.mlp.experts.3.gate_proj.weight"));
  std::vector<float> out(rows * cols);
  absl::Status s = weights.ReadF32("model.layers.0.mlp.experts.3.gate_proj.weight", {rows, cols},
                                   out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("expert 3"));
  s = weights.ReadF32("model.layers.0.mlp.experts.0.gate_proj.weight", {rows * 2, cols / 2},
                      out.data());
  EXPECT_THAT(std::string(s.message()), HasSubstr("[3, 4, 64]"));
  EXPECT_EQ(weights.TensorNames(),
            (std::vector<std::string>{"model.layers.0.mlp.experts.0.gate_proj.weight",
                                      "model.layers.0.mlp.experts.1.gate_proj.weight",
                                      "model.layers.0.mlp.experts.2.gate_proj.weight"}));
  // More experts in the file than the config says: listed up to one past.
  c.num_experts = 1;
  EXPECT_EQ(GgufWeights(f->get(), c).TensorNames().size(), 2u);
  std::filesystem::remove(path);
}

// Mixtral files written before llama.cpp stacked experts (2024-04) hold one
// tensor an expert ("blk.N.ffn_gate.J.weight"): read by the same Hugging Face
// names, Mixtral's (block_sparse_moe, w1/w2/w3) for a Mixtral config.
TEST(GgufWeightsTest, OneTensorAnExpertReadsAsMixtralNames) {
  const int64_t rows = 4, cols = 32;
  GgufWriter w;
  std::vector<std::vector<float>> values;
  for (int e = 0; e < 2; ++e) {
    values.emplace_back(rows * cols);
    for (int64_t i = 0; i < rows * cols; ++i) values[e][i] = static_cast<float>(e * 1000 + i);
    w.AddTensor(absl::StrCat("blk.1.ffn_up.", e, ".weight"), {cols, rows}, GgmlType::kF32,
                Bytes(values[e].data(), values[e].size() * 4));
  }
  const std::vector<float> router(2 * cols, 0.5f);
  w.AddTensor("blk.1.ffn_gate_inp.weight", {cols, 2}, GgmlType::kF32,
              Bytes(router.data(), router.size() * 4));
  const std::string path = WriteTemp("legacy_experts", w.Serialize());
  auto f = GgufFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  LlamaConfig c;
  c.family = FindHfFamily("MixtralForCausalLM");
  c.num_attention_heads = 1;
  c.num_key_value_heads = 1;
  GgufWeights weights(f->get(), c);
  for (int e = 0; e < 2; ++e) {
    const std::string name = absl::StrCat("model.layers.1.block_sparse_moe.experts.", e, ".w3.weight");
    EXPECT_TRUE(weights.Has(name));
    std::vector<float> got(rows * cols);
    ASSERT_TRUE(weights.ReadF32(name, {rows, cols}, got.data()).ok());
    EXPECT_EQ(got, values[e]);
  }
  EXPECT_FALSE(weights.Has("model.layers.1.block_sparse_moe.experts.2.w3.weight"));
  EXPECT_EQ(weights.TensorNames(),
            (std::vector<std::string>{"model.layers.1.block_sparse_moe.experts.0.w3.weight",
                                      "model.layers.1.block_sparse_moe.experts.1.w3.weight",
                                      "model.layers.1.block_sparse_moe.gate.weight"}));
  std::filesystem::remove(path);
}

// The architecture picks the family and its metadata prefix; another one,
// or a part no family has, is refused by name.
TEST(GgufWeightsTest, ArchitectureNamesTheFamilyOrIsRefused) {
  auto config_of = [](const std::string& arch, int64_t sliding_window, int experts = 0) {
    GgufWriter w;
    w.AddString("general.architecture", arch);
    w.AddU32(arch + ".embedding_length", 64);
    w.AddU32(arch + ".feed_forward_length", 128);
    w.AddU32(arch + ".block_count", 1);
    w.AddU32(arch + ".attention.head_count", 4);
    w.AddU32(arch + ".context_length", 256);
    w.AddF32(arch + ".attention.layer_norm_rms_epsilon", 1e-6f);
    if (sliding_window > 0) w.AddU32(arch + ".attention.sliding_window", sliding_window);
    if (experts > 0) {
      w.AddU32(arch + ".expert_count", experts);
      w.AddU32(arch + ".expert_used_count", 2);
      w.AddU32(arch + ".expert_feed_forward_length", 32);
    }
    const std::vector<float> embd(64 * 10, 0.f);
    w.AddTensor("token_embd.weight", {64, 10}, GgmlType::kF32, Bytes(embd.data(), embd.size() * 4));
    const std::string b = w.Serialize();
    auto f = ParseGgufBytes(reinterpret_cast<const uint8_t*>(b.data()), b.size(), "m.gguf");
    EXPECT_TRUE(f.ok()) << f.status();
    return LlamaConfigFromGguf(**f);
  };
  for (const std::string arch : {"llama", "qwen2", "qwen3"}) {
    auto c = config_of(arch, 0);
    ASSERT_TRUE(c.ok()) << c.status();
    EXPECT_EQ(c->family->gguf_architecture, arch);
    EXPECT_EQ(c->hidden_size, 64);
    EXPECT_EQ(c->vocab_size, 10);
  }
  EXPECT_THAT(std::string(config_of("gemma2", 0).status().message()),
              HasSubstr("general.architecture is 'gemma2'; the engine implements llama, qwen2, "
                        "qwen3, qwen2moe, qwen3moe"));
  EXPECT_THAT(std::string(config_of("gemma2", 0, 8).status().message()),
              HasSubstr("general.architecture is 'gemma2'"));
  EXPECT_THAT(std::string(config_of("qwen2", 4096).status().message()),
              HasSubstr("qwen2.attention.sliding_window 4096"));
  // Experts: qwen3moe's, their scores renormalized as llama.cpp does.
  auto moe = config_of("qwen3moe", 0, 8);
  ASSERT_TRUE(moe.ok()) << moe.status();
  EXPECT_EQ(moe->num_experts, 8);
  EXPECT_EQ(moe->num_experts_per_tok, 2);
  EXPECT_EQ(moe->moe_intermediate_size, 32);
  EXPECT_TRUE(moe->norm_topk_prob);
  EXPECT_THAT(std::string(config_of("qwen3moe", 0).status().message()),
              HasSubstr("qwen3moe.expert_count is missing"));
  // A "llama" file with experts is Mixtral (llama.cpp's converter writes it
  // so): experts feed_forward_length wide, renormalized.
  auto mixtral = config_of("llama", 0, 8);
  ASSERT_TRUE(mixtral.ok()) << mixtral.status();
  EXPECT_EQ(std::string(mixtral->family->hf_architecture), "MixtralForCausalLM");
  EXPECT_EQ(mixtral->moe_intermediate_size, 32);  // expert_feed_forward_length, when given
  EXPECT_TRUE(mixtral->norm_topk_prob);
  EXPECT_THAT(std::string(config_of("qwen2", 0, 8).status().message()),
              HasSubstr("qwen2.expert_count 8: experts are implemented for llama, qwen2moe, "
                        "qwen3moe only"));
  auto moe2 = config_of("qwen2moe", 0, 8);  // llama.cpp does not renormalize qwen2moe's
  ASSERT_TRUE(moe2.ok()) << moe2.status();
  EXPECT_FALSE(moe2->norm_topk_prob);
}

TEST(GgufWeightsTest, NamesMapBothWays) {
  EXPECT_EQ(GgufWeights::GgufName("model.layers.12.self_attn.q_proj.weight"),
            "blk.12.attn_q.weight");
  EXPECT_EQ(GgufWeights::GgufName("model.embed_tokens.weight"), "token_embd.weight");
  EXPECT_EQ(GgufWeights::GgufName("model.layers.0.self_attn.q_proj.bias"), "blk.0.attn_q.bias");
  EXPECT_EQ(GgufWeights::GgufName("model.layers.1.self_attn.k_norm.weight"),
            "blk.1.attn_k_norm.weight");
  EXPECT_EQ(GgufWeights::GgufName("model.layers.0.mlp.gate_proj.bias"), "");
  int expert = -1;
  EXPECT_EQ(GgufWeights::GgufName("model.layers.2.mlp.experts.17.down_proj.weight", &expert),
            "blk.2.ffn_down_exps.weight");
  EXPECT_EQ(expert, 17);
  EXPECT_EQ(GgufWeights::GgufName("model.layers.2.mlp.gate.weight", &expert),
            "blk.2.ffn_gate_inp.weight");
  EXPECT_EQ(expert, -1);
  EXPECT_EQ(GgufWeights::GgufName("model.layers.2.mlp.experts.x.down_proj.weight"), "");
  EXPECT_EQ(GgufWeights::HfName("blk.3.ffn_down.weight"), "model.layers.3.mlp.down_proj.weight");
  EXPECT_EQ(GgufWeights::HfName("blk.3.attn_q.bias"), "model.layers.3.self_attn.q_proj.bias");
  EXPECT_EQ(GgufWeights::HfName("blk.3.ffn_gate_exps.weight"), "blk.3.ffn_gate_exps.weight");
  EXPECT_EQ(GgufWeights::HfName("output.weight"), "lm_head.weight");
}

}  // namespace
}  // namespace tandem
