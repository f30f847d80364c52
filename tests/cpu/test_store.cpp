// CPU tests of the TCP rendezvous store (weft/runtime/store.hpp), and of
// ops_detail::max_over_ranks, which the plans' GEMM tuners agree through.
//
// Every test forks one child process per rank. The gtest process itself never
// opens a store (so it has no threads when it forks); children do their part,
// write a line of text to a pipe and _exit. The parent waits with a bound and
// kills stragglers, so a broken store fails a test instead of hanging it.
#include <gtest/gtest.h>

#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "ops/overlap.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/store.hpp"

namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;
using weft::Store;
using weft::StoreOptions;

// A TCP port that is free right now (the kernel picks it).
int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    std::perror("free_port");
    std::abort();
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

bool have_ipv6_loopback() {
  int fd = ::socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = in6addr_loopback;
  bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0;
  ::close(fd);
  return ok;
}

StoreOptions options(int port, int rank, int world, std::chrono::milliseconds timeout = 10s,
                     std::string addr = "127.0.0.1") {
  StoreOptions o;
  o.master_addr = std::move(addr);
  o.master_port = port;
  o.rank = rank;
  o.world_size = world;
  o.timeout = timeout;
  return o;
}

struct Outcome {
  int code = -1;    // exit code: 0 body returned, 1 weft::Error, 2 other exception
  int signal = 0;   // the signal that ended the child, if any
  bool killed = false;  // still running at the bound: the parent killed it
  std::string text;     // what the body returned, or the exception's message
};

std::ostream& operator<<(std::ostream& os, const Outcome& o) {
  return os << "code " << o.code << " signal " << o.signal << (o.killed ? " (killed: hung)" : "")
            << " text: " << o.text;
}

void write_all(int fd, const std::string& s) {
  std::size_t off = 0;
  while (off < s.size()) {
    ssize_t n = ::write(fd, s.data() + off, s.size() - off);
    if (n > 0) off += static_cast<std::size_t>(n);
    else if (n < 0 && errno == EINTR) continue;
    else return;
  }
}

// Runs body(i) in n forked children, i = 0..n-1, and collects what they report.
std::vector<Outcome> run_children(int n, const std::function<std::string(int)>& body,
                                  std::chrono::milliseconds bound = 20s) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids(n, -1);
  std::vector<int> pipes(n, -1);
  std::vector<Outcome> out(n);
  for (int i = 0; i < n; ++i) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) std::abort();
    pid_t pid = ::fork();
    if (pid < 0) std::abort();
    if (pid == 0) {
      ::close(fds[0]);
      int code = 0;
      std::string text;
      try {
        text = body(i);
      } catch (const weft::Error& e) {
        code = 1;
        text = e.what();
      } catch (const std::exception& e) {
        code = 2;
        text = e.what();
      } catch (...) {
        code = 3;
        text = "unknown exception";
      }
      write_all(fds[1], text);
      ::_exit(code);
    }
    ::close(fds[1]);
    pids[i] = pid;
    pipes[i] = fds[0];
  }
  const auto deadline = Clock::now() + bound;
  // Read every child's report until its pipe closes (the child exited).
  for (;;) {
    std::vector<pollfd> fds;
    std::vector<int> who;
    for (int i = 0; i < n; ++i)
      if (pipes[i] >= 0) {
        fds.push_back({pipes[i], POLLIN, 0});
        who.push_back(i);
      }
    if (fds.empty()) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    int rc = ::poll(fds.data(), fds.size(), static_cast<int>(left));
    if (rc < 0 && errno == EINTR) continue;
    if (rc <= 0) break;
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      char buf[4096];
      ssize_t r = ::read(fds[k].fd, buf, sizeof buf);
      if (r > 0) {
        out[who[k]].text.append(buf, static_cast<std::size_t>(r));
      } else if (r == 0 || errno != EINTR) {
        ::close(pipes[who[k]]);
        pipes[who[k]] = -1;
      }
    }
  }
  for (int i = 0; i < n; ++i) {
    int status = 0;
    pid_t r = 0;
    while (Clock::now() < deadline && (r = ::waitpid(pids[i], &status, WNOHANG)) == 0)
      std::this_thread::sleep_for(5ms);
    if (r == 0) {
      ::kill(pids[i], SIGKILL);
      ::waitpid(pids[i], &status, 0);
      out[i].killed = true;
    }
    if (WIFEXITED(status)) out[i].code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) out[i].signal = WTERMSIG(status);
    if (pipes[i] >= 0) ::close(pipes[i]);
    if (std::getenv("WEFT_TEST_VERBOSE")) std::fprintf(stderr, "  child %d: %s\n", i, out[i].text.c_str());
  }
  return out;
}

bool contains(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

#define EXPECT_CONTAINS(text, part) EXPECT_TRUE(contains(text, part)) << "expected \"" << (part) << "\" in:\n" << (text)

// Deterministic pseudo-random bytes (zero bytes included) for (rank, op).
std::string make_blob(int rank, int op, std::size_t size) {
  std::mt19937_64 gen(static_cast<std::uint64_t>(rank) * 1000003u + static_cast<std::uint64_t>(op) * 7919u + size);
  std::string s(size, '\0');
  std::size_t i = 0;
  for (; i + 8 <= size; i += 8) {
    std::uint64_t v = gen();
    std::memcpy(&s[i], &v, 8);
  }
  for (; i < size; ++i) s[i] = static_cast<char>(gen());
  if (size > 2) s[size / 2] = '\0';
  return s;
}

std::size_t blob_size(int rank, int op) {
  if (rank == 1 && op == 2) return 0;  // an empty contribution
  return 1 + static_cast<std::size_t>(rank * 977 + op * 131) % 5000;
}

std::string check_all_gather(int port, int rank, int world) {
  auto store = Store::connect(options(port, rank, world));
  if (store->rank() != rank || store->world_size() != world) return "wrong rank/world_size";
  for (int op = 0; op < 5; ++op) {
    auto got = store->all_gather(make_blob(rank, op, blob_size(rank, op)), "test blobs");
    if (static_cast<int>(got.size()) != world) return "wrong number of blobs";
    for (int r = 0; r < world; ++r)
      if (got[r] != make_blob(r, op, blob_size(r, op)))
        return "blob of rank " + std::to_string(r) + " differs in op " + std::to_string(op);
  }
  return "OK";
}

void expect_all_ok(const std::vector<Outcome>& out) {
  for (std::size_t i = 0; i < out.size(); ++i) {
    EXPECT_EQ(out[i].code, 0) << "child " << i << ": " << out[i];
    EXPECT_EQ(out[i].text, "OK") << "child " << i << ": " << out[i];
  }
}

void all_gather_test(int world) {
  int port = free_port();
  expect_all_ok(run_children(world, [&](int rank) { return check_all_gather(port, rank, world); }));
}

}  // namespace

TEST(StoreTest, AllGatherTwoRanks) { all_gather_test(2); }
TEST(StoreTest, AllGatherThreeRanks) { all_gather_test(3); }
TEST(StoreTest, AllGatherFourRanks) { all_gather_test(4); }

TEST(StoreTest, SingleRankWorld) {
  int port = free_port();
  expect_all_ok(run_children(1, [&](int) -> std::string {
    auto store = Store::connect(options(port, 0, 1));
    auto got = store->all_gather("alone", "solo");
    if (got.size() != 1 || got[0] != "alone") return "bad all_gather";
    if (store->broadcast(0, "x", "solo") != "x") return "bad broadcast";
    store->barrier("solo");
    return "OK";
  }));
}

TEST(StoreTest, BroadcastFromNonZeroRoot) {
  int port = free_port();
  expect_all_ok(run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3));
    std::string payload = make_blob(2, 0, 3000);
    std::string got = store->broadcast(2, rank == 2 ? payload : "ignored " + std::to_string(rank), "root two");
    if (got != payload) return "broadcast from root 2 differs";
    std::string second = std::string("from\0one", 8);
    got = store->broadcast(1, rank == 1 ? second : "", "root one");
    if (got != second) return "broadcast from root 1 differs";
    return "OK";
  }));
}

TEST(StoreTest, BarrierReleasesNoRankBeforeAllArrive) {
  int port = free_port();
  auto out = run_children(4, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 4));
    store->barrier("line up");
    std::this_thread::sleep_for(std::chrono::milliseconds(80 * rank));  // arrive one after another
    auto arrive = Clock::now().time_since_epoch().count();  // CLOCK_MONOTONIC: comparable across processes
    store->barrier("ordered");
    auto leave = Clock::now().time_since_epoch().count();
    return std::to_string(arrive) + " " + std::to_string(leave);
  });
  long long last_arrival = 0, first_departure = LLONG_MAX;
  for (auto& o : out) {
    ASSERT_EQ(o.code, 0) << o;
    std::istringstream is(o.text);
    long long arrive = 0, leave = 0;
    ASSERT_TRUE(is >> arrive >> leave) << o;
    last_arrival = std::max(last_arrival, arrive);
    first_departure = std::min(first_departure, leave);
  }
  EXPECT_GE(first_departure, last_arrival) << "a rank left the barrier before the last rank arrived";
}

TEST(StoreTest, LargeBlobs) {
  int port = free_port();
  constexpr std::size_t kSize = 16u << 20;
  expect_all_ok(run_children(2, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 2));
    auto got = store->all_gather(make_blob(rank, 7, kSize), "big blobs");
    for (int r = 0; r < 2; ++r)
      if (got.at(r) != make_blob(r, 7, kSize)) return "big blob of rank " + std::to_string(r) + " differs";
    std::string b = store->broadcast(1, rank == 1 ? make_blob(1, 8, kSize) : std::string(), "big broadcast");
    if (b != make_blob(1, 8, kSize)) return "big broadcast differs";
    return "OK";
  }));
}

TEST(StoreTest, RanksWaitForALateRankZero) {
  int port = free_port();
  expect_all_ok(run_children(3, [&](int rank) -> std::string {
    if (rank == 0) std::this_thread::sleep_for(400ms);  // the others retry until the server is up
    auto store = Store::connect(options(port, rank, 3, 10s));
    auto got = store->all_gather(std::to_string(rank), "late start");
    return got == std::vector<std::string>{"0", "1", "2"} ? "OK" : "wrong result";
  }));
}

TEST(StoreTest, RankZeroLeavingFirstStillDeliversTheLastResult) {
  // Rank 0 closes its store right after the last all_gather while the server
  // still has megabytes to send to the others: the server must drain first.
  int port = free_port();
  constexpr std::size_t kSize = 6u << 20;
  expect_all_ok(run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3, 10s));
    auto got = store->all_gather(make_blob(rank, 11, kSize), "last words");
    if (rank == 0) return "OK";
    for (int r = 0; r < 3; ++r)
      if (got.at(r) != make_blob(r, 11, kSize)) return "blob of rank " + std::to_string(r) + " differs";
    return "OK";
  }));
}

TEST(StoreTest, ManyMixedOps) {
  int port = free_port();
  expect_all_ok(run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3));
    for (int i = 0; i < 200; ++i) {
      switch (i % 3) {
        case 0: {
          auto got = store->all_gather(std::string("r\0", 2) + std::to_string(rank) + ":" + std::to_string(i), "mixed");
          for (int r = 0; r < 3; ++r)
            if (got.at(r) != std::string("r\0", 2) + std::to_string(r) + ":" + std::to_string(i))
              return "all_gather " + std::to_string(i) + " differs";
          break;
        }
        case 1: {
          int root = (i / 3) % 3;
          std::string expect = "op " + std::to_string(i) + " from " + std::to_string(root);
          if (store->broadcast(root, rank == root ? expect : "", "mixed") != expect)
            return "broadcast " + std::to_string(i) + " differs";
          break;
        }
        default: store->barrier("mixed");
      }
    }
    return "OK";
  }));
}

TEST(StoreTest, HostNameRendezvous) {
  int port = free_port();
  expect_all_ok(run_children(2, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 2, 10s, "localhost"));
    auto got = store->all_gather(std::to_string(rank), "by name");
    return got == std::vector<std::string>{"0", "1"} ? "OK" : "wrong result";
  }));
}

TEST(StoreTest, Ipv6Rendezvous) {
  if (!have_ipv6_loopback()) GTEST_SKIP() << "this machine has no IPv6 loopback";
  int port = free_port();
  expect_all_ok(run_children(2, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 2, 10s, "::1"));
    auto got = store->all_gather(std::to_string(rank), "over ipv6");
    return got == std::vector<std::string>{"0", "1"} ? "OK" : "wrong result";
  }));
}

TEST(StoreTest, CollectiveTimeoutNamesTheMissingRank) {
  int port = free_port();
  auto out = run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3, 1s));
    store->all_gather("x", "warm-up");
    if (rank == 1) {
      std::this_thread::sleep_for(2500ms);  // never calls the barrier, but stays connected
      return "OK";
    }
    store->barrier("late barrier");
    return "barrier returned";
  });
  EXPECT_EQ(out[1].code, 0) << out[1];
  for (int r : {0, 2}) {
    const std::string& t = out[r].text;
    EXPECT_EQ(out[r].code, 1) << out[r];
    EXPECT_CONTAINS(t, "store barrier 'late barrier' (op #2) timed out after");
    EXPECT_CONTAINS(t, "waiting for rank 1 ");
    EXPECT_CONTAINS(t, "127.0.0.1:" + std::to_string(port));
    EXPECT_CONTAINS(t, "ranks 0, 2 had arrived");
    EXPECT_CONTAINS(t, "on rank " + std::to_string(r));
  }
}

TEST(StoreTest, StoreIsUnusableAfterAnError) {
  int port = free_port();
  auto out = run_children(2, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 2, 1s));
    if (rank == 1) {
      std::this_thread::sleep_for(1800ms);
      return "OK";
    }
    try {
      store->barrier("first");
      return "first barrier returned";
    } catch (const weft::Error&) {
    }
    store->barrier("second");
    return "second barrier returned";
  });
  EXPECT_EQ(out[0].code, 1) << out[0];
  EXPECT_CONTAINS(out[0].text, "cannot be used after an earlier error");
  EXPECT_CONTAINS(out[0].text, "'first' (op #1) timed out");
}

TEST(StoreTest, PeerDeathNamesTheDeadRank) {
  int port = free_port();
  auto out = run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3, 10s));
    store->all_gather("x", "warm-up");
    if (rank == 2) ::kill(::getpid(), SIGKILL);  // dies without closing its store
    auto start = Clock::now();
    try {
      store->barrier("after the death");
    } catch (const weft::Error& e) {
      if (Clock::now() - start > 5s) return std::string("reported only after a timeout: ") + e.what();
      throw;
    }
    return "barrier returned";
  });
  EXPECT_EQ(out[2].signal, SIGKILL) << out[2];
  for (int r : {0, 1}) {
    EXPECT_EQ(out[r].code, 1) << out[r];
    EXPECT_CONTAINS(out[r].text, "store barrier 'after the death' (op #2) failed");
    EXPECT_CONTAINS(out[r].text, "the connection to rank 2 ");
    EXPECT_CONTAINS(out[r].text, "was lost");
  }
}

TEST(StoreTest, RankZeroDeathIsReported) {
  int port = free_port();
  auto out = run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3, 10s));
    store->all_gather("x", "warm-up");
    if (rank == 0) {
      std::this_thread::sleep_for(200ms);  // let the others receive op #1 and call op #2
      ::kill(::getpid(), SIGKILL);         // the server dies with it
    }
    store->barrier("without a server");
    return "barrier returned";
  });
  EXPECT_EQ(out[0].signal, SIGKILL) << out[0];
  for (int r : {1, 2}) {
    EXPECT_EQ(out[r].code, 1) << out[r];
    EXPECT_CONTAINS(out[r].text, "lost the connection to the store server at 127.0.0.1:" + std::to_string(port));
    EXPECT_CONTAINS(out[r].text, "'without a server' (op #2)");
  }
}

TEST(StoreTest, ClosedStoreIsNamed) {
  int port = free_port();
  auto out = run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3, 10s));
    store->barrier("together");
    if (rank == 2) return "OK";  // closes its store early
    store->all_gather("y", "one more");
    return "all_gather returned";
  });
  EXPECT_EQ(out[2].code, 0) << out[2];
  for (int r : {0, 1}) {
    EXPECT_EQ(out[r].code, 1) << out[r];
    EXPECT_CONTAINS(out[r].text, "rank 2 (pid ");
    EXPECT_CONTAINS(out[r].text, "closed its store before rank 2 called store op #2");
  }
}

TEST(StoreTest, WorldSizeMismatchNamesBothSizes) {
  int port = free_port();
  auto out = run_children(2, [&](int i) -> std::string {
    auto store = Store::connect(options(port, i, i == 0 ? 2 : 3, 5s));
    return "connected";
  });
  for (auto& o : out) {
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_CONTAINS(o.text, "rank 1 was started with world size 3 but rank 0 has world size 2");
  }
}

TEST(StoreTest, DuplicateRankIsReported) {
  int port = free_port();
  auto out = run_children(3, [&](int i) -> std::string {
    auto store = Store::connect(options(port, i == 0 ? 0 : 1, 3, 5s));
    return "connected";
  });
  for (auto& o : out) {
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_CONTAINS(o.text, "rank 1 joined twice");
  }
}

TEST(StoreTest, RendezvousTimeoutNamesMissingRanks) {
  int port = free_port();
  auto out = run_children(2, [&](int i) -> std::string {
    auto store = Store::connect(options(port, i == 0 ? 0 : 2, 4, 1s));  // ranks 1 and 3 never start
    return "connected";
  });
  for (auto& o : out) {
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_CONTAINS(o.text, "ranks 1, 3 of 4 have not joined");
    EXPECT_CONTAINS(o.text, "127.0.0.1:" + std::to_string(port));
    EXPECT_CONTAINS(o.text, "(timeout 1.0 s)");
  }
}

TEST(StoreTest, UnreachableMasterNamesTheAddress) {
  int port = free_port();  // nobody listens there
  auto out = run_children(2, [&](int i) -> std::string {
    auto start = Clock::now();
    try {
      Store::connect(options(port, 1, 2, 500ms, i == 0 ? "127.0.0.1" : "weft-no-such-host.invalid"));
    } catch (const weft::Error& e) {
      auto waited = Clock::now() - start;
      if (waited < 450ms || waited > 5s) return std::string("waited the wrong time: ") + e.what();
      throw;
    }
    return "connected";
  });
  for (auto& o : out) {
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_CONTAINS(o.text, "cannot reach the store server at ");
    EXPECT_CONTAINS(o.text, "from rank 1");
    EXPECT_CONTAINS(o.text, "WEFT_MASTER_ADDR/MASTER_ADDR");
    EXPECT_CONTAINS(o.text, "rank 0 is running");
  }
  EXPECT_CONTAINS(out[0].text, "127.0.0.1:" + std::to_string(port));
  EXPECT_CONTAINS(out[0].text, "Connection refused");
  EXPECT_CONTAINS(out[1].text, "weft-no-such-host.invalid:" + std::to_string(port));
  EXPECT_CONTAINS(out[1].text, "cannot resolve");
}

TEST(StoreTest, KindMismatchNamesWhatEachRankCalled) {
  int port = free_port();
  auto out = run_children(2, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 2, 10s));
    store->barrier("warm-up");
    if (rank == 0) store->barrier("sync point");
    else store->broadcast(1, "x", "config");
    return "returned";
  });
  for (auto& o : out) {
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_CONTAINS(o.text, "do not match across ranks at op #2");
    EXPECT_CONTAINS(o.text, "rank 0 called barrier('sync point')");
    EXPECT_CONTAINS(o.text, "rank 1 called broadcast(root 1, 'config')");
  }
}

TEST(StoreTest, BroadcastRootMismatchIsReported) {
  int port = free_port();
  auto out = run_children(3, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 3, 10s));
    store->broadcast(rank == 2 ? 2 : 0, "x", "who leads");
    return "returned";
  });
  for (auto& o : out) {
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_CONTAINS(o.text, "at op #1");
    EXPECT_CONTAINS(o.text, "rank 2 called broadcast(root 2, 'who leads')");
    EXPECT_CONTAINS(o.text, "called broadcast(root 0, 'who leads')");
  }
}

int count_entries(const char* dir) {
  int n = 0;
  if (DIR* d = ::opendir(dir)) {
    while (dirent* e = ::readdir(d))
      if (e->d_name[0] != '.') ++n;
    ::closedir(d);
  }
  return n;
}

TEST(StoreTest, NoThreadsOrDescriptorsOutliveTheStore) {
  std::vector<int> ports;  // a fresh port per connect, so rounds cannot meet each other
  for (int i = 0; i < 6; ++i) ports.push_back(free_port());
  expect_all_ok(run_children(2, [&](int rank) -> std::string {
    int fds = count_entries("/proc/self/fd"), threads = count_entries("/proc/self/task");
    for (int round = 0; round < 3; ++round) {
      {
        auto store = Store::connect(options(ports[2 * round], rank, 2, 10s));
        store->all_gather("x", "leak check");
        store->barrier("leak check");
      }
      // A failed connect (rank 1 claims the wrong world size) cleans up too.
      try {
        auto bad = Store::connect(options(ports[2 * round + 1], rank, rank == 0 ? 2 : 3, 10s));
        return std::string("mismatched connect succeeded");
      } catch (const weft::Error&) {
      }
    }
    int fds_after = count_entries("/proc/self/fd"), threads_after = count_entries("/proc/self/task");
    if (fds_after != fds || threads_after != threads)
      return "leak: fds " + std::to_string(fds) + " -> " + std::to_string(fds_after) + ", threads " +
             std::to_string(threads) + " -> " + std::to_string(threads_after);
    return "OK";
  }));
}

TEST(StoreTest, InvalidOptionsAreRejected) {
  // Checked before any socket or thread exists, so this runs in the test process.
  try {
    Store::connect(options(free_port(), 2, 2));
    FAIL() << "rank 2 of 2 was accepted";
  } catch (const weft::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "rank 2 is outside the world of 2 ranks");
  }
  try {
    Store::connect(options(0, 0, 1));
    FAIL() << "port 0 was accepted";
  } catch (const weft::Error& e) {
    EXPECT_CONTAINS(std::string(e.what()), "port 0 is not a TCP port");
  }
}

// ops_detail::max_over_ranks: how the overlapped plans' GEMM tuners agree on
// a configuration (each timing becomes its slowest rank's).
TEST(StoreTest, MaxOverRanksTakesEachValuesMaximumOnEveryRank) {
  int port = free_port();
  const int world = 3;
  expect_all_ok(run_children(world, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, world));
    std::vector<float> v = {static_cast<float>(rank), 10.0f - rank, rank == 1 ? 100.0f : -1.0f};
    weft::ops_detail::max_over_ranks(*store, v, "test timings");
    const std::vector<float> want = {world - 1.0f, 10.0f, 100.0f};
    return v == want ? "OK" : "got " + std::to_string(v[0]) + " " + std::to_string(v[1]) + " " + std::to_string(v[2]);
  }));
}

TEST(StoreTest, MaxOverRanksNamesARankThatGaveAnotherCount) {
  int port = free_port();
  auto out = run_children(2, [&](int rank) -> std::string {
    auto store = Store::connect(options(port, rank, 2));
    std::vector<float> v(rank == 1 ? 2 : 3, 1.0f);
    weft::ops_detail::max_over_ranks(*store, v, "test timings");
    return "no error";
  });
  for (auto& o : out) {
    EXPECT_EQ(o.code, 1) << o;
    EXPECT_CONTAINS(o.text, "test timings: the ranks gave different numbers of values (rank 0 3, rank 1 2)");
  }
}
