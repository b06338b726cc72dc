#include "decode_worker/prefiller_trust.h"

#include <arpa/inet.h>

#include <algorithm>
#include <cstdint>
#include <optional>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace tandem {

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

absl::Status CheckPrefillerTrust(const PrefillerTrust& trust) {
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

static bool Allowed(const PrefillerTrust& trust, const std::string& host, const std::string& host_port) {
  if (trust.any) return true;
  const auto ip = ParseIp(host);
  for (const std::string& entry : trust.allow) {
    if (entry == host_port) return true;
    if (ip) {
      if (auto net = ParseNetwork(entry); net && InNetwork(*ip, *net)) return true;
    }
  }
  return false;
}

absl::StatusOr<std::string> ParsePrefillerName(const std::string& host_port) {
  const bool printable = std::all_of(host_port.begin(), host_port.end(),
                                     [](char c) { return c > 0x20 && c < 0x7f; });
  const size_t colon = host_port.rfind(':');
  const bool port_ok = colon != std::string::npos && colon + 1 < host_port.size() &&
                       host_port.size() - colon <= 6 &&
                       host_port.find_first_not_of("0123456789", colon + 1) == std::string::npos;
  const bool host_ok = colon != std::string::npos && colon > 0 &&
                       host_port.find_first_of("/,", 0) == std::string::npos;
  if (!printable || !port_ok || !host_ok || host_port.size() > 255) {
    return absl::InvalidArgumentError(absl::StrCat("x-prefiller-host-port='", absl::CHexEscape(host_port.substr(0, 64)),
                                                   "': expected HOST:PORT (printable ASCII, at most 255 bytes)"));
  }
  std::string host = host_port.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  if (host.empty()) {  // "[]:443"
    return absl::InvalidArgumentError(absl::StrCat("x-prefiller-host-port='", absl::CHexEscape(host_port.substr(0, 64)),
                                                   "': the host is empty"));
  }
  return host;
}

absl::Status CheckPrefillerTrusted(const PrefillerTrust& trust, const std::string& host,
                                   const std::string& host_port) {
  if (Allowed(trust, host, host_port)) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrCat(
      "x-prefiller-host-port='", absl::CHexEscape(host_port.substr(0, 64)),
      "' is not a trusted prefill endpoint: the decode worker dials only its --prefill-address and "
      "what --prefiller-allow (or --trusted-prefiller-header) names"));
}

}  // namespace tandem
