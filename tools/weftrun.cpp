// weftrun - starts the ranks of a weft job on this node, one process per GPU.
//
//   weftrun -n N [--share-gpu[=WAY]] [--timeout S] [--port P] [--tag-output] [--] program [args...]
//
//   -n, --nproc N     number of ranks to start (required, at least 1); rank i uses GPU i
//   --share-gpu[=WAY] run more ranks than GPUs: rank i uses GPU i % G, N a multiple of G.
//                     WAY mps (the default): through NVIDIA MPS - a daemon already running for
//                     this user, or one weftrun starts in a private directory and stops when the
//                     job ends; each rank then sizes the grids of its waiting kernels from
//                     its share of the GPU's SMs.
//                     WAY timeslice: without MPS (correct, but each wait on another rank costs
//                     milliseconds). The ranks get WEFT_SHARE_GPU=WAY.
//   --timeout S       stop the job after S seconds (fractions allowed; 0 = no limit)
//   --port P          rendezvous port (WEFT_MASTER_PORT) instead of a free one
//   --tag-output      prefix every line a rank prints (stdout and stderr) with "[rank i] "
//   -h, --help        this text
//
// Every rank i gets in its environment:
//   WEFT_RANK=i  WEFT_WORLD_SIZE=N  WEFT_LOCAL_RANK=i  WEFT_LOCAL_WORLD_SIZE=N  WEFT_NODE_RANK=0
//   WEFT_MASTER_ADDR  kept if already set, else 127.0.0.1
//   WEFT_MASTER_PORT  --port P if given, else kept if already set, else a free TCP port
//                     (found by binding port 0)
//   WEFT_JOB_ID       a fresh random hex token, the same for every rank of the job
//   NCCL_NVLS_ENABLE=0, NVSHMEM_DISABLE_NVLS=1, TORCH_SYMM_MEM_DISABLE_MULTICAST=1
//                     unless already set: NVLink multicast must never be used on our machines.
//   with --share-gpu: WEFT_SHARE_GPU, and for a daemon weftrun started,
//                     CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY.
//
// Each rank leads its own process group, so weftrun can stop a rank together with
// every process it started; ranks die with weftrun (PR_SET_PDEATHSIG) if weftrun
// is killed outright. When stdin is not a terminal rank 0 inherits it; every other
// rank (all of them when stdin is a terminal) reads /dev/null.
//
// When a rank fails (non-zero exit or killed by a signal), on --timeout, or when
// weftrun gets SIGINT/SIGTERM/SIGHUP/SIGQUIT, weftrun says why, sends SIGTERM to every
// rank's process group, SIGKILL 3 s later to whatever is left (at once on a second
// Ctrl-C), and exits. Processes that a rank leaves behind in its group are stopped
// the same way when the job ends.
//
// An MPS daemon that weftrun started is stopped ("quit", then SIGKILL to its
// process group after 5 s) once every rank is gone, however the job ended, and
// its directory removed; if weftrun itself is killed outright the daemon gets
// SIGTERM (PR_SET_PDEATHSIG).
//
// Exit status:
//   0        every rank exited 0
//   c        the first rank to fail exited with code c (77, "skipped", passes through)
//   128+s    the first rank to fail was killed by signal s (137 = SIGKILL, 139 = SIGSEGV)
//   124      --timeout expired
//   127      a rank could not be started because the program was not found
//   126      a rank could not be started for another reason (not executable, ...)
//   128+s    weftrun itself got signal s: 130 SIGINT, 143 SIGTERM, 129 SIGHUP, 131 SIGQUIT
//   2        bad usage
//   1        weftrun itself failed (fork, pipe, ...), or --share-gpu could not be set up
//            (no GPU visible, no MPS, another user's MPS daemon)
//
// Self-contained on purpose: links nothing but libc (weft/runtime/gpu_share.hpp is header-only).

#include <fcntl.h>
#include <ftw.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "weft/runtime/gpu_share.hpp"

extern char** environ;

namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kGrace = std::chrono::seconds(3);    // SIGTERM -> SIGKILL
constexpr auto kGiveUp = std::chrono::seconds(5);   // SIGKILL -> exit regardless
constexpr auto kPoll = std::chrono::milliseconds(50);
constexpr int kMaxRanks = 1024;
constexpr std::size_t kMaxLine = 1 << 20;  // longer "lines" are split when tagging
constexpr int kExitUsage = 2;
constexpr int kExitTimeout = 124;

const char* kUsage =
    "usage: weftrun -n N [--share-gpu[=mps|timeslice]] [--timeout S] [--port P] [--tag-output]\n"
    "               [--] program [args...]\n"
    "\n"
    "Starts N ranks of program on this node, one per GPU (rank i uses GPU i).\n"
    "\n"
    "  -n, --nproc N   number of ranks (required, at least 1)\n"
    "  --share-gpu     run more ranks than GPUs, N a multiple of the G GPUs: rank i uses GPU i % G,\n"
    "                  through NVIDIA MPS (a daemon of yours already running, or one weftrun starts\n"
    "                  and stops); each rank's waiting kernels keep to its share of the SMs.\n"
    "                  For correctness runs: times on a shared GPU are not performance figures.\n"
    "  --share-gpu=timeslice  the same without MPS: correct, but each wait on another rank costs\n"
    "                  milliseconds\n"
    "  --timeout S     stop the job after S seconds and exit 124 (fractions allowed; 0 = none)\n"
    "  --port P        rendezvous port (WEFT_MASTER_PORT); default: a free port\n"
    "  --tag-output    prefix each line of output with \"[rank i] \"\n"
    "  -h, --help      show this text\n"
    "\n"
    "Sets WEFT_RANK, WEFT_WORLD_SIZE, WEFT_LOCAL_RANK, WEFT_LOCAL_WORLD_SIZE, WEFT_NODE_RANK,\n"
    "WEFT_MASTER_ADDR, WEFT_MASTER_PORT, WEFT_JOB_ID, and (unless set) NCCL_NVLS_ENABLE=0,\n"
    "NVSHMEM_DISABLE_NVLS=1, TORCH_SYMM_MEM_DISABLE_MULTICAST=1.\n"
    "\n"
    "With --share-gpu also WEFT_SHARE_GPU and, for a daemon weftrun starts,\n"
    "CUDA_MPS_PIPE_DIRECTORY and CUDA_MPS_LOG_DIRECTORY.\n"
    "\n"
    "Exit status: 0 all ranks succeeded; the first failing rank's code (128+signal if it\n"
    "was killed); 124 timeout; 127/126 program could not be started; 130/143 weftrun got\n"
    "SIGINT/SIGTERM; 2 bad usage; 1 weftrun failed (or --share-gpu could not be set up).\n";

// ---- output -----------------------------------------------------------------

bool g_broken[3] = {false, false, false};  // stdout/stderr whose reader went away

void write_all(int fd, const char* p, std::size_t n) {
  if (fd >= 0 && fd <= 2 && g_broken[fd]) return;
  while (n > 0) {
    ssize_t w = write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
    } else if (w < 0 && errno == EINTR) {
      continue;
    } else if (w < 0 && errno == EAGAIN) {
      pollfd pfd{fd, POLLOUT, 0};
      poll(&pfd, 1, 100);
    } else {
      if (fd >= 0 && fd <= 2) g_broken[fd] = true;
      return;
    }
  }
}
void write_all(int fd, const std::string& s) { write_all(fd, s.data(), s.size()); }

// One message from weftrun itself, written to stderr in one piece.
void say(const std::string& msg) { write_all(2, "weftrun: " + msg + "\n"); }

[[noreturn]] void usage_error(const std::string& msg) {
  write_all(2, "weftrun: " + msg + "\nRun 'weftrun --help' for usage.\n");
  std::exit(kExitUsage);
}

const char* signal_name(int sig) {
  switch (sig) {
    case SIGHUP: return "SIGHUP";
    case SIGINT: return "SIGINT";
    case SIGQUIT: return "SIGQUIT";
    case SIGILL: return "SIGILL";
    case SIGTRAP: return "SIGTRAP";
    case SIGABRT: return "SIGABRT";
    case SIGBUS: return "SIGBUS";
    case SIGFPE: return "SIGFPE";
    case SIGKILL: return "SIGKILL";
    case SIGUSR1: return "SIGUSR1";
    case SIGSEGV: return "SIGSEGV";
    case SIGUSR2: return "SIGUSR2";
    case SIGPIPE: return "SIGPIPE";
    case SIGALRM: return "SIGALRM";
    case SIGTERM: return "SIGTERM";
    case SIGCHLD: return "SIGCHLD";
    case SIGCONT: return "SIGCONT";
    case SIGSTOP: return "SIGSTOP";
    case SIGTSTP: return "SIGTSTP";
    case SIGTTIN: return "SIGTTIN";
    case SIGTTOU: return "SIGTTOU";
    case SIGURG: return "SIGURG";
    case SIGXCPU: return "SIGXCPU";
    case SIGXFSZ: return "SIGXFSZ";
    case SIGVTALRM: return "SIGVTALRM";
    case SIGPROF: return "SIGPROF";
    case SIGWINCH: return "SIGWINCH";
    case SIGIO: return "SIGIO";
    case SIGSYS: return "SIGSYS";
#ifdef SIGSTKFLT
    case SIGSTKFLT: return "SIGSTKFLT";
#endif
#ifdef SIGPWR
    case SIGPWR: return "SIGPWR";
#endif
    default: return "unknown signal";
  }
}

// "exited with code 3" / "was killed by signal 9 (SIGKILL)"
std::string describe_status(int status) {
  if (WIFEXITED(status)) {
    std::string s = "exited with code " + std::to_string(WEXITSTATUS(status));
    if (WEXITSTATUS(status) == 77) s += " (skipped)";
    return s;
  }
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    std::string s = "was killed by signal " + std::to_string(sig) + " (" + signal_name(sig) + ")";
    if (WCOREDUMP(status)) s += ", core dumped";
    return s;
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string format_seconds(double s) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", s);
  return buf;
}

// ---- options ------------------------------------------------------------------

struct Options {
  int nproc = 0;
  weft::GpuSharing share = weft::GpuSharing::off;  // --share-gpu
  double timeout = 0;  // seconds; 0 = none
  int port = 0;        // 0 = WEFT_MASTER_PORT or a free one
  bool tag_output = false;
  std::vector<std::string> program;  // program and its arguments
};

bool parse_long(const std::string& s, long lo, long hi, long* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_seconds(const std::string& s, double* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(s.c_str(), &end);
  if (errno != 0 || *end != '\0' || !std::isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

Options parse_args(int argc, char** argv) {
  Options o;
  bool have_n = false;
  int i = 1;
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--") {
      ++i;
      break;
    }
    if (arg.size() < 2 || arg[0] != '-') break;  // the program
    std::string name = arg, value;
    bool inline_value = false;
    if (arg.rfind("--", 0) == 0) {
      auto eq = arg.find('=');
      if (eq != std::string::npos) {
        name = arg.substr(0, eq);
        value = arg.substr(eq + 1);
        inline_value = true;
      }
    } else if (arg.size() > 2) {  // -n4
      name = arg.substr(0, 2);
      value = arg.substr(2);
      inline_value = true;
    }
    auto take = [&](const char* what) -> std::string {
      if (inline_value) return value;
      if (i + 1 >= argc) usage_error(name + " needs a value: " + what);
      return argv[++i];
    };
    auto no_value = [&] {
      if (inline_value) usage_error(name + " takes no value (got '" + arg + "')");
    };
    if (name == "-h" || name == "--help") {
      no_value();
      write_all(1, kUsage);
      std::exit(0);
    } else if (name == "-n" || name == "--nproc") {
      std::string v = take("the number of ranks, e.g. -n 2");
      long n = 0;
      if (!parse_long(v, 1, kMaxRanks, &n))
        usage_error(name + " expects the number of ranks, a whole number from 1 to " +
                    std::to_string(kMaxRanks) + " (got '" + v + "')");
      o.nproc = static_cast<int>(n);
      have_n = true;
    } else if (name == "--timeout") {
      std::string v = take("seconds, e.g. --timeout 600 (0 = no limit)");
      if (!parse_seconds(v, &o.timeout))
        usage_error("--timeout expects a number of seconds >= 0, fractions allowed, 0 = no limit (got '" +
                    v + "')");
    } else if (name == "--port") {
      std::string v = take("a TCP port, e.g. --port 29517");
      long p = 0;
      if (!parse_long(v, 1, 65535, &p)) usage_error("--port expects a TCP port from 1 to 65535 (got '" + v + "')");
      o.port = static_cast<int>(p);
    } else if (name == "--tag-output") {
      no_value();
      o.tag_output = true;
    } else if (name == "--share-gpu") {
      // Only the inline form takes a value, so "--share-gpu program" stays unambiguous.
      auto way = inline_value ? weft::parse_gpu_sharing(value) : std::optional(weft::GpuSharing::mps);
      if (!way || (*way != weft::GpuSharing::mps && *way != weft::GpuSharing::timeslice))
        usage_error("--share-gpu takes =mps (the default) or =timeslice (got '" + arg + "')");
      o.share = *way;
    } else {
      usage_error("unknown option '" + arg +
                  "' (expected -n N, --share-gpu, --timeout S, --port P, --tag-output or -h; put '--' "
                  "before a program whose name starts with '-')");
    }
  }
  for (; i < argc; ++i) o.program.emplace_back(argv[i]);
  if (!have_n) usage_error("missing -n N (or --nproc N): the number of ranks to start, at least 1");
  if (o.program.empty())
    usage_error("missing the program to run: weftrun -n N [options] [--] program [args...]");
  return o;
}

// ---- environment ----------------------------------------------------------------

using EnvList = std::vector<std::string>;  // "NAME=value"

std::optional<std::string> env_get(const EnvList& env, const std::string& name) {
  for (const auto& kv : env)
    if (kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 && kv[name.size()] == '=')
      return kv.substr(name.size() + 1);
  return std::nullopt;
}

void env_set(EnvList& env, const std::string& name, const std::string& value, bool overwrite = true) {
  for (auto& kv : env) {
    if (kv.size() > name.size() && kv.compare(0, name.size(), name) == 0 && kv[name.size()] == '=') {
      if (overwrite) kv = name + "=" + value;
      return;
    }
  }
  env.push_back(name + "=" + value);
}

std::string random_job_id() {
  unsigned char bytes[8];
  std::size_t got = 0;
  while (got < sizeof bytes) {
    ssize_t n = getrandom(bytes + got, sizeof bytes - got, 0);
    if (n > 0) got += static_cast<std::size_t>(n);
    else if (errno != EINTR) break;
  }
  if (got < sizeof bytes) {  // no getrandom: mix time and pid
    auto t = static_cast<unsigned long long>(Clock::now().time_since_epoch().count());
    t ^= static_cast<unsigned long long>(getpid()) << 32;
    for (auto& b : bytes) {
      t = t * 6364136223846793005ULL + 1442695040888963407ULL;
      b = static_cast<unsigned char>(t >> 56);
    }
  }
  static const char* hex = "0123456789abcdef";
  std::string s;
  for (unsigned char b : bytes) {
    s += hex[b >> 4];
    s += hex[b & 15];
  }
  return s;
}

// A TCP port that is free right now: bind port 0 and ask which one the kernel picked.
int find_free_port() {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return -1;
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = 0;
  socklen_t len = sizeof addr;
  int port = -1;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len) == 0)
    port = ntohs(addr.sin_port);
  close(fd);
  return port;
}

// ---- ranks sharing GPUs (--share-gpu) -----------------------------------------------

// The full path of `name` on PATH, or "" if it is not there.
std::string find_in_path(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= dirs.size()) {
    std::size_t end = dirs.find(':', start);
    if (end == std::string::npos) end = dirs.size();
    std::string dir = dirs.substr(start, end - start);
    std::string full = (dir.empty() ? "." : dir) + "/" + name;
    if (access(full.c_str(), X_OK) == 0) return full;
    start = end + 1;
  }
  return "";
}

// In a child about to exec a helper: the signals weftrun blocks (to read them
// from its signalfd) and SIGPIPE, which it ignores, back to their defaults, so
// the helper can be stopped (SIGTERM) and sees broken pipes.
void restore_signals_for_exec() {
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  signal(SIGPIPE, SIG_DFL);
}

struct Ran {
  int code = -1;       // exit code; -1 when it had to be killed at the limit or could not start
  std::string output;  // stdout and stderr together
};

// Runs argv with `env` and `input` on stdin, in a process group of its own,
// collecting its output; SIGKILLs the group at `limit`. Not for the ranks: the
// caller must not be reaping children with waitpid(-1) meanwhile.
Ran run_bounded(const std::vector<std::string>& args, const EnvList& env, const std::string& input,
                std::chrono::milliseconds limit) {
  Ran r;
  int in_pipe[2], out_pipe[2];
  if (pipe2(in_pipe, O_CLOEXEC) != 0) return r;
  if (pipe2(out_pipe, O_CLOEXEC) != 0) {
    close(in_pipe[0]);
    close(in_pipe[1]);
    return r;
  }
  std::vector<char*> argv, envp;
  std::vector<std::string> a = args, e = env;
  for (auto& x : a) argv.push_back(x.data());
  argv.push_back(nullptr);
  for (auto& x : e) envp.push_back(x.data());
  envp.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    restore_signals_for_exec();
    dup2(in_pipe[0], 0);
    dup2(out_pipe[1], 1);
    dup2(out_pipe[1], 2);
    execve(argv[0], argv.data(), envp.data());
    _exit(127);
  }
  close(in_pipe[0]);
  close(out_pipe[1]);
  if (pid < 0) {
    close(in_pipe[1]);
    close(out_pipe[0]);
    return r;
  }
  write_all(in_pipe[1], input);
  close(in_pipe[1]);
  const auto deadline = Clock::now() + limit;
  bool open = true, done = false;
  int status = 0;
  while (!done) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) break;
    if (open) {
      pollfd pfd{out_pipe[0], POLLIN, 0};
      if (poll(&pfd, 1, static_cast<int>(std::min<long long>(left, 50))) > 0) {
        char buf[4096];
        ssize_t n = read(out_pipe[0], buf, sizeof buf);
        if (n > 0) r.output.append(buf, static_cast<std::size_t>(n));
        else if (n == 0 || errno != EINTR) open = false;
      }
    } else {
      usleep(20000);
    }
    pid_t w = waitpid(pid, &status, WNOHANG);
    done = w == pid;
  }
  if (!done) {
    kill(-pid, SIGKILL);
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
  } else {
    r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  }
  close(out_pipe[0]);
  return r;
}

// Removes a directory tree (the private MPS directory: pipes, sockets, logs).
void remove_tree(const std::string& dir) {
  nftw(dir.c_str(), [](const char* p, const struct stat*, int, FTW*) { return remove(p); }, 16, FTW_DEPTH | FTW_PHYS);
}

// The MPS control daemon of a --share-gpu job: one of this user's that is
// already running (used, never stopped), or one weftrun starts in a private
// directory and stops when the job ends.
class MpsDaemon {
 public:
  // Finds or starts the daemon; on failure returns a message saying what to do.
  std::string start(const EnvList& env) {
    control_ = find_in_path("nvidia-cuda-mps-control");
    if (control_.empty())
      return "sharing a GPU needs NVIDIA MPS, but nvidia-cuda-mps-control is not on PATH (it comes with the "
             "NVIDIA driver's utilities). Install it, or pass --share-gpu=timeslice to share GPUs without MPS "
             "(correct, but each wait on another rank costs milliseconds).";
    // A daemon already serving this user's pipe directory is used as it is.
    const auto set_dir = env_get(env, "CUDA_MPS_PIPE_DIRECTORY");
    const std::string pipe_dir = weft::mps_pipe_directory(set_dir ? set_dir->c_str() : nullptr);
    struct stat st{};
    if (stat((pipe_dir + "/control").c_str(), &st) == 0) {
      if (st.st_uid != geteuid())
        return "an MPS daemon of another user (uid " + std::to_string(st.st_uid) + ") serves " + pipe_dir +
               ", and MPS serves one user at a time. Set CUDA_MPS_PIPE_DIRECTORY to a directory of your own "
               "(weftrun then starts a daemon of yours there, if that user's daemon is not holding the GPUs), "
               "or run the job as that user.";
      EnvList probe_env = env;
      env_set(probe_env, "CUDA_MPS_PIPE_DIRECTORY", pipe_dir);
      if (run_bounded({control_}, probe_env, "get_server_list\n", std::chrono::seconds(5)).code == 0) {
        say("--share-gpu: using the MPS daemon already running at CUDA_MPS_PIPE_DIRECTORY=" + pipe_dir);
        return "";
      }
    }
    // Start one of our own: pipe and log directories private to this job.
    char tmpl[] = "/tmp/weft-mps-XXXXXX";
    if (!mkdtemp(tmpl)) return std::string("cannot create a directory for the MPS daemon: ") + std::strerror(errno);
    dir_ = tmpl;
    const std::string pipes = dir_ + "/pipe", logs = dir_ + "/log";
    if (mkdir(pipes.c_str(), 0700) != 0 || mkdir(logs.c_str(), 0700) != 0) {
      std::string why = std::strerror(errno);
      remove_tree(dir_);
      dir_.clear();
      return "cannot create the MPS daemon's directories in " + std::string(tmpl) + ": " + why;
    }
    env_ = env;
    env_set(env_, "CUDA_MPS_PIPE_DIRECTORY", pipes);
    env_set(env_, "CUDA_MPS_LOG_DIRECTORY", logs);
    std::vector<std::string> args = {control_, "-f"};  // in the foreground: weftrun holds its pid
    std::vector<char*> argv, envp;
    for (auto& x : args) argv.push_back(x.data());
    argv.push_back(nullptr);
    for (auto& x : env_) envp.push_back(x.data());
    envp.push_back(nullptr);
    const std::string out = logs + "/weftrun-daemon.out";
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
      setpgid(0, 0);
      restore_signals_for_exec();
      prctl(PR_SET_PDEATHSIG, SIGTERM, 0, 0, 0);  // weftrun killed outright: the daemon goes too
      if (getppid() != parent) _exit(1);
      int devnull = open("/dev/null", O_RDONLY);
      int log = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
      if (devnull >= 0) dup2(devnull, 0);
      if (log >= 0) {
        dup2(log, 1);
        dup2(log, 2);
      }
      execve(argv[0], argv.data(), envp.data());
      _exit(127);
    }
    if (pid < 0) return std::string("cannot start the MPS daemon: fork failed: ") + std::strerror(errno);
    setpgid(pid, pid);
    pid_ = group_ = pid;
    // Ready once its control pipe exists; a daemon that exits first failed.
    const auto deadline = Clock::now() + std::chrono::seconds(10);
    while (Clock::now() < deadline) {
      if (stat((pipes + "/control").c_str(), &st) == 0) {
        say("--share-gpu: started an MPS daemon (pid " + std::to_string(pid_) + ", CUDA_MPS_PIPE_DIRECTORY=" +
            pipes + "); it stops when the job ends");
        return "";
      }
      int status = 0;
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        std::string log = read_log(out);
        remove_tree(dir_);
        dir_.clear();
        return "the MPS daemon (" + control_ + " -f) " + describe_status(status) + " at start" +
               (log.empty() ? std::string(".") : ": " + log);
      }
      usleep(20000);
    }
    std::string log = read_log(out);
    stop();
    return "the MPS daemon did not open its control pipe within 10 s" + (log.empty() ? std::string(".") : ": " + log);
  }

  // The variables the ranks need to reach our daemon (none for a daemon found running).
  void export_to(EnvList& env) const {
    if (dir_.empty()) return;
    env_set(env, "CUDA_MPS_PIPE_DIRECTORY", *env_get(env_, "CUDA_MPS_PIPE_DIRECTORY"));
    env_set(env, "CUDA_MPS_LOG_DIRECTORY", *env_get(env_, "CUDA_MPS_LOG_DIRECTORY"));
  }

  // Whether `pid` is our daemon; if so it has exited (reaped by the caller).
  bool exited(pid_t pid) {
    if (pid_ <= 0 || pid != pid_) return false;
    pid_ = 0;  // reaped: its group may still need stopping
    return true;
  }

  // Stops a daemon weftrun started ("quit", SIGKILL to its group after 5 s)
  // and removes its directory. Returns "" or what could not be stopped.
  std::string stop() {
    std::string left;
    if (pid_ != -1 && !dir_.empty()) {
      const pid_t group = group_;
      if (pid_ > 0) run_bounded({control_}, env_, "quit\n", std::chrono::seconds(5));
      const auto deadline = Clock::now() + std::chrono::seconds(5);
      while (pid_ > 0 && Clock::now() < deadline) {
        int status = 0;
        if (waitpid(pid_, &status, WNOHANG) == pid_) pid_ = 0;
        else usleep(20000);
      }
      if (kill(-group, 0) == 0) {  // the daemon or its servers are still there
        kill(-group, SIGKILL);
        usleep(200000);
        if (pid_ > 0) {
          int status = 0;
          if (waitpid(pid_, &status, WNOHANG) == pid_) pid_ = 0;
        }
        if (kill(-group, 0) == 0) left = "the MPS daemon's process group " + std::to_string(group) + " survived SIGKILL";
      }
      pid_ = -1;
    }
    if (!dir_.empty()) {
      remove_tree(dir_);
      dir_.clear();
    }
    return left;
  }

 private:
  std::string control_;  // nvidia-cuda-mps-control
  std::string dir_;      // our private directory ("" if we did not start the daemon)
  EnvList env_;          // environment with our pipe and log directories
  pid_t pid_ = -1;       // our daemon: > 0 running, 0 exited (reaped), -1 none
  pid_t group_ = -1;     // its process group

  static std::string read_log(const std::string& path) {
    int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    char buf[2048];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    std::string s = n > 0 ? std::string(buf, static_cast<std::size_t>(n)) : "";
    while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
    return s;
  }
};

// ---- output tagging -----------------------------------------------------------

// Reads one rank's stdout or stderr and writes it, whole lines at a time, with a prefix.
struct Forwarder {
  int fd = -1;   // read end of the rank's pipe; -1 once closed
  int dst = 1;   // weftrun's stdout or stderr
  std::string prefix;
  std::string buf;

  void emit(bool final) {
    std::string out;
    std::size_t start = 0;
    for (;;) {
      auto nl = buf.find('\n', start);
      if (nl == std::string::npos) break;
      out += prefix;
      out.append(buf, start, nl + 1 - start);
      start = nl + 1;
    }
    buf.erase(0, start);
    if (!buf.empty() && (final || buf.size() >= kMaxLine)) {
      out += prefix;
      out += buf;
      out += '\n';
      buf.clear();
    }
    if (!out.empty()) write_all(dst, out);
  }
  void close_now() {
    emit(true);
    if (fd >= 0) close(fd);
    fd = -1;
  }
  void on_readable() {
    char tmp[65536];
    ssize_t n = read(fd, tmp, sizeof tmp);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      close_now();
      return;
    }
    buf.append(tmp, static_cast<std::size_t>(n));
    emit(false);
  }
};

// ---- the job ------------------------------------------------------------------

struct Rank {
  int index = 0;
  pid_t pid = -1;     // also its process group id; -1 if never started
  bool alive = false;
  int status = 0;     // wait status once reaped

  // "rank 1 (pid 1234)"
  std::string label() const {
    std::string s = "rank ";
    s += std::to_string(index);
    s += " (pid ";
    s += std::to_string(pid);
    s += ")";
    return s;
  }
};

class Job {
 public:
  explicit Job(Options o) : opts_(std::move(o)) {}

  int run() {
    start_ = Clock::now();
    setup_signals();
    build_env();
    if (opts_.share != weft::GpuSharing::off) share_gpus();
    spawn_all();
    loop();
    drain();
    stop_sharing();
    return exit_code_;
  }

 private:
  Options opts_;
  EnvList env_;
  std::vector<Rank> ranks_;
  std::vector<Forwarder> fwd_;
  int sigfd_ = -1;
  sigset_t old_mask_{};
  struct sigaction old_pipe_{};
  Clock::time_point start_;
  bool stopping_ = false;
  bool killed_ = false;
  int exit_code_ = 0;
  Clock::time_point kill_at_, give_up_at_;
  MpsDaemon mps_;

  // --share-gpu: N ranks over the G visible GPUs (rank i on GPU i % G), with
  // MPS found or started, and each rank's share of its GPU in its environment.
  void share_gpus() {
    auto fail = [](const std::string& msg, int code) {
      say("--share-gpu: " + msg);
      std::exit(code);
    };
    auto cvd = env_get(env_, "CUDA_VISIBLE_DEVICES");
    const weft::VisibleGpus gpus = weft::count_visible_gpus(cvd ? cvd->c_str() : nullptr);
    const int n = opts_.nproc, g = gpus.count;
    if (g == 0) fail("no NVIDIA GPU is visible (" + gpus.why + "), so no rank can run", 1);
    if (n <= g) return;  // a GPU for every rank: nothing is shared
    if (n % g != 0)
      fail(std::to_string(n) + " ranks do not divide evenly over the " + std::to_string(g) +
               " visible GPUs (rank i uses GPU i % " + std::to_string(g) + "); start a multiple of " +
               std::to_string(g) + " ranks",
           kExitUsage);
    const int per_gpu = n / g;
    env_set(env_, "WEFT_SHARE_GPU", weft::to_string(opts_.share));
    if (opts_.share == weft::GpuSharing::timeslice) {
      say("--share-gpu=timeslice: " + std::to_string(per_gpu) + " ranks per GPU, time-sliced without MPS: "
          "correct, but each wait on another rank costs milliseconds");
      return;
    }
    if (std::string why = mps_.start(env_); !why.empty()) fail(why, 1);
    mps_.export_to(env_);
  }

  // Stops the MPS daemon weftrun started, however the job ended.
  void stop_sharing() {
    std::string left = mps_.stop();
    if (left.empty()) return;
    say(left);
    if (exit_code_ == 0) exit_code_ = 1;
  }

  void setup_signals() {
    sigset_t set;
    sigemptyset(&set);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaddset(&set, s);
    // Blocked signals are queued (even ones the parent ignores) and read from the signalfd.
    sigprocmask(SIG_BLOCK, &set, &old_mask_);
    sigfd_ = signalfd(-1, &set, SFD_NONBLOCK | SFD_CLOEXEC);
    if (sigfd_ < 0) {
      say(std::string("signalfd failed: ") + std::strerror(errno));
      std::exit(1);
    }
    struct sigaction ign{};
    ign.sa_handler = SIG_IGN;
    sigemptyset(&ign.sa_mask);
    sigaction(SIGPIPE, &ign, &old_pipe_);  // a closed stdout must not kill weftrun
    // Processes the ranks leave behind are re-parented to weftrun, so it can reap them.
    prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0);
  }

  void build_env() {
    for (char** e = environ; e && *e; ++e) env_.emplace_back(*e);
    env_set(env_, "WEFT_WORLD_SIZE", std::to_string(opts_.nproc));
    env_set(env_, "WEFT_LOCAL_WORLD_SIZE", std::to_string(opts_.nproc));
    env_set(env_, "WEFT_NODE_RANK", "0");
    env_set(env_, "WEFT_MASTER_ADDR", "127.0.0.1", /*overwrite=*/false);
    if (opts_.port > 0) {
      env_set(env_, "WEFT_MASTER_PORT", std::to_string(opts_.port));
    } else if (!env_get(env_, "WEFT_MASTER_PORT")) {
      int port = find_free_port();
      if (port <= 0) {
        port = 29517;
        say("could not find a free TCP port (" + std::string(std::strerror(errno)) +
            "); using " + std::to_string(port) + " (choose one with --port)");
      }
      env_set(env_, "WEFT_MASTER_PORT", std::to_string(port));
    }
    env_set(env_, "WEFT_JOB_ID", random_job_id());
    env_set(env_, "NCCL_NVLS_ENABLE", "0", false);
    env_set(env_, "NVSHMEM_DISABLE_NVLS", "1", false);
    env_set(env_, "TORCH_SYMM_MEM_DISABLE_MULTICAST", "1", false);
  }

  // Starts the ranks in order; stops early (and stops the started ones) if one cannot start.
  void spawn_all() {
    ranks_.resize(static_cast<std::size_t>(opts_.nproc));
    for (int i = 0; i < opts_.nproc; ++i) ranks_[i].index = i;

    int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
    bool stdin_tty = isatty(0);
    std::vector<char*> argv;
    for (auto& a : opts_.program) argv.push_back(a.data());
    argv.push_back(nullptr);
    const std::string& prog = opts_.program[0];

    for (int i = 0; i < opts_.nproc; ++i) {
      EnvList env = env_;
      env_set(env, "WEFT_RANK", std::to_string(i));
      env_set(env, "WEFT_LOCAL_RANK", std::to_string(i));
      std::vector<char*> envp;
      for (auto& kv : env) envp.push_back(kv.data());
      envp.push_back(nullptr);

      int out_pipe[2] = {-1, -1}, err_pipe[2] = {-1, -1}, exec_pipe[2] = {-1, -1};
      bool ok = pipe2(exec_pipe, O_CLOEXEC) == 0;
      if (ok && opts_.tag_output) ok = pipe2(out_pipe, O_CLOEXEC) == 0 && pipe2(err_pipe, O_CLOEXEC) == 0;
      if (!ok) {
        say("cannot create a pipe for rank " + std::to_string(i) + ": " + std::strerror(errno));
        begin_stop(1);
        break;
      }
      bool stdin_null = stdin_tty || i != 0;
      pid_t parent = getpid();
      pid_t pid = fork();
      if (pid < 0) {
        say("cannot start rank " + std::to_string(i) + ": fork failed: " + std::strerror(errno));
        for (int fd : {out_pipe[0], out_pipe[1], err_pipe[0], err_pipe[1], exec_pipe[0], exec_pipe[1]})
          if (fd >= 0) close(fd);
        begin_stop(1);
        break;
      }
      if (pid == 0) {
        // The child: only async-signal-safe calls from here to exec.
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0);
        if (getppid() != parent) _exit(1);  // weftrun is already gone
        if (stdin_null && devnull >= 0) dup2(devnull, 0);
        if (opts_.tag_output) {
          dup2(out_pipe[1], 1);
          dup2(err_pipe[1], 2);
        }
        sigaction(SIGPIPE, &old_pipe_, nullptr);
        sigprocmask(SIG_SETMASK, &old_mask_, nullptr);
        execvpe(prog.c_str(), argv.data(), envp.data());
        int err = errno;
        ssize_t ignored = write(exec_pipe[1], &err, sizeof err);
        (void)ignored;
        _exit(err == ENOENT ? 127 : 126);
      }
      setpgid(pid, pid);  // also here, so it holds before anyone signals the group
      ranks_[i].pid = pid;
      ranks_[i].alive = true;
      close(exec_pipe[1]);
      if (opts_.tag_output) {
        close(out_pipe[1]);
        close(err_pipe[1]);
        for (int k = 0; k < 2; ++k) {
          Forwarder f;
          f.fd = k == 0 ? out_pipe[0] : err_pipe[0];
          fcntl(f.fd, F_SETFL, fcntl(f.fd, F_GETFL) | O_NONBLOCK);
          f.dst = k == 0 ? 1 : 2;
          f.prefix = "[rank " + std::to_string(i) + "] ";
          fwd_.push_back(std::move(f));
        }
      }
      // Wait until the child has exec'd (the pipe closes) or reported why it could not.
      int err = 0;
      ssize_t n;
      do n = read(exec_pipe[0], &err, sizeof err);
      while (n < 0 && errno == EINTR);
      close(exec_pipe[0]);
      if (n == static_cast<ssize_t>(sizeof err)) {
        int st = 0;
        while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {
        }
        ranks_[i].alive = false;
        ranks_[i].status = st;
        say("rank " + std::to_string(i) + " could not start '" + prog + "': " + std::strerror(err));
        begin_stop(err == ENOENT ? 127 : 126);
        break;
      }
    }
    if (devnull >= 0) close(devnull);
  }

  int count_alive() const {
    int n = 0;
    for (const auto& r : ranks_) n += r.alive ? 1 : 0;
    return n;
  }

  // Whether anything is left in the rank's process group (after the rank itself was reaped).
  static bool group_alive(const Rank& r) { return r.pid > 0 && kill(-r.pid, 0) == 0; }

  void signal_all(int sig) {
    for (const auto& r : ranks_) {
      if (r.pid <= 0) continue;
      kill(-r.pid, sig);             // the rank and everything it started
      if (r.alive) kill(r.pid, sig); // in case it moved itself to another group
    }
  }

  void begin_stop(int code) {
    if (stopping_) return;
    stopping_ = true;
    exit_code_ = code;
    signal_all(SIGTERM);
    kill_at_ = Clock::now() + kGrace;
  }

  void kill_now(const std::string& why) {
    for (const auto& r : ranks_) {
      if (r.alive)
        say(r.label() + " " + why + "; sending SIGKILL");
      else if (group_alive(r))
        say("processes started by rank " + std::to_string(r.index) + " (process group " +
            std::to_string(r.pid) + ") " + why + "; sending SIGKILL");
    }
    signal_all(SIGKILL);
    killed_ = true;
    give_up_at_ = Clock::now() + kGiveUp;
  }

  void on_rank_exit(Rank& r) {
    if (stopping_) return;  // expected: weftrun is stopping the job
    if (WIFEXITED(r.status) && WEXITSTATUS(r.status) == 0) return;
    int others = count_alive();
    std::string msg = r.label() + " " + describe_status(r.status);
    if (others > 0) msg += "; stopping the other " + std::to_string(others) + " rank(s)";
    say(msg);
    begin_stop(exit_code_of(r.status));
  }

  void reap() {
    for (;;) {
      int st = 0;
      pid_t p = waitpid(-1, &st, WNOHANG);
      if (p < 0 && errno == EINTR) continue;
      if (p <= 0) return;
      if (mps_.exited(p)) {
        if (!stopping_) {
          say("the MPS daemon weftrun started " + describe_status(st) + " while the ranks ran; stopping them");
          begin_stop(1);
        }
        continue;
      }
      for (auto& r : ranks_) {
        if (r.pid == p && r.alive) {
          r.alive = false;
          r.status = st;
          on_rank_exit(r);
          break;
        }
      }
      // Anything else is an orphan left by a rank (weftrun is a subreaper): just reaped.
    }
  }

  void on_signal(int sig) {
    if (sig == SIGCHLD) return;  // reap() runs every turn of the loop
    if (!stopping_) {
      say(std::string("got ") + signal_name(sig) + "; stopping " + std::to_string(count_alive()) +
          " running rank(s)");
      begin_stop(128 + sig);
    } else if (!killed_) {
      kill_now(std::string("is being stopped and weftrun got ") + signal_name(sig) + " again");
    }
  }

  void wait_for_events(std::chrono::milliseconds timeout) {
    std::vector<pollfd> pfds;
    pfds.push_back({sigfd_, POLLIN, 0});
    std::vector<std::size_t> which;
    for (std::size_t k = 0; k < fwd_.size(); ++k) {
      if (fwd_[k].fd < 0) continue;
      pfds.push_back({fwd_[k].fd, POLLIN, 0});
      which.push_back(k);
    }
    int rc = poll(pfds.data(), pfds.size(), static_cast<int>(timeout.count()));
    if (rc <= 0) return;
    if (pfds[0].revents & POLLIN) {
      signalfd_siginfo si;
      while (read(sigfd_, &si, sizeof si) == static_cast<ssize_t>(sizeof si))
        on_signal(static_cast<int>(si.ssi_signo));
    }
    for (std::size_t j = 1; j < pfds.size(); ++j)
      if (pfds[j].revents & (POLLIN | POLLHUP | POLLERR)) fwd_[which[j - 1]].on_readable();
  }

  void loop() {
    const bool has_timeout = opts_.timeout > 0;
    const auto deadline = start_ + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(opts_.timeout));
    for (;;) {
      reap();
      auto now = Clock::now();
      if (count_alive() == 0) {
        bool leftovers = false;
        for (const auto& r : ranks_) leftovers = leftovers || group_alive(r);
        if (!leftovers) return;
        if (!stopping_) {
          say("every rank has exited, but processes they started are still running; stopping them");
          begin_stop(exit_code_);
        }
      }
      if (!stopping_ && has_timeout && now >= deadline) {
        std::string list;
        for (const auto& r : ranks_) {
          if (!r.alive) continue;
          if (!list.empty()) list += ", ";
          list += r.label();
        }
        say("timeout after " + format_seconds(opts_.timeout) + " s; still running: " + list +
            "; stopping them");
        begin_stop(kExitTimeout);
      }
      if (stopping_ && !killed_ && now >= kill_at_) kill_now("is still running 3 s after SIGTERM");
      if (killed_ && now >= give_up_at_) {
        std::string list;
        for (const auto& r : ranks_) {
          if (!r.alive) continue;
          if (!list.empty()) list += ", ";
          list += r.label();
        }
        if (list.empty()) list = "processes started by the ranks";
        say("giving up: " + list + " did not go away 5 s after SIGKILL (stuck in the kernel or a driver?)");
        return;
      }
      auto wait = kPoll;
      if (!stopping_ && has_timeout) {
        auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - now);
        if (left < wait) wait = std::max(left, std::chrono::milliseconds(0));
      }
      wait_for_events(wait);
    }
  }

  // After the ranks are gone, forwards what is still in the pipes; bounded, since a
  // process that escaped the ranks' process groups may still hold a pipe open.
  void drain() {
    auto until = Clock::now() + std::chrono::seconds(1);
    for (;;) {
      std::vector<pollfd> pfds;
      std::vector<std::size_t> which;
      for (std::size_t k = 0; k < fwd_.size(); ++k) {
        if (fwd_[k].fd < 0) continue;
        pfds.push_back({fwd_[k].fd, POLLIN, 0});
        which.push_back(k);
      }
      if (pfds.empty() || Clock::now() >= until) break;
      int rc = poll(pfds.data(), pfds.size(), 100);
      if (rc < 0 && errno == EINTR) continue;
      if (rc <= 0) break;
      for (std::size_t j = 0; j < pfds.size(); ++j)
        if (pfds[j].revents & (POLLIN | POLLHUP | POLLERR)) fwd_[which[j]].on_readable();
    }
    for (auto& f : fwd_)
      if (f.fd >= 0) f.close_now();
  }
};

}  // namespace

int main(int argc, char** argv) {
  Options opts = parse_args(argc, argv);
  Job job(std::move(opts));
  return job.run();
}
