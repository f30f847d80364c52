// overlap.hpp (private) - what the overlapped operators (AgGemm, GemmRs, GemmAr) share:
// their construction checks, a side stream for the copy engines, the
// start-of-run "free" exchange, chunked pushes whose flags the stream front end
// raises, and the measured choice between fused and sequential paths.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "schedule.hpp"
#include "weft/core/nccl_type.hpp"
#include "weft/gemm/gemm.hpp"
#include "weft/ops/collective.hpp"
#include "weft/ops/gemm_rs.hpp"
#include "weft/runtime/context.hpp"

namespace weft::ops_detail {

/// How a plan's rows split: rows per rank, and those rows in equal chunks
/// (the copy and signal unit).
struct RowChunks {
  std::int64_t rows_per_rank, chunks, chunk_rows;
};

/// An overlapped plan's shape and type, as require_shape checked them.
struct PlanShape {
  std::int64_t m, n, k;
  DType dtype;
};

/// The checks every overlapped plan makes at construction: positive M, N, K;
/// bf16 or fp16 (the hooked kernels' types). Throws naming `who`; returns the
/// shape it checked.
PlanShape require_shape(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype);

/// For a shape require_shape checked: M a multiple of the world size;
/// chunks_wanted >= 1. Throws naming `who`. Returns the row split: rows of
/// `row_bytes` bytes in schedule::copy_chunks chunks (at most chunks_wanted,
/// none under min_chunk_bytes or WEFT_OVERLAP_MIN_CHUNK where set, equal rows).
RowChunks plan_rows(const char* who, const PlanShape& shape, int chunks_wanted, int world, std::int64_t row_bytes,
                    std::int64_t min_chunk_bytes = schedule::kMinChunkBytes);

/// Why the GEMM engine cannot tile the plan's GEMM `g` ("" where it can;
/// Gemm::can_tile's rule: for 2-byte elements, K and N multiples of 8). Such
/// plans run their sequential path on cuBLAS (which takes any K) and say so
/// once, at info level: an overlapped operator never refuses a shape cuBLAS and
/// the collective can compute.
std::string untileable_reason(const GemmOptions& g);

/// The alignment the operands of a plan whose GEMM is `g` need: 16 bytes where
/// weft's kernels may run (TMA), one element where the shape leaves cuBLAS
/// alone (Gemm::can_tile).
inline unsigned operand_alignment(const GemmOptions& g) {
  return Gemm::can_tile(g) ? 16 : static_cast<unsigned>(dtype_size(g.input));
}

/// The mode a plan runs in: `requested`, or sequential where `why_not_fused` is not
/// empty (logged once, at info, naming `who`, the shape and the reason).
OverlapMode runnable_mode(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, OverlapMode requested,
                          const std::string& why_not_fused);

/// "AgGemm plan: 8192 x 14336 x 8192 bf16, B [N,K], auto": what the ranks compare (verify_same_call).
std::string plan_description(const char* who, std::int64_t m, std::int64_t n, std::int64_t k, DType dtype,
                             BLayout layout, OverlapMode mode);

/// Replaces each of `values` by its maximum over the ranks of `store` (one
/// all_gather). Collective; every rank passes as many values, else every
/// rank throws naming each rank's count. `what` names the exchange in errors.
void max_over_ranks(Store& store, std::vector<float>& values, const char* what);

/// GemmOptions::agree for a plan's GEMMs: max_over_ranks of the tuning
/// timings through the context's store, so every rank runs the same
/// configuration, picked by the slowest rank's time. Collective.
std::function<void(std::vector<float>&)> slowest_rank(std::shared_ptr<Context> ctx);

/// GemmOptions::max_sms for the GEMMs of a plan whose tiles wait for rows
/// that other ranks' GEMMs produce and copies carry. Between GPUs the copies
/// run on copy engines (weft-copy-probe) and each GEMM has its GPU: every SM
/// (0). Where ranks share a GPU, two things change. A copy into a peer's
/// buffer stays within the GPU and runs as a kernel (weft-copy-probe at 2
/// ranks on one H200: it waits for SMs), so it needs SMs the waiting tiles do
/// not hold. And a persistent GEMM assigns its tiles to its CTAs up front, so
/// a CTA that never becomes resident stalls every rank downstream of its
/// tiles: all the ranks' GEMMs must be resident at once, placed as clusters
/// of 2 SMs among SMs that copies and other ranks' kernels also take. So the
/// GEMMs keep to half the rank's share (Team::sm_count), the rest left to
/// copies and to the slack that cluster placement needs.
int sms_beside_copies(const Context& ctx);

/// True while `stream` is being captured into a CUDA graph.
bool capturing(cudaStream_t stream);

/// Every operand non-null and `alignment`-byte aligned (16: TMA's requirement;
/// 2, an element, for plans that run cuBLAS only), checked before a run starts
/// any collective work; throws naming `who` and the pointer.
void require_operands(const char* who, std::initializer_list<const void*> operands, unsigned alignment = 16);

/// The machinery of one overlapped plan, and which way it runs. Collective construction.
class Overlap {
 public:
  /// `name` prefixes the symmetric allocations ("ag_gemm"); `mode` fixes the
  /// path now (fused, sequential) or on the first run (automatic); `what`
  /// names the plan in the path choice's log ("AgGemm 8192 x 14336 x 8192").
  Overlap(std::shared_ptr<Context> ctx, const std::string& name, OverlapMode mode, std::string what);
  ~Overlap();
  Overlap(const Overlap&) = delete;
  Overlap& operator=(const Overlap&) = delete;

  /// One way to run the call fused: its path name ("fused", "fused, one
  /// launch") and `enqueue(s)`, which puts the overlapped call on stream s.
  struct Fused {
    std::string name;
    std::function<void(cudaStream_t)> enqueue;
  };
  /// Runs one call the chosen way, of these paths: each of `fused` (in order;
  /// each goes through launch() with `key`), "sequential" (`sequential(false)`:
  /// a plain GEMM, then weft's collective) and "sequential, NCCL" (where the Context has NCCL)
  /// (`sequential(true)`). The candidates: automatic, all of them; fused, the
  /// fused ones; sequential, the two sequential ones. On the first call
  /// outside graph capture with more than one candidate, `first` runs before
  /// anything else where a fused path is a candidate (a sequential run that
  /// fills the buffers, and tuning), then each candidate is warmed up once and
  /// timed: 7 interleaved samples of 3 back-to-back calls, each candidate's
  /// slowest rank (so all ranks agree), the fastest kept and logged. Under
  /// capture the first call takes the first candidate untimed.
  void run(cudaStream_t stream, std::initializer_list<const void*> key, const std::function<void()>& first,
           const std::vector<Fused>& fused, const std::function<void(bool nccl)>& sequential);
  /// True once the path is a fused one.
  bool fused() const { return path_ >= 0 && path_ < fused_paths_; }
  /// The chosen path's name ("fused", "sequential", "sequential, NCCL", ...), or "" before the first run.
  std::string path() const { return path_name_; }
  /// The first automatic run's medians (ms, slowest rank): the fused path, and
  /// the fastest sequential one; 0 where not timed. (The fused path's: the
  /// fastest fused one.)
  float fused_ms() const { return fused_ms_; }
  float sequential_ms() const { return sequential_ms_; }

  /// Enqueues one fused call through a CUDA graph: `enqueue(s)` puts the call
  /// on stream `s`. A fused call is dozens of API calls (the "free" exchange, GEMM
  /// launches, copies, stream waits and writes per chunk); at small shapes
  /// enqueueing them takes as long as running them. So the first call runs
  /// `enqueue` directly (it may tune), later calls capture it once per `key`
  /// (the call's operand pointers) on a private stream and launch the graph:
  /// one API call. Up to 8 graphs are kept; a plan whose pointers keep
  /// changing (16 captures) goes back to enqueueing directly, as does a call
  /// made under the caller's own capture, or WEFT_PLAN_GRAPHS=0.
  /// `path` names the fused path (its index in run()'s `fused`): each has its own graphs.
  void launch(cudaStream_t stream, int path, std::initializer_list<const void*> key,
              const std::function<void(cudaStream_t)>& enqueue);

  /// Starts a fused run and returns the side stream, forked from `stream`.
  /// On `stream`: zeroes reset[0, reset_count) (this rank's flags of the last
  /// run, which no peer writes again before it hears "free" from us). On the
  /// side stream, forked after that: tells every peer "my buffers are free for
  /// this run" with a write from the stream's front end, behind a memory
  /// barrier; then waits for every peer's "free" and takes it back (sets it to
  /// 0), so what is enqueued there next only writes into free buffers. No wait
  /// holds an SM and `stream` waits for no peer and no write: the GEMM
  /// enqueued next starts on its local rows right after the reset. Why taking "free" back cannot erase the peer's next one:
  /// the peer says "free" again only at the start of its next run, after its
  /// GEMM of this run, which needed the pushes we enqueue after taking it back.
  cudaStream_t begin(cudaStream_t stream, std::uint64_t* reset = nullptr, int reset_count = 0);
  /// `stream` continues after everything enqueued on the side stream so far.
  void join(cudaStream_t stream);
  /// On `side`: copies chunk c of `chunk_bytes` from `src` to `dst` (same
  /// offset, cudaMemcpyAsync), then sets flags[c] to 1 from the stream's front
  /// end (cuStreamWriteValue64, behind a memory barrier): no SM is needed, so
  /// nothing queues behind a persistent kernel that waits for the flag. `dst`
  /// and `flags` may be a peer's, as mapped here; null `flags`: no flag (a
  /// local move).
  static void push_chunk(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c, std::uint64_t* flags,
                         cudaStream_t side);
  /// push_chunk, but only once done[c] >= done_value: the side stream's front
  /// end waits for the GEMM's tiles to have stored the chunk (weft::RowsDone),
  /// so it goes while the GEMM goes on. Fork the side stream before the GEMM
  /// is enqueued, or it waits for the whole GEMM.
  static void push_chunk_when_stored(void* dst, const void* src, std::uint64_t chunk_bytes, std::int64_t c,
                                     const std::uint64_t* done, std::uint64_t done_value, std::uint64_t* flags,
                                     cudaStream_t side);
  /// push_chunk by column band: of `rows` rows of `row_bytes` bytes, copies
  /// bytes [c * band_bytes, (c + 1) * band_bytes) of every row (one 2-D copy,
  /// cudaMemcpy2DAsync), then sets flags[c] to 1 as push_chunk does.
  static void push_column_band(void* dst, const void* src, std::int64_t rows, std::uint64_t row_bytes,
                               std::uint64_t band_bytes, std::int64_t c, std::uint64_t* flags, cudaStream_t side);
  /// Waits on `stream` until flags[i] >= 1 for every i in [0, count) whose
  /// rank (i / per_rank) is not this one. One small kernel, bounded by the
  /// timeout. `consume`: it sets each flag back to 0 once seen, for a caller
  /// whose flags nobody else reads and no peer raises again before it hears
  /// "free" from this rank's next run (so no reset is needed after it).
  void wait_all(std::uint64_t* flags, int count, int per_rank, cudaStream_t stream, bool consume);
  /// How AllGather+GEMM's and GEMM+AllReduce's arrival flags go back to 0
  /// between runs. By default their readers consume them
  /// (RowSignals::consume for AllGather+GEMM's hooked GEMM, the `consume` of
  /// wait_all and wait_from), so no memset sits ahead of the GEMM (or after
  /// GEMM+AllReduce's wait). WEFT_FLAG_RESET=memset: a memset, the way before
  /// (an A/B switch). GEMM+ReduceScatter always resets by memset at its start:
  /// its GEMMs consuming their source flags cost more than the memset
  /// (docs/decisions/0023).
  bool resets_by_memset() const { return reset_by_memset_; }
  /// Zeroes flags[0, count) on `stream` (a memset).
  static void reset_flags(std::uint64_t* flags, int count, cudaStream_t stream);
  /// Waits on `stream` until flags[i] >= 1 for every i in [0, count), all
  /// raised by rank `from_rank` (named if the wait times out). One small
  /// kernel; `consume` as wait_all's.
  void wait_from(std::uint64_t* flags, int count, int from_rank, cudaStream_t stream, bool consume);

  /// WEFT_TRACE_OVERLAP=N: the first N fused calls of a plan after its path
  /// choice run on their own (after a barrier, no graph, synchronised after),
  /// and each logs its timeline at info level: every mark's time since the
  /// call started, in us. Plans mark where their streams reach a step
  /// (`label`: "step 0 GEMM", "side: step 0 chunk 1 sent"), nested plans
  /// (GemmAr's GemmRs) included. Outside a traced call a mark records nothing.
  static void mark(cudaStream_t stream, const std::string& label);
  /// True inside a traced call: label-building code can skip its formatting otherwise.
  static bool recording();

  /// WEFT_TILE_WAITS=1: device counters, one per flag of the plan (`flags` of
  /// them, indexed as its flags), that its hooked GEMMs add their tiles'
  /// waiting time to (RowSignals::waited_ns); logged at info level per fused
  /// call when the plan is destroyed (in all, for a plan run by an enclosing
  /// one): how long tiles stalled on each chunk. Call once, at construction.
  void count_tile_waits(int flags);
  /// The counters of count_tile_waits, or null (and nothing is measured).
  unsigned long long* tile_wait_counter() const { return tile_waits_; }

 private:
  struct Path {
    std::string name;
    std::function<void()> call;
  };
  /// The side stream starts after everything enqueued on `stream` so far.
  cudaStream_t fork(cudaStream_t stream);
  void choose(const std::vector<Path>& paths, const std::vector<int>& candidates, cudaStream_t stream);
  void print_trace(cudaStream_t stream);

  struct CachedGraph {
    int path;  // the fused path it was captured for
    std::vector<const void*> key;
    cudaGraphExec_t exec = nullptr;
  };

  std::shared_ptr<Context> ctx_;
  SymmetricBuffer ready_;  // u64 [W], zeroed: word q = 1 once rank q said "free" for our next pushes
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_ = nullptr, join_ = nullptr;
  OverlapMode mode_;
  std::string what_;
  bool use_graphs_ = true;
  bool reset_by_memset_ = false;  // WEFT_FLAG_RESET=memset: flags are reset by memsets, not consumed
  int captures_ = 0;
  cudaStream_t capture_ = nullptr;
  std::vector<CachedGraph> graphs_;
  int path_ = -1;  // [0, fused_paths_): fused; then sequential, sequential with NCCL; -1: undecided
  int fused_paths_ = 0;
  std::vector<bool> enqueued_once_;  // per fused path: its first call runs directly (it may tune)
  std::string path_name_;
  float fused_ms_ = 0, sequential_ms_ = 0;
  int trace_left_ = 0;  // WEFT_TRACE_OVERLAP: fused calls still to trace
  unsigned long long* tile_waits_ = nullptr;  // WEFT_TILE_WAITS: per flag, ns the tiles waited, all fused calls
  int tile_wait_flags_ = 0;
  long long fused_calls_ = 0;
};

/// GemmRs's fused ways, in the order plans list (and, on their first run, tune) them.
inline constexpr FusedWay kFusedWays[] = {FusedWay::ring_per_step, FusedWay::ring_one_launch,
                                          FusedWay::ring_plain_first, FusedWay::one_launch_add};

/// The way whose path name (weft::path_name) is `path`; FusedWay::automatic for any other.
FusedWay fused_way_of(const std::string& path);

/// The fused paths of a plan built on GemmRs (GemmRs, GemmAr): one per way
/// the plan built, the per-step ring first (the pick under capture);
/// `enqueue(s, way)` enqueues one fused call.
std::vector<Overlap::Fused> fused_ways(const GemmRs& plan, const std::function<void(cudaStream_t, FusedWay)>& enqueue);

}  // namespace weft::ops_detail
