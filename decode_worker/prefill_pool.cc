#include "decode_worker/prefill_pool.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"

namespace tandem {

absl::StatusOr<std::vector<std::string>> PrefillPool::SplitTarget(const std::string& address) {
  if (address.empty()) return absl::InvalidArgumentError("the prefill address is empty");
  std::vector<std::string> out;
  for (const char* scheme : {"ipv4:", "ipv6:"}) {
    if (!absl::StartsWith(address, scheme)) continue;
    for (absl::string_view part :
         absl::StrSplit(address.substr(5), ',', absl::SkipWhitespace())) {
      out.push_back(absl::StrCat(scheme, part));
    }
    if (out.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("the prefill address '", address, "' lists no endpoint"));
    }
    return out;
  }
  // HOST:PORT or a resolver's target (dns:///, unix:, ...): one endpoint.
  out.push_back(address);
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
  }
}

std::unique_ptr<PrefillPool::Endpoint> PrefillPool::MakeEndpoint(const std::string& target) const {
  auto e = std::make_unique<Endpoint>();
  e->target = target;
  e->channel = grpc::CreateCustomChannel(target, credentials_, args_);
  e->stubs.push_back(std::make_unique<RawPrefillStub>(e->channel));
  for (int i = 1; i < kv_streams_; ++i) {
    // Channels with equal arguments share one connection (gRPC's subchannel
    // pool); an argument of its own gives each stream its own.
    grpc::ChannelArguments args = args_;
    args.SetInt("tandem.kv_stream", i);
    e->stubs.push_back(std::make_unique<RawPrefillStub>(
        grpc::CreateCustomChannel(target, credentials_, args)));
  }
  return e;
}

bool PrefillPool::Usable(const Endpoint& e, int64_t now_ns) const {
  if (e.ejected_until_ns.load() > now_ns) return false;
  const grpc_connectivity_state s = e.channel->GetState(/*try_to_connect=*/false);
  return s != GRPC_CHANNEL_TRANSIENT_FAILURE && s != GRPC_CHANNEL_SHUTDOWN;
}

PrefillPool::Endpoint* PrefillPool::Pick(const Endpoint* avoid) {
  const int64_t now = absl::ToUnixNanos(absl::Now());
  const size_t n = endpoints_.size();
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

absl::StatusOr<PrefillPool::Endpoint*> PrefillPool::Named(const std::string& host_port) {
  const size_t colon = host_port.rfind(':');
  const bool port_ok = colon != std::string::npos && colon + 1 < host_port.size() &&
                       host_port.size() - colon <= 6 &&
                       host_port.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  const bool host_ok = colon > 0 && host_port.find_first_of(" /,\t\n", 0) == std::string::npos;
  if (!port_ok || !host_ok || host_port.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "x-prefiller-host-port='", host_port.substr(0, 64), "': expected HOST:PORT"));
  }
  MutexLock lock(&named_mu_);
  auto it = named_.find(host_port);
  if (it != named_.end()) return it->second.get();
  if (static_cast<int>(named_.size()) >= kMaxNamed) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "x-prefiller-host-port: this worker already keeps ", kMaxNamed, " named prefill endpoints"));
  }
  std::unique_ptr<Endpoint> e = MakeEndpoint(host_port);
  Endpoint* raw = e.get();
  named_.emplace(host_port, std::move(e));
  return raw;
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
