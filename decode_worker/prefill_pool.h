// PrefillPool: the prefill workers a decode worker pulls KV from, as named by
// --prefill-address. A list (ipv4:h1:p1,h2:p2, ipv6:[a]:p,[b]:p, or targets
// of any form separated by commas: h1:p,dns:///pod-1.svc:p) becomes one
// channel per endpoint, so that prompts are routed by prefix among them, a
// request whose Prefill call stalls is retried on a *different* worker and a
// stuck one is set aside; a single name (dns:///name:port, a Kubernetes
// headless service) is one endpoint whose channel balances over what the
// name resolves to (round_robin, keepalives evicting a dead peer).
//
// An endpoint is usable when its channel is not in TRANSIENT_FAILURE (or
// SHUTDOWN) and it was not set aside (Eject) within the last eject period:
// keepalive pings fail a frozen peer's connection within seconds, and a call
// with no first message within the first-message timeout ejects it at once.
//
// Thread-safe.
#ifndef TANDEM_DECODE_WORKER_PREFILL_POOL_H_
#define TANDEM_DECODE_WORKER_PREFILL_POOL_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "common/serving/kv_transfer.h"
#include "decode_worker/prefiller_trust.h"
#include "decode_worker/prefix_router.h"
#include "absl/time/time.h"
#include "grpcpp/grpcpp.h"
#include "proto/tandem/v1/tandem.grpc.pb.h"

namespace tandem {

class PrefillPool {
 public:
  struct Endpoint {
    std::string target;
    std::shared_ptr<grpc::Channel> channel;
    // Prefill called as raw bytes: the response's KV rows stay in gRPC's
    // slices (ParseReceived). One per stream of a request (kv_streams): the
    // first on `channel`, each other on a channel of its own, so on its own
    // connection.
    std::vector<std::unique_ptr<RawPrefillStub>> stubs;
    std::atomic<int64_t> ejected_until_ns{0};  // absl::ToUnixNanos
    // Prompt tokens this worker's calls to it are computing now (PrefixRouter's load).
    std::atomic<int64_t> load_tokens{0};
  };

  // How Pick chooses among the address's endpoints (--prefill-routing).
  enum class Routing { kPrefix, kRoundRobin };
  // What a prompt is routed by: its tokens, those the decode worker already
  // holds, and its cache's salt (adapter and cache_salt).
  struct RouteKey {
    const std::vector<int32_t>* tokens = nullptr;
    int64_t num_cached = 0;
    uint64_t salt = 0;
  };
  // Why Pick chose: the endpoint holding the longest prefix ("prefix"),
  // rendezvous hashing of a prefix no endpoint holds ("hash"), the best one
  // past its load bound ("load"), or the rotation ("round_robin").
  struct RouteInfo {
    const char* reason = "round_robin";
    int64_t matched_tokens = 0;
  };

  // The endpoint targets `address` names (see above); INVALID_ARGUMENT for
  // an empty one.
  static absl::StatusOr<std::vector<std::string>> SplitTarget(const std::string& address);

  // One channel per target with `args` (keepalives and retries are the
  // caller's; round_robin is set here), and kv_streams - 1 more for the other
  // streams of a request whose layers are split (tandem.proto's num_streams).
  PrefillPool(const std::string& address, std::shared_ptr<grpc::ChannelCredentials> credentials,
              grpc::ChannelArguments args, absl::Duration eject_for, int kv_streams = 1);
  int kv_streams() const { return kv_streams_; }

  // A usable endpoint other than `avoid` (null: any): with a `key` of at
  // least one routing block and prefix routing, PrefixRouter's choice among
  // them; else the next in rotation. When none is usable, the next usable one, `avoid` included;
  // when none at all, the next one in rotation (its call fails or recovers
  // on its own). `info` (may be null) says why.
  Endpoint* Pick(const Endpoint* avoid = nullptr, const RouteKey* key = nullptr,
                 RouteInfo* info = nullptr);
  void set_routing(Routing routing) { routing_ = routing; }
  // The routing grain: prefixes are remembered in blocks of this many tokens
  // (it need not be the workers' block size: only where prefixes went is kept).
  static constexpr int kRouteBlockTokens = 16;
  using Trust = PrefillerTrust;
  static absl::Status CheckTrust(const Trust& trust) { return CheckPrefillerTrust(trust); }
  void set_trust(Trust trust) { trust_ = std::move(trust); }

  // The endpoint HOST:PORT names, outside the rotation: a gateway's choice
  // for one request. One of the address's own endpoints when it names one
  // (always allowed); else, when the trust allows it, made on first use with
  // the pool's credentials and arguments and kept while it is used, closed
  // once unused for trust.idle_close (at most kMaxNamed at once; past that
  // the least recently used idle one goes, or RESOURCE_EXHAUSTED when every
  // one is busy). INVALID_ARGUMENT for what is not HOST:PORT (printable
  // ASCII); PERMISSION_DENIED, never dialled, for one the trust leaves out.
  // The caller holds the result for as long as it uses the endpoint.
  absl::StatusOr<std::shared_ptr<Endpoint>> Named(const std::string& host_port);
  static constexpr int kMaxNamed = 256;
  int named_count() const {
    MutexLock lock(&named_mu_);
    return static_cast<int>(named_.size());
  }
  // Sets `e` aside for the eject period (its call made no progress).
  void Eject(Endpoint* e);
  int CountUsable() const;
  int size() const { return static_cast<int>(endpoints_.size()); }
  // The endpoints of the address's list (not those Named() made).
  std::vector<Endpoint*> endpoints() const {
    std::vector<Endpoint*> out;
    for (const auto& e : endpoints_) out.push_back(e.get());
    return out;
  }

 private:
  bool Usable(const Endpoint& e, int64_t now_ns) const;
  std::unique_ptr<Endpoint> MakeEndpoint(const std::string& target, bool named = false) const;

  std::vector<std::unique_ptr<Endpoint>> endpoints_;
  std::vector<uint64_t> route_ids_;  // a hash of each endpoint's address (PrefixRouter's ids)
  std::shared_ptr<grpc::ChannelCredentials> credentials_;
  grpc::ChannelArguments args_;
  Trust trust_;
  mutable Mutex named_mu_;
  struct NamedEntry {
    std::shared_ptr<Endpoint> endpoint;
    absl::Time last_used;
  };
  absl::flat_hash_map<std::string, NamedEntry> named_ ABSL_GUARDED_BY(named_mu_);
  absl::Duration eject_for_;
  int kv_streams_;
  std::atomic<uint64_t> next_{0};
  Routing routing_ = Routing::kPrefix;
  mutable Mutex router_mu_;
  PrefixRouter router_ ABSL_GUARDED_BY(router_mu_){PrefixRouter::Options()};
};

}  // namespace tandem

#endif  // TANDEM_DECODE_WORKER_PREFILL_POOL_H_
