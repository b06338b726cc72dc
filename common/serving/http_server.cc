#include "common/serving/http_server.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <pthread.h>
#include <strings.h>
#include <sys/socket.h>

#include <cerrno>
#include <chrono>
#include <exception>
#include <thread>
#include <unordered_map>

#include "absl/strings/str_cat.h"
#include "common/base/logging.h"
#include "common/base/mutex.h"

namespace tandem {
namespace {

const char* Reason(int status) {
  switch (status) {
    case 200: return "OK";
    case 400: return "Bad Request";
    case 404: return "Not Found";
    case 405: return "Method Not Allowed";
    case 408: return "Request Timeout";
    case 409: return "Conflict";
    case 413: return "Payload Too Large";
    case 429: return "Too Many Requests";
    case 431: return "Request Header Fields Too Large";
    case 499: return "Client Closed Request";
    case 500: return "Internal Server Error";
    case 501: return "Not Implemented";
    case 503: return "Service Unavailable";
    case 504: return "Gateway Timeout";
    default: return "Status";
  }
}

// What the loop and every Stream share; outlives the server while a Stream
// holds it, so a late write after Stop() is dropped, not a use after free.
struct Core {
  Mutex mu;
  std::vector<std::function<void()>> tasks ABSL_GUARDED_BY(mu);
  event* wake ABSL_GUARDED_BY(mu) = nullptr;  // null once stopped

  // Runs `task` on the loop thread.
  void Post(std::function<void()> task) {
    MutexLock lock(&mu);
    if (wake == nullptr) return;
    tasks.push_back(std::move(task));
    event_active(wake, EV_READ, 0);
  }
};

class ServerImpl;

// An evbuffer holding `text`. A large one is handed over, not copied (a
// 15 MB /tokenize reply copied on the loop is a pause for every stream); the
// buffer frees it once it has been written out.
evbuffer* BufferOf(std::string text) {
  evbuffer* buf = evbuffer_new();
  if (text.size() < (64 << 10)) {
    evbuffer_add(buf, text.data(), text.size());
    return buf;
  }
  auto* owned = new std::string(std::move(text));
  evbuffer_add_reference(
      buf, owned->data(), owned->size(),
      [](const void*, size_t, void* arg) { delete static_cast<std::string*>(arg); }, owned);
  return buf;
}

class StreamImpl final : public HttpServer::Stream, public std::enable_shared_from_this<StreamImpl> {
 public:
  StreamImpl(std::shared_ptr<Core> core, evhttp_request* req)
      : core_(std::move(core)), req_(req), conn_(evhttp_request_get_connection(req)) {}

  void Respond(int status, const std::string& content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> headers) override {
    core_->Post([self = shared_from_this(), status, content_type, body = std::move(body),
                 headers = std::move(headers)]() mutable {
      if (self->req_ == nullptr || self->started_) return;
      self->AddHeaders(content_type, headers);
      evbuffer* buf = BufferOf(std::move(body));
      evhttp_send_reply(self->req_, status, Reason(status), buf);
      evbuffer_free(buf);
      self->Finished();
    });
  }

  void Start(int status, const std::string& content_type,
             std::vector<std::pair<std::string, std::string>> headers) override {
    core_->Post([self = shared_from_this(), status, content_type, headers = std::move(headers)] {
      if (self->req_ == nullptr || self->started_) return;
      self->started_ = true;
      self->AddHeaders(content_type, headers);
      evhttp_send_reply_start(self->req_, status, Reason(status));
    });
  }

  void Write(std::string data) override {
    core_->Post([self = shared_from_this(), data = std::move(data)]() mutable {
      if (self->req_ == nullptr || !self->started_) return;
      evbuffer* buf = BufferOf(std::move(data));
      evhttp_send_reply_chunk(self->req_, buf);
      evbuffer_free(buf);
    });
  }

  void End() override {
    core_->Post([self = shared_from_this()] {
      if (self->req_ == nullptr) return;
      if (!self->started_) {
        evhttp_send_reply(self->req_, 200, "OK", nullptr);
      } else {
        evhttp_send_reply_end(self->req_);
      }
      self->Finished();
    });
  }

  void OnClose(std::function<void()> callback) override {
    core_->Post([self = shared_from_this(), callback = std::move(callback)]() mutable {
      if (self->gone_) return callback();
      if (self->req_ != nullptr) self->on_close_ = std::move(callback);
    });
  }

  // Loop thread: the client went away (its connection is being freed).
  void Closed() {
    if (req_ == nullptr) return;
    gone_ = true;
    // A request whose reply was under way when the peer closed is detached
    // from its connection (libevent's incoming-failure path) and left for
    // us to free; one still attached goes with the connection.
    if (evhttp_request_get_connection(req_) == nullptr) evhttp_request_free(req_);
    req_ = nullptr;
    if (on_close_) {
      std::function<void()> cb = std::move(on_close_);
      on_close_ = nullptr;
      cb();
    }
  }

  evhttp_connection* connection() const { return conn_; }
  bool open() const { return req_ != nullptr; }
  std::function<void(evhttp_connection*)> on_finished;  // set by the server

 private:
  void AddHeaders(const std::string& content_type,
                  const std::vector<std::pair<std::string, std::string>>& headers) {
    evkeyvalq* out = evhttp_request_get_output_headers(req_);
    evhttp_add_header(out, "Content-Type", content_type.c_str());
    for (const auto& [k, v] : headers) evhttp_add_header(out, k.c_str(), v.c_str());
  }
  void Finished() {
    req_ = nullptr;  // libevent frees the request once the reply is out
    on_close_ = nullptr;
    if (on_finished) on_finished(conn_);
  }

  std::shared_ptr<Core> core_;
  // Loop thread only.
  evhttp_request* req_;
  evhttp_connection* conn_;
  bool started_ = false;
  bool gone_ = false;  // the client went away before the response was done
  std::function<void()> on_close_;
};

using Clock = std::chrono::steady_clock;

// One client connection as the limits see it. evhttp has no hook for a new
// connection or for one it frees, and none for a request that is still
// arriving (libevent 2.1's read timeout restarts with every byte, so a
// client trickling a byte a second is never closed). So the server makes
// each connection's bufferevent itself (evhttp_set_bevcb), keeps a reference
// to it, watches its input buffer for bytes, and learns that evhttp let the
// connection go when the bufferevent has lost its callbacks (which
// bufferevent_free clears); the once-a-second sweep then drops its
// reference. A connection is closed by shutting its socket down: evhttp
// sees the end of the stream and frees it as it frees any other.
struct Conn {
  enum class State { kIdle, kReading, kHandling };
  bufferevent* bev = nullptr;
  evbuffer_cb_entry* watch = nullptr;
  State state = State::kIdle;
  Clock::time_point since;  // when `state` began
  bool refused = false;     // over max_connections: closed at once
};

// Writes a whole (small) response straight to the socket, then shuts it
// down: for connections evhttp holds no request of.
void CloseWith(bufferevent* bev, const char* status_line) {
  const evutil_socket_t fd = bufferevent_getfd(bev);
  if (fd < 0) return;
  const std::string reply = absl::StrCat("HTTP/1.1 ", status_line,
                                         "\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
  (void)send(fd, reply.data(), reply.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  shutdown(fd, SHUT_RDWR);
}

class ServerImpl final : public HttpServer {
 public:
  ServerImpl(Handler handler, Options options) : handler_(std::move(handler)), options_(options) {}
  ~ServerImpl() override {
    if (loop_.joinable()) {
      Stop();
      return;
    }
    // Init() failed part way (the address could not be bound, say).
    if (http_ != nullptr) evhttp_free(http_);
    if (io_limit_ != nullptr) bufferevent_rate_limit_group_free(io_limit_);
    if (io_cfg_ != nullptr) ev_token_bucket_cfg_free(io_cfg_);
    if (base_ != nullptr) event_base_free(base_);
  }

  absl::Status Init(const std::string& address) {
    static const int threads_ok = evthread_use_pthreads();
    if (threads_ok != 0) return absl::InternalError("libevent: no pthread support");
    const size_t colon = address.rfind(':');
    if (colon == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("--http-address='", address, "': expected HOST:PORT"));
    }
    std::string host = address.substr(0, colon);
    if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
    int port = 0;
    try {
      port = std::stoi(address.substr(colon + 1));
    } catch (...) {
      port = -1;
    }
    if (port < 0 || port > 65535) {
      return absl::InvalidArgumentError(absl::StrCat("--http-address='", address, "': bad port"));
    }
    base_ = event_base_new();
    http_ = evhttp_new(base_);
    if (base_ == nullptr || http_ == nullptr) return absl::InternalError("libevent: cannot create the HTTP server");
    evhttp_set_max_body_size(http_, static_cast<ev_ssize_t>(options_.max_body_bytes));
    evhttp_set_max_headers_size(http_, static_cast<ev_ssize_t>(options_.max_header_bytes));
    evhttp_set_timeout(http_, options_.read_timeout_seconds);
    evhttp_set_bevcb(http_, &ServerImpl::NewConnection, this);
    if (options_.max_read_bytes_per_second > 0 || options_.max_write_bytes_per_second > 0) {
      // Reading and writing are the loop's to do, and on loopback or a fast
      // link the kernel's copies are the loop's CPU: bounded, so that
      // megabytes arriving or leaving at once take a bounded share of a core
      // (the engine's threads wait for each other, and one core taken
      // stalls every stream). Bursts of 256 KiB: requests and replies of
      // ordinary size go in one read or write.
      const timeval tick{0, 10000};
      auto per_tick = [](size_t per_second) -> size_t {
        return per_second > 0 ? per_second / 100 : EV_RATE_LIMIT_MAX;
      };
      auto burst = [](size_t rate) { return std::max<size_t>(rate, 256 << 10); };
      const size_t read = per_tick(options_.max_read_bytes_per_second);
      const size_t write = per_tick(options_.max_write_bytes_per_second);
      io_cfg_ = ev_token_bucket_cfg_new(read, read == EV_RATE_LIMIT_MAX ? read : burst(read), write,
                                        write == EV_RATE_LIMIT_MAX ? write : burst(write), &tick);
      io_limit_ = bufferevent_rate_limit_group_new(base_, io_cfg_);
    }
    evhttp_set_allowed_methods(http_, EVHTTP_REQ_GET | EVHTTP_REQ_POST | EVHTTP_REQ_HEAD |
                                          EVHTTP_REQ_OPTIONS | EVHTTP_REQ_PUT | EVHTTP_REQ_DELETE);
    evhttp_set_gencb(http_, &ServerImpl::OnRequest, this);
    evhttp_bound_socket* bound = evhttp_bind_socket_with_handle(http_, host.c_str(), static_cast<uint16_t>(port));
    if (bound == nullptr) {
      return absl::UnavailableError(absl::StrCat("cannot listen on --http-address=", address,
                                                 " (the port is in use, or the address is not one of this host's)"));
    }
    sockaddr_storage ss{};
    socklen_t len = sizeof(ss);
    getsockname(evhttp_bound_socket_get_fd(bound), reinterpret_cast<sockaddr*>(&ss), &len);
    port_ = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                           : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
    core_ = std::make_shared<Core>();
    {
      MutexLock lock(&core_->mu);
      core_->wake = event_new(base_, -1, EV_PERSIST, &ServerImpl::OnWake, this);
    }
    check_ = event_new(base_, -1, EV_PERSIST, &ServerImpl::OnCheck, this);
    timeval second{1, 0};
    event_add(check_, &second);
    loop_ = std::thread([this] {
#ifdef __linux__
      pthread_setname_np(pthread_self(), "tandem-http");
#endif
      event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY);
    });
    return absl::OkStatus();
  }

  int port() const override { return port_; }

  void Stop() override {
    if (!loop_.joinable()) return;
    core_->Post([this] {
      // Connections go first: their streams hear of it (OnClose) and cancel.
      evhttp_free(http_);
      http_ = nullptr;
      event_base_loopbreak(base_);
    });
    loop_.join();
    {
      MutexLock lock(&core_->mu);
      event_free(core_->wake);
      core_->wake = nullptr;
      core_->tasks.clear();
    }
    event_free(check_);
    check_ = nullptr;
    for (auto& [bev, conn] : conns_) Release(*conn);
    conns_.clear();
    if (io_limit_ != nullptr) bufferevent_rate_limit_group_free(io_limit_);
    if (io_cfg_ != nullptr) ev_token_bucket_cfg_free(io_cfg_);
    io_limit_ = nullptr;
    io_cfg_ = nullptr;
    event_base_free(base_);
    base_ = nullptr;
  }

 private:
  static void OnWake(evutil_socket_t, short, void* arg) {
    auto* self = static_cast<ServerImpl*>(arg);
    std::vector<std::function<void()>> tasks;
    {
      MutexLock lock(&self->core_->mu);
      tasks.swap(self->core_->tasks);
    }
    for (auto& t : tasks) t();
  }

  // evhttp's bufferevent factory: every accepted connection comes here first.
  static bufferevent* NewConnection(event_base* base, void* arg) {
    auto* self = static_cast<ServerImpl*>(arg);
    bufferevent* bev = bufferevent_socket_new(base, -1, BEV_OPT_CLOSE_ON_FREE);
    if (bev == nullptr) return nullptr;  // evhttp makes its own (unwatched)
    bufferevent_incref(bev);
    if (self->io_limit_ != nullptr) bufferevent_add_to_rate_limit_group(bev, self->io_limit_);
    auto conn = std::make_unique<Conn>();
    conn->bev = bev;
    conn->since = Clock::now();
    conn->watch = evbuffer_add_cb(bufferevent_get_input(bev), &ServerImpl::OnInput, conn.get());
    // Connections evhttp let go since the last sweep still count until
    // they are reclaimed: at the limit, reclaim first (clients that open a
    // connection a request are not refused for the ones they closed).
    if (self->live_ >= self->options_.max_connections) self->Reclaim();
    conn->refused = self->live_ >= self->options_.max_connections;
    if (conn->refused) {
      // evhttp sets the socket right after this returns: close it on the
      // loop's next turn (with a reference of its own, whatever happens to
      // the connection meanwhile).
      bufferevent_incref(bev);
      event_base_once(base, -1, EV_TIMEOUT, &ServerImpl::Refuse, bev, nullptr);
    } else {
      ++self->live_;
    }
    self->conns_[bev] = std::move(conn);
    return bev;
  }

  static void Refuse(evutil_socket_t, short, void* arg) {
    auto* bev = static_cast<bufferevent*>(arg);
    CloseWith(bev, "503 Service Unavailable");
    bufferevent_decref(bev);
  }

  // Bytes arrived on an idle connection: a request's time starts.
  static void OnInput(evbuffer*, const evbuffer_cb_info* info, void* arg) {
    auto* conn = static_cast<Conn*>(arg);
    if (info->n_added == 0 || conn->state != Conn::State::kIdle) return;
    conn->state = Conn::State::kReading;
    conn->since = Clock::now();
  }

  void Release(Conn& conn) {
    if (!conn.refused) --live_;
    evbuffer_remove_cb_entry(bufferevent_get_input(conn.bev), conn.watch);
    // Now, not when the bufferevent is finalized (on a later turn of the
    // loop, which Stop() may not give it): the group is freed with the loop.
    if (io_limit_ != nullptr) bufferevent_remove_from_rate_limit_group(conn.bev);
    bufferevent_decref(conn.bev);
  }

  Conn* FindConn(evhttp_connection* c) {
    bufferevent* bev = evhttp_connection_get_bufferevent(c);
    auto it = conns_.find(bev);
    return it != conns_.end() ? it->second.get() : nullptr;
  }

  // Lets go of the connections evhttp freed (their bufferevents lost
  // their callbacks).
  void Reclaim() {
    for (auto it = conns_.begin(); it != conns_.end();) {
      bufferevent_event_cb event_cb = nullptr;
      bufferevent_getcb(it->second->bev, nullptr, nullptr, &event_cb, nullptr);
      if (event_cb == nullptr) {
        Release(*it->second);
        it = conns_.erase(it);
      } else {
        ++it;
      }
    }
  }

  // The connection limits, once a second: let go of what evhttp freed,
  // close what outstayed its time.
  void SweepConnections() {
    Reclaim();
    const Clock::time_point now = Clock::now();
    const auto request_limit = std::chrono::seconds(options_.request_timeout_seconds);
    const auto idle_limit = std::chrono::seconds(options_.keepalive_timeout_seconds);
    for (auto it = conns_.begin(); it != conns_.end(); ++it) {
      Conn& conn = *it->second;
      if (conn.state == Conn::State::kReading && now - conn.since > request_limit) {
        CloseWith(conn.bev, "408 Request Timeout");
      } else if (conn.state == Conn::State::kIdle && now - conn.since > idle_limit) {
        CloseWith(conn.bev, "408 Request Timeout");
      }
    }
  }

  // Every second: a client that closed its socket while its response waits
  // (a long prefill, a non-streamed completion) is let go now, not at the
  // next write; then the connection limits.
  static void OnCheck(evutil_socket_t, short, void* arg) {
    auto* self = static_cast<ServerImpl*>(arg);
    self->SweepConnections();
    std::vector<evhttp_connection*> gone;
    for (const auto& [conn, stream] : self->active_) {
      bufferevent* bev = evhttp_connection_get_bufferevent(conn);
      const evutil_socket_t fd = bev != nullptr ? bufferevent_getfd(bev) : -1;
      if (fd < 0) continue;
      char byte;
      const ssize_t n = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
        gone.push_back(conn);
      }
    }
    for (evhttp_connection* conn : gone) evhttp_connection_free(conn);  // runs OnConnectionClosed
  }

  static void OnConnectionClosed(evhttp_connection* conn, void* arg) {
    auto* self = static_cast<ServerImpl*>(arg);
    auto it = self->active_.find(conn);
    if (it == self->active_.end()) return;
    std::shared_ptr<StreamImpl> stream = std::move(it->second);
    self->active_.erase(it);
    stream->Closed();
  }

  static void OnRequest(evhttp_request* req, void* arg) {
    auto* self = static_cast<ServerImpl*>(arg);
    Request r;
    switch (evhttp_request_get_command(req)) {
      case EVHTTP_REQ_GET: r.method = "GET"; break;
      case EVHTTP_REQ_POST: r.method = "POST"; break;
      case EVHTTP_REQ_HEAD: r.method = "HEAD"; break;
      case EVHTTP_REQ_PUT: r.method = "PUT"; break;
      case EVHTTP_REQ_DELETE: r.method = "DELETE"; break;
      case EVHTTP_REQ_OPTIONS: r.method = "OPTIONS"; break;
      default: r.method = "OTHER";
    }
    const std::string uri = evhttp_request_get_uri(req);
    const size_t q = uri.find('?');
    r.path = uri.substr(0, q);
    if (q != std::string::npos) r.query = uri.substr(q + 1);
    evkeyvalq* in = evhttp_request_get_input_headers(req);
    for (evkeyval* kv = in->tqh_first; kv != nullptr; kv = kv->next.tqe_next) {
      r.headers.emplace_back(kv->key, kv->value);
    }
    r.body = TakeBody(evhttp_request_get_input_buffer(req));

    auto stream = std::make_shared<StreamImpl>(self->core_, req);
    evhttp_connection* conn = stream->connection();
    Conn* watched = self->FindConn(conn);
    if (watched != nullptr) {
      watched->state = Conn::State::kHandling;
      watched->since = Clock::now();
    }
    stream->on_finished = [self](evhttp_connection* c) {
      self->active_.erase(c);
      // Idle from now (a pipelined request's bytes may already be in).
      if (Conn* w = self->FindConn(c)) {
        w->state = Conn::State::kIdle;
        w->since = Clock::now();
      }
    };
    self->active_[conn] = stream;
    evhttp_connection_set_closecb(conn, &ServerImpl::OnConnectionClosed, self);
    if (watched != nullptr && watched->refused) {
      evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
      return stream->Respond(503, "text/plain", "too many connections\n", {});
    }
    if (static_cast<int>(r.headers.size()) > self->options_.max_headers) {
      evhttp_add_header(evhttp_request_get_output_headers(req), "Connection", "close");
      return stream->Respond(431, "text/plain",
                             absl::StrCat("a request may have at most ", self->options_.max_headers,
                                          " header lines (--http-max-headers); this one has ",
                                          r.headers.size(), "\n"),
                             {});
    }
    // An exception out of a handler would end the process, and every request
    // in flight with it (this is a C callback): it answers 500 instead.
    // Handlers are written not to throw; this is the net under them.
    const std::string what = absl::StrCat(r.method, " ", r.path.substr(0, 64));
    try {
      self->handler_(std::move(r), stream);
    } catch (const std::exception& e) {
      TANDEM_LOG(ERROR) << "HTTP " << what << ": the handler threw: " << e.what();
      stream->Respond(500, "text/plain", absl::StrCat("internal error: ", e.what(), "\n"), {});
    }
  }

  Handler handler_;
  Options options_;
  event_base* base_ = nullptr;
  evhttp* http_ = nullptr;
  event* check_ = nullptr;
  int port_ = 0;
  std::shared_ptr<Core> core_;
  std::thread loop_;
  // Loop thread only: the stream each connection is answering.
  std::unordered_map<evhttp_connection*, std::shared_ptr<StreamImpl>> active_;
  // Loop thread only: every connection by its bufferevent (Conn), and how
  // many of them count against max_connections.
  std::unordered_map<bufferevent*, std::unique_ptr<Conn>> conns_;
  int live_ = 0;
  ev_token_bucket_cfg* io_cfg_ = nullptr;
  bufferevent_rate_limit_group* io_limit_ = nullptr;  // every connection's reads and writes together
};

}  // namespace

struct HttpServer::Body::Chunks {
  evbuffer* buffer = evbuffer_new();
  ~Chunks() { evbuffer_free(buffer); }
};

HttpServer::Body::Body() = default;
HttpServer::Body::Body(std::string text) : text_(std::move(text)) {}
HttpServer::Body::Body(Body&&) noexcept = default;
HttpServer::Body& HttpServer::Body::operator=(Body&&) noexcept = default;
HttpServer::Body::~Body() = default;

size_t HttpServer::Body::size() const {
  return chunks_ != nullptr ? evbuffer_get_length(chunks_->buffer) : text_.size();
}

const std::string& HttpServer::Body::str() const {
  if (chunks_ != nullptr) {
    text_.resize(evbuffer_get_length(chunks_->buffer));
    if (!text_.empty()) evbuffer_remove(chunks_->buffer, text_.data(), text_.size());
    chunks_.reset();
  }
  return text_;
}

HttpServer::Body HttpServer::TakeBody(evbuffer* input) {
  Body body;
  if (evbuffer_get_length(input) == 0) return body;
  body.chunks_ = std::make_unique<Body::Chunks>();
  // Moves the chunks, not their bytes.
  evbuffer_add_buffer(body.chunks_->buffer, input);
  return body;
}

std::string HttpServer::Request::Header(const std::string& name) const {
  for (const auto& [k, v] : headers) {
    if (strcasecmp(k.c_str(), name.c_str()) == 0) return v;
  }
  return "";
}

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(const std::string& address,
                                                              Handler handler, Options options) {
  auto server = std::make_unique<ServerImpl>(std::move(handler), options);
  if (absl::Status s = server->Init(address); !s.ok()) return s;
  return server;
}

}  // namespace tandem
