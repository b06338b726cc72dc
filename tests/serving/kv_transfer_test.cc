#include "common/serving/kv_transfer.h"

#include <cstring>
#include <memory>
#include <vector>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

#include "common/base/crc32c.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

// `bytes` in pieces of `size` (the last shorter), as gRPC's slices hold a
// received message.
std::vector<absl::string_view> Pieces(absl::string_view bytes, size_t size) {
  std::vector<absl::string_view> out;
  for (size_t at = 0; at < bytes.size(); at += size) out.push_back(bytes.substr(at, size));
  return out;
}

std::string Joined(const std::vector<absl::string_view>& pieces) {
  std::string out;
  for (absl::string_view p : pieces) out.append(p.data(), p.size());
  return out;
}

// Export from one engine, import into another with a different block size,
// each chunk's bytes parsed and imported from pieces that cut its rows
// anywhere: the KV rows arrive intact; a flipped bit is DATA_LOSS.
TEST(KvTransferTest, RoundTripAcrossBlockSizes) {
  EngineConfig a, b;
  a.block_size = 4;
  b.block_size = 32;
  for (EngineConfig* c : {&a, &b}) {
    c->runner.graph.requested_mode = CudaGraphMode::kNone;
    c->runner.max_num_batched_tokens = 256;
    c->runner.max_num_seqs = 4;
    c->runner.max_model_len = 512;
  }
  auto src = LlmEngine::Create(a).value();
  auto dst = LlmEngine::Create(b).value();
  std::vector<int32_t> prompt(37);
  for (int i = 0; i < 37; ++i) prompt[i] = 5 + i;
  SamplingParams p;
  p.max_tokens = 1;
  ASSERT_TRUE(src->AddRequest("x", prompt, p, RequestKind::kPrefillOnly).ok());
  while (src->HasWork()) ASSERT_TRUE(src->Step().ok());
  auto messages = ExportKv(*src, "x", 37);
  ASSERT_TRUE(messages.ok()) << messages.status();
  ASSERT_EQ(messages->size(), 1u + 4u);  // header + one chunk per layer
  EXPECT_TRUE(CheckFingerprint((*messages)[0].header().fingerprint(),
                               MakeFingerprint(dst->model_config(), DType::kF32)).ok());
  // The decode side: blocks reserved, then WAITING_FOR_REMOTE_KV.
  p.max_tokens = 4;
  ASSERT_TRUE(dst->AddRequest("x", prompt, p, RequestKind::kRemotePrefill).ok());
  auto outs = dst->Step();
  ASSERT_TRUE(outs.ok());
  ASSERT_EQ(outs->size(), 1u);
  EXPECT_TRUE((*outs)[0].kv_needed);
  EXPECT_EQ((*outs)[0].kv_tokens, 37);
  EXPECT_EQ((*outs)[0].cached_tokens, 0);
  EXPECT_EQ(dst->num_waiting_for_remote_kv(), 1u);
  const int64_t w = src->kv_cache().slot_width();
  const size_t row = src->kv_cache().slot_bytes();
  for (size_t i = 1; i < messages->size(); ++i) {
    const std::string wire = (*messages)[i].SerializeAsString();
    auto received = ParseReceived(Pieces(wire, 1000), nullptr);
    ASSERT_TRUE(received.ok()) << received.status();
    ASSERT_TRUE(received->chunk.has_value());
    const ReceivedChunk& chunk = *received->chunk;
    EXPECT_GT(chunk.k.size(), 1u);  // left in the pieces, not copied out
    ASSERT_TRUE(VerifyChunk(chunk, row).ok());
    ASSERT_TRUE(dst->ImportKv("x", static_cast<int>(chunk.layer), chunk.first_token,
                              chunk.num_tokens, chunk.k, chunk.v)
                    .ok());
  }
  // Rows past the request's tokens are refused, naming the range; so are
  // pieces of another size.
  const std::vector<absl::string_view> one_row = {
      absl::string_view(messages->back().chunk().k()).substr(0, row)};
  absl::Status outside = dst->ImportKv("x", 0, 37, 1, one_row, one_row);
  EXPECT_EQ(outside.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(outside.message().find("[0, 37)"), std::string::npos) << outside;
  absl::Status short_rows = dst->ImportKv("x", 0, 0, 2, one_row, one_row);
  EXPECT_EQ(short_rows.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(short_rows.message().find("expected " + std::to_string(2 * row)), std::string::npos)
      << short_rows;
  for (int layer = 0; layer < 4; ++layer) {
    std::vector<float> k1(37 * w), v1(37 * w), k2(37 * w), v2(37 * w);
    absl::StatusOr<uint32_t> crc1 = src->ReadKv("x", layer, 0, 37, k1.data(), v1.data());
    absl::StatusOr<uint32_t> crc2 = dst->ReadKv("x", layer, 0, 37, k2.data(), v2.data());
    ASSERT_TRUE(crc1.ok() && crc2.ok());
    EXPECT_EQ(k1, k2);
    EXPECT_EQ(v1, v2);
    // The checksum taken while copying is the rows' CRC32C, K's then V's.
    const size_t bytes = k1.size() * sizeof(float);
    EXPECT_EQ(*crc1, Crc32c(Crc32c(0, k1.data(), bytes), v1.data(), bytes)) << layer;
    EXPECT_EQ(*crc2, *crc1) << layer;
  }
  v1::KvChunk bad = (*messages)[1].chunk();
  bad.mutable_k()->at(7) ^= 0x10;
  EXPECT_EQ(VerifyChunk(ReceivedChunk::Of(bad), row).code(), absl::StatusCode::kDataLoss);
  bad.mutable_k()->pop_back();
  EXPECT_EQ(VerifyChunk(ReceivedChunk::Of(bad), row).code(), absl::StatusCode::kInvalidArgument);
  v1::ModelFingerprint other = MakeFingerprint(dst->model_config(), DType::kF32);
  other.set_num_layers(99);
  absl::Status mismatch = CheckFingerprint(other, MakeFingerprint(dst->model_config(), DType::kF32));
  EXPECT_EQ(mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(mismatch.message().find("num_layers=99"), std::string::npos);
  // A bf16 prefill worker cannot feed an f32 decode worker.
  absl::Status dtype_mismatch =
      CheckFingerprint(MakeFingerprint(dst->model_config(), DType::kBF16),
                       MakeFingerprint(dst->model_config(), DType::kF32));
  EXPECT_EQ(dtype_mismatch.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(dtype_mismatch.message().find("dtype=bf16"), std::string::npos);
  // The first token joins the batch; the rest is decoded here.
  ASSERT_TRUE(dst->RemoteKvArrived("x", 7).ok());
  EXPECT_EQ(dst->ImportKv("x", 0, 0, 1, one_row, one_row).code(),
            absl::StatusCode::kFailedPrecondition);
  std::vector<int32_t> tokens;
  while (dst->HasWork()) {
    auto o = dst->Step();
    ASSERT_TRUE(o.ok());
    for (const RequestOutput& x : *o) tokens.insert(tokens.end(), x.new_tokens.begin(), x.new_tokens.end());
  }
  ASSERT_EQ(tokens.size(), 4u);
  EXPECT_EQ(tokens[0], 7);
  ASSERT_TRUE(src->Abort("x").ok());
  EXPECT_EQ(dst->Abort("x").code(), absl::StatusCode::kNotFound);  // finished and gone
  EXPECT_EQ(src->kv_cache().pool().num_used(), 0);
  EXPECT_EQ(dst->kv_cache().pool().num_used(), 0);
}

// Queues prefill-only request `id` with a `length`-token prompt and returns
// an exporter of its whole KV (f32 cache).
KvExporter AddPrefillOnly(LlmEngine& engine, const std::string& id, int length) {
  std::vector<int32_t> prompt(length);
  for (int i = 0; i < length; ++i) prompt[i] = 9 + 3 * i;
  SamplingParams p;
  p.max_tokens = 1;
  EXPECT_TRUE(engine.AddRequest(id, prompt, p, RequestKind::kPrefillOnly).ok());
  return KvExporter(id, 0, length, MakeFingerprint(engine.model_config(), DType::kF32),
                    engine.kv_cache().slot_bytes(), engine.model_config().num_hidden_layers);
}

// A prompt prefilled in three chunks streams its KV as each chunk is
// computed: after the first step the exporter has that chunk's rows of every
// layer and nothing more, before the prompt's end is computed; the rows sent
// early equal the finished request's, and the stream ends exactly once.
TEST(KvTransferTest, StreamsEachComputedChunkBeforeThePromptEnds) {
  EngineConfig c;
  c.runner.graph.requested_mode = CudaGraphMode::kNone;
  c.runner.max_num_batched_tokens = 16;
  c.runner.max_num_seqs = 4;
  c.runner.max_model_len = 512;
  auto engine = LlmEngine::Create(c).value();
  const int layers = engine->model_config().num_hidden_layers;
  KvExporter exporter = AddPrefillOnly(*engine, "s", 40);
  std::vector<v1::KvChunk> streamed;
  const std::vector<int64_t> ready_after_step = {16, 32, 40};
  for (size_t step = 0; step < ready_after_step.size(); ++step) {
    auto outs = engine->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    ASSERT_EQ(outs->size(), 1u);
    const bool last = step + 1 == ready_after_step.size();
    EXPECT_EQ((*outs)[0].finished, last);
    if (!last) {
      EXPECT_EQ((*outs)[0].kv_ready_tokens, ready_after_step[step]);
    }
    EXPECT_EQ(engine->KvReadyTokens("s"), ready_after_step[step]);
    int made = 0;
    while (!exporter.done()) {
      auto msg = exporter.Next(*engine);
      ASSERT_TRUE(msg.ok()) << msg.status();
      if (!msg->has_value()) break;
      v1::PrefillResponse parsed;  // the hand-made encoding parses as protobuf's
      ASSERT_TRUE(parsed.ParseFromArray((*msg)->data.get(), static_cast<int>((*msg)->size)));
      ASSERT_TRUE(parsed.has_chunk());
      const v1::KvChunk& chunk = parsed.chunk();
      EXPECT_EQ((*msg)->kv_bytes, chunk.k().size() + chunk.v().size());
      EXPECT_EQ(chunk.layer(), made % layers);  // layer by layer over the new run
      EXPECT_EQ(chunk.first_token(), step * 16);
      EXPECT_EQ(chunk.first_token() + chunk.num_tokens(), ready_after_step[step]);
      streamed.push_back(chunk);
      ++made;
    }
    EXPECT_EQ(made, layers) << "step " << step;
    EXPECT_EQ(exporter.done(), last);
  }
  EXPECT_FALSE(engine->HasWork());
  // The finished request's KV, read at once, equals what went out early.
  auto whole = ExportKv(*engine, "s", 40);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const size_t row = engine->kv_cache().slot_bytes();
  for (const v1::KvChunk& chunk : streamed) {
    ASSERT_TRUE(VerifyChunk(ReceivedChunk::Of(chunk), row).ok());
    std::string k(chunk.num_tokens() * row, '\0'), v(k.size(), '\0');
    ASSERT_TRUE(engine->ReadKv("s", chunk.layer(), chunk.first_token(), chunk.num_tokens(),
                               k.data(), v.data())
                    .ok());
    EXPECT_EQ(chunk.k(), k);
    EXPECT_EQ(chunk.v(), v);
  }
  // An unknown request has nothing ready: the exporter waits, never reads.
  KvExporter gone("nobody", 0, 8, MakeFingerprint(engine->model_config(), DType::kF32), row,
                  layers);
  auto none = gone.Next(*engine);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(engine->Abort("s").ok());
  EXPECT_EQ(engine->kv_cache().pool().num_used(), 0);
}

// Inside one step, each layer's rows leave as soon as that layer's attention
// has written them: from the engine's layer hook (between PIECEWISE pieces),
// layer L's chunk is made while layers L+1.. are still to run, and nothing of
// a layer the step has not reached is ready. The rows sent from inside the
// step equal the finished request's.
TEST(KvTransferTest, StreamsEachLayerInsideTheStepThatComputesIt) {
  for (CudaGraphMode mode : {CudaGraphMode::kNone, CudaGraphMode::kPiecewise}) {
    SCOPED_TRACE(std::string(mode.name()));
    EngineConfig c;
    c.runner.graph.requested_mode = mode;
    c.runner.max_num_batched_tokens = 64;
    c.runner.max_num_seqs = 4;
    c.runner.max_model_len = 512;
    auto engine = LlmEngine::Create(c).value();
    const int layers = engine->model_config().num_hidden_layers;
    ASSERT_GE(layers, 2);
    KvExporter exporter = AddPrefillOnly(*engine, "s", 40);
    std::vector<std::pair<int, v1::KvChunk>> streamed;  // (hook's layer, chunk)
    std::vector<int> hooked;
    auto on_layer = [&](int layer) {
      hooked.push_back(layer);
      for (int l = 0; l < layers; ++l) {
        EXPECT_EQ(engine->KvReadyTokens("s", l), l <= layer ? 40 : 0) << "layer " << l;
      }
      EXPECT_EQ(engine->KvReadyTokens("s"), 0);  // not every layer until the step ends
      while (!exporter.done()) {
        auto msg = exporter.Next(*engine);
        ASSERT_TRUE(msg.ok()) << msg.status();
        if (!msg->has_value()) break;
        v1::PrefillResponse parsed;
        ASSERT_TRUE(parsed.ParseFromArray((*msg)->data.get(), static_cast<int>((*msg)->size)));
        streamed.emplace_back(layer, parsed.chunk());
      }
    };
    engine->SetLayerHook([&](int layer) {
      on_layer(layer);
      return false;  // nothing in flight: the CPU's reads are done when made
    });
    auto outs = engine->Step();
    ASSERT_TRUE(outs.ok()) << outs.status();
    engine->SetLayerHook(nullptr);
    ASSERT_EQ(hooked.size(), static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) EXPECT_EQ(hooked[l], l);
    ASSERT_EQ(streamed.size(), static_cast<size_t>(layers));
    for (int l = 0; l < layers; ++l) {
      EXPECT_EQ(streamed[l].first, l) << "layer " << l << "'s chunk left after its own layer";
      EXPECT_EQ(static_cast<int>(streamed[l].second.layer()), l);
      EXPECT_EQ(streamed[l].second.first_token(), 0u);
      EXPECT_EQ(streamed[l].second.num_tokens(), 40u);
    }
    EXPECT_TRUE(exporter.done());
    EXPECT_EQ(engine->KvReadyTokens("s"), 40);
    EXPECT_EQ(engine->KvReadyTokens("s", layers - 1), 40);
    const size_t row = engine->kv_cache().slot_bytes();
    for (const auto& [layer, chunk] : streamed) {
      ASSERT_TRUE(VerifyChunk(ReceivedChunk::Of(chunk), row).ok());
      std::string k(chunk.num_tokens() * row, '\0'), v(k.size(), '\0');
      ASSERT_TRUE(engine->ReadKv("s", chunk.layer(), 0, 40, k.data(), v.data()).ok());
      EXPECT_EQ(chunk.k(), k);
      EXPECT_EQ(chunk.v(), v);
    }
    ASSERT_TRUE(engine->Abort("s").ok());
    EXPECT_EQ(engine->kv_cache().pool().num_used(), 0);
  }
}

// What the decode worker makes of the bytes it receives equals protobuf's
// parse, however they are split: the exporter's chunk encoding keeps its rows
// in the pieces; other encodings of a chunk (fields reordered, repeated,
// unknown) and the header and done go through protobuf's parser; bytes that
// are no PrefillResponse are INVALID_ARGUMENT.
TEST(KvTransferTest, ReceivedMessagesParseAsProtobufDoes) {
  v1::PrefillResponse msg;
  v1::KvChunk* c = msg.mutable_chunk();
  c->set_layer(3);
  c->set_first_token(300);
  c->set_num_tokens(2);
  c->set_k(std::string(200, 'k'));
  c->set_v(std::string(200, 'v'));
  c->set_crc32c(0xdeadbeef);
  const std::string canonical = msg.SerializeAsString();
  for (size_t size : {1, 2, 7, 100, 1000}) {
    auto r = ParseReceived(Pieces(canonical, size), nullptr);
    ASSERT_TRUE(r.ok()) << r.status();
    ASSERT_TRUE(r->chunk.has_value());
    EXPECT_EQ(r->chunk->layer, 3u);
    EXPECT_EQ(r->chunk->first_token, 300u);
    EXPECT_EQ(r->chunk->num_tokens, 2u);
    EXPECT_EQ(r->chunk->crc32c, 0xdeadbeefu);
    EXPECT_EQ(Joined(r->chunk->k), c->k());
    EXPECT_EQ(Joined(r->chunk->v), c->v());
    EXPECT_EQ(r->chunk->k_bytes, 200u);
    EXPECT_EQ(r->chunk->v.front().data(), canonical.data() + canonical.find('v'));  // no copy
  }
  // The layer written twice (protobuf: the last wins) and an unknown field:
  // protobuf's parse, not the canonical reader's.
  v1::KvChunk layer_again;
  layer_again.set_layer(9);
  std::string inner = c->SerializeAsString() + layer_again.SerializeAsString() + "\xa0\x06\x01";
  std::string odd = "\x12" + std::string(1, static_cast<char>(0x80 | (inner.size() & 0x7f))) +
                    std::string(1, static_cast<char>(inner.size() >> 7)) + inner;
  v1::PrefillResponse expected;
  ASSERT_TRUE(expected.ParseFromString(odd));
  auto r = ParseReceived(Pieces(odd, 3), nullptr);
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->chunk.has_value());
  EXPECT_EQ(r->chunk->layer, expected.chunk().layer());
  EXPECT_EQ(r->chunk->layer, 9u);
  EXPECT_EQ(Joined(r->chunk->k), c->k());
  v1::PrefillResponse done;
  done.mutable_done()->set_first_token(42);
  auto d = ParseReceived(Pieces(done.SerializeAsString(), 1), nullptr);
  ASSERT_TRUE(d.ok());
  EXPECT_FALSE(d->chunk.has_value());
  EXPECT_EQ(d->message.done().first_token(), 42);
  // Cut short, or a length past the end.
  for (const std::string& bad : {canonical.substr(0, canonical.size() - 5), std::string("\x12\x05" "ab")}) {
    auto b = ParseReceived(Pieces(bad, 4), nullptr);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
  }
}

TEST(KvTransferTest, ChunksStayUnderOneMebibyte) {
  // smollm2-135m: 3 KV heads x 64 dims: 1536 bytes of K and V per token.
  const int per = TokensPerChunk(3 * 64 * sizeof(float));
  EXPECT_LE(static_cast<size_t>(per) * 3 * 64 * 4 * 2, kMaxChunkBytes);
  EXPECT_GT(static_cast<size_t>(per + 1) * 3 * 64 * 4 * 2, kMaxChunkBytes);
}

// A KV stream's MiB-sized buffers come from malloc's heap and stay there once
// freed, instead of a fresh mapping (page faults, zeroing) for every chunk.
TEST(KvTransferTest, ShortPromptsTakeOneStreamLongOnesUpToTheLimit) {
  constexpr int64_t kMiB = int64_t{1} << 20;
  EXPECT_EQ(KvStreamsFor(0, 2), 1);
  EXPECT_EQ(KvStreamsFor(3 * kMiB, 2), 1);  // a 64-token chat of SmolLM2, f32 KV
  EXPECT_EQ(KvStreamsFor(kKvBytesPerStream - 1, 2), 1);
  EXPECT_EQ(KvStreamsFor(kKvBytesPerStream, 2), 2);
  EXPECT_EQ(KvStreamsFor(90 * kMiB, 2), 2);  // 2,048 tokens: the limit
  EXPECT_EQ(KvStreamsFor(90 * kMiB, 16), 12);
  EXPECT_EQ(KvStreamsFor(90 * kMiB, 1), 1);
  EXPECT_EQ(KvStreamsFor(5 * kMiB, 4, kMiB), 4);
  EXPECT_EQ(KvStreamsFor(0, 3, 0), 3);  // 0 bytes per stream: always the limit
  EXPECT_EQ(KvStreamsFor(-1, 0), 1);
}

TEST(KvTransferTest, StreamBuffersStayInTheHeap) {
#if defined(__GLIBC__)
  if (!KeepKvBuffersInHeap()) GTEST_SKIP() << "the allocator is not glibc's (a sanitizer's)";
  const size_t mapped = mallinfo2().hblks;
  std::vector<std::unique_ptr<char[]>> chunks;
  for (int i = 0; i < 4; ++i) {
    chunks.emplace_back(new char[kMaxChunkBytes]);
    chunks.back()[0] = static_cast<char>(i);  // touched, as a chunk is
  }
  EXPECT_EQ(mallinfo2().hblks, mapped) << "a chunk-sized block was given its own mapping";
  chunks.clear();
  EXPECT_GE(mallinfo2().fordblks, 4 * kMaxChunkBytes) << "freed chunks went back to the system";
#else
  GTEST_SKIP() << "not glibc";
#endif
}

}  // namespace
}  // namespace tandem
