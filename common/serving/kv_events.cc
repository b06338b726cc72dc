#include "common/serving/kv_events.h"

#include <array>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/base/logging.h"
#include "nlohmann/json.hpp"
#include "prometheus/family.h"

// msgpack-c's C++ packer, header-only; without Boost (its optional
// adaptors are not used here).
#define MSGPACK_NO_BOOST
#include "msgpack.hpp"
#include "zmq.hpp"
#include "zmq_addon.hpp"

namespace tandem {

absl::StatusOr<KvEventsConfig> ParseKvEventsConfig(std::string_view json) {
  nlohmann::json j = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-events-config: not a JSON object: '", std::string(json), "'"));
  }
  KvEventsConfig c;
  bool publisher_set = false;
  for (auto it = j.begin(); it != j.end(); ++it) {
    // Named, not structured bindings: the lambdas below capture them.
    const std::string& key = it.key();
    const nlohmann::json& value = it.value();
    auto string_field = [&](std::string* out, bool nullable) -> absl::Status {
      if (nullable && value.is_null()) {
        out->clear();
        return absl::OkStatus();
      }
      if (!value.is_string()) {
        return absl::InvalidArgumentError(
            absl::StrCat("--kv-events-config: '", key, "' must be a string, not ", value.dump()));
      }
      *out = value.get<std::string>();
      return absl::OkStatus();
    };
    auto int_field = [&](int* out, int min) -> absl::Status {
      if (!value.is_number_integer() || value.get<int64_t>() < min ||
          value.get<int64_t>() > int64_t{1} << 30) {
        return absl::InvalidArgumentError(absl::StrCat("--kv-events-config: '", key, "' is ",
                                                       value.dump(), "; an integer in [", min,
                                                       ", 2^30] is expected"));
      }
      *out = value.get<int>();
      return absl::OkStatus();
    };
    absl::Status s;
    if (key == "enable_kv_cache_events") {
      if (!value.is_boolean()) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--kv-events-config: 'enable_kv_cache_events' must be true or false, not ",
            value.dump()));
      }
      c.enable_kv_cache_events = value.get<bool>();
    } else if (key == "publisher") {
      publisher_set = !value.is_null();
      s = string_field(&c.publisher, /*nullable=*/true);
      if (s.ok() && publisher_set && c.publisher != "zmq" && c.publisher != "null") {
        return absl::InvalidArgumentError(absl::StrCat(
            "--kv-events-config: publisher '", c.publisher, "' is unknown; 'zmq' or 'null'"));
      }
    } else if (key == "endpoint") {
      s = string_field(&c.endpoint, /*nullable=*/false);
    } else if (key == "replay_endpoint") {
      s = string_field(&c.replay_endpoint, /*nullable=*/true);
    } else if (key == "topic") {
      s = string_field(&c.topic, /*nullable=*/false);
    } else if (key == "buffer_steps") {
      s = int_field(&c.buffer_steps, 1);
    } else if (key == "hwm") {
      s = int_field(&c.hwm, 0);
    } else if (key == "max_queue_size") {
      s = int_field(&c.max_queue_size, 1);
    } else {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-events-config: unknown key '", key,
          "' (known: enable_kv_cache_events, publisher, endpoint, replay_endpoint, "
          "buffer_steps, hwm, max_queue_size, topic)"));
    }
    if (!s.ok()) return s;
  }
  // vLLM: an unset publisher is zmq when events are enabled.
  if (!publisher_set) c.publisher = c.enable_kv_cache_events ? "zmq" : "null";
  if (c.publishes() && c.endpoint.empty()) {
    return absl::InvalidArgumentError("--kv-events-config: 'endpoint' is empty");
  }
  return c;
}

namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

void PackString(Packer& p, std::string_view s) {
  p.pack_str(static_cast<uint32_t>(s.size()));
  p.pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

void PackHashes(Packer& p, const std::vector<uint64_t>& hashes) {
  p.pack_array(static_cast<uint32_t>(hashes.size()));
  for (uint64_t h : hashes) p.pack_uint64(h);
}

constexpr std::string_view kMedium = "GPU";

std::string SeqBytes(int64_t seq) {
  std::string b(8, '\0');
  for (int i = 7; i >= 0; --i, seq >>= 8) b[i] = static_cast<char>(seq & 0xff);
  return b;
}

}  // namespace

std::string EncodeKvEventBatch(double ts, absl::Span<const KvCacheEvent> events, int block_size) {
  msgpack::sbuffer buffer;
  Packer p(&buffer);
  p.pack_array(3);  // KVEventBatch: ts, events, data_parallel_rank
  p.pack_double(ts);
  p.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvCacheEvent& e : events) {
    switch (e.kind) {
      case KvCacheEvent::Kind::kStored:
        p.pack_array(8);
        PackString(p, "BlockStored");
        PackHashes(p, e.hashes);
        if (e.parent.has_value()) {
          p.pack_uint64(*e.parent);
        } else {
          p.pack_nil();
        }
        p.pack_array(static_cast<uint32_t>(e.token_ids.size()));
        for (int32_t t : e.token_ids) p.pack_int32(t);
        p.pack_int32(block_size);
        p.pack_nil();  // lora_id: an adapter's blocks are keyed apart by their root
        PackString(p, kMedium);
        p.pack_nil();  // lora_name
        break;
      case KvCacheEvent::Kind::kRemoved:
        p.pack_array(3);
        PackString(p, "BlockRemoved");
        PackHashes(p, e.hashes);
        PackString(p, kMedium);
        break;
      case KvCacheEvent::Kind::kCleared:
        p.pack_array(1);
        PackString(p, "AllBlocksCleared");
        break;
    }
  }
  p.pack_int32(0);
  return std::string(buffer.data(), buffer.size());
}

struct KvEventPublisher::Sockets {
  zmq::context_t context{1};
  zmq::socket_t pub{context, zmq::socket_type::pub};
  std::optional<zmq::socket_t> replay;
};

KvEventPublisher::KvEventPublisher(const KvEventsConfig& config)
    : config_(config), sockets_(std::make_unique<Sockets>()) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(
    const KvEventsConfig& config, prometheus::Registry* registry, const std::string& role) {
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(config));
  Sockets& s = *p->sockets_;
  const std::string& e = config.endpoint;
  try {
    s.pub.set(zmq::sockopt::sndhwm, config.hwm);
    s.pub.set(zmq::sockopt::linger, 1000);
    // vLLM's rule: a wildcard or a local transport is bound, a host connected.
    if (absl::StrContains(e, "*") || absl::StrContains(e, "::") ||
        absl::StartsWith(e, "ipc://") || absl::StartsWith(e, "inproc://")) {
      s.pub.bind(e);
      p->endpoint_ = s.pub.get(zmq::sockopt::last_endpoint);
    } else {
      s.pub.connect(e);
      p->endpoint_ = e;
    }
  } catch (const zmq::error_t& err) {
    return absl::InvalidArgumentError(
        absl::StrCat("--kv-events-config: endpoint '", e, "': ", err.what()));
  }
  if (!config.replay_endpoint.empty()) {
    try {
      s.replay.emplace(s.context, zmq::socket_type::router);
      s.replay->set(zmq::sockopt::linger, 0);
      s.replay->bind(config.replay_endpoint);
      p->replay_endpoint_ = s.replay->get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& err) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-events-config: replay_endpoint '", config.replay_endpoint, "': ", err.what()));
    }
  }
  if (registry != nullptr) {
    auto& family = prometheus::BuildCounter()
                       .Name("tandem_kv_event_batches_total")
                       .Help("KV event batches (vLLM's KVEventBatch) by what became of them: "
                             "queued for the PUB socket, dropped from a full queue (still "
                             "replayable), or sent again on a replay request")
                       .Register(*registry);
    p->batches_ = &family.Add({{"role", role}, {"outcome", "queued"}});
    p->dropped_ = &family.Add({{"role", role}, {"outcome", "dropped"}});
    p->replays_ = &family.Add({{"role", role}, {"outcome", "replayed"}});
  }
  p->sender_ = std::thread([raw = p.get()] { raw->Run(); });
  return p;
}

KvEventPublisher::~KvEventPublisher() {
  {
    MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (sender_.joinable()) sender_.join();
}

void KvEventPublisher::Publish(absl::Span<const KvCacheEvent> events, int block_size) {
  if (events.empty()) return;
  auto payload = std::make_shared<const std::string>(
      EncodeKvEventBatch(absl::ToUnixMicros(absl::Now()) / 1e6, events, block_size));
  MutexLock lock(&mu_);
  const Batch batch{next_seq_++, std::move(payload)};
  queue_.push_back(batch);
  replay_.push_back(batch);
  if (replay_.size() > static_cast<size_t>(config_.buffer_steps)) replay_.pop_front();
  if (batches_ != nullptr) batches_->Increment();
  if (queue_.size() > static_cast<size_t>(config_.max_queue_size)) {
    queue_.pop_front();
    if (dropped_ != nullptr) dropped_->Increment();
  }
}

void KvEventPublisher::Run() {
  const zmq::const_buffer topic = zmq::buffer(config_.topic);
  for (;;) {
    std::deque<Batch> ready;
    bool stop = false;
    {
      MutexLock lock(&mu_);
      // Wakes for a batch, a stop, or every 10 ms to answer replay requests.
      mu_.AwaitWithTimeout(
          [this]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return stopping_ || !queue_.empty(); },
          absl::Milliseconds(10));
      ready.swap(queue_);
      stop = stopping_;
    }
    for (const Batch& b : ready) {
      const std::string seq = SeqBytes(static_cast<int64_t>(b.seq));
      std::array<zmq::const_buffer, 3> frames = {topic, zmq::buffer(seq), zmq::buffer(*b.payload)};
      // A PUB socket drops at its high-water mark rather than block.
      try {
        zmq::send_multipart(sockets_->pub, frames, zmq::send_flags::dontwait);
      } catch (const zmq::error_t& err) {
        TANDEM_LOG(WARNING) << "kv events: send failed: " << err.what();
      }
    }
    if (stop) return;
    if (sockets_->replay.has_value()) ServeReplay();
  }
}

void KvEventPublisher::ServeReplay() {
  zmq::socket_t& replay = *sockets_->replay;
  for (;;) {
    std::vector<zmq::message_t> request;
    try {
      if (!zmq::recv_multipart(replay, std::back_inserter(request), zmq::recv_flags::dontwait)) {
        return;  // nothing waiting
      }
    } catch (const zmq::error_t& err) {
      TANDEM_LOG(WARNING) << "kv events: replay receive failed: " << err.what();
      return;
    }
    // [client identity, empty delimiter, start seq]; anything else is ignored.
    if (request.size() != 3 || request[2].size() != 8) {
      TANDEM_LOG(WARNING) << "kv events: ignored a replay request of " << request.size()
                          << " frames (3 expected: identity, empty, 8-byte start seq)";
      continue;
    }
    uint64_t start = 0;
    for (size_t i = 0; i < 8; ++i) start = start << 8 | request[2].data<uint8_t>()[i];
    std::vector<Batch> batches;
    {
      MutexLock lock(&mu_);
      for (const Batch& b : replay_) {
        if (b.seq >= start) batches.push_back(b);
      }
    }
    const std::string identity = request[0].to_string();
    try {
      for (const Batch& b : batches) {
        const std::string seq = SeqBytes(static_cast<int64_t>(b.seq));
        std::array<zmq::const_buffer, 4> frames = {zmq::buffer(identity), zmq::const_buffer(),
                                                   zmq::buffer(seq), zmq::buffer(*b.payload)};
        zmq::send_multipart(replay, frames, zmq::send_flags::dontwait);
        if (replays_ != nullptr) replays_->Increment();
      }
      const std::string end = SeqBytes(-1);
      std::array<zmq::const_buffer, 4> frames = {zmq::buffer(identity), zmq::const_buffer(),
                                                 zmq::buffer(end), zmq::const_buffer()};
      zmq::send_multipart(replay, frames, zmq::send_flags::dontwait);
    } catch (const zmq::error_t& err) {
      TANDEM_LOG(WARNING) << "kv events: replay send failed: " << err.what();
    }
  }
}

}  // namespace tandem
