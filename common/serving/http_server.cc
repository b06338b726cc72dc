#include "common/serving/http_server.h"

#include <event2/buffer.h>
#include <event2/bufferevent.h>
#include <event2/event.h>
#include <event2/http.h>
#include <event2/keyvalq_struct.h>
#include <event2/thread.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>

#include <cerrno>
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

class StreamImpl final : public HttpServer::Stream, public std::enable_shared_from_this<StreamImpl> {
 public:
  StreamImpl(std::shared_ptr<Core> core, evhttp_request* req)
      : core_(std::move(core)), req_(req), conn_(evhttp_request_get_connection(req)) {}

  void Respond(int status, const std::string& content_type, std::string body,
               std::vector<std::pair<std::string, std::string>> headers) override {
    core_->Post([self = shared_from_this(), status, content_type, body = std::move(body),
                 headers = std::move(headers)] {
      if (self->req_ == nullptr || self->started_) return;
      self->AddHeaders(content_type, headers);
      evbuffer* buf = evbuffer_new();
      evbuffer_add(buf, body.data(), body.size());
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
    core_->Post([self = shared_from_this(), data = std::move(data)] {
      if (self->req_ == nullptr || !self->started_) return;
      evbuffer* buf = evbuffer_new();
      evbuffer_add(buf, data.data(), data.size());
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

  void OnClose(std::function<void()> callback) override { on_close_ = std::move(callback); }

  // Loop thread: the client went away (its connection is being freed).
  void Closed() {
    if (req_ == nullptr) return;
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
  std::function<void()> on_close_;
};

class ServerImpl final : public HttpServer {
 public:
  ServerImpl(Handler handler, Options options) : handler_(std::move(handler)), options_(options) {}
  ~ServerImpl() override {
    if (loop_.joinable()) {
      Stop();
      return;
    }
    if (http_ != nullptr) evhttp_free(http_);  // Init() failed part way
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
    evhttp_set_timeout(http_, options_.read_timeout_seconds);
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
    loop_ = std::thread([this] { event_base_loop(base_, EVLOOP_NO_EXIT_ON_EMPTY); });
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

  // Every second: a client that closed its socket while its response waits
  // (a long prefill, a non-streamed completion) is let go now, not at the
  // next write.
  static void OnCheck(evutil_socket_t, short, void* arg) {
    auto* self = static_cast<ServerImpl*>(arg);
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
    evbuffer* body = evhttp_request_get_input_buffer(req);
    r.body.resize(evbuffer_get_length(body));
    if (!r.body.empty()) evbuffer_remove(body, r.body.data(), r.body.size());

    auto stream = std::make_shared<StreamImpl>(self->core_, req);
    evhttp_connection* conn = stream->connection();
    stream->on_finished = [self](evhttp_connection* c) { self->active_.erase(c); };
    self->active_[conn] = stream;
    evhttp_connection_set_closecb(conn, &ServerImpl::OnConnectionClosed, self);
    // An exception out of a handler would end the process, and every request
    // in flight with it (this is a C callback): it answers 500 instead.
    // Handlers are written not to throw; this is the net under them.
    try {
      self->handler_(r, stream);
    } catch (const std::exception& e) {
      TANDEM_LOG(ERROR) << "HTTP " << r.method << " " << r.path << ": the handler threw: " << e.what();
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
};

}  // namespace

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
