// weft's programs on a machine without a GPU: each says plainly why it cannot
// run and exits non-zero within seconds - never a crash ("terminate called"),
// never a source location, never silence. And weft-info's help and argument
// errors. (Where a GPU is visible, the no-GPU cases are skipped: they cannot
// be checked there.) And the GPU session script's benchmark command lines,
// each parsed by weft-bench before it looks for a GPU, so a mistyped option
// fails here and not on a scarce multi-GPU machine.
#include <gtest/gtest.h>
#include <stdlib.h>
#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace {

struct Ran {
  int code = -1;
  double seconds = 0;
  std::string output;  // stdout and stderr together
  std::string stdout_only;
};

// `cmd` under coreutils' timeout (killed after limit_s: exit 124).
Ran run(const std::string& cmd, int limit_s = 20, bool stdout_only = false) {
  const auto t0 = std::chrono::steady_clock::now();
  Ran r;
  const std::string full = "timeout -k 2 " + std::to_string(limit_s) + " " + cmd + (stdout_only ? " 2>/dev/null" : " 2>&1");
  FILE* p = popen(full.c_str(), "r");
  std::array<char, 512> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) r.output += buf.data();
  const int status = p ? pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

bool gpu_visible() { return run("nvidia-smi -L", 10).code == 0; }

void expect_plain_refusal(const std::string& what, const Ran& r) {
  EXPECT_EQ(r.code, 1) << what << "\n" << r.output;
  EXPECT_LT(r.seconds, 10.0) << what;
  EXPECT_EQ(r.output.find("terminate called"), std::string::npos) << what << " crashed:\n" << r.output;
  EXPECT_EQ(r.output.find(".cpp:"), std::string::npos) << what << " names a source location:\n" << r.output;
  EXPECT_TRUE(r.output.find("no NVIDIA driver") != std::string::npos ||
              r.output.find("no CUDA GPU is visible") != std::string::npos)
      << what << " does not say what is missing:\n" << r.output;
}

}  // namespace

TEST(ProgramsWithoutAGpu, EachSaysWhatIsMissingAndExitsNonZero) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible here: the no-GPU messages cannot be checked";
  const std::string weftrun = WEFTRUN_PATH;
  expect_plain_refusal("weft-info", run(WEFT_INFO_PATH));
  for (const char* example : {WEFT_EXAMPLE_01, WEFT_EXAMPLE_02, WEFT_EXAMPLE_07, WEFT_EXAMPLE_08}) {
    expect_plain_refusal(example, run(example));                                   // alone: a world of one
    expect_plain_refusal(example, run(weftrun + " -n 2 -- " + example));           // two ranks
  }
  expect_plain_refusal("weft-wait-probe", run(WEFT_WAIT_PROBE_PATH));
  expect_plain_refusal("weft-bench", run(std::string(WEFT_BENCH_PATH) + " all_reduce --bytes 1K"));
  // weft-info's reason goes to stderr, nothing to stdout.
  EXPECT_EQ(run(WEFT_INFO_PATH, 20, /*stdout_only=*/true).output, "");
}

TEST(ProgramsWithoutAGpu, TheMainJobSaysWhatIsMissingBeforeBuildingAnything) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible here: the no-GPU message cannot be checked";
  const Ran r = run("bash " + std::string(WEFT_SOURCE_DIR) + "/scripts/run.sh", 10);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_LT(r.seconds, 10.0);
  EXPECT_NE(r.output.find("no NVIDIA GPU"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("[build]"), std::string::npos) << "run.sh built before it checked the GPU:\n" << r.output;
  EXPECT_EQ(r.output.find("[setup]"), std::string::npos) << "run.sh set up before it checked the GPU:\n" << r.output;
}

TEST(ProgramsWithoutAGpu, WeftInfoHelpsAndRefusesArguments) {
  const Ran help = run(std::string(WEFT_INFO_PATH) + " --help");
  EXPECT_EQ(help.code, 0) << help.output;
  EXPECT_NE(help.output.find("usage: weftrun -n N [--share-gpu] weft-info"), std::string::npos) << help.output;
  const Ran bad = run(std::string(WEFT_INFO_PATH) + " --verbose");
  EXPECT_EQ(bad.code, 2) << bad.output;
  EXPECT_NE(bad.output.find("unknown argument '--verbose' (it takes none; -h for help)"), std::string::npos)
      << bad.output;
}

TEST(SessionScript, EveryBenchCommandLineOfTheRehearsalAndBenchStagesParses) {
  if (gpu_visible()) GTEST_SKIP() << "a GPU is visible here: weft-bench would run its benchmarks, not only parse";
  // A build folder whose weft-bench records each command line and its exit
  // code before passing it on, and whose weftrun runs the command after "--"
  // as one rank. Without a GPU weft-bench exits 1 once its arguments parse,
  // 2 when they do not.
  char dir_template[] = "/tmp/weft-session-XXXXXX";
  const char* dir_made = mkdtemp(dir_template);
  ASSERT_NE(dir_made, nullptr);
  const std::string dir = dir_made, calls = dir + "/calls.tsv";
  {
    std::ofstream bench(dir + "/weft-bench");
    bench << "#!/usr/bin/env bash\n\"" << WEFT_BENCH_PATH << "\" \"$@\"; rc=$?\n"
          << "printf '%s\\t%s\\n' \"$rc\" \"$*\" >> \"" << calls << "\"\nexit $rc\n";
    std::ofstream weftrun(dir + "/weftrun");
    weftrun << "#!/usr/bin/env bash\nwhile [ $# -gt 0 ] && [ \"$1\" != -- ]; do shift; done\nshift\nexec \"$@\"\n";
  }
  ASSERT_EQ(run("chmod +x " + dir + "/weft-bench " + dir + "/weftrun").code, 0);
  const std::string env = "OUT=" + dir + "/out WEFT_BUILD_DIR=" + dir +
                          " TWO_GPU_PARTS='overlap ep moe decode collectives' EP_TEST_WORLDS=''";
  const Ran session = run("env " + env + " bash " + std::string(WEFT_SOURCE_DIR) +
                              "/scripts/gpu_session.sh two_gpu shared ep moe decode grouped",
                          110);
  EXPECT_NE(session.code, 124) << "the session script did not finish:\n" << session.output;
  EXPECT_NE(session.output.find("==== summary"), std::string::npos) << session.output;
  std::ifstream log(calls);
  std::string line;
  int parsed = 0;
  while (std::getline(log, line)) {
    const std::string code = line.substr(0, line.find('\t'));
    EXPECT_EQ(code, "1") << "weft-bench " << line.substr(line.find('\t') + 1)
                         << ": exit " << code << " (1: its arguments parsed and no GPU was found)";
    parsed += code == "1";
  }
  // The rehearsal's 12 (overlap: 3 ops x 2 types; ep; moe: 2 routings; decode: 2; collectives), shared's
  // 12, ep's 1, moe's 2, decode's 5, grouped's 2 + 4 forced tiles.
  EXPECT_GE(parsed, 38) << "fewer weft-bench calls than the stages make";
  run("rm -rf " + dir);
}
