#include "common/serving/kv_events.h"

#include <string>
#include <vector>

#include "gtest/gtest.h"

#define MSGPACK_NO_BOOST
#include "msgpack.hpp"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace tandem {
namespace {

TEST(KvEventsConfigTest, ParsesVllmJsonWithItsDefaults) {
  auto c = ParseKvEventsConfig(R"({"enable_kv_cache_events": true, "publisher": "zmq",
      "endpoint": "tcp://*:6000", "replay_endpoint": "tcp://*:6001", "topic": "kv",
      "buffer_steps": 5, "hwm": 7, "max_queue_size": 9})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(c->publishes());
  EXPECT_EQ(c->endpoint, "tcp://*:6000");
  EXPECT_EQ(c->replay_endpoint, "tcp://*:6001");
  EXPECT_EQ(c->topic, "kv");
  EXPECT_EQ(c->buffer_steps, 5);
  EXPECT_EQ(c->hwm, 7);
  EXPECT_EQ(c->max_queue_size, 9);
  // vLLM: no publisher named means zmq when enabled; replay may be null.
  c = ParseKvEventsConfig(R"({"enable_kv_cache_events": true, "replay_endpoint": null})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->publisher, "zmq");
  EXPECT_EQ(c->endpoint, "tcp://*:5557");
  EXPECT_TRUE(c->replay_endpoint.empty());
  c = ParseKvEventsConfig(R"({"enable_kv_cache_events": false})");
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->publishes());
}

TEST(KvEventsConfigTest, RefusalsNameTheKey) {
  for (const auto& [json, needle] : std::vector<std::pair<std::string, std::string>>{
           {"[1]", "not a JSON object"},
           {"{", "not a JSON object"},
           {R"({"enable_kv_cache_events": "yes"})", "enable_kv_cache_events"},
           {R"({"publisher": "kafka"})", "kafka"},
           {R"({"buffer_steps": 0})", "buffer_steps"},
           {R"({"hwm": -1})", "hwm"},
           {R"({"endpoint": 5})", "endpoint"},
           {R"({"endpont": "tcp://*:1"})", "unknown key 'endpont'"}}) {
    auto c = ParseKvEventsConfig(json);
    ASSERT_FALSE(c.ok()) << json;
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(c.status().message().find(needle), std::string::npos) << c.status().message();
  }
}

TEST(KvEventsEncodeTest, BatchIsVllmsArrayLayout) {
  std::vector<KvCacheEvent> events(3);
  events[0].kind = KvCacheEvent::Kind::kCleared;
  events[1] = {.kind = KvCacheEvent::Kind::kStored, .hashes = {0xfffffffffffffff0u, 2},
               .parent = std::nullopt, .token_ids = {1, 2, 3, 4}};
  events[2] = {.kind = KvCacheEvent::Kind::kRemoved, .hashes = {2}};
  const std::string bytes = EncodeKvEventBatch(12.5, events, 2);
  msgpack::object_handle oh = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& batch = oh.get();
  ASSERT_EQ(batch.type, msgpack::type::ARRAY);
  ASSERT_EQ(batch.via.array.size, 3u);
  EXPECT_DOUBLE_EQ(batch.via.array.ptr[0].as<double>(), 12.5);
  EXPECT_EQ(batch.via.array.ptr[2].as<int>(), 0);  // data_parallel_rank
  const msgpack::object& list = batch.via.array.ptr[1];
  ASSERT_EQ(list.via.array.size, 3u);
  const msgpack::object& cleared = list.via.array.ptr[0];
  ASSERT_EQ(cleared.via.array.size, 1u);
  EXPECT_EQ(cleared.via.array.ptr[0].as<std::string>(), "AllBlocksCleared");
  const msgpack::object& stored = list.via.array.ptr[1];
  ASSERT_EQ(stored.via.array.size, 8u);
  EXPECT_EQ(stored.via.array.ptr[0].as<std::string>(), "BlockStored");
  EXPECT_EQ(stored.via.array.ptr[1].as<std::vector<uint64_t>>(),
            (std::vector<uint64_t>{0xfffffffffffffff0u, 2}));
  EXPECT_TRUE(stored.via.array.ptr[2].is_nil());
  EXPECT_EQ(stored.via.array.ptr[3].as<std::vector<int>>(), (std::vector<int>{1, 2, 3, 4}));
  EXPECT_EQ(stored.via.array.ptr[4].as<int>(), 2);
  EXPECT_TRUE(stored.via.array.ptr[5].is_nil());
  EXPECT_EQ(stored.via.array.ptr[6].as<std::string>(), "GPU");
  EXPECT_TRUE(stored.via.array.ptr[7].is_nil());
  const msgpack::object& removed = list.via.array.ptr[2];
  ASSERT_EQ(removed.via.array.size, 3u);
  EXPECT_EQ(removed.via.array.ptr[0].as<std::string>(), "BlockRemoved");
  EXPECT_EQ(removed.via.array.ptr[1].as<std::vector<uint64_t>>(), (std::vector<uint64_t>{2}));
}

uint64_t SeqOf(const zmq::message_t& m) {
  uint64_t seq = 0;
  for (size_t i = 0; i < 8; ++i) seq = seq << 8 | m.data<uint8_t>()[i];
  return seq;
}

TEST(KvEventPublisherTest, SubscriberGetsNumberedBatchesAndReplaysWhatItMissed) {
  KvEventsConfig config;
  config.enable_kv_cache_events = true;
  config.publisher = "zmq";
  config.endpoint = "tcp://127.0.0.1:*";
  config.replay_endpoint = "tcp://127.0.0.1:*";
  config.topic = "kv@test";
  config.buffer_steps = 3;
  auto publisher = KvEventPublisher::Start(config, nullptr, "prefill");
  ASSERT_TRUE(publisher.ok()) << publisher.status();
  ASSERT_NE((*publisher)->endpoint().find("tcp://127.0.0.1:"), std::string::npos);

  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "kv@test");
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  sub.connect((*publisher)->endpoint());
  // A SUB socket joins late (ZeroMQ's slow joiner): publish until one arrives.
  KvCacheEvent cleared{.kind = KvCacheEvent::Kind::kCleared};
  std::vector<zmq::message_t> frames;
  sub.set(zmq::sockopt::rcvtimeo, 50);
  for (int i = 0; i < 100 && frames.empty(); ++i) {
    (*publisher)->Publish({&cleared, 1}, 16);
    (void)zmq::recv_multipart(sub, std::back_inserter(frames));
  }
  ASSERT_EQ(frames.size(), 3u);
  EXPECT_EQ(frames[0].to_string(), "kv@test");
  uint64_t first = SeqOf(frames[1]);
  // Whatever else the joining loop sent arrives in order.
  for (;;) {
    frames.clear();
    if (!zmq::recv_multipart(sub, std::back_inserter(frames))) break;
    EXPECT_EQ(SeqOf(frames[1]), first + 1);
    first = SeqOf(frames[1]);
  }
  // Numbered one by one from there.
  sub.set(zmq::sockopt::rcvtimeo, 5000);
  for (uint64_t want = first + 1; want < first + 4; ++want) {
    frames.clear();
    (*publisher)->Publish({&cleared, 1}, 16);
    ASSERT_TRUE(zmq::recv_multipart(sub, std::back_inserter(frames)));
    EXPECT_EQ(SeqOf(frames[1]), want);
  }
  // Replay from seq 0: only the last buffer_steps batches are kept, then the
  // end marker (seq -1, empty payload). A DEALER socket takes the whole
  // stream (a REQ socket would take one message per request).
  zmq::socket_t dealer(context, zmq::socket_type::dealer);
  dealer.set(zmq::sockopt::rcvtimeo, 5000);
  dealer.connect((*publisher)->replay_endpoint());
  const std::string zero(8, '\0');
  std::array<zmq::const_buffer, 2> request = {zmq::const_buffer(), zmq::buffer(zero)};
  ASSERT_TRUE(zmq::send_multipart(dealer, request));
  std::vector<uint64_t> replayed;
  for (;;) {
    std::vector<zmq::message_t> reply;
    ASSERT_TRUE(zmq::recv_multipart(dealer, std::back_inserter(reply)));
    ASSERT_EQ(reply.size(), 3u);  // empty delimiter, seq, payload
    if (reply[1].to_string() == std::string(8, '\xff')) {
      EXPECT_EQ(reply[2].size(), 0u);
      break;
    }
    replayed.push_back(SeqOf(reply[1]));
  }
  EXPECT_EQ(replayed, (std::vector<uint64_t>{first + 1, first + 2, first + 3}));
}

TEST(KvEventPublisherTest, AnUnusableEndpointIsAnError) {
  KvEventsConfig config;
  config.enable_kv_cache_events = true;
  config.publisher = "zmq";
  config.endpoint = "tcp://*:notaport";
  auto publisher = KvEventPublisher::Start(config, nullptr, "decode");
  ASSERT_FALSE(publisher.ok());
  EXPECT_NE(publisher.status().message().find("tcp://*:notaport"), std::string::npos);
}

}  // namespace
}  // namespace tandem
