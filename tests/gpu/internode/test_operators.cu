// The overlapped tensor-parallel operators (AgGemm, GemmRs, GemmAr) across nodes
// (virtual ones on one machine, WEFT_VIRTUAL_NODES, or real ones): their fused
// paths load and store every peer's heap and have no two-level schedule yet,
// so every mode runs the sequential path, whose collective takes its two-level
// schedule while a weft::RemotePeers is alive (docs/decisions/0073). Checked as
// on one node (overlap_check.hpp): fresh inputs, poisoned outputs, two runs
// through one plan, against cuBLAS with fp32 accumulation; the gathered A
// bitwise; shapes the engine cannot tile and M not a multiple of the tile.
// Where NCCL is up (a GPU per rank) the first run times weft's collective
// against NCCL's, meeting on the host between samples. Without a RemotePeers
// the plans refuse, naming themselves and the remedy.
#include <string>

#include "internode_test.hpp"
#include "overlap_check.hpp"
#include "weft/core/error.hpp"
#include "weft/internode/remote_peers.hpp"

using namespace weft;
using namespace weft::test::overlap;
using weft::test::ctx;
using weft::test::ctx_ptr;

namespace {
// The sequential path ran: weft's collective on its two-level schedule, or, where
// ranks have NCCL (a GPU each) and the first run timed it faster, NCCL's.
void expect_sequential(const std::string& path, const std::string& what) {
  if (ctx().has_nccl()) EXPECT_EQ(path.rfind("sequential", 0), 0u) << what << ": " << path;
  else EXPECT_EQ(path, "sequential") << what;
}
}  // namespace

TEST(AcrossNodes, OverlappedOperatorsRunTheirSequentialPathInEveryMode) {
  NEED_NODES();
  RemotePeers remote(ctx_ptr());
  Cublas cb;
  const int w = ctx().world_size();
  for (DType t : {DType::bf16, DType::fp16})
    for (OverlapMode mode : {OverlapMode::automatic, OverlapMode::fused, OverlapMode::sequential}) {
      const std::string what = std::string(to_string(t)) + ", " + to_string(mode);
      const AgResult ag = check_ag_gemm(256 * w, 512, 384, mode, cb, AgWay::automatic, t);
      EXPECT_LT(ag.err, 1e-2) << "AgGemm " << what;
      EXPECT_EQ(ag.gathered_mismatch, 0u) << "AgGemm " << what;
      EXPECT_EQ(ag.mode, OverlapMode::sequential) << "AgGemm " << what;
      expect_sequential(ag.path, "AgGemm " + what);
      for (bool all_reduce : {false, true}) {
        const ReduceResult r = check_gemm_reduce(all_reduce, 256 * w, 512, 384, mode, cb, FusedWay::automatic, t);
        EXPECT_LT(r.err, 1e-2) << (all_reduce ? "GemmAr " : "GemmRs ") << what;
        EXPECT_EQ(r.mode, OverlapMode::sequential) << (all_reduce ? "GemmAr " : "GemmRs ") << what;
        expect_sequential(r.path, (all_reduce ? "GemmAr " : "GemmRs ") + what);
      }
    }
  // M not a multiple of the tile, nor (GemmAr) of the world size; K the engine cannot tile (cuBLAS, odd shards).
  EXPECT_LT(check_ag_gemm(125 * w, 256, 256, OverlapMode::automatic, cb).err, 1e-2);
  EXPECT_LT(check_ag_gemm(125 * w, 256, 1001, OverlapMode::automatic, cb).err, 1e-2);
  EXPECT_LT(check_gemm_reduce(false, 125 * w, 256, 1001, OverlapMode::automatic, cb).err, 1e-2);
  EXPECT_LT(check_gemm_reduce(true, 1001, 256, 256, OverlapMode::automatic, cb).err, 1e-2);
}

TEST(AcrossNodes, OverlappedOperatorsWithoutRemotePeersAreRefusedNamingTheRemedy) {
  NEED_NODES();
  const int w = ctx().world_size();
  auto refusal = [](auto build) {
    try {
      build();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  const std::string ag = refusal([&] { AgGemm plan(ctx_ptr(), AgGemmOptions{.m = 256 * w, .n = 256, .k = 256}); });
  const std::string rs = refusal([&] { GemmRs plan(ctx_ptr(), GemmRsOptions{.m = 256 * w, .n = 256, .k = 256}); });
  const std::string ar = refusal([&] { GemmAr plan(ctx_ptr(), GemmArOptions{.m = 256 * w, .n = 256, .k = 256}); });
  const char* names[] = {"AgGemm", "GemmRs", "GemmAr"};
  const std::string* errors[] = {&ag, &rs, &ar};
  for (int i = 0; i < 3; ++i) {
    EXPECT_NE(errors[i]->find(std::string(names[i]) + ": some peers are on other nodes"), std::string::npos)
        << *errors[i];
    EXPECT_NE(errors[i]->find("weft::RemotePeers"), std::string::npos) << *errors[i];
  }
}
