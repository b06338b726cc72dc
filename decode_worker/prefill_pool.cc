#include "decode_worker/prefill_pool.h"

#include "common/base/fnv1a.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/ascii.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/base/status_macros.h"

namespace tandem {

absl::StatusOr<std::vector<std::string>> PrefillPool::SplitTarget(const std::string& address) {
  if (address.empty()) return absl::InvalidArgumentError("the prefill address is empty");
  std::vector<std::string> out;
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(address, scheme)) continue;
    for (absl::string_view part :
         absl::StrSplit(address.substr(5), ',', absl::SkipWhitespace())) {
      out.push_back(absl::StrCat(scheme, absl::StripAsciiWhitespace(part)));
    }
    if (out.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the prefill address '", address, "' lists no endpoint"));
    }
    return out;
  }
  // HOST:PORT or a resolver's target (dns:///, unix:, ...): one endpoint
  // each, comma-separated (a StatefulSet's pods by their stable names).
  for (absl::string_view part : absl::StrSplit(address, ',', absl::SkipWhitespace())) {
    out.push_back(std::string(absl::StripAsciiWhitespace(part)));
  }
  if (out.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the prefill address '", address, "' lists no endpoint"));
  }
  return out;
}

PrefillPool::PrefillPool(const std::string& address,
                         std::shared_ptr<grpc::ChannelCredentials> credentials,
                         grpc::ChannelArguments args, absl::Duration eject_for, int kv_streams)
    : credentials_(credentials), eject_for_(eject_for), kv_streams_(std::max(1, kv_streams)) {
  args.SetLoadBalancingPolicyName("round_robin");
  args_ = args;
  auto targets = SplitTarget(address);
  for (const std::string& target : targets.ok() ? *targets : std::vector<std::string>{address}) {
    endpoints_.push_back(MakeEndpoint(target));
    route_ids_.push_back(Fnv1a64(target));
  }
}

std::unique_ptr<PrefillPool::Endpoint> PrefillPool::MakeEndpoint(const std::string& target,
                                                                 bool named) const {
  auto e = std::make_unique<Endpoint>();
  e->target = target;
  grpc::ChannelArguments args = args_;
  // A named channel with no call for the idle period lets its connection go
  // and stops dialling (gRPC's client idle timeout), even while the pool
  // still keeps it.
  if (named) args.SetInt(GRPC_ARG_CLIENT_IDLE_TIMEOUT_MS, static_cast<int>(absl::ToInt64Milliseconds(trust_.idle_close)));
  e->channel = grpc::CreateCustomChannel(target, credentials_, args);
  e->stubs.push_back(std::make_unique<RawPrefillStub>(e->channel));
  for (int i = 1; i < kv_streams_; ++i) {
    // Channels with equal arguments share one connection (gRPC's subchannel
    // pool); an argument of its own gives each stream its own.
    grpc::ChannelArguments stream_args = args;
    stream_args.SetInt("tandem.kv_stream", i);
    e->stubs.push_back(std::make_unique<RawPrefillStub>(
        grpc::CreateCustomChannel(target, credentials_, stream_args)));
  }
  return e;
}

bool PrefillPool::Usable(const Endpoint& e, int64_t now_ns) const {
  if (e.ejected_until_ns.load() > now_ns) return false;
  const grpc_connectivity_state s = e.channel->GetState(/*try_to_connect=*/false);
  return s != GRPC_CHANNEL_TRANSIENT_FAILURE && s != GRPC_CHANNEL_SHUTDOWN;
}

PrefillPool::Endpoint* PrefillPool::Pick(const Endpoint* avoid, const RouteKey* key, RouteInfo* info) {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  const size_t n = endpoints_.size();
  if (key != nullptr && routing_ == Routing::kPrefix && n > 1 && n <= PrefixRouter::kMaxEndpoints) {
    std::vector<int> candidates;
    std::vector<int64_t> loads(n);
    for (size_t i = 0; i < n; ++i) {
      loads[i] = endpoints_[i]->load_tokens.load(std::memory_order_relaxed);
      if (endpoints_[i].get() != avoid && Usable(*endpoints_[i], now)) candidates.push_back(static_cast<int>(i));
    }
    const std::vector<int32_t>& tokens = *key->tokens;
    const std::vector<uint64_t> chain =
        PrefixRouter::Chain(tokens.data(), tokens.size(), kRouteBlockTokens, key->salt);
    // A prompt shorter than a block has no prefix a cache could keep: it
    // takes the rotation.
    if (!candidates.empty() && !chain.empty()) {
      const int64_t to_compute = static_cast<int64_t>(tokens.size()) - key->num_cached;
      PrefixRouter::Choice choice;
      {
        MutexLock lock(&router_mu_);
        choice = router_.Pick(chain, to_compute, candidates, loads, route_ids_);
      }
      if (info != nullptr) {
        info->reason = choice.reason == PrefixRouter::Reason::kPrefix ? "prefix"
                       : choice.reason == PrefixRouter::Reason::kLoad ? "load"
                                                                       : "hash";
        info->matched_tokens = int64_t{choice.matched_blocks} * kRouteBlockTokens;
      }
      return endpoints_[choice.endpoint].get();
    }
  }
  const uint64_t start = next_.fetch_add(1);
  Endpoint* fallback = nullptr;
  for (size_t i = 0; i < n; ++i) {
    Endpoint* e = endpoints_[(start + i) % n].get();
    if (!Usable(*e, now)) continue;
    if (e != avoid) return e;
    fallback = e;
  }
  return fallback != nullptr ? fallback : endpoints_[start % n].get();
}

absl::StatusOr<std::shared_ptr<PrefillPool::Endpoint>> PrefillPool::Named(const std::string& host_port) {
  ASSIGN_OR_RETURN(const std::string host, ParsePrefillerName(host_port));
  // One of the configured endpoints: the pool's own channel, never refused.
  for (const auto& e : endpoints_) {
    std::string target = e->target;
    for (const char* scheme : {"ipv4:", "ipv6:", "dns:///"}) {
      if (absl::StartsWith(target, scheme)) target = target.substr(strlen(scheme));
    }
    if (target == host_port) return std::shared_ptr<Endpoint>(std::shared_ptr<Endpoint>(), e.get());
  }
  RETURN_IF_ERROR(CheckPrefillerTrusted(trust_, host, host_port));
  const absl::Time now = absl::Now();
  MutexLock lock(&named_mu_);
  // Channels nobody used for the idle period are closed (a name that no
  // longer answers is not redialled for ever).
  for (auto it = named_.begin(); it != named_.end();) {
    auto next = std::next(it);
    if (it->second.endpoint.use_count() == 1 && now - it->second.last_used > trust_.idle_close &&
        it->first != host_port) {
      named_.erase(it);
    }
    it = next;
  }
  auto it = named_.find(host_port);
  if (it != named_.end()) {
    it->second.last_used = now;
    return it->second.endpoint;
  }
  if (static_cast<int>(named_.size()) >= kMaxNamed) {
    auto lru = named_.end();
    for (auto i = named_.begin(); i != named_.end(); ++i) {
      if (i->second.endpoint.use_count() == 1 &&
          (lru == named_.end() || i->second.last_used < lru->second.last_used)) {
        lru = i;
      }
    }
    if (lru == named_.end()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "x-prefiller-host-port: all ", kMaxNamed, " named prefill endpoints are in use"));
    }
    named_.erase(lru);
  }
  std::shared_ptr<Endpoint> e = MakeEndpoint(host_port, /*named=*/true);
  named_.emplace(host_port, NamedEntry{e, now});
  return e;
}

void PrefillPool::Eject(Endpoint* e) {
  e->ejected_until_ns = absl::ToUnixNanos(absl::Now() + eject_for_);
}

int PrefillPool::CountUsable() const {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  int usable = 0;
  for (const auto& e : endpoints_) usable += Usable(*e, now);
  return usable;
}

}  // namespace tandem
