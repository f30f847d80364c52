// Every device primitive, on real peers: scoped loads/stores/atomics, wait/notify
// with all six comparisons and both signal ops, put/get/put-with-signal in every
// form, fence/quiet, device and stream barriers, and the async-proxy fence.
// Each rank talks to the next rank (rank + 1 mod world) and hears from the
// previous one, so the same tests run at any world size, 1 included.
#include <thread>

#include "gpu_check.hpp"
#include "gpu_test.hpp"
#include "weft/core/error.hpp"
#include "weft/device.cuh"

using namespace weft;
using dev::Cmp;
using dev::Scope;
using dev::SignalOp;
using weft::test::ctx;

namespace {

int prev_rank() { return (ctx().rank() + ctx().world_size() - 1) % ctx().world_size(); }

// A symmetric scratch allocation freed at scope exit (collective both ways).
struct Scratch {
  SymmetricBuffer buf;
  Scratch(std::uint64_t bytes, const char* name) : buf(ctx().heap(), bytes, "bytes", name) {}
  template <class T>
  T* as() const { return buf.as<T>(); }
};

std::uint64_t read_u64(const std::uint64_t* d) {
  std::uint64_t h = 0;
  WEFT_CUDA(cudaMemcpy(&h, d, sizeof(h), cudaMemcpyDeviceToHost));
  return h;
}

// ---------------------------------------------------------------------------
// Message passing: block 0 sends 256 words then releases a flag to the next
// rank; block 1 acquires the flag from the previous rank and checks the words;
// an ack flows back so the sender never overwrites unread data.
constexpr int kWords = 256;

template <bool kShmemApi>
__global__ void message_passing(dev::World w, std::uint64_t* data, std::uint64_t* flag, std::uint64_t* ack,
                                std::uint64_t* staging, int iters, unsigned long long* errors) {
  const int next = (w.rank + 1) % w.size, prev = (w.rank + w.size - 1) % w.size;
  if (blockIdx.x == 0) {
    for (int i = 1; i <= iters; ++i) {
      if (threadIdx.x == 0) dev::wait_until(w, ack, Cmp::ge, i - 1, Scope::sys);
      __syncthreads();
      if (kShmemApi) {  // stage locally, put, fence, then a plain store of the flag
        for (int k = threadIdx.x; k < kWords; k += blockDim.x) staging[k] = std::uint64_t(i) * 1000 + k;
        __syncthreads();
        if (threadIdx.x == 0) {
          shmem::putmem(w, data, staging, kWords * sizeof(std::uint64_t), next);
          shmem::fence(w);
          shmem::p<std::uint64_t>(w, flag, i, next);
        }
      } else {  // direct peer stores, then a release by one thread after the block barrier
        for (int k = threadIdx.x; k < kWords; k += blockDim.x) w.symm_at(data, next)[k] = std::uint64_t(i) * 1000 + k;
        __syncthreads();
        if (threadIdx.x == 0) dev::st_release(w.symm_at(flag, next), i, Scope::sys);
      }
      __syncthreads();
    }
  } else {
    for (int i = 1; i <= iters; ++i) {
      if (threadIdx.x == 0) dev::wait_until(w, flag, Cmp::ge, i, Scope::sys);
      __syncthreads();
      for (int k = threadIdx.x; k < kWords; k += blockDim.x)
        if (data[k] != std::uint64_t(i) * 1000 + k) atomicAdd(errors, 1ull);
      __syncthreads();
      if (threadIdx.x == 0) dev::notify(w, ack, prev, i, SignalOp::set, Scope::sys);
    }
  }
}

template <bool kShmemApi>
void run_message_passing() {
  Scratch s(sizeof(std::uint64_t) * (2 * kWords + 2), kShmemApi ? "test.mp.shmem" : "test.mp.dev");
  auto* data = s.as<std::uint64_t>();
  unsigned long long* errors = nullptr;
  WEFT_CUDA(cudaMalloc(&errors, sizeof(*errors)));
  WEFT_CUDA(cudaMemset(errors, 0, sizeof(*errors)));
  ctx().host_barrier("message passing ready");
  message_passing<kShmemApi><<<2, 128, 0, test::stream()>>>(ctx().world(), data, data + kWords, data + kWords + 1,
                                                            data + kWords + 2, 2000, errors);
  ctx().synchronize(test::stream());
  EXPECT_EQ(read_u64(reinterpret_cast<std::uint64_t*>(errors)), 0u);
  EXPECT_EQ(read_u64(data + kWords), 2000u);
  WEFT_CUDA(cudaFree(errors));
  ctx().host_barrier("message passing done");
}

// ---------------------------------------------------------------------------
__global__ void atomics_kernel(dev::World w, std::uint64_t* cells, int adds, std::uint64_t* won) {
  std::uint64_t* on_rank0 = w.symm_at(cells, 0);
  for (int a = 0; a < adds; ++a) {
    dev::atomic_add(on_rank0 + 0, 1, Scope::sys);
    dev::red_release(on_rank0 + 1, 2, Scope::sys);
    shmem::atomic_fetch_add(w, cells + 2, 3, 0);
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    *won = dev::atomic_cas(on_rank0 + 3, 0, w.rank + 1, Scope::sys) == 0;
    won[1] = shmem::atomic_compare_swap(w, cells + 4, 0, w.rank + 1, 0) == 0;
  }
}

// ---------------------------------------------------------------------------
// Waits: block 0 waits on this rank's flags; block 1 updates the next rank's.
struct WaitCase {
  const char* name;
  std::uint64_t initial;
  Cmp cmp;
  std::uint64_t target;
  SignalOp op;
  std::uint64_t v1, v2;  // two updates (v2 = 0: none)
  std::uint64_t final_value;
};

__global__ void wait_kernel(dev::World w, std::uint64_t* flags, WaitCase c, bool warp_form, std::uint64_t* seen) {
  const int next = (w.rank + 1) % w.size;
  if (blockIdx.x == 0) {
    if (warp_form) {
      if (threadIdx.x < 32) dev::wait(w, flags, 32, c.target, c.cmp, Scope::sys);
      if (threadIdx.x < 32) seen[threadIdx.x] = dev::ld_acquire(flags + threadIdx.x, Scope::sys);
    } else if (threadIdx.x == 0) {
      seen[0] = shmem::signal_wait_until(w, flags, c.cmp, c.target);
    }
  } else if (threadIdx.x < (warp_form ? 32u : 1u)) {
    std::uint64_t t0 = dev::globaltimer_ns();
    while (dev::globaltimer_ns() - t0 < 20000) {  // let the waiter start spinning first
    }
    dev::notify(w, flags + threadIdx.x, next, c.v1, c.op, Scope::sys);
    if (c.v2) dev::notify(w, flags + threadIdx.x, next, c.v2, c.op, Scope::sys);
  }
}

// ---------------------------------------------------------------------------
enum class Form { thread, warp, block };

__global__ void put_kernel(dev::World w, char* dest, const char* src, std::uint64_t bytes, std::uint64_t* sig,
                           Form form, bool nbi, bool with_signal, std::uint64_t value) {
  const int next = (w.rank + 1) % w.size;
  const bool lane_of_warp0 = threadIdx.x < 32;
  switch (form) {
    case Form::thread:
      if (threadIdx.x != 0) break;
      if (with_signal && nbi) shmem::putmem_signal_nbi(w, dest, src, bytes, sig, value, SignalOp::set, next);
      else if (with_signal) shmem::putmem_signal(w, dest, src, bytes, sig, value, SignalOp::set, next);
      else if (nbi) shmem::putmem_nbi(w, dest, src, bytes, next);
      else shmem::putmem(w, dest, src, bytes, next);
      break;
    case Form::warp:
      if (!lane_of_warp0) break;
      if (with_signal && nbi) shmem::putmem_signal_nbi_warp(w, dest, src, bytes, sig, value, SignalOp::set, next);
      else if (with_signal) shmem::putmem_signal_warp(w, dest, src, bytes, sig, value, SignalOp::set, next);
      else if (nbi) shmem::putmem_nbi_warp(w, dest, src, bytes, next);
      else shmem::putmem_warp(w, dest, src, bytes, next);
      break;
    case Form::block:
      if (with_signal && nbi) shmem::putmem_signal_nbi_block(w, dest, src, bytes, sig, value, SignalOp::set, next);
      else if (with_signal) shmem::putmem_signal_block(w, dest, src, bytes, sig, value, SignalOp::set, next);
      else if (nbi) shmem::putmem_nbi_block(w, dest, src, bytes, next);
      else shmem::putmem_block(w, dest, src, bytes, next);
      break;
  }
  shmem::quiet(w);
  // With a signal, this rank also waits for the previous rank's data (the point of the signal).
  if (with_signal && threadIdx.x == 0) shmem::signal_wait_until(w, sig, Cmp::ge, value);
}

__global__ void get_kernel(dev::World w, char* dest, const char* src, std::uint64_t bytes, Form form, bool nbi) {
  const int prev = (w.rank + w.size - 1) % w.size;
  switch (form) {
    case Form::thread:
      if (threadIdx.x == 0) nbi ? shmem::getmem_nbi(w, dest, src, bytes, prev) : shmem::getmem(w, dest, src, bytes, prev);
      break;
    case Form::warp:
      if (threadIdx.x < 32)
        nbi ? shmem::getmem_nbi_warp(w, dest, src, bytes, prev) : shmem::getmem_warp(w, dest, src, bytes, prev);
      break;
    case Form::block:
      nbi ? shmem::getmem_nbi_block(w, dest, src, bytes, prev) : shmem::getmem_block(w, dest, src, bytes, prev);
      break;
  }
  shmem::quiet(w);
}

// ---------------------------------------------------------------------------
__global__ void barrier_loop(dev::World w, std::uint64_t* counter, int iters, bool sync_only,
                             unsigned long long* errors) {
  for (int i = 0; i < iters; ++i) {
    for (int p = threadIdx.x; p < w.size; p += blockDim.x) shmem::atomic_add(w, counter, 1, p);
    sync_only ? shmem::sync_all_block(w) : shmem::barrier_all_block(w);
    if (threadIdx.x == 0 && shmem::atomic_fetch(w, counter, w.rank) != std::uint64_t(w.size) * (i + 1))
      atomicAdd(errors, 1ull);
    sync_only ? shmem::sync_all_block(w) : shmem::barrier_all_block(w);
  }
}

__global__ void stamp_next(dev::World w, std::uint64_t* slot, std::uint64_t value) {
  dev::st_relaxed(w.symm_at(slot, (w.rank + 1) % w.size), value, Scope::sys);
}
__global__ void check_stamp(const std::uint64_t* slot, std::uint64_t value, unsigned long long* errors) {
  if (dev::ld_relaxed(slot, Scope::sys) != value) atomicAdd(errors, 1ull);
}

// ---------------------------------------------------------------------------
// TMA (async proxy) reads data that the previous rank wrote with ordinary stores.
constexpr unsigned kTmaBytes = 4096;

__global__ void tma_read_after_wait(dev::World w, const char* src, std::uint64_t* flag, std::uint64_t epoch, char* out) {
  __shared__ alignas(128) unsigned char smem[kTmaBytes];
  __shared__ alignas(8) std::uint64_t bar;
  if (threadIdx.x == 0) {
    dev::wait_until(w, flag, Cmp::ge, epoch, Scope::sys);
    dev::fence_proxy_async_global();  // the helper under test: generic-proxy writes -> async-proxy reads
    auto bar_addr = static_cast<unsigned>(__cvta_generic_to_shared(&bar));
    auto smem_addr = static_cast<unsigned>(__cvta_generic_to_shared(smem));
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(bar_addr));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar_addr), "r"(kTmaBytes) : "memory");
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                 ::"r"(smem_addr), "l"(src), "r"(kTmaBytes), "r"(bar_addr) : "memory");
    unsigned done = 0;
    while (!done)
      asm volatile("{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0; selp.u32 %0, 1, 0, p; }"
                   : "=r"(done) : "r"(bar_addr) : "memory");
  }
  __syncthreads();
  for (unsigned i = threadIdx.x; i < kTmaBytes; i += blockDim.x) out[i] = static_cast<char>(smem[i]);
}

}  // namespace

TEST(Primitives, ReleaseAcquireMessagePassing) { run_message_passing<false>(); }
TEST(Primitives, PutFenceFlagMessagePassing) { run_message_passing<true>(); }

TEST(Primitives, AtomicsOnAPeer) {
  Scratch s(8 * sizeof(std::uint64_t), "test.atomics");
  auto* cells = s.as<std::uint64_t>();
  std::uint64_t* won = nullptr;
  WEFT_CUDA(cudaMalloc(&won, 2 * sizeof(std::uint64_t)));
  ctx().host_barrier("atomics ready");
  const int blocks = 8, threads = 128, adds = 10;
  atomics_kernel<<<blocks, threads, 0, test::stream()>>>(ctx().world(), cells, adds, won);
  ctx().synchronize(test::stream());
  ctx().host_barrier("atomics done");
  const std::uint64_t per_rank = std::uint64_t{blocks} * threads * adds, world = ctx().world_size();
  std::uint64_t wins = 0;
  for (auto& v : test::gather(std::to_string(read_u64(won)) + "," + std::to_string(read_u64(won + 1)))) {
    wins += std::stoull(v.substr(0, v.find(','))) * 100 + std::stoull(v.substr(v.find(',') + 1));
  }
  EXPECT_EQ(wins, 101u) << "exactly one rank must win each compare-and-swap";
  if (ctx().rank() == 0) {
    EXPECT_EQ(read_u64(cells + 0), per_rank * world);
    EXPECT_EQ(read_u64(cells + 1), 2 * per_rank * world);
    EXPECT_EQ(read_u64(cells + 2), 3 * per_rank * world);
    EXPECT_GE(read_u64(cells + 3), 1u);
    EXPECT_LE(read_u64(cells + 3), world);
  }
  WEFT_CUDA(cudaFree(won));
}

TEST(Primitives, WaitWithEveryComparisonAndSignalOp) {
  const WaitCase cases[] = {
      {"eq", 0, Cmp::eq, 5, SignalOp::set, 5, 0, 5},   {"ne", 0, Cmp::ne, 0, SignalOp::set, 9, 0, 9},
      {"gt", 0, Cmp::gt, 5, SignalOp::add, 3, 3, 6},   {"ge", 0, Cmp::ge, 7, SignalOp::set, 7, 0, 7},
      {"lt", 100, Cmp::lt, 5, SignalOp::set, 4, 0, 4}, {"le", 100, Cmp::le, 5, SignalOp::set, 5, 0, 5},
      {"ge-add", 0, Cmp::ge, 8, SignalOp::add, 4, 4, 8},
  };
  std::uint64_t* seen = nullptr;
  WEFT_CUDA(cudaMalloc(&seen, 32 * sizeof(std::uint64_t)));
  for (const WaitCase& c : cases) {
    for (bool warp_form : {false, true}) {
      Scratch s(32 * sizeof(std::uint64_t), "test.wait.flags");
      auto* flags = s.as<std::uint64_t>();
      std::vector<std::uint64_t> init(32, c.initial);
      WEFT_CUDA(cudaMemcpy(flags, init.data(), 32 * sizeof(std::uint64_t), cudaMemcpyHostToDevice));
      WEFT_CUDA(cudaMemset(seen, 0xFF, 32 * sizeof(std::uint64_t)));
      ctx().host_barrier("wait case ready");
      wait_kernel<<<2, 64, 0, test::stream()>>>(ctx().world(), flags, c, warp_form, seen);
      ctx().synchronize(test::stream());
      ctx().host_barrier("wait case done");
      std::vector<std::uint64_t> got(32);
      WEFT_CUDA(cudaMemcpy(got.data(), seen, 32 * sizeof(std::uint64_t), cudaMemcpyDeviceToHost));
      for (int i = 0; i < (warp_form ? 32 : 1); ++i) {
        EXPECT_TRUE(dev::compare(got[i], c.cmp, c.target))
            << c.name << (warp_form ? " (warp)" : " (thread)") << ": returned " << got[i];
        if (c.v2 == 0) EXPECT_EQ(got[i], c.final_value) << c.name;
      }
      EXPECT_EQ(read_u64(flags), c.final_value) << c.name;
    }
  }
  WEFT_CUDA(cudaFree(seen));
}

TEST(Primitives, PutGetAndPutSignalInEveryForm) {
  const std::uint64_t sizes[] = {1005, (64u << 10) + 16};
  Scratch src_buf(256u << 10, "test.put.src"), dst_buf(256u << 10, "test.put.dst"), sig_buf(64, "test.put.sig");
  std::uint64_t value = 0;
  for (std::uint64_t bytes : sizes) {
    for (Form form : {Form::thread, Form::warp, Form::block}) {
      for (bool nbi : {false, true}) {
        for (int kind = 0; kind < 3; ++kind) {  // 0 put, 1 put+signal, 2 get
          const std::uint64_t offset = bytes % 16 ? 3 : 0;  // odd sizes also start unaligned
          char* src = src_buf.as<char>() + offset;
          char* dst = dst_buf.as<char>() + offset;
          std::uint64_t seed = bench::fresh_seed(ctx().rank(), bytes);
          auto seeds = test::gather(std::to_string(seed));
          bench::fill_random(src, bytes, seed, test::stream());
          bench::poison(dst, bytes, 0xC3, test::stream());
          ctx().synchronize(test::stream());
          ctx().host_barrier("put/get ready");
          ++value;
          if (kind == 2) get_kernel<<<1, 128, 0, test::stream()>>>(ctx().world(), dst, src, bytes, form, nbi);
          else
            put_kernel<<<1, 128, 0, test::stream()>>>(ctx().world(), dst, src, bytes, sig_buf.as<std::uint64_t>(), form,
                                                      nbi, kind == 1, value);
          ctx().barrier(test::stream());
          ctx().synchronize(test::stream());
          std::uint64_t bad = bench::count_mismatches_random(dst, bytes, std::stoull(seeds[prev_rank()]), test::stream());
          EXPECT_EQ(bad, 0u) << "bytes " << bytes << " form " << int(form) << " nbi " << nbi << " kind " << kind;
          ctx().host_barrier("put/get checked");
        }
      }
    }
  }
}

TEST(Primitives, DeviceBarriersHoldEveryRankInStep) {
  for (bool sync_only : {false, true}) {
    Scratch s(sizeof(std::uint64_t), "test.barrier.counter");
    unsigned long long* errors = nullptr;
    WEFT_CUDA(cudaMalloc(&errors, sizeof(*errors)));
    WEFT_CUDA(cudaMemset(errors, 0, sizeof(*errors)));
    ctx().host_barrier("barrier loop ready");
    barrier_loop<<<1, 64, 0, test::stream()>>>(ctx().world(), s.as<std::uint64_t>(), 500, sync_only, errors);
    ctx().synchronize(test::stream());
    EXPECT_EQ(read_u64(reinterpret_cast<std::uint64_t*>(errors)), 0u) << (sync_only ? "sync_all" : "barrier_all");
    WEFT_CUDA(cudaFree(errors));
  }
}

TEST(Primitives, StreamBarrierOrdersWorkAcrossRanks) {
  Scratch s(sizeof(std::uint64_t), "test.stream_barrier.slot");
  unsigned long long* errors = nullptr;
  WEFT_CUDA(cudaMalloc(&errors, sizeof(*errors)));
  WEFT_CUDA(cudaMemset(errors, 0, sizeof(*errors)));
  ctx().host_barrier("stream barrier ready");
  for (std::uint64_t i = 1; i <= 100; ++i) {
    // Rank 0 enqueues late: the barrier must still hold every rank's check until its stamp.
    if (ctx().rank() == 0 && i % 10 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
    stamp_next<<<1, 1, 0, test::stream()>>>(ctx().world(), s.as<std::uint64_t>(), i);
    ctx().barrier(test::stream());
    check_stamp<<<1, 1, 0, test::stream()>>>(s.as<std::uint64_t>(), i, errors);
    ctx().barrier(test::stream());  // nobody stamps i+1 before everyone checked i
  }
  ctx().synchronize(test::stream());
  EXPECT_EQ(read_u64(reinterpret_cast<std::uint64_t*>(errors)), 0u);
  WEFT_CUDA(cudaFree(errors));
}

TEST(Primitives, AsyncProxyReadsPeerWrittenDataAfterTheFence) {
  Scratch data(kTmaBytes, "test.tma.data"), src(kTmaBytes, "test.tma.src"), flag(8, "test.tma.flag");
  char* out = nullptr;
  WEFT_CUDA(cudaMalloc(&out, kTmaBytes));
  cudaStream_t reader;
  WEFT_CUDA(cudaStreamCreateWithFlags(&reader, cudaStreamNonBlocking));
  for (std::uint64_t epoch = 1; epoch <= 4; ++epoch) {
    std::uint64_t seed = bench::fresh_seed(ctx().rank(), epoch);
    auto seeds = test::gather(std::to_string(seed));
    bench::fill_random(src.as<char>(), kTmaBytes, seed, test::stream());
    bench::poison(out, kTmaBytes, 0x11, test::stream());
    ctx().synchronize(test::stream());
    ctx().host_barrier("tma ready");
    // The reader waits for the flag; the writer (on another stream) pushes, then signals.
    tma_read_after_wait<<<1, 128, 0, reader>>>(ctx().world(), data.as<char>(), flag.as<std::uint64_t>(), epoch, out);
    put_kernel<<<1, 128, 0, test::stream()>>>(ctx().world(), data.as<char>(), src.as<char>(), kTmaBytes,
                                              flag.as<std::uint64_t>(), Form::block, false, false, 0);
    // put_kernel without signal, then the flag: a second tiny put-with-signal carries it.
    put_kernel<<<1, 32, 0, test::stream()>>>(ctx().world(), data.as<char>(), src.as<char>(), 0,
                                             flag.as<std::uint64_t>(), Form::thread, false, true, epoch);
    ctx().synchronize(reader);
    ctx().synchronize(test::stream());
    EXPECT_EQ(bench::count_mismatches_random(out, kTmaBytes, std::stoull(seeds[prev_rank()]), test::stream()), 0u)
        << "epoch " << epoch;
    ctx().host_barrier("tma checked");
  }
  cudaStreamDestroy(reader);
  WEFT_CUDA(cudaFree(out));
}
