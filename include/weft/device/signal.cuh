// weft/device/signal.cuh - tile-level wait/notify on 64-bit symmetric flags.
//
// Producers notify (release set/add on a flag, possibly a peer's); consumers
// wait (acquire spin until flag CMP value). Flags only ever move forward:
// each use compares against an epoch the owner advances, so nothing is reset.
//
// Every spin is bounded by World::wait_timeout_ns (WEFT_WAIT_TIMEOUT, default
// 60 s). Past it, the waiter writes a WaitReport naming its rank, the flag, the
// expected and the observed value, and traps; the host turns the report into
// a weft::Error (Context::synchronize). A hang becomes an error you can read.
#pragma once

#include <cstdint>

#include "weft/device/memory.cuh"
#include "weft/device/world.cuh"

#if defined(__CUDACC__)
namespace weft::dev {

namespace detail {
/// Records a timed-out wait in the World's report and traps. Two waiters that
/// time out at once may interleave their fields; either report names a real stuck wait.
WEFT_DEVICE void write_wait_report(const World& w, const std::uint64_t* flag, Cmp cmp, std::uint64_t expected,
                                   std::uint64_t observed, std::uint64_t waited_ns, int from) {
  if (WaitReport* r = w.wait_report) {
    volatile WaitReport* vr = r;
    if (vr->hit == 0) {
      vr->rank = w.rank;
      vr->flag_offset = w.offset_of(flag);
      vr->expected = expected;
      vr->observed = observed;
      vr->cmp = static_cast<std::uint32_t>(cmp);
      vr->block = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
      vr->waited_ns = waited_ns;
      vr->peer = from;
      __threadfence_system();
      vr->hit = 1;
      __threadfence_system();
    }
  }
  __trap();
}
/// The same, out of line: keeps the cold path out of the callers' spin loops.
static __device__ __noinline__ void report_wait_timeout(const World& w, const std::uint64_t* flag, Cmp cmp,
                                                        std::uint64_t expected, std::uint64_t observed,
                                                        std::uint64_t waited_ns, int from) {
  write_wait_report(w, flag, cmp, expected, observed, waited_ns, from);
}

/// wait_until's body; kNoCall writes the timeout report inline instead of calling out.
template <bool kNoCall>
WEFT_DEVICE std::uint64_t wait_until(const World& w, const std::uint64_t* flag, Cmp cmp, std::uint64_t value,
                                     Scope scope, int from) {
  std::uint64_t v = ld_acquire(flag, scope);
  if (!compare(v, cmp, value)) {
    std::uint64_t start = 0;
    std::uint32_t spins = 0;
    do {
      v = ld_relaxed(flag, scope);
      if (w.wait_timeout_ns != 0 && (++spins & 1023u) == 0) {
        std::uint64_t now = globaltimer_ns();
        if (start == 0) start = now;
        else if (now - start > w.wait_timeout_ns) {
          if constexpr (kNoCall) write_wait_report(w, flag, cmp, value, v, now - start, from);
          else report_wait_timeout(w, flag, cmp, value, v, now - start, from);
        }
      }
    } while (!compare(v, cmp, value));
    // The relaxed spin saw the value; an acquire load of the same flag reads
    // it or a later one (coherence) and orders this thread's later reads
    // after it. A fence instead of it costs 4x: weft-wait-probe, one H200,
    // a wait on a set flag at sys scope: 202 ns with ld.acquire against 874
    // with ld.relaxed + fence.acq_rel, and 1.0 against 3.9 us while the
    // block's other warps stream stores. The value returned is the one that held.
    (void)ld_acquire(flag, scope);
  }
  return v;
}
}  // namespace detail

/// Spins until (*flag CMP value) holds, then returns the value seen.
/// One thread; acquire at `scope` (use Scope::sys for flags that peers write).
/// Blocks; bounded by w.wait_timeout_ns (then reports and traps, naming
/// `from`, the rank expected to signal, if the caller knows it).
WEFT_DEVICE std::uint64_t wait_until(const World& w, const std::uint64_t* flag, Cmp cmp,
                                     std::uint64_t value, Scope scope, int from = -1) {
  return detail::wait_until<false>(w, flag, cmp, value, scope, from);
}

/// wait_until for kernels that must make no function call: the timeout
/// report is written inline. A kernel that sets its warps' register budgets
/// (setmaxnreg, as CUTLASS's warp-specialised GEMMs do) loses them to any
/// remaining call: ptxas then ignores setmaxnreg for the whole kernel
/// (warning C7507). Same arguments, ordering and bound as wait_until.
WEFT_DEVICE std::uint64_t wait_until_no_call(const World& w, const std::uint64_t* flag, Cmp cmp,
                                             std::uint64_t value, Scope scope, int from = -1) {
  return detail::wait_until<true>(w, flag, cmp, value, scope, from);
}

/// Warp-cooperative wait: every lane of the warp calls it with the same
/// arguments; lane i watches flags[i], flags[i+32], ... until each satisfies
/// (flag CMP value). Returns when all `count` flags do. Acquire at `scope`;
/// __syncwarp makes every lane's acquire cover the whole warp's later reads.
/// Blocks; bounded by the World's timeout.
WEFT_DEVICE void wait(const World& w, const std::uint64_t* flags, int count, std::uint64_t value,
                      Cmp cmp, Scope scope) {
  for (int i = static_cast<int>(threadIdx.x & 31u); i < count; i += 32)
    wait_until(w, flags + i, cmp, value, scope);
  __syncwarp();
}

/// Sets or adds `value` to `flag` on rank `pe` (flag is a symmetric address on
/// this rank; pe may be this rank). Release at `scope`: this thread's earlier
/// writes, and writes it has observed, are visible before the flag changes.
/// Use Scope::sys whenever pe is another GPU. Does not block.
WEFT_DEVICE void notify(const World& w, std::uint64_t* flag, int pe, std::uint64_t value, SignalOp op,
                        Scope scope) {
  std::uint64_t* target = w.symm_at(flag, pe);
  if (op == SignalOp::set) st_release(target, value, scope);
  else red_release(target, value, scope);
}

/// Programmatic dependent launch (Hopper): a kernel launched with weft's
/// launch helper may start while the previous kernel in its stream finishes.
/// pdl_wait() holds this grid until that kernel has completed and its memory
/// is visible; call it before the first read of anything earlier work wrote
/// (inputs, epochs, flags). pdl_trigger() lets the next kernel launch early.
/// Both are no-ops for kernels launched the ordinary way.
WEFT_DEVICE void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
WEFT_DEVICE void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

/// The epoch of this launch: the last completed launch's epoch + 1. Every block
/// calls it (any thread). Ordinary load: the previous launch on the same stream
/// finished before this one started. Does not block.
/// Waits for the previous kernel first (pdl_wait), so it is safe as a kernel's
/// first statement under programmatic dependent launch.
WEFT_DEVICE std::uint64_t epoch_begin(LaunchEpoch e) {
  pdl_wait();
  pdl_trigger();
  return *e.value + 1;
}

/// Every thread of every block calls it once, last: the final block to arrive
/// publishes `epoch` for the next launch. Does not block (one block barrier).
WEFT_DEVICE void epoch_end(LaunchEpoch e, std::uint64_t epoch) {
  __syncthreads();
  if (threadIdx.x + threadIdx.y + threadIdx.z == 0) {
    unsigned blocks = gridDim.x * gridDim.y * gridDim.z;
    if (atomicAdd(e.arrivals, 1u) == blocks - 1) {
      *e.arrivals = 0;
      *e.value = epoch;
    }
  }
}

}  // namespace weft::dev
#endif  // __CUDACC__
