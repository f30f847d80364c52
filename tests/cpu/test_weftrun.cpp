// Tests of the launcher weftrun (tools/weftrun.cpp), driving it with the helper
// weft_test_rank (tests/cpu/helpers/test_rank.cpp). Every run is bounded in wall time.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "weft/runtime/gpu_share.hpp"

#ifndef WEFTRUN_PATH
#error "WEFTRUN_PATH must be defined by the build"
#endif
#ifndef WEFT_TEST_RANK_PATH
#error "WEFT_TEST_RANK_PATH must be defined by the build"
#endif

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Whether a process exists and is not a zombie.
bool process_alive(pid_t pid) {
  if (pid <= 0) return false;
  if (kill(pid, 0) != 0) return errno == EPERM;
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text((std::istreambuf_iterator<char>(stat)), std::istreambuf_iterator<char>());
  auto close_paren = text.rfind(')');
  if (close_paren == std::string::npos || close_paren + 2 >= text.size()) return false;  // gone meanwhile
  char state = text[close_paren + 2];
  return state != 'Z' && state != 'X';
}

// Waits up to `max_s` for every pid to disappear; returns those still alive.
std::vector<pid_t> still_alive(const std::vector<pid_t>& pids, double max_s = 2.0) {
  auto t0 = Clock::now();
  std::vector<pid_t> alive;
  for (;;) {
    alive.clear();
    for (pid_t p : pids)
      if (process_alive(p)) alive.push_back(p);
    if (alive.empty() || seconds_since(t0) > max_s) return alive;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

struct Result {
  int exit_code = -1;    // exit code, or 128+signal if weftrun itself was killed
  bool hung = false;     // had to be killed by the test
  double seconds = 0;    // wall time from start to exit
  std::string output;    // stdout and stderr together
};

// weftrun running under the test, with its stdout+stderr in one pipe.
class Launch {
 public:
  Launch(const std::vector<std::string>& args, const std::map<std::string, std::string>& env_over = {}) {
    std::vector<std::string> argv{WEFTRUN_PATH};
    argv.insert(argv.end(), args.begin(), args.end());
    // A clean environment: the launcher variables are only what the test sets.
    static const std::set<std::string> strip = {
        "WEFT_RANK", "WEFT_WORLD_SIZE", "WEFT_LOCAL_RANK", "WEFT_LOCAL_WORLD_SIZE", "WEFT_NODE_RANK",
        "WEFT_MASTER_ADDR", "WEFT_MASTER_PORT", "WEFT_JOB_ID", "MASTER_ADDR", "MASTER_PORT",
        "NCCL_NVLS_ENABLE", "NVSHMEM_DISABLE_NVLS", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "WEFT_SHARE_GPU",
        "CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_VISIBLE_DEVICES"};
    std::vector<std::string> env;
    for (char** e = environ; e && *e; ++e) {
      std::string kv = *e;
      const std::string key = kv.substr(0, kv.find('='));
      if (!strip.count(key) && !env_over.count(key)) env.push_back(kv);
    }
    for (const auto& [k, v] : env_over) env.push_back(k + "=" + v);
    std::vector<char*> cargv, cenv;
    for (auto& a : argv) cargv.push_back(a.data());
    cargv.push_back(nullptr);
    for (auto& kv : env) cenv.push_back(kv.data());
    cenv.push_back(nullptr);

    int fds[2];
    EXPECT_EQ(pipe2(fds, O_CLOEXEC), 0);
    start_ = Clock::now();
    pid_ = fork();
    if (pid_ == 0) {
      int devnull = open("/dev/null", O_RDONLY);
      dup2(devnull, 0);
      dup2(fds[1], 1);
      dup2(fds[1], 2);
      signal(SIGINT, SIG_DFL);
      signal(SIGTERM, SIG_DFL);
      sigset_t none;
      sigemptyset(&none);
      sigprocmask(SIG_SETMASK, &none, nullptr);
      execve(cargv[0], cargv.data(), cenv.data());
      _exit(126);
    }
    close(fds[1]);
    fd_ = fds[0];
    fcntl(fd_, F_SETFL, fcntl(fd_, F_GETFL) | O_NONBLOCK);
  }
  ~Launch() {
    if (!reaped_ && pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (fd_ >= 0) close(fd_);
  }

  pid_t pid() const { return pid_; }
  const std::string& output() const { return out_; }

  // Reads output until `done(output)` holds; false after `max_s` seconds or on EOF.
  bool read_until(const std::function<bool(const std::string&)>& done, double max_s) {
    auto t0 = Clock::now();
    while (!done(out_)) {
      if (seconds_since(t0) > max_s) return false;
      if (!read_some(50) && eof_) return done(out_);
    }
    return true;
  }

  // Waits for weftrun to exit (killing it after max_s seconds), then collects the rest of its output.
  Result wait(double max_s = 20) {
    Result r;
    int status = 0;
    for (;;) {
      pid_t p = waitpid(pid_, &status, WNOHANG);
      if (p == pid_) break;
      if (seconds_since(start_) > max_s) {
        r.hung = true;
        kill(pid_, SIGKILL);
        waitpid(pid_, &status, 0);
        break;
      }
      read_some(20);
    }
    reaped_ = true;
    r.seconds = seconds_since(start_);
    auto t0 = Clock::now();
    while (!eof_ && seconds_since(t0) < 2.0)
      if (!read_some(100)) break;
    r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    r.output = out_;
    return r;
  }

 private:
  pid_t pid_ = -1;
  int fd_ = -1;
  bool reaped_ = false;
  bool eof_ = false;
  std::string out_;
  Clock::time_point start_;

  // Returns whether anything was read within timeout_ms.
  bool read_some(int timeout_ms) {
    if (eof_) {
      std::this_thread::sleep_for(std::chrono::milliseconds(timeout_ms));
      return false;
    }
    pollfd pfd{fd_, POLLIN, 0};
    if (poll(&pfd, 1, timeout_ms) <= 0) return false;
    char buf[4096];
    ssize_t n = read(fd_, buf, sizeof buf);
    if (n == 0) eof_ = true;
    if (n <= 0) return false;
    out_.append(buf, static_cast<std::size_t>(n));
    return true;
  }
};

Result run_weftrun(const std::vector<std::string>& args, const std::map<std::string, std::string>& env = {},
                   double max_s = 20) {
  Launch l(args, env);
  return l.wait(max_s);
}

std::vector<std::string> rank_cmd(int n, std::vector<std::string> rank_args, std::vector<std::string> opts = {}) {
  std::vector<std::string> args{"-n", std::to_string(n)};
  args.insert(args.end(), opts.begin(), opts.end());
  args.push_back("--");
  args.push_back(WEFT_TEST_RANK_PATH);
  args.insert(args.end(), rank_args.begin(), rank_args.end());
  return args;
}

// pid of each rank, from "test_rank: rank R pid P pgid G ready" lines.
std::map<int, pid_t> rank_pids(const std::string& out) {
  std::map<int, pid_t> m;
  static const std::regex re(R"(test_rank: rank (\d+) pid (\d+) pgid (\d+) ready)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it) {
    m[std::stoi((*it)[1])] = static_cast<pid_t>(std::stol((*it)[2]));
    EXPECT_EQ((*it)[2], (*it)[3]) << "each rank should lead its own process group";
  }
  return m;
}

// pid of each rank's grandchild, from "test_rank: rank R grandchild pid P" lines.
std::map<int, pid_t> grandchild_pids(const std::string& out) {
  std::map<int, pid_t> m;
  static const std::regex re(R"(test_rank: rank (\d+) grandchild pid (\d+))");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator(); ++it)
    m[std::stoi((*it)[1])] = static_cast<pid_t>(std::stol((*it)[2]));
  return m;
}

std::vector<pid_t> values(const std::map<int, pid_t>& m) {
  std::vector<pid_t> v;
  for (const auto& [k, p] : m) v.push_back(p);
  return v;
}

std::function<bool(const std::string&)> ready_count(int n) {
  return [n](const std::string& out) { return static_cast<int>(rank_pids(out).size()) >= n; };
}

struct EnvLine {
  std::map<std::string, std::string> kv;
  int i(const std::string& k) const { return std::stoi(kv.at(k)); }
};

std::vector<EnvLine> env_lines(const std::string& out) {
  std::vector<EnvLine> lines;
  std::istringstream is(out);
  std::string line;
  while (std::getline(is, line)) {
    if (line.rfind("test_rank: rank=", 0) != 0) continue;
    EnvLine e;
    std::istringstream ls(line.substr(std::strlen("test_rank: ")));
    std::string tok;
    while (ls >> tok) {
      auto eq = tok.find('=');
      if (eq != std::string::npos) e.kv[tok.substr(0, eq)] = tok.substr(eq + 1);
    }
    lines.push_back(e);
  }
  return lines;
}

}  // namespace

TEST(Weftrun, AllRanksSucceedWithTheirLaunchEnvironment) {
  Result r = run_weftrun(rank_cmd(3, {"--print-env"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto lines = env_lines(r.output);
  ASSERT_EQ(lines.size(), 3u) << r.output;
  std::set<int> ranks;
  std::set<std::string> jobs, ports;
  for (const auto& e : lines) {
    ranks.insert(e.i("rank"));
    EXPECT_EQ(e.i("world"), 3);
    EXPECT_EQ(e.i("local_rank"), e.i("rank"));
    EXPECT_EQ(e.i("local_world"), 3);
    EXPECT_EQ(e.i("node"), 0);
    EXPECT_EQ(e.kv.at("launcher"), "weftrun");
    EXPECT_EQ(e.kv.at("addr"), "127.0.0.1");
    EXPECT_GT(e.i("port"), 0);
    EXPECT_LT(e.i("port"), 65536);
    EXPECT_TRUE(std::regex_match(e.kv.at("job"), std::regex("[0-9a-f]{8,}"))) << e.kv.at("job");
    EXPECT_EQ(e.kv.at("nvls"), "0");
    EXPECT_EQ(e.kv.at("nvshmem_nvls"), "1");
    EXPECT_EQ(e.kv.at("torch_mc"), "1");
    jobs.insert(e.kv.at("job"));
    ports.insert(e.kv.at("port"));
  }
  EXPECT_EQ(ranks, (std::set<int>{0, 1, 2}));
  EXPECT_EQ(jobs.size(), 1u) << "all ranks share one job id";
  EXPECT_EQ(ports.size(), 1u) << "all ranks share one rendezvous port";
  EXPECT_EQ(r.output.find("weftrun:"), std::string::npos) << "a clean run says nothing: " << r.output;

  // A second job gets another job id.
  Result r2 = run_weftrun(rank_cmd(1, {"--print-env"}));
  auto lines2 = env_lines(r2.output);
  ASSERT_EQ(lines2.size(), 1u) << r2.output;
  EXPECT_NE(lines2[0].kv.at("job"), *jobs.begin());
}

TEST(Weftrun, KeepsPresetVariablesAndHonoursPort) {
  Result r = run_weftrun(rank_cmd(2, {"--print-env"}, {"--port", "23456"}),
                         {{"WEFT_MASTER_ADDR", "127.0.0.2"}, {"NCCL_NVLS_ENABLE", "1"}});
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto lines = env_lines(r.output);
  ASSERT_EQ(lines.size(), 2u) << r.output;
  for (const auto& e : lines) {
    EXPECT_EQ(e.i("port"), 23456);
    EXPECT_EQ(e.kv.at("addr"), "127.0.0.2");
    EXPECT_EQ(e.kv.at("nvls"), "1") << "a variable the user set is left alone";
    EXPECT_EQ(e.kv.at("nvshmem_nvls"), "1");
  }

  Result r2 = run_weftrun(rank_cmd(1, {"--print-env"}), {{"WEFT_MASTER_PORT", "24567"}});
  auto lines2 = env_lines(r2.output);
  ASSERT_EQ(lines2.size(), 1u) << r2.output;
  EXPECT_EQ(lines2[0].i("port"), 24567);
}

TEST(Weftrun, FailingRankExitCodeIsPropagated) {
  Result r = run_weftrun(
      rank_cmd(3, {"--print-pid", "--fail-rank", "1", "--code", "3", "--delay", "0.5", "--sleep", "60"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 3) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  auto pids = rank_pids(r.output);
  ASSERT_EQ(pids.size(), 3u) << r.output;
  EXPECT_NE(r.output.find("weftrun: rank 1 (pid " + std::to_string(pids[1]) +
                          ") exited with code 3; stopping the other 2 rank(s)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(still_alive(values(pids)).empty());
}

TEST(Weftrun, SkippedCode77PassesThrough) {
  Result r = run_weftrun(rank_cmd(2, {"--fail-rank", "all", "--code", "77"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 77) << r.output;
}

TEST(Weftrun, RankKilledBySigkillIsReportedQuickly) {
  Result r = run_weftrun(rank_cmd(
      2, {"--print-pid", "--crash-rank", "1", "--signal", "KILL", "--delay", "0.5", "--sleep", "60"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_EQ(r.exit_code, 128 + SIGKILL) << r.output;
  auto pids = rank_pids(r.output);
  ASSERT_EQ(pids.size(), 2u) << r.output;
  EXPECT_NE(r.output.find("weftrun: rank 1 (pid " + std::to_string(pids[1]) +
                          ") was killed by signal 9 (SIGKILL); stopping the other 1 rank(s)"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(still_alive(values(pids)).empty());
}

TEST(Weftrun, RankCrashWithSegfaultIsReported) {
  Result r = run_weftrun(rank_cmd(2, {"--crash-rank", "0", "--signal", "SEGV", "--sleep", "60"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  EXPECT_EQ(r.exit_code, 128 + SIGSEGV) << r.output;
  EXPECT_NE(r.output.find("weftrun: rank 0 (pid "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("was killed by signal 11 (SIGSEGV)"), std::string::npos) << r.output;
}

TEST(Weftrun, TimeoutStopsTheJobAndNamesRunningRanks) {
  Result r = run_weftrun(rank_cmd(2, {"--print-pid", "--sleep", "60"}, {"--timeout", "1"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_GE(r.seconds, 1.0) << r.output;
  EXPECT_LT(r.seconds, 5) << r.output;
  auto pids = rank_pids(r.output);
  ASSERT_EQ(pids.size(), 2u) << r.output;
  EXPECT_NE(r.output.find("weftrun: timeout after 1 s; still running: rank 0 (pid " +
                          std::to_string(pids[0]) + "), rank 1 (pid " + std::to_string(pids[1]) + ")"),
            std::string::npos)
      << r.output;
  EXPECT_TRUE(still_alive(values(pids)).empty());
}

TEST(Weftrun, SigintStopsAllRanksAndTheirChildren) {
  Launch l(rank_cmd(2, {"--spawn-child", "--print-pid", "--sleep", "60"}));
  ASSERT_TRUE(l.read_until(ready_count(2), 10)) << l.output();
  auto pids = rank_pids(l.output());
  auto kids = grandchild_pids(l.output());
  ASSERT_EQ(kids.size(), 2u) << l.output();
  for (pid_t p : values(pids)) EXPECT_TRUE(process_alive(p));
  auto t0 = Clock::now();
  ASSERT_EQ(kill(l.pid(), SIGINT), 0);
  Result r = l.wait();
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_LT(seconds_since(t0), 5) << r.output;
  EXPECT_EQ(r.exit_code, 130) << r.output;
  EXPECT_NE(r.output.find("weftrun: got SIGINT; stopping 2 running rank(s)"), std::string::npos) << r.output;
  EXPECT_TRUE(still_alive(values(pids)).empty()) << "ranks outlived weftrun";
  EXPECT_TRUE(still_alive(values(kids)).empty()) << "grandchildren outlived weftrun";
  for (pid_t p : values(pids)) EXPECT_NE(kill(-p, 0), 0) << "process group " << p << " still exists";
}

TEST(Weftrun, SigtermExits143) {
  Launch l(rank_cmd(2, {"--print-pid", "--sleep", "60"}));
  ASSERT_TRUE(l.read_until(ready_count(2), 10)) << l.output();
  auto pids = rank_pids(l.output());
  ASSERT_EQ(kill(l.pid(), SIGTERM), 0);
  Result r = l.wait();
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 143) << r.output;
  EXPECT_TRUE(still_alive(values(pids)).empty());
}

TEST(Weftrun, GrandchildrenAreKilledWhenARankFails) {
  Result r = run_weftrun(rank_cmd(
      2, {"--spawn-child", "--print-pid", "--fail-rank", "0", "--code", "5", "--delay", "0.5", "--sleep", "60"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 5) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  auto kids = grandchild_pids(r.output);
  ASSERT_EQ(kids.size(), 2u) << r.output;
  EXPECT_TRUE(still_alive(values(kids)).empty()) << r.output;
}

TEST(Weftrun, LeftoverChildrenAreStoppedAfterSuccess) {
  Result r = run_weftrun(rank_cmd(2, {"--spawn-child"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_LT(r.seconds, 10) << r.output;
  auto kids = grandchild_pids(r.output);
  ASSERT_EQ(kids.size(), 2u) << r.output;
  EXPECT_TRUE(still_alive(values(kids)).empty()) << r.output;
  EXPECT_NE(r.output.find("still running; stopping them"), std::string::npos) << r.output;
}

TEST(Weftrun, SigkillFollowsWhenSigtermIsIgnored) {
  Result r = run_weftrun(rank_cmd(2, {"--ignore-term", "--print-pid", "--sleep", "60"}, {"--timeout", "1"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 124) << r.output;
  EXPECT_GE(r.seconds, 4.0) << "1 s timeout + 3 s grace: " << r.output;
  EXPECT_LT(r.seconds, 9) << r.output;
  EXPECT_NE(r.output.find("is still running 3 s after SIGTERM; sending SIGKILL"), std::string::npos) << r.output;
  EXPECT_TRUE(still_alive(values(rank_pids(r.output))).empty());
}

TEST(Weftrun, RanksDieWhenWeftrunIsKilled) {
  Launch l(rank_cmd(2, {"--print-pid", "--sleep", "60"}));
  ASSERT_TRUE(l.read_until(ready_count(2), 10)) << l.output();
  auto pids = rank_pids(l.output());
  ASSERT_EQ(kill(l.pid(), SIGKILL), 0);
  Result r = l.wait();
  EXPECT_EQ(r.exit_code, 128 + SIGKILL);
  EXPECT_TRUE(still_alive(values(pids), 5.0).empty()) << "PR_SET_PDEATHSIG should have killed the ranks";
}

TEST(Weftrun, BadUsageExits2WithAHelpfulMessage) {
  struct Case {
    std::vector<std::string> args;
    std::string expect;
  };
  const std::string prog = WEFT_TEST_RANK_PATH;
  std::vector<Case> cases = {
      {{}, "missing -n N"},
      {{prog}, "missing -n N"},
      {{"-n"}, "-n needs a value"},
      {{"-n", "0", prog}, "-n expects the number of ranks"},
      {{"-n", "abc", prog}, "(got 'abc')"},
      {{"--nproc=-3", prog}, "--nproc expects the number of ranks"},
      {{"-n", "2"}, "missing the program to run"},
      {{"-n", "2", "--bogus", prog}, "unknown option '--bogus'"},
      {{"-n", "2", "--timeout", "-1", prog}, "--timeout expects a number of seconds"},
      {{"-n", "2", "--timeout", "soon", prog}, "(got 'soon')"},
      {{"-n", "2", "--port", "70000", prog}, "--port expects a TCP port from 1 to 65535"},
      {{"-n", "2", "--tag-output=yes", prog}, "--tag-output takes no value"},
  };
  for (const auto& c : cases) {
    std::string joined;
    for (const auto& a : c.args) joined += " " + a;
    Result r = run_weftrun(c.args, {}, 10);
    EXPECT_EQ(r.exit_code, 2) << "weftrun" << joined << "\n" << r.output;
    EXPECT_NE(r.output.find(c.expect), std::string::npos) << "weftrun" << joined << "\n" << r.output;
    EXPECT_NE(r.output.find("weftrun --help"), std::string::npos) << r.output;
  }
  Result help = run_weftrun({"--help"}, {}, 10);
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_NE(help.output.find("usage: weftrun -n N"), std::string::npos) << help.output;
}

TEST(Weftrun, MissingProgramExits127) {
  const std::string prog = "/nonexistent/weft-no-such-program";
  Result r = run_weftrun({"-n", "2", prog, "--flag"});
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 127) << r.output;
  EXPECT_NE(r.output.find("weftrun: rank 0 could not start '" + prog + "': No such file or directory"),
            std::string::npos)
      << r.output;
  Result r2 = run_weftrun({"-n", "1", "weft-no-such-program-on-path"});
  EXPECT_EQ(r2.exit_code, 127) << r2.output;
}

TEST(Weftrun, TagOutputPrefixesWholeLines) {
  Result r = run_weftrun(rank_cmd(2, {"--lines", "3"}, {"--tag-output"}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  std::multiset<std::string> lines;
  std::istringstream is(r.output);
  std::string line;
  while (std::getline(is, line)) {
    EXPECT_TRUE(line.rfind("[rank 0] ", 0) == 0 || line.rfind("[rank 1] ", 0) == 0) << "untagged line '" << line
                                                                                  << "' in\n" << r.output;
    lines.insert(line);
  }
  for (int rank = 0; rank < 2; ++rank) {
    std::string tag = "[rank " + std::to_string(rank) + "] ";
    for (int k = 0; k < 3; ++k) {
      EXPECT_EQ(lines.count(tag + "line " + std::to_string(k) + " of rank " + std::to_string(rank)), 1u) << r.output;
      EXPECT_EQ(lines.count(tag + "err " + std::to_string(k) + " of rank " + std::to_string(rank)), 1u) << r.output;
    }
    EXPECT_EQ(lines.count(tag + "partial-apartial-b"), 1u) << "a line written in pieces stays whole\n" << r.output;
    EXPECT_EQ(lines.count(tag + "tail of rank " + std::to_string(rank)), 1u) << r.output;
  }
  EXPECT_EQ(lines.size(), 2u * (3 + 3 + 2)) << r.output;
}

// ---- --share-gpu: ranks sharing a GPU through MPS ------------------------------
// The MPS control program is a stand-in here (tests/cpu/helpers/fake_mps): what
// is tested is weftrun's handling of the daemon - found, started in a private
// directory, given to the ranks, stopped however the job ends - and its refusals.

namespace {

const std::string kFakeMps = WEFT_FAKE_MPS_DIR;

std::map<std::string, std::string> with_fake_mps(std::map<std::string, std::string> env = {}) {
  const char* path = std::getenv("PATH");
  env["PATH"] = kFakeMps + ":" + (path ? path : "/usr/bin:/bin");
  return env;
}

// "started an MPS daemon (pid P, CUDA_MPS_PIPE_DIRECTORY=D)" -> {P, D}
std::pair<pid_t, std::string> started_daemon(const std::string& out) {
  static const std::regex re(R"(started an MPS daemon \(pid (\d+), CUDA_MPS_PIPE_DIRECTORY=([^)]+)\))");
  std::smatch m;
  if (!std::regex_search(out, m, re)) return {-1, ""};
  return {static_cast<pid_t>(std::stol(m[1])), m[2]};
}

bool exists(const std::string& path) { return access(path.c_str(), F_OK) == 0; }

// The ranks print what weftrun gave them, then check the daemon's pipe is there.
const std::string kShowShare =
    "echo \"rank=$WEFT_RANK share=$WEFT_SHARE_GPU pct=$CUDA_MPS_ACTIVE_THREAD_PERCENTAGE "
    "pipe=$CUDA_MPS_PIPE_DIRECTORY\"; test -z \"$CUDA_MPS_PIPE_DIRECTORY\" || test -p \"$CUDA_MPS_PIPE_DIRECTORY/control\"";

}  // namespace

TEST(Weftrun, ShareGpuStartsAnMpsDaemonGivesEachRankItsShareAndStopsIt) {
  Result r = run_weftrun({"-n", "4", "--share-gpu", "--", "sh", "-c", kShowShare},
                         with_fake_mps({{"CUDA_VISIBLE_DEVICES", "0"}}));
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 0) << r.output;
  auto [pid, pipe] = started_daemon(r.output);
  ASSERT_GT(pid, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank)
    EXPECT_NE(r.output.find("rank=" + std::to_string(rank) + " share=mps pct= pipe=" + pipe), std::string::npos)
        << r.output;
  EXPECT_EQ(pipe.rfind("/tmp/weft-mps-", 0), 0u) << pipe;
  EXPECT_TRUE(still_alive({pid}).empty()) << "the daemon weftrun started outlived the job";
  EXPECT_FALSE(exists(pipe)) << "the daemon's private directory was left behind: " << pipe;
}

TEST(Weftrun, ARankKilledUnderSharedGpusStopsTheOthersAndTheDaemonWithin10s) {
  const std::string script = "if [ \"$WEFT_RANK\" = 1 ]; then sleep 1; kill -9 $$; fi; sleep 60";
  Result r = run_weftrun({"-n", "4", "--share-gpu", "--", "sh", "-c", script},
                         with_fake_mps({{"CUDA_VISIBLE_DEVICES", "0"}}), 30);
  ASSERT_FALSE(r.hung) << r.output;
  EXPECT_EQ(r.exit_code, 137) << r.output;
  EXPECT_NE(r.output.find("rank 1 (pid"), std::string::npos) << r.output;
  EXPECT_LT(r.seconds, 11.0) << r.output;
  auto [pid, pipe] = started_daemon(r.output);
  ASSERT_GT(pid, 0) << r.output;
  EXPECT_TRUE(still_alive({pid}).empty()) << "the daemon weftrun started outlived the job";
  EXPECT_FALSE(exists(pipe)) << pipe;
}

TEST(Weftrun, ShareGpuUsesAnMpsDaemonAlreadyRunningAndLeavesItRunning) {
  char tmpl[] = "/tmp/weft-test-mps-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::string dir = tmpl;
  pid_t daemon = fork();
  if (daemon == 0) {
    setenv("CUDA_MPS_PIPE_DIRECTORY", dir.c_str(), 1);
    const std::string prog = kFakeMps + "/nvidia-cuda-mps-control";
    execl(prog.c_str(), prog.c_str(), "-f", static_cast<char*>(nullptr));
    _exit(127);
  }
  for (int i = 0; i < 200 && !exists(dir + "/daemon.pid"); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  Result r = run_weftrun({"-n", "2", "--share-gpu", "--", "sh", "-c", kShowShare},
                         with_fake_mps({{"CUDA_VISIBLE_DEVICES", "0"}, {"CUDA_MPS_PIPE_DIRECTORY", dir}}));
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("using the MPS daemon already running at CUDA_MPS_PIPE_DIRECTORY=" + dir), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("rank=1 share=mps pct= pipe=" + dir), std::string::npos) << r.output;
  EXPECT_TRUE(process_alive(daemon)) << "weftrun stopped a daemon it did not start";
  kill(daemon, SIGKILL);
  waitpid(daemon, nullptr, 0);
  std::string cleanup = "rm -rf " + dir;
  EXPECT_EQ(std::system(cleanup.c_str()), 0);
}

TEST(Weftrun, ShareGpuRefusesPlainlyWhatCannotRun) {
  // No GPU visible.
  Result none = run_weftrun({"-n", "2", "--share-gpu", "--", "true"}, with_fake_mps({{"CUDA_VISIBLE_DEVICES", ""}}), 10);
  EXPECT_EQ(none.exit_code, 1) << none.output;
  EXPECT_NE(none.output.find("--share-gpu: no NVIDIA GPU is visible"), std::string::npos) << none.output;
  // No MPS on PATH, and time slicing not asked for.
  Result no_mps = run_weftrun({"-n", "2", "--share-gpu", "--", "true"},
                              {{"CUDA_VISIBLE_DEVICES", "0"}, {"PATH", "/nonexistent-weft-path"}}, 10);
  EXPECT_EQ(no_mps.exit_code, 1) << no_mps.output;
  EXPECT_NE(no_mps.output.find("nvidia-cuda-mps-control is not on PATH"), std::string::npos) << no_mps.output;
  EXPECT_NE(no_mps.output.find("--share-gpu=timeslice"), std::string::npos) << no_mps.output;
  // A bad way.
  Result bad = run_weftrun({"-n", "2", "--share-gpu=often", "--", "true"}, {}, 10);
  EXPECT_EQ(bad.exit_code, 2) << bad.output;
  EXPECT_NE(bad.output.find("--share-gpu takes =mps (the default) or =timeslice"), std::string::npos) << bad.output;
  // Ranks that do not divide evenly over the GPUs (where two are visible: always without a driver).
  if (weft::count_visible_gpus("0,1").count == 2) {
    Result uneven = run_weftrun({"-n", "3", "--share-gpu", "--", "true"},
                                with_fake_mps({{"CUDA_VISIBLE_DEVICES", "0,1"}}), 10);
    EXPECT_EQ(uneven.exit_code, 2) << uneven.output;
    EXPECT_NE(uneven.output.find("3 ranks do not divide evenly over the 2 visible GPUs"), std::string::npos)
        << uneven.output;
  }
  // Another user's daemon (a pipe owned by someone else: needs root to make).
  if (geteuid() == 0) {
    char tmpl[] = "/tmp/weft-test-mps-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    const std::string control = std::string(tmpl) + "/control";
    ASSERT_EQ(mkfifo(control.c_str(), 0600), 0);
    ASSERT_EQ(chown(control.c_str(), 65534, 65534), 0);
    Result other = run_weftrun({"-n", "2", "--share-gpu", "--", "true"},
                               with_fake_mps({{"CUDA_VISIBLE_DEVICES", "0"}, {"CUDA_MPS_PIPE_DIRECTORY", tmpl}}), 10);
    EXPECT_EQ(other.exit_code, 1) << other.output;
    EXPECT_NE(other.output.find("an MPS daemon of another user (uid 65534)"), std::string::npos) << other.output;
    EXPECT_NE(other.output.find("CUDA_MPS_PIPE_DIRECTORY"), std::string::npos) << other.output;
    std::string cleanup = std::string("rm -rf ") + tmpl;
    EXPECT_EQ(std::system(cleanup.c_str()), 0);
  }
}

TEST(Weftrun, ShareGpuByTimeSlicingNeedsNoDaemonAndSaysWhatItCosts) {
  Result r = run_weftrun({"-n", "2", "--share-gpu=timeslice", "--", "sh", "-c", kShowShare},
                         {{"CUDA_VISIBLE_DEVICES", "0"}}, 10);
  EXPECT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("rank=1 share=timeslice pct= pipe="), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("each wait on another rank costs milliseconds"), std::string::npos) << r.output;
}
