// weft_test_rank - a stand-in rank program for testing weftrun (tests/cpu/test_weftrun.cpp).
//
//   weft_test_rank [options]      (run as: weftrun -n N weft_test_rank [options])
//
// What every rank does, in this order (each step only when asked for):
//   --ignore-term          ignore SIGTERM (so only weftrun's SIGKILL can stop it)
//   --print-env            print one line "test_rank: rank=R world=W local_rank=L local_world=LW
//                          node=N launcher=X addr=A port=P job=J nvls=... nvshmem_nvls=...
//                          torch_mc=..." from weft::detect_launch_env, then "test_rank: rank R: <describe>"
//   --spawn-child          fork a grandchild (same process group) that sleeps forever; print
//                          "test_rank: rank R grandchild pid P"
//   --print-pid            print "test_rank: rank R pid P pgid G ready"
//   --lines K              print K lines to stdout ("line k of rank R") and stderr ("err k of rank R"),
//                          one line written in two pieces ("partial-a" + "partial-b"), and a last
//                          unterminated "tail of rank R"
//   --fail-rank R|all --code C   rank R (or every rank) exits with code C after --delay S seconds
//   --crash-rank R [--signal KILL|SEGV|ABRT]   rank R kills itself with the signal after --delay S
//   --sleep S              sleep S seconds (fractions allowed), then exit 0
// Unknown arguments exit 2. The rank comes from the launch environment (WEFT_RANK, ...).
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <string>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/launch_env.hpp"

namespace {

void sleep_seconds(double s) {
  if (s <= 0) return;
  timespec ts;
  ts.tv_sec = static_cast<time_t>(s);
  ts.tv_nsec = static_cast<long>((s - static_cast<double>(ts.tv_sec)) * 1e9);
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
  }
}

[[noreturn]] void bad_usage(const std::string& msg) {
  std::fprintf(stderr, "weft_test_rank: %s\n", msg.c_str());
  std::exit(2);
}

int signal_from_name(const std::string& name) {
  if (name == "KILL" || name == "SIGKILL" || name == "9") return SIGKILL;
  if (name == "SEGV" || name == "SIGSEGV" || name == "11") return SIGSEGV;
  if (name == "ABRT" || name == "SIGABRT" || name == "6") return SIGABRT;
  bad_usage("--signal expects KILL, SEGV or ABRT (got '" + name + "')");
}

const char* env_or(const char* name, const char* fallback) {
  const char* v = std::getenv(name);
  return v ? v : fallback;
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  for (int i = 1; i < argc; ++i)  // first of all, so no SIGTERM can arrive before it holds
    if (std::strcmp(argv[i], "--ignore-term") == 0) signal(SIGTERM, SIG_IGN);
  bool print_env = false, print_pid = false, spawn_child = false;
  int lines = 0;
  std::string fail_rank, crash_rank;  // "" = none; a number or "all"
  int code = 1;
  int crash_signal = SIGKILL;
  double delay = 0, sleep_s = 0;

  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) bad_usage(a + " needs a value");
      return argv[++i];
    };
    if (a == "--print-env") print_env = true;
    else if (a == "--print-pid") print_pid = true;
    else if (a == "--spawn-child") spawn_child = true;
    else if (a == "--ignore-term") continue;  // done above
    else if (a == "--lines") lines = std::atoi(value().c_str());
    else if (a == "--fail-rank") fail_rank = value();
    else if (a == "--code") code = std::atoi(value().c_str());
    else if (a == "--crash-rank") crash_rank = value();
    else if (a == "--signal") crash_signal = signal_from_name(value());
    else if (a == "--delay") delay = std::atof(value().c_str());
    else if (a == "--sleep") sleep_s = std::atof(value().c_str());
    else bad_usage("unknown argument '" + a + "'");
  }

  weft::LaunchEnv le;
  try {
    le = weft::detect_launch_env(weft::process_env());
  } catch (const weft::Error& e) {
    std::fprintf(stderr, "test_rank: cannot read the launch environment: %s\n", e.what());
    return 3;
  }
  const int rank = le.rank;
  auto is_me = [&](const std::string& which) {
    return !which.empty() && (which == "all" || std::atoi(which.c_str()) == rank);
  };

  if (print_env) {
    std::printf(
        "test_rank: rank=%d world=%d local_rank=%d local_world=%d node=%d launcher=%s addr=%s "
        "port=%d job=%s nvls=%s nvshmem_nvls=%s torch_mc=%s\n",
        le.rank, le.world_size, le.local_rank, le.local_world_size, le.node_rank, le.launcher.c_str(),
        le.master_addr.c_str(), le.master_port, env_or("WEFT_JOB_ID", "-"), env_or("NCCL_NVLS_ENABLE", "-"),
        env_or("NVSHMEM_DISABLE_NVLS", "-"), env_or("TORCH_SYMM_MEM_DISABLE_MULTICAST", "-"));
    std::printf("test_rank: rank %d: %s\n", rank, weft::describe(le).c_str());
  }

  if (spawn_child) {
    std::fflush(nullptr);
    pid_t child = fork();
    if (child < 0) {
      std::perror("test_rank: fork");
      return 4;
    }
    if (child == 0) {
      // Let go of the output pipes, so a leak shows up as a live pid, not a hung reader.
      std::freopen("/dev/null", "w", stdout);
      std::freopen("/dev/null", "w", stderr);
      for (;;) pause();
    }
    std::printf("test_rank: rank %d grandchild pid %d\n", rank, static_cast<int>(child));
  }

  if (print_pid)
    std::printf("test_rank: rank %d pid %d pgid %d ready\n", rank, static_cast<int>(getpid()),
                static_cast<int>(getpgrp()));

  if (lines > 0) {
    for (int k = 0; k < lines; ++k) {
      std::printf("line %d of rank %d\n", k, rank);
      std::fprintf(stderr, "err %d of rank %d\n", k, rank);
    }
    std::printf("partial-a");
    std::fflush(stdout);
    sleep_seconds(0.05);
    std::printf("partial-b\n");
    std::printf("tail of rank %d", rank);
    std::fflush(stdout);
  }

  if (is_me(fail_rank)) {
    sleep_seconds(delay);
    std::printf("test_rank: rank %d exits with code %d\n", rank, code);
    std::fflush(nullptr);
    return code;
  }
  if (is_me(crash_rank)) {
    sleep_seconds(delay);
    std::printf("test_rank: rank %d raises signal %d\n", rank, crash_signal);
    std::fflush(nullptr);
    rlimit no_core{0, 0};
    setrlimit(RLIMIT_CORE, &no_core);  // no core files in the test's directory
    signal(crash_signal, SIG_DFL);
    raise(crash_signal);
    return 5;  // not reached
  }

  sleep_seconds(sleep_s);
  return 0;
}
