// Reading a worker's /metrics: a minimal HTTP/1.0 GET and a lookup in the
// Prometheus text format. Used by `tandem bench serve` (metric deltas over a
// run) and the integration tests. A dependency-free client on purpose: the
// only HTTP the project speaks as a client is this one loopback-style GET, and
// Debian's prometheus-cpp ships no client.
#ifndef TANDEM_COMMON_SERVING_PROMETHEUS_SCRAPE_H_
#define TANDEM_COMMON_SERVING_PROMETHEUS_SCRAPE_H_

#include <map>
#include <optional>
#include <string>

namespace tandem {

// GET http://host:port/path (host: a name or an IPv4/IPv6 literal) with a
// 5 s receive timeout; the body, or empty on any failure.
std::string HttpGet(const std::string& host, int port, const std::string& path);

// The value of the first sample of `name` whose labels include `labels`;
// nullopt when absent.
std::optional<double> MetricValue(const std::string& text, const std::string& name,
                                  const std::map<std::string, std::string>& labels = {});

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_PROMETHEUS_SCRAPE_H_
