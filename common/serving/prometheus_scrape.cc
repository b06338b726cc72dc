#include "common/serving/prometheus_scrape.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

namespace tandem {

std::string HttpGet(const std::string& host, int port, const std::string& path) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found) != 0) return "";
  int fd = -1;
  for (addrinfo* a = found; a != nullptr && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    timeval tv{5, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(found);
  if (fd < 0) return "";
  const std::string req =
      "GET " + path + " HTTP/1.0\r\nHost: " + host + "\r\nConnection: close\r\n\r\n";
  if (write(fd, req.data(), req.size()) != static_cast<ssize_t>(req.size())) {
    close(fd);
    return "";
  }
  // Read until the body announced by Content-Length is complete (the server
  // may keep the connection open).
  std::string out;
  char buf[8192];
  ssize_t n;
  size_t body = std::string::npos, length = std::string::npos;
  while ((n = read(fd, buf, sizeof(buf))) > 0) {
    out.append(buf, n);
    if (body == std::string::npos && (body = out.find("\r\n\r\n")) != std::string::npos) {
      body += 4;
      std::string headers = out.substr(0, body);
      for (char& c : headers) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      const size_t at = headers.find("content-length:");
      if (at != std::string::npos) length = std::strtoul(headers.c_str() + at + 15, nullptr, 10);
    }
    if (body != std::string::npos && length != std::string::npos && out.size() >= body + length) break;
  }
  close(fd);
  return body == std::string::npos ? "" : out.substr(body);
}

std::optional<double> MetricValue(const std::string& text, const std::string& name,
                                  const std::map<std::string, std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == absl::string_view::npos || line.substr(0, name_end) != name) continue;
    std::map<std::string, std::string> got;
    absl::string_view rest = line.substr(name_end);
    if (!rest.empty() && rest[0] == '{') {
      const size_t close = rest.find('}');
      if (close == absl::string_view::npos) continue;
      for (absl::string_view kv : absl::StrSplit(rest.substr(1, close - 1), ',', absl::SkipEmpty())) {
        const size_t eq = kv.find('=');
        if (eq == absl::string_view::npos) continue;
        got[std::string(kv.substr(0, eq))] =
            std::string(absl::StripSuffix(absl::StripPrefix(kv.substr(eq + 1), "\""), "\""));
      }
      rest = rest.substr(close + 1);
    }
    bool match = true;
    for (const auto& [k, v] : labels) match = match && got.count(k) && got[k] == v;
    if (!match) continue;
    double value = 0;
    if (absl::SimpleAtod(absl::StripAsciiWhitespace(rest), &value)) return value;
  }
  return std::nullopt;
}

}  // namespace tandem
