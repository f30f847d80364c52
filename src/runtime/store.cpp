// src/runtime/store.cpp - the TCP rendezvous store: rank 0's server thread and every rank's client.
//
// Wire protocol. Every message is one frame; integers are big-endian.
//   frame   = type:u8 | length:u64 | payload[length]          bytes = length:u64 | data
//   HELLO   client->server  magic[8] | version:u32 | rank:i32 | world:i32 | pid:i32 | host:bytes
//   WELCOME server->client  magic[8] | version:u32 | world:i32   (to every rank once all have joined)
//   OP      client->server  seq:u64 | kind:u8 | root:i32 | what:bytes | blob:bytes
//   RESULT  server->client  seq:u64 | count:u32 | blob:bytes * count   (W blobs, 1, or 0)
//   ERROR   server->client  text: a job-wide failure; the store is unusable afterwards
//   QUERY   client->server  seq:u64 (0 = the rendezvous): "who has not arrived?" after a timeout
//   STATUS  server->client  seq:u64 | done:u8 | count:u32 | missing rank:i32 * count | notes:bytes
//   BYE     client->server  (empty) orderly close; the server closes its end in reply
//
// The server is one thread running a poll() loop over non-blocking sockets, so
// a slow or dead client never stalls the others. It collects op N from every
// rank (checking that all ranks called the same kind, and the same root for a
// broadcast), then sends the same RESULT frame to all. At most one op is being
// collected at a time: no rank can call op N+1 before op N has completed.
// Clients use non-blocking sockets too, and every wait is a poll() bounded by
// the operation's deadline.
#include "weft/runtime/store.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <thread>

#include "weft/core/error.hpp"
#include "weft/core/log.hpp"
#include "weft/core/rank_text.hpp"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;
using detail::rank_list;
using detail::ranks_text;

// ---- wire format -------------------------------------------------------------

enum class Msg : std::uint8_t { hello = 1, welcome, op, result, error, query, status, bye };
constexpr std::uint8_t kLastMsg = static_cast<std::uint8_t>(Msg::bye);
enum class Kind : std::uint8_t { all_gather = 1, broadcast, barrier };

constexpr char kMagic[8] = {'W', 'E', 'F', 'T', 'S', 'T', 'O', 'R'};
constexpr std::uint32_t kVersion = 1;
constexpr std::size_t kHeaderBytes = 9;
// A length above this is a corrupt stream or a foreign peer, not a real blob.
constexpr std::uint64_t kMaxFrameBytes = std::uint64_t{1} << 38;
// Until the handshake completes only frames up to 16 MiB are accepted, so a
// stray connection that sends garbage cannot make the other side allocate gigabytes.
constexpr std::uint64_t kMaxControlFrameBytes = std::uint64_t{1} << 24;

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::all_gather: return "all_gather";
    case Kind::broadcast: return "broadcast";
    case Kind::barrier: return "barrier";
  }
  return "unknown operation";
}

std::uint64_t load_u64(const char* p) {
  std::uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

// Builds one frame: the header is written first and its length patched by finish().
class Writer {
 public:
  explicit Writer(Msg type, std::size_t reserve = 0) {
    s_.reserve(kHeaderBytes + reserve);
    s_.push_back(static_cast<char>(type));
    s_.append(8, '\0');
  }
  Writer& u8(std::uint8_t v) {
    s_.push_back(static_cast<char>(v));
    return *this;
  }
  Writer& u32(std::uint32_t v) {
    for (int i = 3; i >= 0; --i) s_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& i32(std::int32_t v) { return u32(static_cast<std::uint32_t>(v)); }
  Writer& u64(std::uint64_t v) {
    for (int i = 7; i >= 0; --i) s_.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
    return *this;
  }
  Writer& raw(std::string_view b) {
    s_.append(b.data(), b.size());
    return *this;
  }
  Writer& bytes(std::string_view b) { return u64(b.size()).raw(b); }
  std::string finish() {  // moves the frame out; the writer is spent
    std::uint64_t len = s_.size() - kHeaderBytes;
    for (int i = 0; i < 8; ++i) s_[1 + i] = static_cast<char>((len >> (8 * (7 - i))) & 0xff);
    return std::move(s_);
  }

 private:
  std::string s_;
};

struct Malformed : std::runtime_error {
  Malformed() : std::runtime_error("message shorter than its fields") {}
};

// Reads a frame's payload; throws Malformed when it ends early.
class Reader {
 public:
  explicit Reader(std::string_view s) : s_(s) {}
  std::uint8_t u8() { return static_cast<std::uint8_t>(raw(1)[0]); }
  std::uint32_t u32() {
    auto b = raw(4);
    std::uint32_t v = 0;
    for (char c : b) v = (v << 8) | static_cast<unsigned char>(c);
    return v;
  }
  std::int32_t i32() { return static_cast<std::int32_t>(u32()); }
  std::uint64_t u64() { return load_u64(raw(8).data()); }
  std::string_view raw(std::uint64_t n) {
    if (n > s_.size() - pos_) throw Malformed();
    auto v = s_.substr(pos_, n);
    pos_ += n;
    return v;
  }
  std::string_view bytes() { return raw(u64()); }

 private:
  std::string_view s_;
  std::size_t pos_ = 0;
};

struct Frame {
  Msg type{};
  std::string payload;
};

// Bytes received from a socket, cut into frames. Partial frames survive across
// calls, so a wait that times out mid-frame loses nothing.
class FrameBuffer {
 public:
  void set_limit(std::uint64_t max_payload) { limit_ = max_payload; }

  // 1: a frame was taken out into f; 0: more bytes are needed; -1: the bytes are
  // not a weft store frame (*why says how).
  int take(Frame& f, std::string* why) {
    std::size_t avail = end_ - begin_;
    if (avail < kHeaderBytes) return 0;
    const char* h = buf_.data() + begin_;
    auto type = static_cast<std::uint8_t>(h[0]);
    std::uint64_t len = load_u64(h + 1);
    if (type < 1 || type > kLastMsg) {
      *why = str("unknown message type ", static_cast<int>(type));
      return -1;
    }
    if (len > limit_) {
      *why = str("a message of ", len, " bytes, more than the limit of ", limit_);
      return -1;
    }
    if (avail - kHeaderBytes < len) return 0;
    f.type = static_cast<Msg>(type);
    f.payload.assign(h + kHeaderBytes, len);
    begin_ += kHeaderBytes + len;
    if (begin_ == end_) {
      begin_ = end_ = 0;
      if (buf_.size() > (std::size_t{1} << 20)) std::string().swap(buf_);  // give back big blobs
    }
    return 1;
  }

  // One recv() into the buffer, sized to finish the current frame when its
  // length is known. Returns what recv returned (errno is set when < 0).
  ssize_t receive(int fd) {
    std::size_t avail = end_ - begin_;
    std::size_t want = 64 * 1024;
    if (avail >= kHeaderBytes) {
      std::uint64_t len = load_u64(buf_.data() + begin_ + 1);
      if (len <= limit_ && kHeaderBytes + len > avail)
        want = std::max<std::size_t>(want, kHeaderBytes + len - avail);
    }
    if (begin_ > 0 && buf_.size() - end_ < want) {
      std::memmove(buf_.data(), buf_.data() + begin_, avail);
      begin_ = 0;
      end_ = avail;
    }
    if (buf_.size() - end_ < want) buf_.resize(end_ + want);
    ssize_t n = ::recv(fd, buf_.data() + end_, buf_.size() - end_, 0);
    if (n > 0) end_ += static_cast<std::size_t>(n);
    return n;
  }

 private:
  std::string buf_;  // raw storage; [begin_, end_) holds received bytes
  std::size_t begin_ = 0, end_ = 0;
  std::uint64_t limit_ = kMaxControlFrameBytes;
};

// ---- small helpers -----------------------------------------------------------

// strerror_r is the GNU (returns char*) or the XSI (returns int) variant.
[[maybe_unused]] const char* pick_strerror(const char* result, const char*) { return result; }
[[maybe_unused]] const char* pick_strerror(int, const char* buf) { return buf; }

std::string errno_text(int e) {
  if (e == 0) return "the connection was closed by the other side";
  char buf[256] = {0};
  return pick_strerror(strerror_r(e, buf, sizeof buf), buf);
}

std::string seconds_text(Clock::duration d) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", std::chrono::duration<double>(d).count());
  return buf;
}

// "host:port", with IPv6 literals in brackets.
std::string host_port(const std::string& host, int port) {
  if (host.find(':') != std::string::npos) return str("[", host, "]:", port);
  return str(host, ":", port);
}

std::string numeric_address(const sockaddr* sa, socklen_t len) {
  char host[NI_MAXHOST] = {0}, serv[NI_MAXSERV] = {0};
  if (::getnameinfo(sa, len, host, sizeof host, serv, sizeof serv, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
    return "an unknown address";
  return host_port(host, std::atoi(serv));
}

std::string this_host() {
  char buf[256] = {0};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "an unknown host";
  return buf;
}

int ms_until(Clock::time_point deadline) {
  auto left = std::chrono::ceil<Millis>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<std::int64_t>(left, 0, INT_MAX));
}

// Waits until fd is ready for `events` or the deadline passes. Returns the
// poll revents, 0 on timeout. EINTR restarts the wait with the time left.
short wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms_until(deadline));
    if (rc > 0) return p.revents;
    if (rc == 0) return 0;
    if (errno != EINTR) return POLLERR;
  }
}

enum class Io { ok, timeout, closed, bad };

// Sends all of data on a non-blocking socket before the deadline (partial
// writes and EINTR handled; MSG_NOSIGNAL, so a dead peer is EPIPE, not SIGPIPE).
Io send_all(int fd, std::string_view data, Clock::time_point deadline, int* err) {
  std::size_t off = 0;
  while (off < data.size()) {
    ssize_t n = ::send(fd, data.data() + off, data.size() - off, MSG_NOSIGNAL);
    if (n > 0) {
      off += static_cast<std::size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (wait_fd(fd, POLLOUT, deadline) == 0 || Clock::now() > deadline) return Io::timeout;
      continue;  // writable, or an error that the next send() reports
    }
    *err = n < 0 ? errno : EPIPE;
    return Io::closed;
  }
  return Io::ok;
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);  // never retried: on Linux the fd is gone even on EINTR
  fd = -1;
}

// One non-blocking connect to one resolved address, bounded by the deadline
// (and by a few seconds, so an address that drops packets does not use up the
// whole timeout before the next address is tried). Returns the fd or -1.
int connect_one(const addrinfo* ai, Clock::time_point deadline, int* err) {
  int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);
  if (fd < 0) {
    *err = errno;
    return -1;
  }
  int rc = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
  if (rc != 0 && errno != EINPROGRESS && errno != EINTR) {
    *err = errno;
    close_fd(fd);
    return -1;
  }
  if (rc != 0) {
    auto attempt_deadline = std::min(deadline, Clock::now() + Millis(3000));
    if (wait_fd(fd, POLLOUT, attempt_deadline) == 0) {
      *err = ETIMEDOUT;
      close_fd(fd);
      return -1;
    }
    int so_error = 0;
    socklen_t len = sizeof so_error;
    if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &so_error, &len) != 0) so_error = errno;
    if (so_error != 0) {
      *err = so_error;
      close_fd(fd);
      return -1;
    }
  }
  // A loopback connect to a port in the ephemeral range can connect the socket
  // to itself (TCP simultaneous open) while nobody listens: treat as refused.
  sockaddr_storage self{}, peer{};
  socklen_t self_len = sizeof self, peer_len = sizeof peer;
  if (::getsockname(fd, reinterpret_cast<sockaddr*>(&self), &self_len) == 0 &&
      ::getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &peer_len) == 0 && self_len == peer_len &&
      std::memcmp(&self, &peer, self_len) == 0) {
    *err = ECONNREFUSED;
    close_fd(fd);
    return -1;
  }
  int one = 1;
  ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  return fd;
}

// Listens on every interface: a dual-stack IPv6 socket (which takes IPv4 too),
// or plain IPv4 where the host has no IPv6. Returns the fd, or -1 with *why.
int listen_on(int port, std::string* why) {
  for (int family : {AF_INET6, AF_INET}) {
    int fd = ::socket(family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
      *why = errno_text(errno);
      continue;
    }
    int one = 1, zero = 0;
    ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_storage ss{};
    socklen_t len = 0;
    if (family == AF_INET6) {
      ::setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
      auto* a = reinterpret_cast<sockaddr_in6*>(&ss);
      a->sin6_family = AF_INET6;
      a->sin6_addr = in6addr_any;
      a->sin6_port = htons(static_cast<std::uint16_t>(port));
      len = sizeof(sockaddr_in6);
    } else {
      auto* a = reinterpret_cast<sockaddr_in*>(&ss);
      a->sin_family = AF_INET;
      a->sin_addr.s_addr = htonl(INADDR_ANY);
      a->sin_port = htons(static_cast<std::uint16_t>(port));
      len = sizeof(sockaddr_in);
    }
    if (::bind(fd, reinterpret_cast<sockaddr*>(&ss), len) == 0 && ::listen(fd, SOMAXCONN) == 0)
      return fd;
    int e = errno;
    *why = errno_text(e);
    close_fd(fd);
    if (e == EADDRINUSE) return -1;  // IPv4 would collide as well (or reach the other program)
  }
  return -1;
}

std::string error_frame(std::string_view text) { return Writer(Msg::error).raw(text).finish(); }

// ---- the server (rank 0 only) ------------------------------------------------

class StoreServer {
 public:
  StoreServer(int port, int world_size);
  ~StoreServer();
  StoreServer(const StoreServer&) = delete;
  StoreServer& operator=(const StoreServer&) = delete;

  // Stops accepting connections, keeps serving the connected ranks until they
  // have all closed their stores or drain_until passes, then joins the thread.
  void stop(Clock::time_point drain_until);

 private:
  struct Peer {
    int fd = -1;
    std::string address;  // the peer's numeric address, for logs
    FrameBuffer in;
    std::deque<std::shared_ptr<const std::string>> out;  // frames to send; RESULT frames are shared
    std::size_t out_offset = 0;
    bool greeted = false;  // sent a valid HELLO
    int rank = -1;         // registered rank
    bool said_bye = false;
    bool dead = false, reaped = false;
    std::string death;  // why the connection ended
  };
  struct Call {
    Kind kind;
    int root;
    std::string what;
    std::string blob;
  };

  void run();
  void serve();
  void accept_new();
  void read_from(Peer& p);
  void flush(Peer& p);
  void send_to(Peer& p, const std::shared_ptr<const std::string>& frame);
  void kill(Peer& p, std::string why);
  void reap();
  void handle(Peer& p, const Frame& f);
  void on_hello(Peer& p, Reader& r);
  void on_op(Peer& p, Reader& r);
  void on_query(Peer& p, Reader& r);
  void depart(Peer& p);
  void complete();
  void fail_all(const std::string& message);
  std::string describe(const Call& c) const;
  std::string mismatch_text() const;
  std::string gone_text(int rank) const;

  const int world_;
  int listen_fd_ = -1;
  int wake_r_ = -1, wake_w_ = -1;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
  std::atomic<Clock::rep> drain_until_{0};

  // Everything below is touched by the server thread only.
  std::vector<std::unique_ptr<Peer>> peers_;
  std::vector<Peer*> by_rank_;       // connected peer of each joined rank
  std::vector<char> joined_;         // rank has joined (possibly left since)
  std::vector<std::string> who_;     // "pid P on host H" per joined rank
  std::vector<std::string> gone_;    // how a joined rank left; empty while it is there
  std::vector<std::string> gone_hint_;  // what that probably means, if anything
  int joined_count_ = 0;
  bool welcomed_ = false;            // every rank joined; ops may start
  std::string fatal_;                // the job-wide failure, once there is one
  std::uint64_t seq_ = 1;            // the op being collected
  std::vector<std::optional<Call>> calls_;
  int arrived_ = 0;
};

StoreServer::StoreServer(int port, int world_size)
    : world_(world_size),
      by_rank_(world_size, nullptr),
      joined_(world_size, 0),
      who_(world_size),
      gone_(world_size),
      gone_hint_(world_size),
      calls_(world_size) {
  std::string why = "unknown error";
  listen_fd_ = listen_on(port, &why);
  WEFT_REQUIRE(listen_fd_ >= 0, "rank 0 cannot start the store server on port ", port,
               " (all interfaces): ", why,
               ". Another job, or an earlier run that has not exited yet, may be using the port; "
               "choose another with WEFT_MASTER_PORT/MASTER_PORT.");
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0) {
    int e = errno;
    close_fd(listen_fd_);
    WEFT_FAIL("rank 0 cannot start the store server: pipe2 failed: ", errno_text(e));
  }
  wake_r_ = fds[0];
  wake_w_ = fds[1];
  try {
    thread_ = std::thread([this] { run(); });
  } catch (const std::exception& e) {
    close_fd(listen_fd_);
    close_fd(wake_r_);
    close_fd(wake_w_);
    WEFT_FAIL("rank 0 cannot start the store server thread: ", e.what());
  }
}

StoreServer::~StoreServer() {
  stop(Clock::now());
  close_fd(wake_r_);
  close_fd(wake_w_);
}

void StoreServer::stop(Clock::time_point drain_until) {
  if (!thread_.joinable()) return;
  drain_until_.store(drain_until.time_since_epoch().count());
  stopping_.store(true);
  char c = 1;
  while (::write(wake_w_, &c, 1) < 0 && errno == EINTR) {
  }
  thread_.join();
}

void StoreServer::run() {
  try {
    serve();
  } catch (const std::exception& e) {
    // Clients see their connection drop and report it; say why here.
    WEFT_LOG(error, "the store server stopped after an internal error: ", e.what());
  }
  for (auto& p : peers_) close_fd(p->fd);
  peers_.clear();
  close_fd(listen_fd_);
}

void StoreServer::serve() {
  std::vector<pollfd> fds;
  std::vector<Peer*> polled;
  bool draining = false;
  for (;;) {
    Clock::time_point drain_until{};
    if (stopping_.load()) {
      drain_until = Clock::time_point(Clock::duration(drain_until_.load()));
      if (!draining) {
        draining = true;
        close_fd(listen_fd_);
        for (auto& p : peers_)
          if (!p->greeted) kill(*p, "the server is stopping");
        reap();
      }
      bool anyone = std::any_of(peers_.begin(), peers_.end(), [](auto& p) { return !p->dead; });
      if (!anyone) return;
      if (Clock::now() >= drain_until) {
        WEFT_LOG(debug, "store server: stopping with ranks still connected (drain time is over)");
        return;
      }
    }
    fds.clear();
    polled.clear();
    fds.push_back({wake_r_, POLLIN, 0});
    std::size_t listen_index = fds.size();
    if (listen_fd_ >= 0) fds.push_back({listen_fd_, POLLIN, 0});
    std::size_t first_peer = fds.size();
    for (auto& p : peers_) {
      short events = POLLIN;
      if (!p->out.empty()) events |= POLLOUT;
      fds.push_back({p->fd, events, 0});
      polled.push_back(p.get());
    }
    int wait_ms = draining ? std::min(ms_until(drain_until), 1000) : 1000;
    int rc = ::poll(fds.data(), fds.size(), wait_ms);
    if (rc < 0) {
      if (errno == EINTR) continue;
      throw std::runtime_error(str("poll failed: ", errno_text(errno)));
    }
    if (rc == 0) continue;
    if (fds[0].revents) {
      char buf[64];
      while (::read(wake_r_, buf, sizeof buf) > 0) {
      }
    }
    if (listen_fd_ >= 0 && fds[listen_index].revents) accept_new();
    for (std::size_t i = 0; i < polled.size(); ++i) {
      Peer& p = *polled[i];
      short rev = fds[first_peer + i].revents;
      if (!p.dead && (rev & (POLLIN | POLLHUP | POLLERR))) read_from(p);
      if (!p.dead && (rev & POLLOUT)) flush(p);
    }
    reap();
  }
}

void StoreServer::accept_new() {
  for (;;) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    int fd = ::accept4(listen_fd_, reinterpret_cast<sockaddr*>(&ss), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0) {
      if (errno == EINTR || errno == ECONNABORTED) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      WEFT_LOG(warn, "store server: accept failed: ", errno_text(errno));
      if (errno == EMFILE || errno == ENFILE) std::this_thread::sleep_for(Millis(10));  // no busy loop
      return;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    auto p = std::make_unique<Peer>();
    p->fd = fd;
    p->address = numeric_address(reinterpret_cast<sockaddr*>(&ss), len);
    p->in.set_limit(kMaxControlFrameBytes);
    WEFT_LOG(debug, "store server: connection from ", p->address);
    peers_.push_back(std::move(p));
  }
}

void StoreServer::read_from(Peer& p) {
  // Bounded rounds, so one fast sender cannot starve the others.
  for (int round = 0; round < 64 && !p.dead; ++round) {
    ssize_t n = p.in.receive(p.fd);
    if (n == 0) return kill(p, "closed without an orderly goodbye");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      return kill(p, errno_text(errno));
    }
    Frame f;
    std::string why;
    for (;;) {
      int t = p.in.take(f, &why);
      if (t == 0) break;
      if (t < 0) return kill(p, str("it sent bytes that are not a weft store message (", why, ")"));
      handle(p, f);
      if (p.dead) return;
    }
  }
}

void StoreServer::flush(Peer& p) {
  while (!p.out.empty() && !p.dead) {
    const std::string& s = *p.out.front();
    ssize_t n = ::send(p.fd, s.data() + p.out_offset, s.size() - p.out_offset, MSG_NOSIGNAL);
    if (n > 0) {
      p.out_offset += static_cast<std::size_t>(n);
      if (p.out_offset == s.size()) {
        p.out.pop_front();
        p.out_offset = 0;
      }
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;  // POLLOUT resumes it
    kill(p, n < 0 ? errno_text(errno) : std::string("send failed"));
  }
}

void StoreServer::send_to(Peer& p, const std::shared_ptr<const std::string>& frame) {
  if (p.dead) return;
  p.out.push_back(frame);
  flush(p);
}

void StoreServer::kill(Peer& p, std::string why) {
  if (p.dead) return;
  p.dead = true;
  p.death = std::move(why);
}

// Handles the departures of dead peers (which may make other sends fail, so
// until nothing changes), then closes and forgets them.
void StoreServer::reap() {
  for (bool again = true; again;) {
    again = false;
    for (std::size_t i = 0; i < peers_.size(); ++i) {
      Peer& p = *peers_[i];
      if (p.dead && !p.reaped) {
        p.reaped = true;
        again = true;
        depart(p);
      }
    }
  }
  for (auto& p : peers_)
    if (p->dead) close_fd(p->fd);
  peers_.erase(std::remove_if(peers_.begin(), peers_.end(), [](auto& p) { return p->dead; }), peers_.end());
}

void StoreServer::handle(Peer& p, const Frame& f) {
  try {
    Reader r(f.payload);
    if (!p.greeted && f.type != Msg::hello && f.type != Msg::bye)
      return kill(p, "it did not start with a weft store handshake");
    switch (f.type) {
      case Msg::hello: return on_hello(p, r);
      case Msg::op: return on_op(p, r);
      case Msg::query: return on_query(p, r);
      case Msg::bye:
        p.said_bye = true;
        return kill(p, "it closed its store");
      default: return kill(p, str("it sent an unexpected message (type ", static_cast<int>(f.type), ")"));
    }
  } catch (const Malformed&) {
    kill(p, "it sent a malformed message");
  }
}

void StoreServer::on_hello(Peer& p, Reader& r) {
  if (p.greeted) return kill(p, "it sent a second handshake");
  if (r.raw(8) != std::string_view(kMagic, 8)) return kill(p, "it is not a weft store client");
  std::uint32_t version = r.u32();
  int rank = r.i32(), world = r.i32(), pid = r.i32();
  std::string host(r.bytes());
  p.greeted = true;
  p.in.set_limit(kMaxFrameBytes);
  std::string whom = str("pid ", pid, " on ", host);
  WEFT_LOG(debug, "store server: rank ", rank, " of ", world, " (", whom, ") joined from ", p.address);
  if (!fatal_.empty()) return send_to(p, std::make_shared<const std::string>(error_frame(fatal_)));
  if (version != kVersion)
    return fail_all(str("rank ", rank, " (", whom, ") speaks store protocol version ", version,
                        " but rank 0 speaks version ", kVersion,
                        ": every rank must run the same weft build"));
  if (world != world_)
    return fail_all(str("rank ", rank, " was started with world size ", world, " but rank 0 has world size ",
                        world_, " (rank ", rank, " is ", whom,
                        "). Start every rank with the same world size."));
  if (rank < 0 || rank >= world_)
    return fail_all(str("a process (", whom, ") joined as rank ", rank, ", outside the world of ", world_,
                        " ranks"));
  if (joined_[rank])
    return fail_all(str("rank ", rank, " joined twice: first ", who_[rank], ", then ", whom,
                        ". Every rank number must be used by exactly one process."));
  joined_[rank] = 1;
  ++joined_count_;
  by_rank_[rank] = &p;
  p.rank = rank;
  who_[rank] = whom;
  if (joined_count_ < world_) return;
  // A rank that joined and then left cannot take part any more.
  for (int g = 0; g < world_; ++g)
    if (!gone_[g].empty())
      return fail_all(str(gone_[g], " during the rendezvous, before all ranks had joined"));
  welcomed_ = true;
  auto frame = std::make_shared<const std::string>(
      Writer(Msg::welcome).raw(std::string_view(kMagic, 8)).u32(kVersion).i32(world_).finish());
  for (Peer* q : by_rank_) send_to(*q, frame);
  WEFT_LOG(debug, "store server: all ", world_, " ranks joined");
}

void StoreServer::on_op(Peer& p, Reader& r) {
  std::uint64_t seq = r.u64();
  auto kind = static_cast<Kind>(r.u8());
  int root = r.i32();
  std::string what(r.bytes());
  std::string_view blob = r.bytes();
  if (!fatal_.empty()) return send_to(p, std::make_shared<const std::string>(error_frame(fatal_)));
  if (p.rank < 0 || !welcomed_) return kill(p, "it sent an operation before the rendezvous completed");
  if (kind != Kind::all_gather && kind != Kind::broadcast && kind != Kind::barrier)
    return kill(p, str("it sent an unknown operation kind ", static_cast<int>(kind)));
  if (kind == Kind::broadcast && (root < 0 || root >= world_))
    return fail_all(str("rank ", p.rank, " called broadcast('", what, "') with root ", root,
                        ", outside the world of ", world_, " ranks"));
  if (seq != seq_ || calls_[p.rank])
    return fail_all(str("rank ", p.rank, " sent store op #", seq, " while the server is collecting op #",
                        seq_, " (internal error in the weft store)"));
  calls_[p.rank] = Call{kind, kind == Kind::broadcast ? root : 0, std::move(what), std::string(blob)};
  ++arrived_;
  // Every arrived call must match: compare against any one earlier arrival.
  for (int q = 0; q < world_; ++q) {
    if (q == p.rank || !calls_[q]) continue;
    if (calls_[q]->kind != kind || calls_[q]->root != calls_[p.rank]->root) return fail_all(mismatch_text());
    break;
  }
  for (int g = 0; g < world_; ++g)
    if (!gone_[g].empty() && !calls_[g]) return fail_all(gone_text(g));
  if (arrived_ == world_) complete();
}

void StoreServer::complete() {
  const Call& first = *calls_[0];
  std::size_t total = 16;
  for (auto& c : calls_) total += 8 + c->blob.size();
  Writer w(Msg::result, first.kind == Kind::all_gather ? total : 16 + calls_[first.root]->blob.size());
  w.u64(seq_);
  if (first.kind == Kind::all_gather) {
    w.u32(static_cast<std::uint32_t>(world_));
    for (auto& c : calls_) w.bytes(c->blob);
  } else if (first.kind == Kind::broadcast) {
    w.u32(1).bytes(calls_[first.root]->blob);
  } else {
    w.u32(0);
  }
  auto frame = std::make_shared<const std::string>(w.finish());
  for (auto& c : calls_) c.reset();
  arrived_ = 0;
  ++seq_;
  // Rank 0's own client last: this thread runs inside rank 0, which must not
  // move on (and perhaps exit) before the other ranks' results are on their way.
  for (int q = 1; q <= world_; ++q)
    if (Peer* peer = by_rank_[q % world_]) send_to(*peer, frame);
  // A rank that left after calling that op can never call the next one.
  for (int g = 0; g < world_; ++g)
    if (!gone_[g].empty()) return fail_all(gone_text(g));
}

void StoreServer::on_query(Peer& p, Reader& r) {
  std::uint64_t seq = r.u64();
  if (!fatal_.empty()) return send_to(p, std::make_shared<const std::string>(error_frame(fatal_)));
  bool done = false;
  std::vector<int> missing;
  std::string notes;
  if (seq == 0) {
    done = welcomed_;
    for (int q = 0; q < world_ && !done; ++q)
      if (!joined_[q]) missing.push_back(q);
  } else if (seq < seq_) {
    done = true;
  } else if (seq == seq_) {
    for (int q = 0; q < world_; ++q)
      if (!calls_[q]) missing.push_back(q);
  } else {
    notes = str("The server is still collecting op #", seq_, ". ");
  }
  for (int g = 0; g < world_; ++g)
    if (!gone_[g].empty()) notes += gone_[g] + ". ";
  Writer w(Msg::status);
  w.u64(seq).u8(done ? 1 : 0).u32(static_cast<std::uint32_t>(missing.size()));
  for (int m : missing) w.i32(m);
  w.bytes(notes);
  send_to(p, std::make_shared<const std::string>(w.finish()));
}

void StoreServer::depart(Peer& p) {
  if (p.rank < 0) {
    if (p.greeted || !p.said_bye)
      WEFT_LOG(debug, "store server: connection from ", p.address, " ended (", p.death, ")");
    return;
  }
  const int r = p.rank;
  by_rank_[r] = nullptr;
  gone_[r] = p.said_bye ? str("rank ", r, " (", who_[r], ") closed its store")
                        : str("the connection to rank ", r, " (", who_[r], ") was lost (", p.death, ")");
  if (!p.said_bye) gone_hint_[r] = str("rank ", r, "'s process has probably exited or been killed");
  WEFT_LOG(debug, "store server: ", gone_[r]);
  if (!welcomed_) {
    // A rank that gave up on the rendezvous itself (BYE) is reported when the
    // others ask who is missing; a crash during it fails everyone now.
    if (!p.said_bye)
      fail_all(str(gone_[r], " during the rendezvous, before all ranks had joined; ", gone_hint_[r]));
    return;
  }
  // With no call pending, nobody can be stranded yet: a rank that leaves at the
  // end of a job is normal. on_op fails the next call that can never complete.
  if (!calls_[r] && arrived_ > 0) fail_all(gone_text(r));
}

void StoreServer::fail_all(const std::string& message) {
  if (!fatal_.empty()) return;  // the first failure is the one worth reporting
  fatal_ = message;
  WEFT_LOG(debug, "store server: failing the job: ", message);
  auto frame = std::make_shared<const std::string>(error_frame(message));
  for (auto& p : peers_)
    if (p->greeted) send_to(*p, frame);
}

std::string StoreServer::describe(const Call& c) const {
  if (c.kind == Kind::broadcast) return str("broadcast(root ", c.root, ", '", c.what, "')");
  return str(kind_name(c.kind), "('", c.what, "')");
}

std::string StoreServer::mismatch_text() const {
  std::vector<std::pair<std::string, std::vector<int>>> groups;  // call -> ranks, in rank order
  std::vector<int> absent;
  for (int q = 0; q < world_; ++q) {
    if (!calls_[q]) {
      absent.push_back(q);
      continue;
    }
    std::string d = describe(*calls_[q]);
    auto it = std::find_if(groups.begin(), groups.end(), [&](auto& g) { return g.first == d; });
    if (it == groups.end()) groups.push_back({d, {q}});
    else it->second.push_back(q);
  }
  std::string out = str("store calls do not match across ranks at op #", seq_, ": ");
  for (std::size_t i = 0; i < groups.size(); ++i)
    out += str(i ? "; " : "", ranks_text(groups[i].second), " called ", groups[i].first);
  if (!absent.empty())
    out += str("; ", ranks_text(absent), absent.size() == 1 ? " has" : " have", " not called op #", seq_,
               " yet");
  out += ". Every rank must make the same store calls (same operation, same broadcast root) in the same order.";
  return out;
}

std::string StoreServer::gone_text(int rank) const {
  std::string op = str("op #", seq_);
  for (auto& c : calls_)
    if (c) {
      op += str(" (", describe(*c), ")");
      break;
    }
  return str(gone_[rank], " before rank ", rank, " called store ", op, ", so that op can never complete",
             gone_hint_[rank].empty() ? "" : "; " + gone_hint_[rank]);
}

// ---- the client (every rank) -------------------------------------------------

class TcpStore final : public Store {
 public:
  explicit TcpStore(const StoreOptions& o) : opt_(o), where_(host_port(o.master_addr, o.master_port)) {}
  ~TcpStore() override;

  void start_server() { server_ = std::make_unique<StoreServer>(opt_.master_port, opt_.world_size); }
  void join();

  std::vector<std::string> all_gather(std::string_view blob, std::string_view what) override {
    return collective(Kind::all_gather, 0, blob, what);
  }
  std::string broadcast(int root, std::string_view blob, std::string_view what) override {
    WEFT_REQUIRE(root >= 0 && root < opt_.world_size, "store broadcast '", what, "': root ", root,
                 " is outside the world of ", opt_.world_size, " ranks");
    return std::move(collective(Kind::broadcast, root, blob, what).at(0));
  }
  void barrier(std::string_view what) override { collective(Kind::barrier, 0, {}, what); }

  int rank() const override { return opt_.rank; }
  int world_size() const override { return opt_.world_size; }
  Millis timeout() const override { return opt_.timeout; }

 private:
  void join_server();
  void connect_with_retry(Clock::time_point start, Clock::time_point deadline);
  std::vector<std::string> collective(Kind kind, int root, std::string_view blob, std::string_view what);
  std::vector<std::string> run_op(Kind kind, int root, std::string_view blob, std::string_view what,
                                  std::uint64_t seq, const std::string& label);
  std::vector<std::string> parse_result(const Frame& f, Kind kind, std::uint64_t seq, const std::string& label);
  Io read_frame(Frame& f, Clock::time_point deadline, int* err, std::string* why);
  struct Status {
    bool ok = false;  // a STATUS arrived
    bool done = false;
    std::vector<int> missing;
    std::string notes;
    std::string failure;  // why there is no answer
  };
  Status ask_server(std::uint64_t seq, const std::string& label, const std::function<bool(Frame&)>& awaited);
  [[noreturn]] void fail_lost(const std::string& label, int err);
  [[noreturn]] void fail_protocol(const std::string& label, const std::string& why);

  StoreOptions opt_;
  std::string where_;  // "host:port" of the server
  std::unique_ptr<StoreServer> server_;
  int fd_ = -1;
  FrameBuffer in_;
  std::uint64_t seq_ = 0;
  std::string broken_;  // the error that made this store unusable
};

TcpStore::~TcpStore() {
  if (fd_ >= 0) {
    // Orderly close: BYE, then read until the server closes, so that neither
    // side resets a connection with unread data.
    auto deadline = Clock::now() + std::min<Clock::duration>(opt_.timeout, Millis(2000));
    int err = 0;
    if (send_all(fd_, Writer(Msg::bye).finish(), deadline, &err) == Io::ok) {
      ::shutdown(fd_, SHUT_WR);
      char buf[4096];
      while (wait_fd(fd_, POLLIN, deadline) != 0) {
        ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
        if (n > 0 || (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))) continue;
        break;
      }
    }
    close_fd(fd_);
  }
  // Rank 0: let the other ranks finish with the server (bounded by the timeout).
  if (server_) server_->stop(Clock::now() + opt_.timeout);
}

void TcpStore::connect_with_retry(Clock::time_point start, Clock::time_point deadline) {
  const std::string port = std::to_string(opt_.master_port);
  std::string last = "no connection attempt was made";
  Millis pause(20);
  for (;;) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_protocol = IPPROTO_TCP;
    addrinfo* res = nullptr;
    int g = ::getaddrinfo(opt_.master_addr.c_str(), port.c_str(), &hints, &res);
    if (g != 0) {
      last = str("cannot resolve '", opt_.master_addr, "': ", g == EAI_SYSTEM ? errno_text(errno) : gai_strerror(g));
    } else {
      std::unique_ptr<addrinfo, decltype(&::freeaddrinfo)> guard(res, &::freeaddrinfo);
      for (addrinfo* ai = res; ai; ai = ai->ai_next) {  // every address the name resolves to
        int err = 0;
        int fd = connect_one(ai, deadline, &err);
        if (fd >= 0) {
          fd_ = fd;
          return;
        }
        last = str(errno_text(err), " (connecting to ", numeric_address(ai->ai_addr, ai->ai_addrlen), ")");
      }
    }
    auto now = Clock::now();
    if (now >= deadline) break;
    std::this_thread::sleep_for(std::min<Clock::duration>(pause, deadline - now));
    pause = std::min(pause * 2, Millis(500));
  }
  WEFT_FAIL("cannot reach the store server at ", where_, " from rank ", opt_.rank, " (world size ",
            opt_.world_size, ") after trying for ", seconds_text(Clock::now() - start), ": ", last,
            ". Check that WEFT_MASTER_ADDR/MASTER_ADDR and WEFT_MASTER_PORT/MASTER_PORT name rank 0's "
            "host and port, and that rank 0 is running.");
}

void TcpStore::join() {
  try {
    join_server();
  } catch (const Malformed&) {
    fail_protocol(str("store rendezvous at ", where_), "a malformed message");
  }
}

void TcpStore::join_server() {
  const auto start = Clock::now();
  const auto deadline = start + opt_.timeout;
  connect_with_retry(start, deadline);
  const std::string label = str("store rendezvous at ", where_);
  in_.set_limit(kMaxControlFrameBytes);
  int err = 0;
  std::string hello = Writer(Msg::hello)
                          .raw(std::string_view(kMagic, 8))
                          .u32(kVersion)
                          .i32(opt_.rank)
                          .i32(opt_.world_size)
                          .i32(static_cast<std::int32_t>(::getpid()))
                          .bytes(this_host())
                          .finish();
  Io io = send_all(fd_, hello, deadline, &err);
  if (io == Io::timeout) WEFT_FAIL(label, ": sending the handshake timed out after ", seconds_text(Clock::now() - start));
  if (io != Io::ok) fail_lost(label, err);
  auto accept_welcome = [&](Frame& f) {
    Reader r(f.payload);
    if (r.raw(8) != std::string_view(kMagic, 8) || r.u32() != kVersion)
      fail_protocol(label, "its welcome is not a weft store message");
    int world = r.i32();
    WEFT_REQUIRE(world == opt_.world_size, label, ": rank 0 reports world size ", world, " but rank ",
                 opt_.rank, " has ", opt_.world_size);
    in_.set_limit(kMaxFrameBytes);
  };
  for (;;) {
    Frame f;
    std::string why;
    io = read_frame(f, deadline, &err, &why);
    if (io == Io::closed) fail_lost(label, err);
    if (io == Io::bad) fail_protocol(label, why);
    if (io == Io::timeout) {
      bool welcomed = false;
      Status st = ask_server(0, label, [&](Frame& g) {
        if (g.type != Msg::welcome) return false;
        accept_welcome(g);
        return welcomed = true;
      });
      if (welcomed) return;
      std::string waited = seconds_text(Clock::now() - start);
      if (!st.ok)
        WEFT_FAIL(label, " timed out after ", waited, " on rank ", opt_.rank, " (timeout ",
                  seconds_text(opt_.timeout), ") waiting for the other ranks to join, and ", st.failure,
                  ". Check that all ", opt_.world_size, " ranks were started with the same "
                  "WEFT_MASTER_ADDR/MASTER_ADDR and port.");
      std::vector<int> joined;
      for (int q = 0; q < opt_.world_size; ++q)
        if (std::find(st.missing.begin(), st.missing.end(), q) == st.missing.end()) joined.push_back(q);
      WEFT_FAIL(label, " timed out after ", waited, " on rank ", opt_.rank, " (timeout ",
                seconds_text(opt_.timeout), "): ", ranks_text(st.missing), " of ", opt_.world_size,
                st.missing.size() == 1 ? " has" : " have", " not joined (joined: ", rank_list(joined),
                "). Check that every rank was started, with the same WEFT_MASTER_ADDR/MASTER_ADDR and "
                "port, and that none failed before reaching the rendezvous.",
                st.notes.empty() ? "" : " " + st.notes);
    }
    switch (f.type) {
      case Msg::welcome:
        accept_welcome(f);
        return;
      case Msg::error: WEFT_FAIL(label, " failed: ", f.payload);
      case Msg::status: continue;  // an answer to an earlier question: stale
      default: fail_protocol(label, str("unexpected message type ", static_cast<int>(f.type)));
    }
  }
}

Io TcpStore::read_frame(Frame& f, Clock::time_point deadline, int* err, std::string* why) {
  for (;;) {
    int t = in_.take(f, why);
    if (t > 0) return Io::ok;
    if (t < 0) return Io::bad;
    if (wait_fd(fd_, POLLIN, deadline) == 0) return Io::timeout;
    ssize_t n = in_.receive(fd_);
    if (n > 0) continue;
    if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) {
      if (Clock::now() > deadline) return Io::timeout;
      continue;
    }
    *err = n == 0 ? 0 : errno;
    return Io::closed;
  }
}

// After a timeout: sends QUERY(seq) and waits briefly for the server's STATUS.
// Frames arriving first go to `awaited`; it returns true when one is what the
// caller was waiting for (a RESULT or WELCOME that raced the timeout).
TcpStore::Status TcpStore::ask_server(std::uint64_t seq, const std::string& label,
                                      const std::function<bool(Frame&)>& awaited) {
  Status st;
  auto deadline = Clock::now() + std::clamp<Clock::duration>(opt_.timeout, Millis(200), Millis(2000));
  int err = 0;
  Io io = send_all(fd_, Writer(Msg::query).u64(seq).finish(), deadline, &err);
  if (io != Io::ok) {
    st.failure = io == Io::timeout ? "the question to the store server which ranks are missing timed out"
                                   : str("asking the store server which ranks are missing failed (",
                                         errno_text(err), ")");
    return st;
  }
  for (;;) {
    Frame f;
    std::string why;
    io = read_frame(f, deadline, &err, &why);
    if (io == Io::timeout) {
      st.failure = "the store server did not say which ranks are missing";
      return st;
    }
    if (io == Io::closed) {
      st.failure = str("the connection to the store server was lost while asking which ranks are missing (",
                       errno_text(err), ")");
      return st;
    }
    if (io == Io::bad) fail_protocol(label, why);
    if (awaited(f)) {
      st.ok = st.done = true;
      return st;
    }
    if (f.type == Msg::error) WEFT_FAIL(label, " failed: ", f.payload);
    if (f.type != Msg::status) continue;
    Reader r(f.payload);
    if (r.u64() != seq) continue;  // stale answer
    st.done = r.u8() != 0;
    std::uint32_t n = r.u32();
    for (std::uint32_t i = 0; i < n; ++i) st.missing.push_back(r.i32());
    st.notes = std::string(r.bytes());
    st.ok = true;
    return st;
  }
}

std::vector<std::string> TcpStore::collective(Kind kind, int root, std::string_view blob, std::string_view what) {
  WEFT_REQUIRE(broken_.empty(), "the store at ", where_, " cannot be used after an earlier error: ", broken_);
  const std::uint64_t seq = ++seq_;
  std::string label =
      kind == Kind::broadcast
          ? str("store broadcast '", what, "' from root ", root, " (op #", seq, ")")
          : str("store ", kind_name(kind), " '", what, "' (op #", seq, ")");
  try {
    return run_op(kind, root, blob, what, seq, label);
  } catch (const Error& e) {
    broken_ = e.what();
    throw;
  } catch (const Malformed&) {
    broken_ = "malformed message from the server";
    fail_protocol(label, "a malformed message");
  }
}

std::vector<std::string> TcpStore::run_op(Kind kind, int root, std::string_view blob, std::string_view what,
                                          std::uint64_t seq, const std::string& label) {
  const auto start = Clock::now();
  const auto deadline = start + opt_.timeout;
  if (kind == Kind::barrier || (kind == Kind::broadcast && root != opt_.rank)) blob = {};
  std::string frame = Writer(Msg::op, 32 + what.size() + blob.size())
                          .u64(seq)
                          .u8(static_cast<std::uint8_t>(kind))
                          .i32(root)
                          .bytes(what)
                          .bytes(blob)
                          .finish();
  int err = 0;
  Io io = send_all(fd_, frame, deadline, &err);
  if (io == Io::closed) fail_lost(label, err);
  if (io == Io::timeout)  // the stream now ends mid-frame: no question can follow it
    WEFT_FAIL(label, " timed out after ", seconds_text(Clock::now() - start), " on rank ", opt_.rank,
              " while sending ", blob.size(), " bytes to the store server at ", where_,
              ": the server is not reading (is rank 0 stopped or the network stalled?)");
  for (;;) {
    Frame f;
    std::string why;
    io = read_frame(f, deadline, &err, &why);
    if (io == Io::closed) fail_lost(label, err);
    if (io == Io::bad) fail_protocol(label, why);
    if (io == Io::timeout) {
      std::vector<std::string> late;
      bool arrived = false;
      Status st = ask_server(seq, label, [&](Frame& g) {
        if (g.type != Msg::result) return false;
        late = parse_result(g, kind, seq, label);
        return arrived = true;
      });
      if (arrived) return late;
      std::string waited = seconds_text(Clock::now() - start);
      if (!st.ok)
        WEFT_FAIL(label, " timed out after ", waited, " on rank ", opt_.rank, " waiting for the other ranks "
                  "(store server ", where_, "), and ", st.failure, ". Every rank must make the same store "
                  "calls in the same order.");
      std::vector<int> arrived_ranks;
      for (int q = 0; q < opt_.world_size; ++q)
        if (std::find(st.missing.begin(), st.missing.end(), q) == st.missing.end()) arrived_ranks.push_back(q);
      std::string missing = ranks_text(st.missing);
      WEFT_FAIL(label, " timed out after ", waited, " on rank ", opt_.rank, ", waiting for ", missing,
                " (store server ", where_, "; ", ranks_text(arrived_ranks), " had arrived). Every rank must "
                "make the same store calls in the same order: check whether ", missing,
                st.missing.size() == 1 ? " is" : " are",
                " stuck, slower than the timeout, or skipped this call.",
                st.notes.empty() ? "" : " " + st.notes);
    }
    switch (f.type) {
      case Msg::result: return parse_result(f, kind, seq, label);
      case Msg::error: WEFT_FAIL(label, " failed: ", f.payload);
      case Msg::status: continue;  // an answer to an earlier question: stale
      default: fail_protocol(label, str("unexpected message type ", static_cast<int>(f.type)));
    }
  }
}

std::vector<std::string> TcpStore::parse_result(const Frame& f, Kind kind, std::uint64_t seq,
                                                const std::string& label) {
  Reader r(f.payload);
  std::uint64_t got = r.u64();
  if (got != seq) fail_protocol(label, str("the result of op #", got, " arrived while waiting for op #", seq));
  std::uint32_t n = r.u32();
  std::uint32_t expected = kind == Kind::all_gather ? static_cast<std::uint32_t>(opt_.world_size)
                           : kind == Kind::broadcast ? 1
                                                     : 0;
  if (n != expected) fail_protocol(label, str("the result holds ", n, " blobs instead of ", expected));
  std::vector<std::string> out;
  out.reserve(n);
  for (std::uint32_t i = 0; i < n; ++i) out.emplace_back(r.bytes());
  return out;
}

void TcpStore::fail_lost(const std::string& label, int err) {
  // The server may have said why before the connection went: read what is left.
  for (int i = 0; i < 64; ++i) {
    if (wait_fd(fd_, POLLIN, Clock::now()) == 0) break;
    ssize_t n = in_.receive(fd_);
    if (n <= 0 && !(n < 0 && errno == EINTR)) break;
  }
  Frame f;
  std::string why;
  while (in_.take(f, &why) > 0)
    if (f.type == Msg::error) WEFT_FAIL(label, " failed: ", f.payload);
  WEFT_FAIL(label, " failed on rank ", opt_.rank, ": lost the connection to the store server at ", where_, " (",
            errno_text(err), "). The server runs inside rank 0",
            opt_.rank == 0 ? " (this process): it has stopped" : ", which has probably exited or crashed",
            "; look for rank 0's own error.");
}

void TcpStore::fail_protocol(const std::string& label, const std::string& why) {
  WEFT_FAIL(label, " on rank ", opt_.rank, ": the server at ", where_, " does not speak the weft store protocol (",
            why, "). Is another program listening on that port, or do the ranks run different weft builds?");
}

}  // namespace

std::unique_ptr<Store> Store::connect(const StoreOptions& o) {
  WEFT_REQUIRE(o.world_size >= 1, "store: world size ", o.world_size, " must be at least 1");
  WEFT_REQUIRE(o.rank >= 0 && o.rank < o.world_size, "store: rank ", o.rank, " is outside the world of ",
               o.world_size, " ranks (valid ranks: 0 to ", o.world_size - 1, ")");
  WEFT_REQUIRE(o.master_port >= 1 && o.master_port <= 65535, "store: port ", o.master_port,
               " is not a TCP port (1-65535); check WEFT_MASTER_PORT/MASTER_PORT");
  WEFT_REQUIRE(!o.master_addr.empty(), "store: the master address is empty; set WEFT_MASTER_ADDR/MASTER_ADDR");
  WEFT_REQUIRE(o.timeout.count() > 0, "store: the timeout must be positive (got ", o.timeout.count(), " ms)");
  auto store = std::make_unique<TcpStore>(o);
  if (o.rank == 0) store->start_server();
  store->join();  // on failure the store's destructor stops the server and closes the socket
  return store;
}

}  // namespace weft
