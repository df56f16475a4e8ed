#include "services/ivy/http/server.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <array>
#include <atomic>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/executor_work_guard.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <cerrno>
#include <cstdio>
#include <optional>
#include <random>
#include <thread>
#include <unordered_map>
#include <vector>

#include "common/logging.h"
#include "common/mutex.h"
#include "services/ivy/http/framing.h"
#include "services/ivy/http/response_stream.h"

namespace garden::ivy {
namespace {

namespace beast = boost::beast;
namespace http = beast::http;
namespace net = boost::asio;
using tcp = net::ip::tcp;

constexpr std::chrono::seconds kLingerTimeout{2};

bool isRequestIdChar(char c) {
  return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '.' ||
         c == '_' || c == ':' || c == '-';
}

// Beast 1.74 uses boost::string_view; convert at the boundary.
template <typename View>
std::string_view sv(const View& v) {
  return std::string_view(v.data(), v.size());
}

std::string toLower(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

// [TAG_DIRECT_WRITE] A plain (not streamed) response, built as the strand's write() builds it.
http::response<http::string_body> makeResponse(HttpResponse&& r, const std::string& request_id,
                                               bool keep) {
  http::response<http::string_body> res;
  res.version(11);
  res.result(static_cast<unsigned>(r.status));
  res.set(http::field::server, "garden-ivy");
  res.set(http::field::content_type, r.content_type);
  res.set("x-request-id", request_id);
  for (auto& [k, v] : r.headers) res.set(k, v);
  res.body() = std::move(r.body);
  res.keep_alive(keep);
  res.prepare_payload();
  return res;
}

// A response written by the thread that produced it [TAG_DIRECT_WRITE]: what send() took now, the
// rest (if the socket's buffer filled) is written by the connection's strand.
struct DirectReply {
  http::response<http::string_body> res;
  std::optional<http::response_serializer<http::string_body>> sr;  // over `res`
  bool keep = false;
  beast::error_code ec;  // send() failed: the connection is closed
};

// Sends what the socket takes without blocking (MSG_DONTWAIT: never waits for buffer space).
void sendWithoutBlocking(int fd, DirectReply& d) {
  while (!d.sr->is_done()) {
    std::array<iovec, 16> iov;
    size_t n_iov = 0, total = 0;
    beast::error_code ec;
    d.sr->next(ec, [&](beast::error_code&, const auto& buffers) {
      for (auto b : beast::buffers_range_ref(buffers)) {
        if (n_iov == iov.size()) break;
        if (b.size() == 0) continue;
        iov[n_iov++] = {const_cast<void*>(b.data()), b.size()};
        total += b.size();
      }
    });
    if (ec) {
      d.ec = ec;
      return;
    }
    msghdr msg{};
    msg.msg_iov = iov.data();
    msg.msg_iovlen = n_iov;
    ssize_t w = ::sendmsg(fd, &msg, MSG_DONTWAIT | MSG_NOSIGNAL);
    if (w < 0) {
      if (errno == EINTR) continue;
      if (errno != EAGAIN && errno != EWOULDBLOCK) {
        d.ec = beast::error_code(errno, boost::system::system_category());
      }
      return;
    }
    d.sr->consume(static_cast<size_t>(w));
    if (static_cast<size_t>(w) < total) return;  // the buffer is full: the strand writes the rest
  }
}

}  // namespace

std::string requestIdFor(std::string_view incoming) {
  if (!incoming.empty() && incoming.size() <= 128) {
    bool ok = true;
    for (char c : incoming) ok = ok && isRequestIdChar(c);
    if (ok) return std::string(incoming);
  }
  thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char kHex[] = "0123456789abcdef";
  std::string id(32, '0');
  uint64_t a = rng(), b = rng();
  for (int i = 0; i < 16; ++i) {
    id[i] = kHex[(a >> (4 * i)) & 0xf];
    id[16 + i] = kHex[(b >> (4 * i)) & 0xf];
  }
  return id;
}

class Session;

struct HttpServer::Core : std::enable_shared_from_this<HttpServer::Core> {
  Core(HttpServerOptions o, const Router* r, AccessObserver d)
      : options(std::move(o)), router(r), on_done(std::move(d)), iocs(makeContexts(options)),
        acceptor(net::make_strand(*iocs[0])) {}

  // [TAG_IO_PER_THREAD] One io_context per io thread, each run by its thread alone (concurrency
  // hint 1), and each connection on one of them (round robin at accept). One io_context shared by
  // N threads made its scheduler wake another thread for nearly every handler: on the 2-core
  // development VM ~9.5 context switches and ~340 µs of ivy CPU per embeddings request with two
  // threads, ~4.2 and ~265 µs with one (bench/results/ivy-e2e-2026-12-05-cpu.md).
  static std::vector<std::unique_ptr<net::io_context>> makeContexts(const HttpServerOptions& o) {
    int n = o.threads > 0 ? o.threads
                          : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
    std::vector<std::unique_ptr<net::io_context>> v;
    for (int i = 0; i < n; ++i) v.push_back(std::make_unique<net::io_context>(1));
    return v;
  }

  void doAccept();
  void add(Session* s, std::weak_ptr<Session> w) EXCLUDES(mu) {
    MutexLock lock(mu);
    sessions.emplace(s, std::move(w));
  }
  void remove(Session* s) EXCLUDES(mu) {
    MutexLock lock(mu);
    sessions.erase(s);
  }

  HttpServerOptions options;
  const Router* router;
  AccessObserver on_done;
  std::vector<std::unique_ptr<net::io_context>> iocs;  // one per io thread
  // Keep every io_context running (a thread with no connection yet) until stop().
  std::vector<net::executor_work_guard<net::io_context::executor_type>> guards;
  size_t next_ioc = 0;  // round robin of accepted connections (the acceptor's strand only)
  tcp::acceptor acceptor;
  uint16_t port = 0;
  std::atomic<bool> stopping{false};
  std::vector<std::thread> threads;
  Mutex mu;
  CondVar cv;
  int running GUARDED_BY(mu) = 0;
  std::unordered_map<Session*, std::weak_ptr<Session>> sessions GUARDED_BY(mu);
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(std::shared_ptr<HttpServer::Core> core, net::io_context& ioc, tcp::socket&& socket)
      : core_(std::move(core)), ioc_(ioc), stream_(std::move(socket)) {}
  ~Session() { core_->remove(this); }

  void start() {
    core_->add(this, weak_from_this());
    beast::error_code ec;
    stream_.socket().set_option(tcp::no_delay(true), ec);
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->readHeader(); });
  }

  // Called (posted) by HttpServer::stop(): idle connections close now, busy ones after replying.
  void onStop() {
    net::post(stream_.get_executor(), [self = shared_from_this()] {
      self->stopping_ = true;
      if (!self->busy_) self->stream_.cancel();
    });
  }

 private:
  const HttpServerOptions& options() const { return core_->options; }

  // A protocol error in what the client sent deserves a response; a closed, reset, timed-out or
  // cancelled connection does not.
  static bool isAnswerable(const beast::error_code& ec) {
    return ec.category() == beast::error_code(http::error::body_limit).category() &&
           ec != http::error::end_of_stream && ec != http::error::partial_message;
  }

  // What the access record of a request says about it (strand fields, or the copies a Pending
  // carries to the answering thread [TAG_DIRECT_WRITE]).
  struct RequestFacts {
    std::string_view request_id, method, path, route;
    std::chrono::steady_clock::time_point start;
    size_t request_bytes = 0;
  };
  RequestFacts facts() const {
    return {request_id_, method_, path_, route_, start_, request_bytes_};
  }
  // The request's AccessRecord to on_done (any thread: on_done is thread-safe).
  void report(const RequestFacts& f, int status, size_t response_bytes, bool client_gone) const {
    if (!core_->on_done) return;
    AccessRecord rec;
    rec.request_id = f.request_id;
    rec.method = f.method;
    rec.path = f.path;
    rec.route = f.route;
    rec.status = status;
    rec.latency = std::chrono::duration_cast<std::chrono::microseconds>(
        std::chrono::steady_clock::now() - f.start);
    rec.request_bytes = f.request_bytes;
    rec.response_bytes = response_bytes;
    rec.client_gone = client_gone;
    core_->on_done(rec);
  }

  void readHeader() {
    if (stopping_ || core_->stopping.load()) return close();
    parser_.emplace();
    parser_->body_limit(options().max_body_bytes);
    parser_->header_limit(options().max_header_bytes);
    stream_.expires_after(options().idle_timeout);
    http::async_read_header(stream_, buffer_, *parser_,
                            beast::bind_front_handler(&Session::onHeader, shared_from_this()));
  }

  // Copies what is known of the request line and headers into the per-request fields.
  void captureHeader() {
    start_ = std::chrono::steady_clock::now();
    busy_ = true;
    client_gone_ = false;
    keep_alive_ = false;
    method_.clear();
    path_.clear();
    query_.clear();
    // The request line is known even when the header failed after it (a Content-Length over the
    // body limit is refused while the fields are read): the access line names method and route.
    auto& req = parser_->get();
    method_ = std::string(sv(req.method_string()));
    std::string_view target = sv(req.target());
    size_t q = target.find('?');
    path_ = std::string(target.substr(0, q));
    if (q != std::string_view::npos) query_ = std::string(target.substr(q + 1));
    std::string_view incoming_id = sv(req["x-request-id"]);
    if (parser_->is_header_done()) keep_alive_ = req.keep_alive();
    request_id_ = requestIdFor(incoming_id);
    route_ = core_->router->routeLabel(path_);
  }

  void onHeader(beast::error_code ec, size_t) {
    if (ec && !isAnswerable(ec)) return close();
    captureHeader();
    if (ec == http::error::body_limit) return sendTooLarge();
    if (ec == http::error::header_limit) {
      return fail(invalidArgument("request header is larger than " +
                                  std::to_string(options().max_header_bytes) + " bytes"));
    }
    if (ec) return fail(invalidArgument("malformed HTTP request: " + ec.message()));
    if (auto c = parser_->content_length(); c && *c > options().max_body_bytes) {
      return sendTooLarge();
    }
    auto& req = parser_->get();
    // [TAG_HTTP_FRAMING] A body Beast would not frame as the client meant is refused and the
    // connection closed: its bytes are never parsed as a request.
    std::vector<std::string_view> te;
    for (auto r = req.equal_range(http::field::transfer_encoding); r.first != r.second; ++r.first) {
      te.push_back(sv(r.first->value()));
    }
    FramingCheck framing = checkRequestFraming(req.version(), te,
                                               req.count(http::field::content_length) > 0,
                                               parser_->chunked());
    if (framing.verdict == FramingCheck::Verdict::kBadRequest) {
      return fail(invalidArgument(framing.message));
    }
    if (framing.verdict == FramingCheck::Verdict::kUnsupportedCoding) {
      return failWith(unsupportedMediaType(framing.message));
    }
    if (beast::iequals(req[http::field::expect], "100-continue")) {
      auto cont = std::make_shared<http::response<http::empty_body>>(http::status::continue_, 11);
      http::async_write(stream_, *cont,
                        [self = shared_from_this(), cont](beast::error_code wec, size_t) {
                          if (wec) return self->close();
                          self->readBody();
                        });
      return;
    }
    readBody();
  }

  void readBody() {
    stream_.expires_after(options().idle_timeout);
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::onBody, shared_from_this()));
  }

  void onBody(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit) return sendTooLarge();
    if (ec) {
      if (isAnswerable(ec))
        return fail(invalidArgument("malformed HTTP request body: " + ec.message()));
      return close();
    }
    auto& req = parser_->get();
    HttpRequest r;
    r.method = method_;
    r.path = path_;
    r.query = query_;
    r.request_id = request_id_;
    r.received = start_;
    for (const auto& f : req) {
      r.headers.emplace_back(toLower(sv(f.name_string())), std::string(sv(f.value())));
    }
    r.body = std::move(req.body());
    request_bytes_ = r.body.size();
    // [TAG_CLIENT_DISCONNECT] This request's cancellation, fired by onReadable().
    ++request_seq_;
    request_cancel_ = std::make_shared<CallCanceller>();
    r.cancel = request_cancel_;
    awaiting_ = true;

    auto pending = std::make_shared<Pending>(shared_from_this(), ioc_);
    pending->fd = stream_.socket().native_handle();
    pending->keep_alive = keep_alive_;
    pending->request_id = request_id_;
    pending->method = method_;
    pending->path = path_;
    pending->route = route_;
    pending->start = start_;
    pending->request_bytes = request_bytes_;
    direct_.store(kDirectArmed, std::memory_order_release);
    Responder respond = [pending](HttpResponse response) {
      CHECK_MSG(!pending->called.exchange(true), "Responder called twice");
      auto s = pending->session;
      if (response.stream || !s->writeDirect(*pending, response)) {
        net::post(s->stream_.get_executor(),
                  [s, response = std::move(response)]() mutable { s->write(std::move(response)); });
      }
      pending->work.reset();
    };
    core_->router->dispatch(std::move(r), std::move(respond));
    // A handler that answered at once (its write() is already posted) needs no watch.
    if (!pending->called.load()) watchDisconnect();
  }

  // --- client gone while the response is awaited [TAG_CLIENT_DISCONNECT] ---
  // One async_wait for readability; nothing is read. write() cancels it (strand), so a response
  // and a disconnect never both take effect: whichever runs first on the strand wins.
  void watchDisconnect() {
    wait_armed_ = true;
    stream_.socket().async_wait(tcp::socket::wait_read,
                                [self = shared_from_this(), seq = request_seq_](
                                    beast::error_code ec) { self->onReadable(seq, ec); });
  }

  void onReadable(uint64_t seq, beast::error_code ec) {
    if (seq != request_seq_) return;  // the wait of an earlier request, already answered
    wait_armed_ = false;
    if (!awaiting_ || client_gone_ || ec == net::error::operation_aborted) return;
    if (!ec) {
      char c;
      ssize_t n = ::recv(stream_.socket().native_handle(), &c, 1, MSG_PEEK | MSG_DONTWAIT);
      // Data: the next pipelined request. It stays in the kernel for the next readHeader(); the
      // watch ends here (waiting again would fire at once while those bytes are unread).
      if (n > 0) return;
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
        return watchDisconnect();  // a spurious wake-up
      }
    }
    clientGone();  // n == 0: EOF; n < 0 or ec: reset or another socket error
  }

  void clientGone() {
    // [TAG_DIRECT_WRITE] The response is already being written by its own thread: that wins (the
    // socket stays open for it; finishDirect() sees the error, if any, and closes).
    int armed = kDirectArmed;
    if (!direct_.compare_exchange_strong(armed, kDirectOff, std::memory_order_acq_rel) &&
        armed == kDirectTaken) {
      return;
    }
    client_gone_ = true;
    report(facts(), 499, 0, true);  // client closed request (nginx's convention)
    request_bytes_ = 0;
    close();
    // Last: the hooks may complete calls inline, whose Responder only posts to this strand.
    std::shared_ptr<CallCanceller> cancel = std::move(request_cancel_);
    cancel->cancel();
  }

  void sendTooLarge() {
    fail(outOfRange("request body is larger than the limit of " +
                    std::to_string(options().max_body_bytes) + " bytes"));
  }

  // An error response on a connection whose input can no longer be trusted: always closes.
  void fail(const Status& st) { failWith(errorResponse(st)); }
  void failWith(HttpResponse r) {
    keep_alive_ = false;
    linger_ = true;
    write(std::move(r));
  }

  // --- the response written by the thread that produced it [TAG_DIRECT_WRITE] ---
  // The Responder runs on whatever thread the handler answers from (a gRPC callback thread for
  // model routes). Posting the response to the strand costs a wake-up of an io thread and two
  // context switches before the first byte leaves; instead that thread sends it itself, without
  // blocking, when it can take the connection from the strand: `direct_` goes Armed -> Taken
  // (here) or Armed -> Off (clientGone(), or write() for a response that came through the strand).
  // While Taken the strand never closes the socket, so the descriptor cannot be reused under the
  // send. What the socket's buffer did not take, and the rest of the request's bookkeeping
  // (cancelling the disconnect watch, keep-alive, the next read), happens on the strand in
  // finishDirect(). Nothing of the Session but `direct_`, `core_` and the executor is touched here:
  // the request's fields were copied into `p` on the strand.
  struct Pending {
    Pending(std::shared_ptr<Session> s, net::io_context& ioc)
        : session(std::move(s)), work(net::make_work_guard(ioc)) {}
    std::shared_ptr<Session> session;
    net::executor_work_guard<net::io_context::executor_type> work;  // stop() drains until answered
    std::atomic<bool> called{false};
    int fd = -1;
    bool keep_alive = false;
    std::string request_id, method, path;
    std::string_view route;
    std::chrono::steady_clock::time_point start;
    size_t request_bytes = 0;
  };

  bool writeDirect(const Pending& p, HttpResponse& r) {
    int armed = kDirectArmed;
    if (!direct_.compare_exchange_strong(armed, kDirectTaken, std::memory_order_acq_rel)) {
      return false;
    }
    auto d = std::make_shared<DirectReply>();
    d->keep = p.keep_alive && !core_->stopping.load();
    d->res = makeResponse(std::move(r), p.request_id, d->keep);
    report({p.request_id, p.method, p.path, p.route, p.start, p.request_bytes},
           static_cast<int>(d->res.result_int()), d->res.body().size(), false);
    d->sr.emplace(d->res);
    sendWithoutBlocking(p.fd, *d);
    net::post(stream_.get_executor(), [s = p.session, d] { s->finishDirect(d); });
    return true;
  }

  void finishDirect(const std::shared_ptr<DirectReply>& d) {
    CHECK(awaiting_ && !client_gone_);
    awaiting_ = false;
    request_bytes_ = 0;
    request_cancel_.reset();
    if (wait_armed_) {
      beast::error_code ec;
      stream_.socket().cancel(ec);
      wait_armed_ = false;
    }
    direct_.store(kDirectOff, std::memory_order_release);
    if (d->ec) {
      busy_ = false;
      return close();
    }
    if (d->sr->is_done()) return afterWrite({}, d->keep);
    stream_.expires_after(options().idle_timeout);
    http::async_write(stream_, *d->sr, [self = shared_from_this(), d](beast::error_code ec, size_t) {
      self->afterWrite(ec, d->keep);
    });
  }

  void afterWrite(beast::error_code ec, bool keep) {
    busy_ = false;
    if (ec) return close();
    if (!keep) return linger_ ? lingerClose() : close();
    readHeader();
  }

  void write(HttpResponse r) {
    // A response through the strand: its Responder did not take the connection (a streamed one,
    // or the client left first), and nothing else answers a dispatched request.
    CHECK(direct_.exchange(kDirectOff, std::memory_order_acq_rel) != kDirectTaken);
    if (awaiting_) {  // the response of a dispatched request [TAG_CLIENT_DISCONNECT]
      awaiting_ = false;
      request_cancel_.reset();
      if (wait_armed_) {
        beast::error_code ec;
        stream_.socket().cancel(ec);  // onReadable then sees operation_aborted (or !awaiting_)
        wait_armed_ = false;
      }
      if (client_gone_) {  // already logged as 499 and closed: drop the response
        if (r.stream) r.stream->cancel();
        busy_ = false;
        return;
      }
    }
    if (r.stream) return startStream(std::move(r));
    bool keep = keep_alive_ && !stopping_ && !core_->stopping.load();
    res_ = makeResponse(std::move(r), request_id_, keep);

    report(facts(), static_cast<int>(res_.result_int()), res_.body().size(), false);
    request_bytes_ = 0;

    stream_.expires_after(options().idle_timeout);
    http::async_write(stream_, res_,
                      [self = shared_from_this(), keep](beast::error_code ec, size_t) {
                        self->afterWrite(ec, keep);
                      });
  }

  // --- streamed responses (http/response_stream.h) [TAG_HTTP_STREAMING] ---
  // The header goes out with Transfer-Encoding: chunked; then each batch of bytes the handler
  // wrote becomes one chunk. Meanwhile a read on the raw socket (no idle timeout: generation may
  // pause) watches for the client closing, which cancels the stream. Bytes the client sends early
  // (a pipelined request) are kept in buffer_ for the next request.
  void startStream(HttpResponse r) {
    body_stream_ = std::move(r.stream);
    stream_keep_ = keep_alive_ && !stopping_ && !core_->stopping.load();
    stream_status_ = r.status;
    stream_bytes_ = 0;
    sres_ = {};
    sres_.version(11);
    sres_.result(static_cast<unsigned>(r.status));
    sres_.set(http::field::server, "garden-ivy");
    sres_.set(http::field::content_type, r.content_type);
    sres_.set("x-request-id", request_id_);
    for (auto& [k, v] : r.headers) sres_.set(k, v);
    sres_.keep_alive(stream_keep_);
    sres_.chunked(true);
    ssr_.emplace(sres_);
    stream_.expires_after(options().idle_timeout);
    http::async_write_header(
        stream_, *ssr_, [self = shared_from_this()](beast::error_code ec, size_t) {
          if (ec) return self->abortStream();
          // A strong reference: the stream keeps the connection alive until it ends; detach() or
          // cancel() breaks the cycle.
          self->body_stream_->attach(
              [s = self] { net::post(s->stream_.get_executor(), [s] { s->pumpStream(); }); });
          self->watchClient();
          self->pumpStream();
        });
  }

  void watchClient() {
    watching_ = true;
    stream_.socket().async_read_some(
        buffer_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
          self->watching_ = false;
          if (!ec) self->buffer_.commit(n);
          if (self->body_stream_) {
            if (ec) return self->abortStream();  // the client closed or reset mid-stream
            return;  // pipelined bytes: keep them; a close is then noticed by the next write
          }
          // The stream already finished (finishStream cancelled this read).
          if (ec && ec != net::error::operation_aborted) return self->close();
          self->readHeader();
        });
  }

  void pumpStream() {
    if (!body_stream_ || stream_writing_) return;
    ResponseStream::Taken t = body_stream_->take();
    if (t.data.empty() && !t.ended) return;
    chunk_out_.clear();
    if (!t.data.empty()) {
      char hex[20];
      int len = std::snprintf(hex, sizeof hex, "%zx\r\n", t.data.size());
      chunk_out_.append(hex, static_cast<size_t>(len));
      chunk_out_ += t.data;
      chunk_out_ += "\r\n";
      stream_bytes_ += t.data.size();
    }
    if (t.ended) chunk_out_ += "0\r\n\r\n";
    stream_writing_ = true;
    stream_.expires_after(options().idle_timeout);
    net::async_write(stream_, net::buffer(chunk_out_),
                     [self = shared_from_this(), ended = t.ended](beast::error_code ec, size_t) {
                       self->stream_writing_ = false;
                       if (ec) return self->abortStream();
                       if (ended) return self->finishStream();
                       self->pumpStream();
                     });
  }

  void logStream(int status) {
    report(facts(), status, stream_bytes_, status == 499);
    request_bytes_ = 0;
  }

  void finishStream() {
    body_stream_->detach();
    body_stream_.reset();
    ssr_.reset();
    logStream(stream_status_);
    busy_ = false;
    if (!stream_keep_ || stopping_ || core_->stopping.load()) return close();
    if (watching_) {
      beast::error_code ec;
      stream_.socket().cancel(ec);  // watchClient's handler continues with readHeader()
      return;
    }
    readHeader();
  }

  void abortStream() {
    if (!body_stream_) return close();
    auto body = std::move(body_stream_);
    body->cancel();
    ssr_.reset();
    logStream(499);  // client closed request (nginx's convention) for logs and metrics
    busy_ = false;
    close();
  }

  // Half-close, then drain what the client still sends (e.g. the rest of a body we refused) for a
  // moment, so the kernel does not answer it with a RST that would destroy our response.
  void lingerClose() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return close();
    stream_.expires_after(kLingerTimeout);
    drain();
  }
  void drain() {
    stream_.async_read_some(net::buffer(scratch_),
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->close();
                              self->drain();
                            });
  }

  void close() {
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.socket().close(ec);
  }

  std::shared_ptr<HttpServer::Core> core_;  // first member: destroyed last (owns the io_context)
  net::io_context& ioc_;                    // the one this connection runs on
  beast::tcp_stream stream_;
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  http::response<http::string_body> res_;
  // Streamed response state (strand only).
  std::shared_ptr<ResponseStream> body_stream_;
  http::response<http::empty_body> sres_;
  std::optional<http::response_serializer<http::empty_body>> ssr_;
  std::string chunk_out_;
  bool stream_keep_ = false;
  bool stream_writing_ = false;
  bool watching_ = false;
  int stream_status_ = 0;
  size_t stream_bytes_ = 0;
  std::array<char, 16384> scratch_;
  bool busy_ = false;
  bool stopping_ = false;
  bool keep_alive_ = false;
  bool linger_ = false;  // the request was not read to its end: drain before closing
  // The dispatched request awaiting its response [TAG_CLIENT_DISCONNECT] (strand only).
  uint64_t request_seq_ = 0;
  std::shared_ptr<CallCanceller> request_cancel_;
  bool awaiting_ = false;     // dispatched; write() not yet called for it
  bool wait_armed_ = false;   // watchDisconnect()'s async_wait is outstanding
  bool client_gone_ = false;  // the client left before the response: it is dropped
  // Who may write the awaited response [TAG_DIRECT_WRITE] (any thread; see writeDirect()).
  enum : int { kDirectOff = 0, kDirectArmed = 1, kDirectTaken = 2 };
  std::atomic<int> direct_{kDirectOff};
  std::string request_id_, method_, path_, query_;
  std::string_view route_ = "other";
  std::chrono::steady_clock::time_point start_;
  size_t request_bytes_ = 0;
};

void HttpServer::Core::doAccept() {
  net::io_context& ioc = *iocs[next_ioc++ % iocs.size()];
  acceptor.async_accept(net::make_strand(ioc), [self = shared_from_this(), &ioc](
                                                   beast::error_code ec, tcp::socket socket) {
    if (ec) {
      if (ec == net::error::operation_aborted || !self->acceptor.is_open()) return;
      log::warn("accept failed", {{"error", ec.message()}});
    } else {
      std::make_shared<Session>(self, ioc, std::move(socket))->start();
    }
    self->doAccept();
  });
}

HttpServer::HttpServer(HttpServerOptions options, const Router* router, AccessObserver on_done)
    : core_(std::make_shared<Core>(std::move(options), router, std::move(on_done))) {}

HttpServer::~HttpServer() { stop(); }

Status HttpServer::start() {
  Core& c = *core_;
  CHECK(c.threads.empty());
  beast::error_code ec;
  tcp::resolver resolver(*c.iocs[0]);
  auto results =
      resolver.resolve(c.options.host, std::to_string(c.options.port), tcp::resolver::passive, ec);
  std::string where = c.options.host + ":" + std::to_string(c.options.port);
  if (ec || results.empty()) return unavailable("cannot resolve " + where + ": " + ec.message());
  tcp::endpoint ep = results.begin()->endpoint();
  c.acceptor.open(ep.protocol(), ec);
  if (!ec) c.acceptor.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) c.acceptor.bind(ep, ec);
  if (!ec) c.acceptor.listen(net::socket_base::max_listen_connections, ec);
  if (ec) return unavailable("cannot listen on " + where + ": " + ec.message());
  c.port = c.acceptor.local_endpoint().port();
  for (auto& ioc : c.iocs) c.guards.push_back(net::make_work_guard(*ioc));
  c.doAccept();
  const int n = static_cast<int>(c.iocs.size());
  {
    MutexLock lock(c.mu);
    c.running = n;
  }
  for (int i = 0; i < n; ++i) {
    c.threads.emplace_back([core = core_.get(), i] {
      core->iocs[i]->run();
      MutexLock lock(core->mu);
      if (--core->running == 0) core->cv.notifyAll();
    });
  }
  return okStatus();
}

uint16_t HttpServer::port() const { return core_->port; }

void HttpServer::stop() {
  Core& c = *core_;
  if (c.stopping.exchange(true)) return;
  if (c.threads.empty()) return;
  net::post(c.acceptor.get_executor(), [core = core_] {
    beast::error_code ec;
    core->acceptor.close(ec);
  });
  std::vector<std::shared_ptr<Session>> live;
  {
    MutexLock lock(c.mu);
    for (auto& [p, w] : c.sessions) {
      if (auto s = w.lock()) live.push_back(std::move(s));
    }
  }
  for (auto& s : live) s->onStop();
  live.clear();
  // Each io thread now ends once its connections are done (the acceptor's close is queued first).
  for (auto& g : c.guards) g.reset();
  {
    MutexLock lock(c.mu);
    if (!c.cv.waitFor(lock, c.options.drain_timeout,
                      [&c]() REQUIRES(c.mu) { return c.running == 0; })) {
      log::warn("http drain timed out; dropping requests in flight", {});
      lock.unlock();
      for (auto& ioc : c.iocs) ioc->stop();
    }
  }
  for (auto& t : c.threads) t.join();
  c.threads.clear();
}

}  // namespace garden::ivy
