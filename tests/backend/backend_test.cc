// The backend loader and host dtype conversions (no GPU needed).
#include "common/kernels/backend.h"

#include <unistd.h>

#include <cctype>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "common/backend/cpu/cpu_device.h"

namespace tandem {
namespace {

// The CPU computes in f32; bf16 is a storage dtype for weights and KV there,
// f16 is refused.
TEST(BackendTest, CpuComputesInF32OverF32OrBf16Storage) {
  auto cpu = CreateBackend({});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_EQ((*cpu)->device->name(), "cpu");
  EXPECT_EQ((*cpu)->ops->dtype(), DType::kF32);
  EXPECT_EQ((*cpu)->ops->weight_dtype(), DType::kF32);
  EXPECT_EQ((*cpu)->ops->kv_dtype(), DType::kF32);
  EXPECT_TRUE(CreateBackend({"cpu", "f32"}).ok());

  auto bf16 = CreateBackend({"cpu", "bf16"});
  ASSERT_TRUE(bf16.ok()) << bf16.status();
  EXPECT_EQ((*bf16)->ops->dtype(), DType::kF32);
  EXPECT_EQ((*bf16)->ops->weight_dtype(), DType::kBF16);
  EXPECT_EQ((*bf16)->ops->kv_dtype(), DType::kBF16);

  auto f16 = CreateBackend({"cpu", "f16"});
  EXPECT_EQ(f16.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(f16.status().message().find("dtype=f16"), std::string::npos) << f16.status();
}

TEST(BackendTest, BadDeviceAndDTypeNameTheField) {
  auto tpu = CreateBackend({"tpu"});
  EXPECT_EQ(tpu.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(tpu.status().message().find("device must be cpu or cuda, got 'tpu'"),
            std::string::npos)
      << tpu.status();
  for (const char* device : {"cpu", "cuda"}) {
    auto fp8 = CreateBackend({device, "fp8"});
    EXPECT_EQ(fp8.status().code(), absl::StatusCode::kInvalidArgument) << device;
    EXPECT_NE(fp8.status().message().find("'fp8'"), std::string::npos) << fp8.status();
  }
}

// --device=cuda either works (a GPU is visible) or fails at once with the
// reason: this build has no CUDA module, or the module found no usable GPU.
TEST(BackendTest, CudaLoadsOrSaysWhyNot) {
  auto cuda = CreateBackend({"cuda"});
  const bool gpu_visible = access("/dev/nvidiactl", F_OK) == 0;
#ifdef TANDEM_CUDA_BUILT
  if (cuda.ok()) {
    EXPECT_EQ((*cuda)->ops->dtype(), DType::kBF16);  // the default for auto
    EXPECT_EQ((*cuda)->device->name().rfind("cuda:", 0), 0u) << (*cuda)->device->name();
    return;
  }
  EXPECT_FALSE(gpu_visible) << "a GPU is visible but --device=cuda failed: " << cuda.status();
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition) << cuda.status();
  EXPECT_NE(cuda.status().message().find("device=cuda: no usable GPU"), std::string::npos)
      << cuda.status();
  EXPECT_NE(cuda.status().message().find("device=cpu"), std::string::npos) << cuda.status();
#else
  (void)gpu_visible;
  EXPECT_EQ(cuda.status().code(), absl::StatusCode::kFailedPrecondition) << cuda.status();
  EXPECT_NE(cuda.status().message().find("cannot load the CUDA backend module"),
            std::string::npos)
      << cuda.status();
#endif
}

uint16_t Bits16(const std::vector<uint16_t>& v, size_t i) { return v[i]; }

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  const std::vector<float> in = {1.0f, -2.5f, 0.0f, 1.00390625f /* tie: 1 + 2^-8 */,
                                 1.01171875f /* tie: 1 + 3 * 2^-8 */, 3.0e38f, INFINITY};
  std::vector<uint16_t> out(in.size());
  ConvertFromF32(in.data(), DType::kBF16, out.data(), in.size());
  EXPECT_EQ(Bits16(out, 0), 0x3f80);
  EXPECT_EQ(Bits16(out, 1), 0xc020);
  EXPECT_EQ(Bits16(out, 2), 0x0000);
  EXPECT_EQ(Bits16(out, 3), 0x3f80);  // tie to even (down)
  EXPECT_EQ(Bits16(out, 4), 0x3f82);  // tie to even (up)
  EXPECT_EQ(Bits16(out, 6), 0x7f80);
  std::vector<float> back(in.size());
  ConvertToF32(out.data(), DType::kBF16, back.data(), in.size());
  EXPECT_EQ(back[1], -2.5f);
  EXPECT_NEAR(back[5], 3.0e38f, 3.0e38f / 128);
}

// A file's 16-bit tensors may start at an odd address (a GGUF's
// general.alignment is the file's to choose): widened byte-wise, no
// misaligned load (UBSan in the sanitizer run; the GGUF fuzzer found it).
TEST(DTypeTest, SixteenBitTensorsAtOddAddressesWiden) {
  const uint16_t one_bf16 = 0x3f80, one_f16 = 0x3c00;
  for (DType dt : {DType::kBF16, DType::kF16}) {
    alignas(4) unsigned char bytes[1 + 2 * 3];
    for (int i = 0; i < 3; ++i) {
      std::memcpy(bytes + 1 + 2 * i, dt == DType::kBF16 ? &one_bf16 : &one_f16, 2);
    }
    float out[3];
    ConvertToF32(bytes + 1, dt, out, 3);
    for (float v : out) EXPECT_EQ(v, 1.f) << DTypeName(dt);
  }
}

// A corrupt file's non-finite weights quantize without undefined behaviour
// (a float-to-int conversion of NaN or of a value out of range is; UBSan in
// the sanitizer run, the GGUF fuzzer found it): a NaN element becomes the
// block's zero, its finite neighbours keep their values.
TEST(DTypeTest, NonFiniteValuesQuantizeToDefinedBlocks) {
  for (DType dt : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_1}) {
    std::vector<float> in(32);
    for (int i = 0; i < 32; ++i) in[i] = static_cast<float>(i % 8) - 4.f;
    in[5] = std::nanf("");
    std::vector<uint8_t> blocks(BlockBytes(dt));
    ConvertFromF32(in.data(), dt, blocks.data(), 32);
    std::vector<float> back(32);
    ConvertToF32(blocks.data(), dt, back.data(), 32);
    for (int i = 0; i < 32; ++i) {
      if (i != 5) {
        EXPECT_NEAR(back[i], in[i], 0.6f) << DTypeName(dt) << " " << i;
      }
    }
    EXPECT_NEAR(back[5], 0.f, 0.6f) << DTypeName(dt);

    in[7] = INFINITY;  // the block's scale is infinite: defined, if useless
    in[9] = -INFINITY;
    ConvertFromF32(in.data(), dt, blocks.data(), 32);
    ConvertToF32(blocks.data(), dt, back.data(), 32);
  }
}

TEST(DTypeTest, F16CoversNormalsSubnormalsAndOverflow) {
  const std::vector<float> in = {1.0f,     -2.0f,    65504.0f, 65520.0f /* rounds to inf */,
                                 6.1035156e-05f /* smallest normal */,
                                 5.9604645e-08f /* smallest subnormal */, 1.0e-9f,
                                 1.00048828125f /* tie: 1 + 2^-11 */};
  std::vector<uint16_t> out(in.size());
  ConvertFromF32(in.data(), DType::kF16, out.data(), in.size());
  EXPECT_EQ(Bits16(out, 0), 0x3c00);
  EXPECT_EQ(Bits16(out, 1), 0xc000);
  EXPECT_EQ(Bits16(out, 2), 0x7bff);
  EXPECT_EQ(Bits16(out, 3), 0x7c00);
  EXPECT_EQ(Bits16(out, 4), 0x0400);
  EXPECT_EQ(Bits16(out, 5), 0x0001);
  EXPECT_EQ(Bits16(out, 6), 0x0000);
  EXPECT_EQ(Bits16(out, 7), 0x3c00);  // tie to even
  std::vector<float> back(in.size());
  ConvertToF32(out.data(), DType::kF16, back.data(), in.size());
  for (size_t i : {0, 1, 2, 4, 5}) EXPECT_EQ(back[i], in[i]) << i;
  EXPECT_TRUE(std::isinf(back[3]));
}

// Arenas from 2 MiB up sit on 2 MiB boundaries with the kernel's huge-page
// advice (VmFlags "hg" in /proc/self/smaps), zeroed like every allocation;
// small ones do not take the advice.
TEST(CpuDeviceTest, LargeAllocationsAskForHugePages) {
  if (!std::ifstream("/sys/kernel/mm/transparent_hugepage/enabled")) {
    GTEST_SKIP() << "kernel without transparent huge pages";
  }
  // The VmFlags of the mapping that holds p.
  const auto flags_of = [](const void* p) {
    std::ifstream smaps("/proc/self/smaps");
    const auto addr = reinterpret_cast<uintptr_t>(p);
    bool inside = false;
    for (std::string line; std::getline(smaps, line);) {
      uintptr_t lo = 0, hi = 0;
      char dash = 0;
      std::istringstream range(line);
      if (range >> std::hex >> lo >> dash >> hi && dash == '-' && line.find(' ') != std::string::npos &&
          std::isxdigit(static_cast<unsigned char>(line[0]))) {
        inside = lo <= addr && addr < hi;
      } else if (inside && line.rfind("VmFlags:", 0) == 0) {
        return line;
      }
    }
    return std::string();
  };
  auto device = CreateCpuDevice();
  auto big = device->Allocate(size_t{5} << 20);
  ASSERT_TRUE(big.ok()) << big.status();
  EXPECT_EQ(reinterpret_cast<uintptr_t>(*big) % (size_t{2} << 20), 0u);
  const auto* bytes = static_cast<const unsigned char*>(*big);
  for (size_t i = 0; i < (size_t{5} << 20); i += 4093) ASSERT_EQ(bytes[i], 0) << i;
  const std::string flags = flags_of(*big);
  ASSERT_FALSE(flags.empty());
  EXPECT_NE(flags.find(" hg"), std::string::npos) << flags;
}

// The measure pass: the same allocation code on a measuring arena, then on a
// real one of exactly the measured size, places every tensor, at the size its
// dtype needs (a bf16 arena is half an f32 one, not sized for 4-byte elements).
TEST(ArenaTest, MeasureThenAllocateExactly) {
  auto device = CreateCpuDevice();
  auto place = [](Arena* a, DType d) -> absl::Status {
    for (int i = 0; i < 5; ++i) {
      auto t = a->Allocate(d, {7 + i, 33});
      if (!t.ok()) return t.status();
    }
    return absl::OkStatus();
  };
  size_t measured[2];
  const DType dtypes[2] = {DType::kF32, DType::kBF16};
  for (int k = 0; k < 2; ++k) {
    auto measure = Arena::Measure("test");
    ASSERT_TRUE(place(measure.get(), dtypes[k]).ok());
    measured[k] = measure->used();
    auto real = Arena::Create(device.get(), measured[k], "test");
    ASSERT_TRUE(real.ok());
    ASSERT_TRUE(place(real->get(), dtypes[k]).ok());
    EXPECT_EQ((*real)->used(), (*real)->capacity());
    // One more tensor does not fit, and the error names the arena.
    auto more = (*real)->Allocate(dtypes[k], {1});
    EXPECT_EQ(more.status().code(), absl::StatusCode::kResourceExhausted);
    EXPECT_NE(more.status().message().find("arena 'test'"), std::string::npos);
  }
  EXPECT_LT(measured[1], measured[0]);
  EXPECT_LE(measured[1], measured[0] / 2 + 5 * 256);
}

// Runs gathered out of device memory and scattered into it: every run, in
// order, whatever their sizes and alignments and wherever the host pieces
// are cut; nothing written outside the runs (which never overlap, as a
// request's KV blocks do not). On the CPU device (the defaults, copy by copy)
// and, where a GPU starts, on CUDA (one launch and one DMA each way).
void ExpectRunsGatherAndScatterInOrder(Device* device) {
  {
    constexpr size_t kBytes = 1 << 16;
    auto memory = device->Allocate(kBytes);
    ASSERT_TRUE(memory.ok()) << memory.status();
    char* base = static_cast<char*>(*memory);
    std::vector<char> pattern(kBytes);
    for (size_t i = 0; i < kBytes; ++i) pattern[i] = static_cast<char>(i * 131 + i / 256);
    ASSERT_TRUE(device->CopyToDevice(base, pattern.data(), kBytes).ok());
    // Aligned KV-like rows, odd sizes at odd offsets, out of order, an empty
    // one; then enough runs to outgrow the first table.
    std::vector<DeviceRun> runs = {{base + 4096, 3072}, {base + 17, 5},   {base + 1100, 1000},
                                   {base + 8192, 0},    {base + 513, 16}, {base + 40000, 12288}};
    for (int i = 0; i < 300; ++i) runs.push_back({base + 20000 + 48 * i + i % 3, size_t{32} + i % 7});
    std::string want;
    for (const DeviceRun& r : runs) want.append(pattern.data() + (r.device - base), r.bytes);
    // Gathers in flight together (a layer's chunks issued before the first
    // is waited for), each into its own buffer; one dropped unfinished (a
    // cancelled stream), whose buffer the next gather reuses.
    for (int round = 0; round < 2; ++round) {  // the second reuses the buffers
      std::vector<std::unique_ptr<PendingGather>> pending;
      for (int i = 0; i < 3; ++i) {
        auto issued = device->IssueGather(i == 1 ? absl::MakeConstSpan(runs).subspan(1) : runs);
        ASSERT_TRUE(issued.ok()) << issued.status();
        pending.push_back(std::move(*issued));
      }
      pending.erase(pending.begin() + 1);
      auto after_drop = device->IssueGather(runs);
      ASSERT_TRUE(after_drop.ok()) << after_drop.status();
      pending.push_back(std::move(*after_drop));
      for (std::unique_ptr<PendingGather>& g : pending) {
        auto got = g->Wait();
        ASSERT_TRUE(got.ok()) << got.status();
        EXPECT_EQ(std::string(got->data(), got->size()), want);
        EXPECT_TRUE(g->ready());
      }
    }
    // A gather issued before a scatter into its runs reads the bytes before
    // it, however late it is waited for.
    auto before_scatter = device->IssueGather(runs);
    ASSERT_TRUE(before_scatter.ok()) << before_scatter.status();
    // Scatter new bytes into the same runs from pieces cut anywhere (an
    // empty piece among them): the runs change, the rest does not.
    std::string fresh(want.size(), '\0');
    for (size_t i = 0; i < fresh.size(); ++i) fresh[i] = static_cast<char>(255 - i % 251);
    std::vector<absl::string_view> pieces;
    for (size_t at = 0, cut = 1; at < fresh.size(); at += cut, cut = cut * 3 % 997 + 1) {
      pieces.push_back(absl::string_view(fresh).substr(at, cut));
      if (pieces.size() == 3) pieces.push_back(absl::string_view());
    }
    ASSERT_TRUE(device->ScatterToDevice(pieces, runs).ok());
    ASSERT_TRUE(device->stream()->Synchronize().ok());
    auto old_bytes = (*before_scatter)->Wait();
    ASSERT_TRUE(old_bytes.ok()) << old_bytes.status();
    EXPECT_EQ(std::string(old_bytes->data(), old_bytes->size()), want);
    std::vector<char> after(kBytes);
    ASSERT_TRUE(device->CopyToHost(after.data(), base, kBytes).ok());
    std::vector<char> expected = pattern;
    size_t at = 0;
    for (const DeviceRun& r : runs) {
      std::memcpy(expected.data() + (r.device - base), fresh.data() + at, r.bytes);
      at += r.bytes;
    }
    EXPECT_TRUE(after == expected);
    // Sizes that differ are refused, naming both.
    absl::Status short_host = device->ScatterToDevice({absl::string_view(fresh).substr(1)}, runs);
    EXPECT_EQ(short_host.code(), absl::StatusCode::kInvalidArgument) << short_host;
    EXPECT_NE(short_host.message().find(std::to_string(fresh.size() - 1) + " bytes of host"),
              std::string::npos)
        << short_host;
  }
}

TEST(DeviceTest, CpuRunsGatherAndScatterInOrder) {
  auto cpu = CreateBackend({"cpu"});
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EXPECT_FALSE((*cpu)->device->async_gathers());
  ExpectRunsGatherAndScatterInOrder((*cpu)->device.get());
}

// --debug-async-kv-reads: the CPU's gathers are done only after a few polls,
// as a GPU's copies land after the host has gone on; their bytes are those
// of the moment they were issued.
TEST(DeviceTest, CpuLateGathersAreDoneAfterPolls) {
  BackendOptions options;
  options.debug_async_kv_reads = true;
  auto cpu = CreateBackend(options);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  Device* device = (*cpu)->device.get();
  EXPECT_TRUE(device->async_gathers());
  ExpectRunsGatherAndScatterInOrder(device);
  auto memory = device->Allocate(64);
  ASSERT_TRUE(memory.ok());
  char* base = static_cast<char*>(*memory);
  std::memset(base, 7, 64);
  const DeviceRun run = {base, 64};
  auto gather = device->IssueGather({&run, 1});
  ASSERT_TRUE(gather.ok()) << gather.status();
  std::memset(base, 9, 64);
  int polls = 1;
  while (!(*gather)->ready()) ++polls;
  EXPECT_GT(polls, 1);
  auto bytes = (*gather)->Wait();
  ASSERT_TRUE(bytes.ok());
  EXPECT_EQ(std::string(bytes->data(), bytes->size()), std::string(64, '\7'));
}

TEST(DeviceTest, CudaRunsGatherAndScatterInOrder) {
  auto cuda = CreateBackend({"cuda"});
  if (!cuda.ok()) GTEST_SKIP() << "no GPU here: " << cuda.status().message();
  ExpectRunsGatherAndScatterInOrder((*cuda)->device.get());
}

}  // namespace
}  // namespace tandem
