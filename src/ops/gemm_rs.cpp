// GEMM + ReduceScatter: the plan. The kernels are weft::Gemm, the steps after
// the first with the wait_source_rows hook (src/gemm/tile_hooks.cuh); the
// primitives are overlap.hpp's.
#include "weft/ops/gemm_rs.hpp"

#include "overlap.hpp"
#include "weft/core/error.hpp"
#include "weft/core/log.hpp"

namespace weft {

using ops_detail::Overlap;
using ops_detail::OverlapPath;

GemmRs::GemmRs(std::shared_ptr<Context> ctx, const GemmRsOptions& o) : ctx_(std::move(ctx)), options_(o) {
  const int world = ctx_->world_size();
  WEFT_REQUIRE(o.m > 0 && o.n > 0 && o.k > 0, "GemmRs: M, N, K must be positive, got ", o.m, " x ", o.n, " x ", o.k);
  WEFT_REQUIRE(o.m % world == 0, "GemmRs: M = ", o.m, " must be a multiple of the world size ", world,
               " (rank r keeps rows block r)");
  WEFT_REQUIRE(o.dtype == DType::bf16, "GemmRs: dtype must be bf16 (the hooked GEMM kernels' type), got ",
               to_string(o.dtype));
  WEFT_REQUIRE(o.chunks_per_block >= 1, "GemmRs: chunks_per_block must be >= 1, got ", o.chunks_per_block);
  block_rows_ = o.m / world;
  chunks_ = ops_detail::even_chunks(block_rows_, o.chunks_per_block);
  chunk_rows_ = block_rows_ / chunks_;
  ctx_->verify_same_call(str("GemmRs plan: ", o.m, " x ", o.n, " x ", o.k, " ", to_string(o.dtype), ", B ",
                             o.b_layout == BLayout::nk ? "[N,K]" : "[K,N]", ", ", to_string(o.mode)));
  overlap_ = std::make_unique<Overlap>(ctx_, "gemm_rs");
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * o.n * 2);
  const int steps = world - 1;
  if (o.mode != OverlapMode::sequential && steps > 0) {
    staging_ = SymmetricBuffer(ctx_->heap(), steps * block_bytes, "bf16", "gemm_rs.staging");
    arrived_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(steps * chunks_ * 8), "u64",
                               "gemm_rs.arrived");
    WEFT_CUDA(cudaMalloc(&send_, steps * block_bytes));
  }
  GemmOptions g = gemm_options(block_rows_, o.n, o.k, o.dtype, o.b_layout);
  g.allow_cublas = true;  // unhooked GEMMs take cuBLAS where it is faster
  if (o.mode != OverlapMode::sequential) {
    first_gemm_ = std::make_unique<Gemm>(g);
    if (steps > 0) {
      GemmOptions hooked = g;
      hooked.hook = GemmHook::wait_source_rows;
      step_gemm_ = std::make_unique<Gemm>(hooked);
      // Parts of the last step: each must hold a whole number of chunks and
      // at least two waves of 128 x 256 tiles, or splitting costs more than it gives.
      int sms = 0, device = 0;
      WEFT_CUDA(cudaGetDevice(&device));
      WEFT_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
      for (int parts = std::max(1, o.last_step_parts); parts > 1; --parts) {
        const std::int64_t rows = block_rows_ / parts;
        const std::int64_t tiles = ((rows + 127) / 128) * ((o.n + 255) / 256);
        if (chunks_ % parts == 0 && tiles >= 2 * sms) {
          parts_ = parts;
          break;
        }
      }
      if (parts_ > 1) {
        GemmOptions part = hooked;
        part.m = block_rows_ / parts_;
        last_gemm_ = std::make_unique<Gemm>(part);
      }
    }
  }
  if (o.mode != OverlapMode::fused) {
    GemmOptions whole = g;
    whole.m = o.m;
    plain_gemm_ = std::make_unique<Gemm>(whole);
    partial_ = SymmetricBuffer(ctx_->heap(), static_cast<std::uint64_t>(o.m * o.n * 2), "bf16", "gemm_rs.partial");
    reduce_scatter_ = std::make_unique<ReduceScatter>(
        ctx_, ReduceScatterOptions{.count = static_cast<std::uint64_t>(block_rows_ * o.n), .dtype = o.dtype});
  }
  if (o.mode == OverlapMode::fused) path_ = static_cast<int>(OverlapPath::fused);
  if (o.mode == OverlapMode::sequential) path_ = static_cast<int>(OverlapPath::sequential);
}

GemmRs::~GemmRs() {
  if (send_) cudaFree(send_);
}

std::string GemmRs::path() const { return path_ < 0 ? "" : ops_detail::to_string(static_cast<OverlapPath>(path_)); }

std::string GemmRs::gemm_config() const {
  if (path_ == static_cast<int>(OverlapPath::fused))
    return step_gemm_ ? str(first_gemm_->config(), "; then ", step_gemm_->config(),
                            last_gemm_ ? str("; last step in ", parts_, " parts: ", last_gemm_->config()) : "")
                      : first_gemm_->config();
  if (path_ == static_cast<int>(OverlapPath::sequential)) return plain_gemm_->config();
  return "";
}

void GemmRs::run(const void* a, const void* b, void* out, cudaStream_t stream) {
  WEFT_REQUIRE(a && b && out, "GemmRs::run: a, b and out must be device pointers");
  for (const void* p : {a, b, static_cast<const void*>(out)})
    WEFT_REQUIRE((reinterpret_cast<std::uintptr_t>(p) & 15u) == 0, "GemmRs::run: ", p,
                 " is not 16-byte aligned (TMA needs 16-byte aligned matrices)");
  if (ctx_->check_calls())
    ctx_->verify_same_call(str("GemmRs run: ", options_.m, " x ", options_.n, " x ", options_.k));
  if (path_ < 0) {
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    WEFT_CUDA(cudaStreamIsCapturing(stream, &capturing));
    if (capturing != cudaStreamCaptureStatusNone) {
      path_ = static_cast<int>(OverlapPath::fused);
    } else {
      run_sequential(a, b, out, stream);
      run_fused(a, b, out, stream);  // tunes its GEMMs (before its handshake), then runs
      const OverlapPath chosen = overlap_->choose([&] { run_fused(a, b, out, stream); },
                                                  [&] { run_sequential(a, b, out, stream); }, stream, &fused_ms_,
                                                  &sequential_ms_);
      path_ = static_cast<int>(chosen);
      WEFT_LOG(info, "GemmRs ", options_.m, " x ", options_.n, " x ", options_.k, ": fused ", fused_ms_,
               " ms, sequential ", sequential_ms_, " ms: runs ", ops_detail::to_string(chosen));
    }
  }
  if (path_ == static_cast<int>(OverlapPath::fused)) run_fused(a, b, out, stream);
  else run_sequential(a, b, out, stream);
}

void GemmRs::run_sequential(const void* a, const void* b, void* out, cudaStream_t stream) {
  plain_gemm_->run(a, b, partial_.get(), stream);
  reduce_scatter_->run(partial_.get(), out, stream);
}

void GemmRs::run_fused(const void* a, const void* b, void* out, cudaStream_t stream, const PartDone& part_done) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  const std::int64_t n = options_.n, k = options_.k;
  const std::uint64_t block_bytes = static_cast<std::uint64_t>(block_rows_ * n * 2);
  auto block_of_a = [&](int blk) { return static_cast<const char*>(a) + blk * block_rows_ * k * 2; };
  auto send = [&](int step) { return static_cast<char*>(send_) + step * block_bytes; };
  auto staging = [&](int step) { return staging_.as<char>() + step * block_bytes; };
  auto* arrived = arrived_.as<std::uint64_t>();
  const int steps = world - 1;
  // Tune (first run only) before the handshake, so no peer waits on a tuning rank.
  first_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = steps ? send(0) : out}, stream);
  if (steps == 0) {
    first_gemm_->run(a, b, out, stream);
    if (part_done) part_done(0, block_rows_);
    return;
  }
  step_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = out, .source = staging(0)}, stream);
  if (last_gemm_) last_gemm_->prepare(GemmArgs{.a = a, .b = b, .c = out, .source = staging(0)}, stream);

  // Every rank's staging and flags are free for this run; our flags of the last run are zeroed.
  overlap_->handshake(stream, arrived, static_cast<int>(steps * chunks_));
  const int next = (me + 1) % world;
  auto* next_arrived = static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(arrived, next));
  for (int s = 0; s < world; ++s) {
    const int blk = ((me - 1 - s) % world + world) % world;
    void* dst = s == steps ? out : send(s);
    if (s == 0) {
      first_gemm_->run(block_of_a(blk), b, dst, stream);
    } else {
      // The last step may run as row parts (see last_step_parts), each waiting
      // on its own chunks of the partial sum and announced when enqueued.
      const int parts = s == steps ? parts_ : 1;
      const std::int64_t part_rows = block_rows_ / parts, part_chunks = chunks_ / parts;
      for (int p = 0; p < parts; ++p) {
        const std::int64_t row0 = p * part_rows;
        GemmArgs args{.a = block_of_a(blk) + row0 * k * 2,
                      .b = b,
                      .c = static_cast<char*>(dst) + row0 * n * 2,
                      .source = staging(s - 1) + row0 * n * 2};
        args.signals = RowSignals{.world = &ctx_->world(),
                                  .flags = arrived + (s - 1) * chunks_ + p * part_chunks,
                                  .rows_per_flag = chunk_rows_,
                                  .value = 1,
                                  .from_rank = (me - 1 + world) % world};
        (parts > 1 ? last_gemm_ : step_gemm_)->run(args, stream);
        if (s == steps && part_done) part_done(row0, part_rows);
      }
    }
    if (s == steps) break;
    // This step's block goes to rank + 1, chunk by chunk, while the next step computes.
    cudaStream_t side = overlap_->fork(stream);
    char* peer_staging = static_cast<char*>(ctx_->heap().peer_ptr(staging(s), next));
    for (std::int64_t ch = 0; ch < chunks_; ++ch) {
      const std::uint64_t off = static_cast<std::uint64_t>(ch * chunk_rows_ * n * 2);
      WEFT_CUDA(cudaMemcpyAsync(peer_staging + off, send(s) + off, static_cast<std::size_t>(chunk_rows_ * n * 2),
                                cudaMemcpyDeviceToDevice, side));
      Overlap::raise(next_arrived + s * chunks_ + ch, 1, side);
    }
  }
  overlap_->join(stream);  // our sends are done: the next run may overwrite them
}

}  // namespace weft
