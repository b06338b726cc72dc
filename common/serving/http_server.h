// HttpServer: an HTTP/1.1 server on libevent's evhttp, for the decode
// worker's OpenAI-compatible API. One event-loop thread holds every
// connection (no thread per stream: a thousand open SSE streams are a
// thousand sockets on one loop); handlers run on that thread and must not
// block. A response may be written from any thread through its Stream,
// whole or in chunks (SSE); a client that goes away is noticed when a write
// fails or, while nothing is written, within a second (its socket is
// checked), and the stream's OnClose callback runs once. Every limit a
// client could spend the loop on (header bytes and lines, body bytes, the
// time to send a request, idle keep-alive time, connections) is an Option.
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

struct evbuffer;

namespace tandem {

class HttpServer {
 public:
  // A request's body as it arrived. The loop thread hands over the chunks it
  // read without copying them (a 15 MB copy there is a pause for every
  // stream on the loop); the first str() gathers them into one string, on
  // the thread that asks. One thread at a time.
  class Body {
   public:
    Body();
    explicit Body(std::string text);
    Body(Body&&) noexcept;
    Body& operator=(Body&&) noexcept;
    ~Body();
    size_t size() const;
    bool empty() const { return size() == 0; }
    const std::string& str() const;

   private:
    friend class HttpServer;
    struct Chunks;  // the connection's buffer, until str() gathers it
    mutable std::unique_ptr<Chunks> chunks_;
    mutable std::string text_;
  };

  struct Request {
    std::string method;  // "GET", "POST", ...
    std::string path;    // without the query
    std::string query;
    std::vector<std::pair<std::string, std::string>> headers;
    Body body;
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
    // Runs once, on the loop thread, if the client goes away before End();
    // at once (on the loop) when it went away before this call. Set it at
    // most once, from any thread.
    virtual void OnClose(std::function<void()> callback) = 0;
  };

  // The request is the handler's to keep (move its body elsewhere).
  using Handler = std::function<void(Request, std::shared_ptr<Stream>)>;

  // What one client may spend of the server. A connection past a limit is
  // answered (413, 431, 408, 503) where HTTP allows and closed.
  struct Options {
    size_t max_body_bytes = 16 << 20;
    size_t max_header_bytes = 64 << 10;  // the request line and headers together
    int max_headers = 128;               // header lines a request may have (431 past it)
    int read_timeout_seconds = 60;       // a read that makes no progress
    // A request's headers and body from its first byte: a client that
    // trickles them (slowloris) is answered 408 and closed after this long.
    int request_timeout_seconds = 30;
    // A kept-alive connection with no request under way is closed after this.
    int keepalive_timeout_seconds = 30;
    // Open connections at once; one more is answered 503 and closed.
    int max_connections = 1024;
    // What the loop reads from all connections together, per second (0: no
    // bound): large bodies arrive at this pace rather than taking a core.
    size_t max_read_bytes_per_second = 0;
    // What the loop writes to all connections together, per second (0: no
    // bound): a reply of megabytes leaves at this pace (the kernel's copies
    // are the loop's CPU); streams of tokens are a small fraction of it.
    size_t max_write_bytes_per_second = 0;
    static constexpr size_t kDefaultMaxBytesPerSecond = 64 << 20;  // the decode worker's flags
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

 protected:
  // The request's body, its chunks moved out of the connection's buffer.
  static Body TakeBody(evbuffer* input);
};

}  // namespace tandem

#endif  // TANDEM_COMMON_SERVING_HTTP_SERVER_H_
