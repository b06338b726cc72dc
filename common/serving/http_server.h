// HttpServer: an HTTP/1.1 server on libevent's evhttp, for the decode
// worker's OpenAI-compatible API. One event-loop thread holds every
// connection (no thread per stream: a thousand open SSE streams are a
// thousand sockets on one loop); handlers run on that thread and must not
// block. A response may be written from any thread through its Stream,
// whole or in chunks (SSE); a client that goes away is noticed when a write
// fails or, while nothing is written, within a second (its socket is
// checked), and the stream's OnClose callback runs once.
//
// Why evhttp: see docs/serving.md ("The HTTP server"): among Debian's
// packages it is the one that keeps every stream on one event loop with a
// small C API; cpp-httplib serves a stream per pool thread.
#ifndef TANDEM_COMMON_SERVING_HTTP_SERVER_H_
#define TANDEM_COMMON_SERVING_HTTP_SERVER_H_

#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"

namespace tandem {

class HttpServer {
 public:
  struct Request {
    std::string method;  // "GET", "POST", ...
    std::string path;    // without the query
    std::string query;
    std::vector<std::pair<std::string, std::string>> headers;
    std::string body;
    // The first header named `name` (case-insensitive), or "".
    std::string Header(const std::string& name) const;
  };

  // A response under way. Thread-safe; every call after End() or after the
  // client went away does nothing.
  class Stream {
   public:
    virtual ~Stream() = default;
    // The whole response.
    virtual void Respond(int status, const std::string& content_type, std::string body,
                         std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
    // A chunked response: the status and headers now, then Write()s, then End().
    virtual void Start(int status, const std::string& content_type,
                       std::vector<std::pair<std::string, std::string>> headers = {}) = 0;
    virtual void Write(std::string data) = 0;
    virtual void End() = 0;
    // Runs once, on the loop thread, if the client goes away before End().
    // Set it at most once, from the handler.
    virtual void OnClose(std::function<void()> callback) = 0;
  };

  using Handler = std::function<void(const Request&, std::shared_ptr<Stream>)>;

  struct Options {
    size_t max_body_bytes = 16 << 20;
    int read_timeout_seconds = 60;  // for a request's headers and body
  };

  // Listens on `address` (HOST:PORT; port 0 picks one) and starts the loop.
  // UNAVAILABLE names the address when it cannot be bound.
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           Handler handler, Options options);
  static absl::StatusOr<std::unique_ptr<HttpServer>> Start(const std::string& address,
                                                           Handler handler) {
    return Start(address, std::move(handler), Options());
  }
  virtual ~HttpServer() = default;

  virtual int port() const = 0;
  // Closes the listener and every connection and joins the loop (idempotent).
  virtual void Stop() = 0;
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_HTTP_SERVER_H_
