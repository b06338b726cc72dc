#include "decode_worker/prefill_pool.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
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

namespace {

// An IP literal's bytes (4 or 16) and family, or nullopt.
std::optional<std::vector<uint8_t>> ParseIp(const std::string& text) {
  std::vector<uint8_t> out(16);
  if (inet_pton(AF_INET, text.c_str(), out.data()) == 1) {
    out.resize(4);
    return out;
  }
  if (inet_pton(AF_INET6, text.c_str(), out.data()) == 1) return out;
  return std::nullopt;
}

// `entry` as a network: its address bytes and prefix length, or nullopt.
std::optional<std::pair<std::vector<uint8_t>, int>> ParseNetwork(const std::string& entry) {
  const size_t slash = entry.find('/');
  if (slash == std::string::npos) return std::nullopt;
  auto ip = ParseIp(entry.substr(0, slash));
  int bits = -1;
  if (!ip || !absl::SimpleAtoi(entry.substr(slash + 1), &bits) || bits < 0 ||
      bits > static_cast<int>(ip->size()) * 8) {
    return std::nullopt;
  }
  return std::make_pair(*ip, bits);
}

bool InNetwork(const std::vector<uint8_t>& ip, const std::pair<std::vector<uint8_t>, int>& net) {
  if (ip.size() != net.first.size()) return false;
  for (int bit = 0; bit < net.second; ++bit) {
    const int byte = bit / 8, mask = 0x80 >> (bit % 8);
    if ((ip[byte] & mask) != (net.first[byte] & mask)) return false;
  }
  return true;
}

}  // namespace

absl::Status PrefillPool::CheckTrust(const Trust& trust) {
  for (const std::string& entry : trust.allow) {
    if (entry.find('/') != std::string::npos) {
      if (!ParseNetwork(entry)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--prefiller-allow: '", entry, "' is not an IP network (10.0.0.0/8, fd00::/8)"));
      }
    } else if (entry.rfind(':') == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--prefiller-allow: '", entry, "' is neither HOST:PORT nor an IP network"));
    }
  }
  return absl::OkStatus();
}

bool PrefillPool::Allowed(const std::string& host, const std::string& host_port) const {
  if (trust_.any) return true;
  const auto ip = ParseIp(host);
  for (const std::string& entry : trust_.allow) {
    if (entry == host_port) return true;
    if (ip) {
      if (auto net = ParseNetwork(entry); net && InNetwork(*ip, *net)) return true;
    }
  }
  return false;
}

absl::StatusOr<std::shared_ptr<PrefillPool::Endpoint>> PrefillPool::Named(const std::string& host_port) {
  const std::string echo = absl::CHexEscape(host_port.substr(0, 64));
  const bool printable = std::all_of(host_port.begin(), host_port.end(),
                                     [](char c) { return c > 0x20 && c < 0x7f; });
  const size_t colon = host_port.rfind(':');
  const bool port_ok = colon != std::string::npos && colon + 1 < host_port.size() &&
                       host_port.size() - colon <= 6 &&
                       host_port.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  const bool host_ok = colon != std::string::npos && colon > 0 &&
                       host_port.find_first_of("/,", 0) == std::string::npos;
  if (!printable || !port_ok || !host_ok || host_port.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat(
        "x-prefiller-host-port='", echo, "': expected HOST:PORT (printable ASCII, at most 255 bytes)"));
  }
  // One of the configured endpoints: the pool's own channel, never refused.
  for (const auto& e : endpoints_) {
    std::string target = e->target;
    for (const char* scheme : {"ipv4:", "ipv6:", "dns:///"}) {
      if (absl::StartsWith(target, scheme)) target = target.substr(strlen(scheme));
    }
    if (target == host_port) return std::shared_ptr<Endpoint>(std::shared_ptr<Endpoint>(), e.get());
  }
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (!Allowed(host, host_port)) {
    return absl::PermissionDeniedError(absl::StrCat(
        "x-prefiller-host-port='", echo, "' is not a trusted prefill endpoint: the decode worker "
        "dials only its --prefill-address and what --prefiller-allow (or --trusted-prefiller-header) names"));
  }
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
