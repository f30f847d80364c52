// The inter-node cost model (tools/model/scale_model.py) and its page
// (docs/SCALE.md): the page's tables are the script's output, and the
// script predicts every world size the page promises. Needs python3 (standard
// library only); skipped, with the reason, where there is none.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <array>
#include <cstdio>
#include <string>

namespace {

struct Ran {
  int code = -1;
  std::string output;  // stdout and stderr together
};

Ran run(const std::string& cmd) {
  Ran r;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  std::array<char, 512> buf{};
  while (p && fgets(buf.data(), buf.size(), p)) r.output += buf.data();
  const int status = p ? pclose(p) : -1;
  r.code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

bool have_python3() { return run("python3 -c 'import difflib, argparse, math'").code == 0; }

const std::string kScript = std::string(WEFT_SOURCE_DIR) + "/tools/model/scale_model.py";
const std::string kDoc = std::string(WEFT_SOURCE_DIR) + "/docs/SCALE.md";

}  // namespace

TEST(ScaleModel, DocMatchesTheScript) {
  if (!have_python3()) GTEST_SKIP() << "python3 is not on PATH: the model's page cannot be checked";
  const Ran r = run("python3 '" + kScript + "' --check '" + kDoc + "'");
  EXPECT_EQ(r.code, 0) << "docs/SCALE.md's tables differ from the script's output; paste "
                          "`python3 tools/model/scale_model.py` between the markers:\n"
                       << r.output;
}

TEST(ScaleModel, PredictsSixteenThirtyTwoAndSixtyFourGpus) {
  if (!have_python3()) GTEST_SKIP() << "python3 is not on PATH: the model cannot run";
  const Ran r = run("python3 '" + kScript + "' --markdown");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* op : {"| AllGather+GEMM | 8192 x 28672 x 8192 | ", "| GEMM+ReduceScatter | 8192 x 8192 x 28672 | "})
    for (const char* gpus : {"16 |", "32 |", "64 |"})
      EXPECT_NE(r.output.find(std::string(op) + gpus), std::string::npos) << "no row " << op << gpus << "\n"
                                                                          << r.output;
  for (const char* gpus : {"| 16 | dispatch |", "| 32 | combine |", "| 64 | dispatch |"})
    EXPECT_NE(r.output.find(gpus), std::string::npos) << "no expert-parallel row " << gpus;
  // Every parameter says where it comes from.
  for (const char* kind : {"measured-here", "published", "assumed"})
    EXPECT_NE(r.output.find(std::string("| ") + kind + " |"), std::string::npos) << kind;
  // A parameter that is not the model's is refused, not ignored.
  EXPECT_EQ(run("python3 '" + kScript + "' --set no_such_parameter=1").code, 2);
}
