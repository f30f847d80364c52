#include "copy_pipe.hpp"

#include "weft/core/driver.hpp"
#include "weft/device.cuh"

namespace weft::ops_detail {
namespace {

// Each flag goes back to 0 once it reached `value`: this kernel is its only
// reader (as RowWait::count_out() for a waiting GEMM). `first_rank` and
// `per_rank` name who raises flag i (first_rank + i / per_rank); a flag of
// this rank is skipped unless `own` (a local count, raised here for `from`).
__global__ void wait_and_consume_kernel(dev::World w, std::uint64_t* flags, int count, int per_rank, int first_rank,
                                        std::uint64_t value, bool own) {
  for (int i = static_cast<int>(threadIdx.x); i < count; i += blockDim.x) {
    const int from = first_rank + i / per_rank;
    if (from == w.rank && !own) continue;
    dev::wait_until(w, flags + i, dev::Cmp::ge, value, dev::Scope::sys, from);
    dev::st_relaxed(flags + i, 0, dev::Scope::sys);
  }
}

/// flags[c] = 1 from `side`'s front end, once the work before it on `side` is done (no SM needed).
void raise_flag(std::uint64_t* flags, std::int64_t c, cudaStream_t side) {
  if (flags) WEFT_CU(driver().cuStreamWriteValue64(side, reinterpret_cast<CUdeviceptr>(flags + c), 1, 0));
}

}  // namespace

CopyPipe::CopyPipe(std::shared_ptr<Context> ctx, const std::string& name)
    : ctx_(std::move(ctx)),
      ready_(ctx_->heap(), static_cast<std::uint64_t>(ctx_->world_size()) * sizeof(std::uint64_t), "u64",
             name + ".ready") {
  WEFT_REQUIRE(ctx_->world_size() <= 1024, "overlapped operators support up to 1024 ranks, got ", ctx_->world_size());
}

cudaStream_t CopyPipe::begin(cudaStream_t stream, std::uint64_t* reset, int reset_count) {
  const int world = ctx_->world_size(), me = ctx_->rank();
  if (reset_count > 0) reset_flags(reset, reset_count, stream);
  auto* ready = ready_.as<std::uint64_t>();
  // "Free" goes from the side stream, forked after the reset and the caller's
  // last use of its buffers: the GEMM enqueued next on `stream` waits for
  // nothing but the reset. Flags 0: the write waits until the writes before
  // the fork are visible to the peer.
  WEFT_CUDA(cudaEventRecord(fork_, stream));
  WEFT_CUDA(cudaStreamWaitEvent(side_, fork_, 0));
  for (int p = 0; p < world; ++p)
    if (p != me)
      WEFT_CU(driver().cuStreamWriteValue64(
          side_, reinterpret_cast<CUdeviceptr>(static_cast<std::uint64_t*>(ctx_->heap().peer_ptr(ready + me, p))), 1,
          0));
  for (int p = 0; p < world; ++p) {
    if (p == me) continue;
    const auto flag = reinterpret_cast<CUdeviceptr>(ready + p);
    WEFT_CU(driver().cuStreamWaitValue64(side_, flag, 1, CU_STREAM_WAIT_VALUE_GEQ));
    WEFT_CU(driver().cuStreamWriteValue64(side_, flag, 0, 0));
  }
  return side_;
}

cudaStream_t CopyPipe::fork(cudaStream_t stream) {
  WEFT_CUDA(cudaEventRecord(fork_, stream));
  WEFT_CUDA(cudaStreamWaitEvent(side_, fork_, 0));
  return side_;
}

void CopyPipe::join(cudaStream_t stream) {
  WEFT_CUDA(cudaEventRecord(join_, side_));
  WEFT_CUDA(cudaStreamWaitEvent(stream, join_, 0));
}

void push_chunk(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c, std::uint64_t* flags,
                cudaStream_t side) {
  const std::uint64_t off = static_cast<std::uint64_t>(c) * chunk_bytes;
  if (chunk_bytes > 0)  // an empty chunk (a rank with no tokens) still raises its flag
    WEFT_CUDA(cudaMemcpyAsync(static_cast<char*>(dst) + off, static_cast<const char*>(src) + off, chunk_bytes,
                              cudaMemcpyDeviceToDevice, side));
  raise_flag(flags, c, side);
}

void push_column_band(void* dst, const void* src, std::int64_t rows, std::uint64_t row_bytes,
                      std::uint64_t band_bytes, std::int64_t c, std::uint64_t* flags, cudaStream_t side) {
  const std::uint64_t off = static_cast<std::uint64_t>(c) * band_bytes;
  WEFT_CUDA(cudaMemcpy2DAsync(static_cast<char*>(dst) + off, row_bytes, static_cast<const char*>(src) + off, row_bytes,
                              band_bytes, static_cast<std::size_t>(rows), cudaMemcpyDeviceToDevice, side));
  raise_flag(flags, c, side);
}

void push_chunk_when_stored(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c,
                            const std::uint64_t* done, std::uint64_t done_value, std::uint64_t* flags,
                            cudaStream_t side) {
  WEFT_CU(driver().cuStreamWaitValue64(side, reinterpret_cast<CUdeviceptr>(done + c), done_value,
                                       CU_STREAM_WAIT_VALUE_GEQ));
  push_chunk(dst, src, chunk_bytes, c, flags, side);
}

void raise_flag_when_done(std::uint64_t* flags, std::int64_t c, cudaStream_t stream) {
  WEFT_REQUIRE(flags, "raise_flag_when_done: needs a flag array, got a null pointer");
  raise_flag(flags, c, stream);
}

void reset_flags(std::uint64_t* flags, int count, cudaStream_t stream) {
  WEFT_CUDA(cudaMemsetAsync(flags, 0, static_cast<std::size_t>(count) * sizeof(std::uint64_t), stream));
}

void wait_all_and_consume(const dev::World& world, std::uint64_t* flags, int count, int per_rank,
                          cudaStream_t stream) {
  wait_and_consume_kernel<<<1, 256, 0, stream>>>(world, flags, count, per_rank, 0, 1, false);
  WEFT_CUDA(cudaGetLastError());
}

void wait_from_and_consume(const dev::World& world, std::uint64_t* flags, int count, int from_rank,
                           cudaStream_t stream) {
  wait_and_consume_kernel<<<1, 256, 0, stream>>>(world, flags, count, count, from_rank, 1, false);
  WEFT_CUDA(cudaGetLastError());
}

void wait_count_and_consume(const dev::World& world, std::uint64_t* count, std::uint64_t value, int from_rank,
                            cudaStream_t stream) {
  wait_and_consume_kernel<<<1, 32, 0, stream>>>(world, count, 1, 1, from_rank, value, true);
  WEFT_CUDA(cudaGetLastError());
}

}  // namespace weft::ops_detail
