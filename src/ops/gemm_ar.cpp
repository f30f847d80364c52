// GEMM + AllReduce: the plan. Fused = GemmRs's ring, then a copy-engine
// AllGather of the reduced blocks; the primitives are overlap.hpp's.
#include "weft/ops/gemm_ar.hpp"

#include "overlap.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {

using ops_detail::Overlap;
using ops_detail::OverlapPath;

GemmAr::GemmAr(std::shared_ptr<Context> ctx, const GemmArOptions& o) : ctx_(std::move(ctx)), options_(o) {
  const int world = ctx_->world_size();
  WEFT_REQUIRE(o.m > 0 && o.n > 0 && o.k > 0, "GemmAr: M, N, K must be positive, got ", o.m, " x ", o.n, " x ", o.k);
  WEFT_REQUIRE(o.m % world == 0, "GemmAr: M = ", o.m, " must be a multiple of the world size ", world);
  WEFT_REQUIRE(o.dtype == DType::bf16, "GemmAr: dtype must be bf16, got ", to_string(o.dtype));
  block_rows_ = o.m / world;
  chunks_ = ops_detail::even_chunks(block_rows_, o.chunks_per_block);
  chunk_rows_ = block_rows_ / chunks_;
  ctx_->verify_same_call(str("GemmAr plan: ", o.m, " x ", o.n, " x ", o.k, " ", to_string(o.dtype), ", B ",
                             o.b_layout == BLayout::nk ? "[N,K]" : "[K,N]", ", ", to_string(o.mode)));
  if (o.mode != OverlapMode::sequential) {
    reduce_ = std::make_unique<GemmRs>(ctx_, GemmRsOptions{.m = o.m, .n = o.n, .k = o.k, .dtype = o.dtype,
                                                           .b_layout = o.b_layout, .mode = OverlapMode::fused,
                                                           .chunks_per_block = o.chunks_per_block,
                                                           .last_step_parts = 4});
    overlap_ = std::make_unique<Overlap>(ctx_, "gemm_ar");
    arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(world * chunks_ * 8), "u64",
                               "gemm_ar.arrived");
  }
  if (o.mode != OverlapMode::fused) {
    GemmOptions g = gemm_options(o.m, o.n, o.k, o.dtype, o.b_layout);
    g.allow_cublas = true;  // unhooked: cuBLAS where it is faster
    plain_gemm_ = std::make_unique<Gemm>(g);
    all_reduce_ = std::make_unique<AllReduce>(
        ctx_, AllReduceOptions{.count = static_cast<std::uint64_t>(o.m * o.n), .dtype = o.dtype});
  }
  if (o.mode == OverlapMode::fused) path_ = static_cast<int>(OverlapPath::fused);
  if (o.mode == OverlapMode::sequential) path_ = static_cast<int>(OverlapPath::sequential);
}

GemmAr::~GemmAr() = default;

std::string GemmAr::path() const { return path_ < 0 ? "" : ops_detail::to_string(static_cast<OverlapPath>(path_)); }

std::string GemmAr::gemm_config() const {
  if (path_ == static_cast<int>(OverlapPath::fused)) return reduce_->gemm_config();
  if (path_ == static_cast<int>(OverlapPath::sequential)) return plain_gemm_->config();
  return "";
}

void GemmAr::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  WEFT_REQUIRE(a && b && out, "GemmAr::run: a, b and out must be device pointers");
  for (const void* p : {a, b, static_cast<const void*>(out)})
    WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(p) & 15u) == 0, "GemmAr::run: ", p,
                 " is not 16-byte aligned (TMA needs 16-byte aligned matrices)");
  WEFT_REQUIRE(ctx_->heap().contains(out, static_cast<std::uint64_t>(options_.m * options_.n * 2)),
               "GemmAr::run: out (", out, ", ", options_.m, " x ", options_.n,
               " bf16) must be in the symmetric heap: peers write their blocks into it");
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmAr run: ", options_.m, " x ", options_.n, " x ", options_.k));
  if (path_ < 0) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    WEFT_CUDA(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) {
      path_ = static_cast<int>(OverlapPath::fused);
    } else {
      run_sequential(a, b, out, stream);
      run_fused(a, b, out, stream);
      const OverlapPath chosen = overlap_->choose([&] { run_fused(a, b, out, stream); },
                                                  [&] { run_sequential(a, b, out, stream); }, stream, &fused_ms_,
                                                  &sequential_ms_);
      path_ = static_cast<int>(chosen);
      WEFT_LOG(info, "GemmAr ", options_.m, " x ", options_.n, " x ", options_.k, ": fused ", fused_ms_,
               " ms, sequential ", sequential_ms_, " ms: runs ", ops_detail::to_string(chosen));
    }
  }
  if (path_ == static_cast<int>(OverlapPath::fused)) run_fused(a, b, out, stream);
  else run_sequential(a, b, out, stream);
}

void GemmAr::run_sequential(const void* a, const void* b, void* out, cudaStream_t stream) {
  plain_gemm_->run(a, b, out, stream);
  all_reduce_->run(out, out, stream);
}

void GemmAr::run_fused(const void* a, const void* b, void* out, cudaStream_t stream) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  const std::int64_t n = options_.n;
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * n * 2);
  char* mine = static_cast<char*>(out) + me * block_bytes;
  auto* arrived = arrived_.as<std::uint64_t>();
  // GemmRs's handshake also tells us every peer's out is free for this run.
  // Each finished part of our block goes to every peer while the next part computes.
  reduce_->run_fused(a, b, mine, stream, [&](std::int64_t row0, std::int64_t rows) {
    if (world == 1) return;
    cudaStream_t side = overlap_->fork(stream);
    for (int i = 1; i < world; ++i) {
      const int peer = (me + i) % world;
      char* dst = static_cast<char*>(ctx_->heap().peer_ptr(mine, peer));
      auto* peer_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, peer));
      for (std::int64_t ch = row0 / chunk_rows_; ch < (row0 + rows) / chunk_rows_; ++ch) {
        const std::uint64_t off = static_cast<std::uint64_t>(ch * chunk_rows_ * n * 2);
        WEFT_CUDA(cudaMemcpyAsync(dst + off, mine + off, static_cast<std::size_t>(chunk_rows_ * n * 2),
                                  cudaMemcpyDeviceToDevice, side));
        Overlap::raise(peer_arrived + me * chunks_ + ch, 1, side);
      }
    }
  });
  if (world == 1) return;
  overlap_->wait_all(arrived, static_cast<int>(world * chunks_), static_cast<int>(chunks_), stream);
  overlap_->join(stream);
  WEFT_CUDA(cudaMemsetAsync(arrived, 0, static_cast<std::size_t>(world * chunks_ * 8), stream));
}

}  // namespace weft
