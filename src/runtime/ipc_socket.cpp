#include "ipc_socket.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <exception>
#include <random>
#include <thread>

#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {
namespace {

using Clock = std::chrono::steady_clock;

struct Hello {  // client -> server
  char token[33];
  std::int32_t rank;
};
struct Reply {  // server -> client, carries the fd
  std::int32_t rank;
  std::uint64_t bytes;
};

std::string random_token() {
  std::random_device rd;
  std::string t;
  const char* hex = "0123456789abcdef";
  for (int i = 0; i < 32; ++i) t += hex[rd() & 15u];
  return t;
}

int ms_left(Clock::time_point deadline) {
  auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::max<long long>(0, left));
}

bool wait_fd(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    int rc = ::poll(&p, 1, ms_left(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

void send_all(int fd, const void* data, std::size_t n, Clock::time_point deadline, const std::string& who) {
  const char* p = static_cast<const char*>(data);
  while (n) {
    WEFT_REQUIRE(wait_fd(fd, POLLOUT, deadline), "heap handle exchange: timed out sending to ", who);
    ssize_t k = ::send(fd, p, n, MSG_NOSIGNAL);
    if (k < 0 && errno == EINTR) continue;
    WEFT_REQUIRE(k > 0, "heap handle exchange: send to ", who, " failed: ", std::strerror(errno));
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

void recv_all(int fd, void* data, std::size_t n, Clock::time_point deadline, const std::string& who) {
  char* p = static_cast<char*>(data);
  while (n) {
    WEFT_REQUIRE(wait_fd(fd, POLLIN, deadline), "heap handle exchange: timed out waiting for ", who);
    ssize_t k = ::recv(fd, p, n, 0);
    if (k < 0 && errno == EINTR) continue;
    WEFT_REQUIRE(k > 0, "heap handle exchange: ", who, " closed the connection (",
                 k == 0 ? "end of stream" : std::strerror(errno), ")");
    p += k;
    n -= static_cast<std::size_t>(k);
  }
}

ucred peer_cred(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  WEFT_REQUIRE(::getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0,
               "heap handle exchange: SO_PEERCRED failed: ", std::strerror(errno));
  return cred;
}

sockaddr_un socket_address(const std::string& dir, int rank) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::string path = dir + "/r" + std::to_string(rank) + ".sock";
  WEFT_REQUIRE(path.size() < sizeof(addr.sun_path), "socket path too long: ", path);
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// A one-buffer message with room for one SCM_RIGHTS file descriptor.
struct FdMessage {
  iovec iov;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
  msghdr msg{};
  FdMessage(void* data, std::size_t bytes) : iov{data, bytes} {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
  }
  FdMessage(const FdMessage&) = delete;
  FdMessage& operator=(const FdMessage&) = delete;
};

struct Fd {
  int fd = -1;
  explicit Fd(int f = -1) : fd(f) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

std::vector<PeerHandle> exchange_fds(Store& store, const Team& team, int my_fd, std::uint64_t my_bytes) {
  const auto timeout = store.timeout();
  const int me = team.rank;
  const bool first_on_node = team.local_ranks.front() == me;

  // 1. The node's first rank makes the private directory; rank 0 makes the token.
  std::string dir;
  if (first_on_node) {
    char tmpl[] = "/tmp/weft-XXXXXX";
    WEFT_REQUIRE(::mkdtemp(tmpl) != nullptr, "cannot create a private socket directory under /tmp: ",
                 std::strerror(errno));
    dir = tmpl;  // mkdtemp creates it with mode 0700
  }
  std::string token = me == 0 ? random_token() : std::string(32, '-');
  std::string mine = std::to_string(::getpid()) + "\n" + token + "\n" + dir;
  auto all = store.all_gather(mine, "heap socket set-up");
  std::vector<pid_t> pid_of(team.world_size);
  for (int r = 0; r < team.world_size; ++r) {
    auto a = all[r].find('\n'), b = all[r].find('\n', a + 1);
    pid_of[r] = static_cast<pid_t>(std::stol(all[r].substr(0, a)));
    if (r == 0) token = all[r].substr(a + 1, b - a - 1);
    if (r == team.local_ranks.front()) dir = all[r].substr(b + 1);
  }

  // 2. Listen.
  Fd listener(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  WEFT_REQUIRE(listener.fd >= 0, "socket(AF_UNIX) failed: ", std::strerror(errno));
  sockaddr_un my_addr = socket_address(dir, me);
  WEFT_REQUIRE(::bind(listener.fd, reinterpret_cast<sockaddr*>(&my_addr), sizeof(my_addr)) == 0,
               "cannot bind heap socket ", my_addr.sun_path, ": ", std::strerror(errno));
  ::chmod(my_addr.sun_path, 0600);
  WEFT_REQUIRE(::listen(listener.fd, 64) == 0, "listen on ", my_addr.sun_path, " failed: ", std::strerror(errno));
  store.barrier("heap sockets listening");

  const int peers = team.local_world_size - 1;
  const auto deadline = Clock::now() + timeout;

  // 3. Serve our fd to each local peer, on a thread, while this thread fetches theirs.
  std::exception_ptr server_error;
  std::thread server([&] {
    try {
      for (int served = 0; served < peers;) {
        WEFT_REQUIRE(wait_fd(listener.fd, POLLIN, deadline), "heap handle exchange: rank ", me,
                     " served ", served, " of ", peers, " local peers before the ", timeout.count() / 1000.0,
                     " s timeout; the others never connected");
        Fd conn(::accept4(listener.fd, nullptr, nullptr, SOCK_CLOEXEC));
        if (conn.fd < 0) continue;
        ucred cred = peer_cred(conn.fd);
        auto reject = [&] {
          WEFT_LOG(warn, "heap socket: rejected a connection from pid ", cred.pid, " uid ", cred.uid,
                   ": not a rank of this job");
        };
        bool job_pid = std::find(pid_of.begin(), pid_of.end(), cred.pid) != pid_of.end();
        if (cred.uid != ::geteuid() || !job_pid) {
          reject();
          continue;
        }
        Hello hello{};
        recv_all(conn.fd, &hello, sizeof(hello), deadline, "a local peer");
        hello.token[32] = '\0';
        if (token != hello.token || hello.rank < 0 || hello.rank >= team.world_size ||
            pid_of[hello.rank] != cred.pid) {
          reject();
          continue;
        }
        Reply reply{me, my_bytes};
        FdMessage fm(&reply, sizeof(reply));
        msghdr& msg = fm.msg;
        cmsghdr* c = CMSG_FIRSTHDR(&msg);
        c->cmsg_level = SOL_SOCKET;
        c->cmsg_type = SCM_RIGHTS;
        c->cmsg_len = CMSG_LEN(sizeof(int));
        std::memcpy(CMSG_DATA(c), &my_fd, sizeof(int));
        WEFT_REQUIRE(wait_fd(conn.fd, POLLOUT, deadline), "heap handle exchange: timed out sending to rank ", hello.rank);
        WEFT_REQUIRE(::sendmsg(conn.fd, &msg, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof(reply)),
                     "sending the heap handle to rank ", hello.rank, " failed: ", std::strerror(errno));
        char ack = 0;  // the peer confirms receipt before we close
        recv_all(conn.fd, &ack, 1, deadline, str("rank ", hello.rank));
        ++served;
      }
    } catch (...) {
      server_error = std::current_exception();
    }
  });

  std::vector<PeerHandle> out(team.world_size);
  std::exception_ptr client_error;
  try {
    for (int r : team.local_ranks) {
      if (r == me) continue;
      std::string who = str("rank ", r);
      Fd conn(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
      sockaddr_un addr = socket_address(dir, r);
      while (::connect(conn.fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        WEFT_REQUIRE(Clock::now() < deadline, "cannot connect to ", who, "'s heap socket ", addr.sun_path,
                     ": ", std::strerror(errno));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ucred cred = peer_cred(conn.fd);
      WEFT_REQUIRE(cred.uid == ::geteuid() && cred.pid == pid_of[r], "the process behind ", addr.sun_path,
                   " (pid ", cred.pid, ", uid ", cred.uid, ") is not ", who, " of this job (pid ", pid_of[r], ")");
      Hello hello{};
      std::memcpy(hello.token, token.c_str(), 32);
      hello.rank = me;
      send_all(conn.fd, &hello, sizeof(hello), deadline, who);
      Reply reply{};
      FdMessage fm(&reply, sizeof(reply));
      msghdr& msg = fm.msg;
      WEFT_REQUIRE(wait_fd(conn.fd, POLLIN, deadline), "heap handle exchange: timed out waiting for ", who);
      ssize_t k = ::recvmsg(conn.fd, &msg, MSG_CMSG_CLOEXEC);
      WEFT_REQUIRE(k == static_cast<ssize_t>(sizeof(reply)), "receiving the heap handle of ", who,
                   " failed: ", k < 0 ? std::strerror(errno) : "short message");
      cmsghdr* c = CMSG_FIRSTHDR(&msg);
      WEFT_REQUIRE(c && c->cmsg_type == SCM_RIGHTS, who, " sent no file descriptor");
      std::memcpy(&out[r].fd, CMSG_DATA(c), sizeof(int));
      out[r].bytes = reply.bytes;
      char ack = 1;
      send_all(conn.fd, &ack, 1, deadline, who);
    }
  } catch (...) {
    client_error = std::current_exception();
  }
  server.join();
  ::unlink(my_addr.sun_path);
  auto close_received = [&] {
    for (auto& h : out)
      if (h.fd >= 0) ::close(h.fd);
  };
  if (client_error) {
    close_received();
    std::rethrow_exception(client_error);
  }
  if (server_error) {
    close_received();
    std::rethrow_exception(server_error);
  }
  store.barrier("heap handles exchanged");
  if (first_on_node) ::rmdir(dir.c_str());
  return out;
}

}  // namespace weft
