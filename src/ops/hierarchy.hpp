// hierarchy.hpp (private) - the index maps of the two-level (multi-node) schedules, as plain functions.
//
// Past one node every operator runs a two-level schedule: NVLink inside a
// node, and a rail across nodes (the GPUs with the same local rank on every
// node, each with its own NIC). docs/SCALE.md and tools/model/scale_model.py
// describe these schedules and time them; this header is what they are, index
// by index: which shard or block a GPU sends at which step, to whom, which
// partial sums it waits for, in which order its GEMM walks the data. The
// kernels (device) and the CPU tests (host, grids of 1 to 8 nodes of 1 to 8
// GPUs) call the same functions, so a schedule that loses or duplicates a
// block fails on a machine without a GPU.
//
// Ranks are numbered node-major (NodeGrid): GPU (n, l) is rank n x L + l, and
// its rail is the GPUs (m, l) of every node m. Every node holds the same L
// GPUs, with contiguous ranks (grid_from_nodes says why not when they do not).
//
//   ag_*        AllGather (+GEMM): a ring on each rail, NVLink pushes of what lands
//   rs_*        (GEMM+)ReduceScatter: NVLink partials to the rail GPU, one NIC put
//               per remote node, the owner's final sum
//   ar_*, hd_*  AllReduce: ReduceScatter in the node, AllReduce of S / L on each
//               rail (direct or halving-doubling), AllGather in the node
//   ep_*        EP dispatch and combine, two hops: one NIC crossing per remote node, then NVLink
//               (ep_two_hop: a token's route; ep_walk: a call's steps; moe/ep_layout.hpp: the rows)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "schedule.hpp"
#include "weft/device/types.cuh"

namespace weft::hierarchy {

using schedule::wrap;

// ---- the grid ----

/// `nodes` nodes of `local` GPUs, ranks node-major: rank = node x local + local rank.
struct NodeGrid {
  int nodes = 1;
  int local = 1;

  WEFT_HD int world() const { return nodes * local; }
  WEFT_HD int rank(int node, int local_rank) const { return node * local + local_rank; }
  WEFT_HD int node_of(int rank) const { return rank / local; }
  WEFT_HD int local_of(int rank) const { return rank % local; }
  WEFT_HD bool valid() const { return nodes >= 1 && local >= 1; }
  /// The GPU on `gpu`'s rail `node_shift` nodes on (mod nodes): (n + shift, l).
  WEFT_HD int rail_peer(int gpu, int node_shift) const {
    return rank(wrap(node_of(gpu) + node_shift, nodes), local_of(gpu));
  }
  /// The GPU of `gpu`'s node `local_shift` local ranks on (mod local): (n, l + shift).
  WEFT_HD int node_peer(int gpu, int local_shift) const {
    return rank(node_of(gpu), wrap(local_of(gpu) + local_shift, local));
  }
};

/// The grid of a team whose rank r runs on node `node_of[r]` (node ids in
/// order of first appearance, as Team::node_of has them), into `grid`.
/// Returns "" when the ranks form a grid, else why not: the two-level
/// schedules need every node to hold the same number of ranks, contiguous.
inline std::string grid_from_nodes(const std::vector<int>& node_of, NodeGrid& grid) {
  const int world = static_cast<int>(node_of.size());
  if (world == 0) return "no ranks";
  int nodes = 0;
  for (int r = 0; r < world; ++r) {
    const int id = node_of[r];
    if (id < 0 || id > nodes)
      return "rank " + std::to_string(r) + " is on node " + std::to_string(id) +
             ": node ids must be 0, 1, ... in order of first appearance";
    if (id == nodes) ++nodes;
    if (r > 0 && id < node_of[r - 1])
      return "the ranks of node " + std::to_string(id) + " are not contiguous (rank " + std::to_string(r) +
             " follows a rank of node " + std::to_string(node_of[r - 1]) + ")";
  }
  std::vector<int> count(static_cast<std::size_t>(nodes), 0);
  for (int id : node_of) ++count[id];
  for (int n = 1; n < nodes; ++n)
    if (count[n] != count[0])
      return "node " + std::to_string(n) + " holds " + std::to_string(count[n]) + " ranks and node 0 holds " +
             std::to_string(count[0]) + ": the two-level schedules need nodes of equal size";
  grid = NodeGrid{nodes, count[0]};
  return "";
}

/// How a GPU gets a piece of data.
enum class Via : int {
  self = 0,    ///< it is its own
  rail = 1,    ///< over its NIC, from (or to) the GPU of its local rank on another node
  nvlink = 2,  ///< from (or to) a GPU of its own node
};

// ---- AllGather and AllGather+GEMM (scale_model.py: ag_arrivals, ag_weft) ----
//
// Shard s is rank s's. Rail ring: at step h (1..nodes-1) GPU (n, l) sends to
// (n+1, l) the shard it received at step h-1 (its own at h = 1), and receives
// from (n-1, l) the shard of (n-h, l). So after step h a GPU holds the shards
// of its rail h hops back; every GPU puts nodes-1 shards on its NIC.
//
// NVLink: at hop h (0: its own shard, then each rail step as it lands) GPU
// (n, l) pushes the shard of (n-h, l) to its local peers, at turn i
// (1..L-1) to (n, l-i). So (n, l) receives at turn i from (n, l+i), and at
// every turn the pushes of a node are a permutation: no GPU takes two at once.
//
// Arrival order (the tie rule): by hop, and within a hop the rail's shard
// first (its own at hop 0), then the peers' in turn order (l+1, l+2, ...):
//   i-th shard at (n, l) = shard of (n - i / L, l + i % L).
// It is the order in which the shards land when a hop's L-1 NVLink pushes take
// no longer than one rail step (the model's times); when NVLink lags, the next
// rail shard lands before the last pushes of the hop before, and the order
// still names every shard after everything its delivery depends on.

/// The GPU that (n, l) sends to on its rail (every step): (n+1, l).
WEFT_HD int ag_rail_to(NodeGrid g, int gpu) { return g.rail_peer(gpu, 1); }
/// The GPU that (n, l) receives from on its rail (every step): (n-1, l).
WEFT_HD int ag_rail_from(NodeGrid g, int gpu) { return g.rail_peer(gpu, -1); }
/// The shard (n, l) sends on its rail at step h (1..nodes-1): that of (n-h+1, l), the ring AllGather's on the rail.
WEFT_HD int ag_rail_send_shard(NodeGrid g, int gpu, int step) {
  return g.rank(schedule::ring_all_gather_shard(g.node_of(gpu), step, g.nodes), g.local_of(gpu));
}
/// The shard (n, l) receives on its rail at step h (1..nodes-1): that of (n-h, l).
WEFT_HD int ag_rail_recv_shard(NodeGrid g, int gpu, int step) { return g.rail_peer(gpu, -step); }
/// The shard (n, l) pushes to its local peers at hop h (0..nodes-1): that of (n-h, l), its own at hop 0,
/// then the one rail step h brought.
WEFT_HD int ag_push_shard(NodeGrid g, int gpu, int hop) { return ag_rail_recv_shard(g, gpu, hop); }
/// The local peer (n, l) pushes to at turn i (1..L-1) of every hop: (n, l-i). It is
/// schedule::shard_push_peer on the local rank, which is host-only, so not called here.
WEFT_HD int ag_push_to(NodeGrid g, int gpu, int turn) { return g.node_peer(gpu, -turn); }

/// The i-th shard (0..W-1) present at `gpu`, in arrival order (own first).
WEFT_HD int ag_arrival(NodeGrid g, int gpu, int i) {
  return g.node_peer(g.rail_peer(gpu, -(i / g.local)), i % g.local);
}
/// Where shard s falls in `gpu`'s arrival order (the inverse of ag_arrival).
WEFT_HD int ag_arrival_index(NodeGrid g, int gpu, int shard) {
  const int hop = wrap(g.node_of(gpu) - g.node_of(shard), g.nodes);
  return hop * g.local + wrap(g.local_of(shard) - g.local_of(gpu), g.local);
}

/// The local peer whose push (n, l) takes at turn i (1..L-1) of every hop: (n, l+i), the inverse of ag_push_to.
WEFT_HD int ag_push_from(NodeGrid g, int gpu, int turn) { return g.node_peer(gpu, turn); }

/// AllGather+GEMM: the shard whose rows `gpu`'s GEMM computes i-th (the arrival order).
WEFT_HD int ag_tile_order(NodeGrid g, int gpu, int i) { return ag_arrival(g, gpu, i); }

/// Who brings a shard, and after which event:
///   self:   its own, at the start;
///   rail:   `from` = (n-1, l), at rail step `hop`;
///   nvlink: `from` = a local peer, at turn `turn` of its hop `hop` (hop 0: the peer's own shard, at the
///           start; else once the peer's rail step `hop` has landed).
struct AgDelivery {
  Via via;
  int from;  ///< the GPU that sends it (itself for self)
  int hop;   ///< 0 for self; the rail step that brings it (rail) or brought it to `from` (nvlink)
  int turn;  ///< for nvlink, the sender's turn (1..L-1); 0 otherwise
};

/// How shard `shard` reaches `gpu`.
WEFT_HD AgDelivery ag_delivery(NodeGrid g, int gpu, int shard) {
  const int hop = wrap(g.node_of(gpu) - g.node_of(shard), g.nodes);
  const int turn = wrap(g.local_of(shard) - g.local_of(gpu), g.local);
  if (turn == 0) {
    if (hop == 0) return AgDelivery{Via::self, gpu, 0, 0};
    return AgDelivery{Via::rail, ag_rail_from(g, gpu), hop, 0};
  }
  return AgDelivery{Via::nvlink, g.node_peer(gpu, turn), hop, turn};
}

// ---- ReduceScatter and GEMM+ReduceScatter (scale_model.py: rs_weft) ----
//
// The output is W blocks, block b owned by rank b; every GPU holds (or its
// GEMM computes) a partial of every block. GPU (n, l) walks its W blocks in
// L-block groups by destination node: group k (0..nodes-1) is node
// (n+1+k) mod nodes, so the remote nodes come first (their sums have the NIC
// to cross) and its own node last; "farthest" is the shift k, chosen so that
// at every group each node sends to one node and receives from one, and no
// NIC takes two partials at once. Inside group k, at turn i (0..L-1) it
// computes the block of local rank (l+1+i) mod L of that node: the L-1 blocks
// its local peers' rails own first (pushed over NVLink to that peer, which
// sums them; each turn's pushes are a permutation of the node), the block of
// its own rail last.
//   step t = k x L + i:   block (n+1+k, l+1+i)
// Rail block (j, l), j != n: the GPU sums its own partial and the L-1 its
// peers pushed (all sent at earlier steps), and puts this node partial over
// its NIC to the owner (j, l). Own block (the last step): the node partial as
// above, then the nodes-1 node partials its rail peers put, summed from HBM.

/// The block `gpu` computes at step t (0..W-1).
WEFT_HD int rs_block(NodeGrid g, int gpu, int step) {
  return g.node_peer(g.rail_peer(gpu, 1 + step / g.local), 1 + step % g.local);
}
/// The step at which `gpu` computes block b (the inverse of rs_block).
WEFT_HD int rs_step(NodeGrid g, int gpu, int block) {
  const int k = wrap(g.node_of(block) - g.node_of(gpu) - 1, g.nodes);
  return k * g.local + wrap(g.local_of(block) - g.local_of(gpu) - 1, g.local);
}

/// Where `gpu`'s partial of a block goes:
///   nvlink: pushed to `to`, the local peer on the block's rail, who sums it;
///   rail:   summed here with the node's other partials, the node partial put to `to`, the owner;
///   self:   its own block (`to` = itself), summed here last.
struct RsRoute {
  Via via;
  int to;
};
WEFT_HD RsRoute rs_route(NodeGrid g, int gpu, int block) {
  if (g.local_of(block) != g.local_of(gpu)) return RsRoute{Via::nvlink, g.rank(g.node_of(gpu), g.local_of(block))};
  if (block != gpu) return RsRoute{Via::rail, block};
  return RsRoute{Via::self, gpu};
}

/// Partials a GPU waits for before each rail put (its peers', over NVLink): L-1.
WEFT_HD int rs_rail_waits(NodeGrid g) { return g.local - 1; }
/// Partials a GPU waits for before its final sum: L-1 over NVLink, nodes-1 node partials over its rail.
WEFT_HD int rs_final_waits(NodeGrid g) { return g.local - 1 + g.nodes - 1; }

/// For a block on `gpu`'s rail, the i-th (1..L-1) peer partial to arrive: from
/// (n, l-i), pushed at turn i-1 of its group for that block's node.
WEFT_HD int rs_peer_partial_from(NodeGrid g, int gpu, int i) { return g.node_peer(gpu, -i); }
/// The i-th (1..nodes-1) node partial of `gpu`'s own block to arrive: from
/// (n-i, l), put at the end of its group i-1.
WEFT_HD int rs_node_partial_from(NodeGrid g, int gpu, int i) { return g.rail_peer(gpu, -i); }

// ---- AllReduce (scale_model.py: ar_weft) ----
//
// Three phases over the S elements each GPU holds:
//  1. ReduceScatter in the node: slice q (schedule::split into L) is
//     owned by local rank q; at turn i (1..L-1) GPU (n, l) pushes its slice
//     l+i to (n, l+i), so it receives slice l's partials from l-i.
//  2. AllReduce of slice l along rail l (the nodes' sums of it), one of two ways:
//     - direct: at turn i (1..nodes-1) put the whole slice to (n+i, l); each
//       GPU sums the nodes' slices in ascending node order, so every GPU of the
//       rail computes the same bits. NIC: (nodes-1) S / L per GPU, one latency.
//     - halving then doubling (nodes a power of two): the slice is cut into
//       `nodes` sub-chunks (hd_sub_range; the kernels cut each block's piece
//       of it the same way on every GPU of the rail). Halving round r
//       (0..log2 nodes - 1) pairs node n with n xor (nodes >> (r+1)): each
//       keeps the half of its range on its side of that bit and sends the
//       other half, so after the last round node n holds sub-chunk n, summed. Doubling undoes it, round
//       d pairing n with n xor (1 << d), each sending all it holds.
//       Every sub-chunk is summed at one node and copied to the others, so
//       every GPU of the rail holds the same bits; the order of the sum is
//       the butterfly's, not ascending nodes, so its last bits may differ
//       from the direct way's. NIC: 2 (nodes-1) / nodes x S / L per GPU,
//       2 log2(nodes) latencies.
//       For other node counts the plan falls back to direct (ar_rail_way).
//  3. AllGather in the node: at turn i, GPU (n, l) pushes slice l to (n, l+i).

/// Elements [lo, hi) of slice q when `count` elements are shared by `local` GPUs (slice q: local rank q).
WEFT_HD void ar_slice(std::uint64_t count, int local, std::uint64_t grain, int q, std::uint64_t& lo,
                      std::uint64_t& hi) {
  schedule::split(0, count, grain, local, q, lo, hi);
}
/// In-node ReduceScatter and AllGather: the local peer (n, l) pushes to at turn i (1..L-1): (n, l+i).
WEFT_HD int ar_node_to(NodeGrid g, int gpu, int turn) { return g.node_peer(gpu, turn); }
/// ... and the one it receives from at turn i: (n, l-i).
WEFT_HD int ar_node_from(NodeGrid g, int gpu, int turn) { return g.node_peer(gpu, -turn); }
/// In-node ReduceScatter: the slice (n, l) pushes at turn i (its receiver's own): l+i.
WEFT_HD int ar_rs_slice(NodeGrid g, int gpu, int turn) { return g.local_of(ar_node_to(g, gpu, turn)); }

enum class RailWay : int { direct = 0, halving_doubling = 1 };

/// True when `nodes` is a power of two, at least 2.
WEFT_HD bool hd_applies(int nodes) { return nodes >= 2 && (nodes & (nodes - 1)) == 0; }
/// The way the rail runs when `want` is asked: halving-doubling only where it applies, else direct.
WEFT_HD RailWay ar_rail_way(int nodes, RailWay want) {
  return want == RailWay::halving_doubling && hd_applies(nodes) ? RailWay::halving_doubling : RailWay::direct;
}

/// Direct: the rail peer (n, l) puts its slice to at turn i (1..nodes-1): (n+i, l).
WEFT_HD int ar_direct_to(NodeGrid g, int gpu, int turn) { return g.rail_peer(gpu, turn); }
/// ... and the one whose slice it receives at turn i: (n-i, l).
WEFT_HD int ar_direct_from(NodeGrid g, int gpu, int turn) { return g.rail_peer(gpu, -turn); }

/// Halving-doubling rounds each way: log2(nodes) (nodes a power of two).
WEFT_HD int hd_rounds(int nodes) {
  int r = 0;
  while ((1 << r) < nodes) ++r;
  return r;
}
/// The sub-chunks [lo, hi) node n holds before halving round r (0..rounds; r =
/// rounds: after the last, [n, n+1)): the aligned run of nodes >> r sub-chunks that contains n.
WEFT_HD void hd_held(int node, int round, int nodes, int& lo, int& hi) {
  const int size = nodes >> round;
  lo = node / size * size;
  hi = lo + size;
}
/// Halving round r's partner of node n: n xor (nodes >> (r+1)). Node n sends it
/// hd_held(partner, r+1) and receives (to sum) hd_held(n, r+1).
WEFT_HD int hd_halving_partner(int node, int round, int nodes) { return node ^ (nodes >> (round + 1)); }
/// Doubling round d's partner of node n: n xor (1 << d). Node n sends it
/// hd_held(n, rounds-d) and receives hd_held(partner, rounds-d).
WEFT_HD int hd_doubling_partner(int node, int round) { return node ^ (1 << round); }
/// Elements [lo, hi) of sub-chunks [first, last) (first < last) of `nodes` (schedule::split
/// of [begin, end) in `grain` units): one run, since the sub-chunks tile the range in order.
WEFT_HD void hd_sub_range(std::uint64_t begin, std::uint64_t end, std::uint64_t grain, int nodes, int first, int last,
                          std::uint64_t& lo, std::uint64_t& hi) {
  std::uint64_t unused;
  schedule::split(begin, end, grain, nodes, first, lo, unused);
  schedule::split(begin, end, grain, nodes, last - 1, unused, hi);
}

// ---- the collectives' kernels, step by step (weft::internode, src/ops/internode/) ----
//
// The two-level AllGather, ReduceScatter and AllReduce kernels run one list of
// steps per GPU, the same in every thread block (each block on its own slice
// of the data, with its own flags): ag_walk, rs_walk and ar_walk call f(step)
// for each, in order. The kernels execute the steps; the CPU tests run the
// same lists for every GPU of a grid, several launches back to back, in random
// interleavings, and check that none deadlocks, that every wait names the GPU
// that raises its flag, that no buffer is overwritten before it was read, and
// that every result is complete.
//
// Flags are per block and per slot (a slot names the role: who raises it,
// for what); values are the launch's epoch, set, so nothing is reset. Staging
// buffers of ReduceScatter and AllReduce are double-buffered by the epoch's
// parity: a GPU writes a peer's staging for launch e + 2 only after finishing
// launch e + 1, which waited for something the peer sent in e + 1, after it had
// finished reading launch e's staging (the tests check it; for AllReduce's
// halving-doubling, see ar_walk). AllGather writes into the
// caller's output, so each GPU first raises "ready" (its output is free for
// this launch) to the GPUs that write into it, and they wait for it.

/// What a step does.
enum class Act : int {
  signal,     ///< raise flag `flag` on `peer` (no data)
  wait,       ///< wait here for flag `flag`, raised by `peer`; then `buffer` holds what it announced
  put,        ///< put data `index` (a shard, or the block's / slice's contribution) into `peer`'s
              ///< buffer `buffer`, raising its flag `flag`
  sum_node,   ///< sum this node's contributions to `index` (its own and the peers' staged ones), in
              ///< local rank order, in fp32: the node sum
  put_sum,    ///< put the node sum of `index` into `peer`'s buffer `buffer` (fp32), raising its flag `flag`
  sum_final,  ///< sum the nodes' sums of `index` in node order and round once: the result
  get,        ///< fetch `peer`'s result `index` (AllReduce's in-node AllGather)
  // AllReduce's halving-doubling rail, on sub-chunks [first, last) of slice `index`:
  put_part,      ///< put those sub-chunks of this GPU's node sum into `peer`'s buffer `buffer`, at the same
                 ///< offsets, raising its flag `flag`
  add_part,      ///< add those sub-chunks of buffer `buffer` (a rail peer's partial) into this GPU's node
                 ///< sum, in place, in fp32
  round_result,  ///< round this GPU's node sum, now the whole slice's sum, once: the result
  // EP dispatch and combine across nodes (ep_walk); their rows are moe/ep_layout.hpp's:
  ep_send,     ///< each own token once to each rank of this node it goes to (staging row and meta, as on
               ///< one node) and once to each remote node, into its rail GPU's rail staging (row and record)
  ep_forward,  ///< each token in this GPU's rail staging to the ranks of this node it goes to
  ep_receive,  ///< each staged token to its rows of recv_x (as on one node)
  ep_reduce,   ///< each staged token's partial: w x y over its pairs here, in slot order (as on one node)
  ep_return,   ///< each rail token's node sum (its ranks here ascending, fp32, rounded) to its source's return row
  ep_gather,   ///< each own token's output: over its nodes ascending, the own node's partials one by one,
               ///< each remote node's returned sum; fp32, rounded once
};

struct Step {
  Act act;
  int peer;       ///< the GPU signalled, waited for, written to or read from (itself for the sums)
  int index;      ///< the shard (AllGather), block (ReduceScatter) or slice (AllReduce) the step moves
  int flag;       ///< the flag slot (signal, wait, put, put_sum, put_part); -1 for the others
  int buffer;     ///< the buffer slot written (put, put_sum, put_part), announced (wait) or read (add_part);
                  ///< -1 where none
  int first = 0;  ///< put_part, add_part and the waits before them: the sub-chunks [first, last) of the slice;
  int last = 0;   ///< [0, 0) where a step moves whole data
};

#if defined(__CUDACC__)
#define WEFT_HIERARCHY_WALK _Pragma("nv_exec_check_disable") template <class F>
#else
#define WEFT_HIERARCHY_WALK template <class F>
#endif

// AllGather. Buffers: the output's shard slots (buffer = shard). Flags: ready
// from each GPU (slot = that GPU), the rail steps, the NVLink pushes by hop and
// sender.

/// Flag slots of the AllGather kernel: ready[W], rail[nodes-1], push[nodes][L].
WEFT_HD int ag_flag_slots(NodeGrid g) { return g.world() + g.nodes - 1 + g.nodes * g.local; }
/// "GPU `writer`'s output is free for this launch", raised by `writer` on the GPUs that write into it.
WEFT_HD int ag_ready_flag(NodeGrid, int writer) { return writer; }
/// Rail step `step` (1..nodes-1) has landed, raised by ag_rail_from.
WEFT_HD int ag_rail_flag(NodeGrid g, int step) { return g.world() + step - 1; }
/// The push of hop `hop` by the local peer of local rank `sender_local` has landed.
WEFT_HD int ag_push_flag(NodeGrid g, int hop, int sender_local) {
  return g.world() + g.nodes - 1 + hop * g.local + sender_local;
}

/// The steps of `gpu`'s AllGather kernel: raise ready to those that write into
/// its output; then, hop by hop, forward the shard that arrived (its own at hop
/// 0) along the rail and push it to the local peers, waiting for each rail
/// step's shard and for each peer's ready before its first write there. At hop 0
/// the NVLink pushes go first (the rail successor's ready crosses the NIC); at
/// later hops the rail put goes first (the NIC's leg is the longer one). The
/// waits for the local peers' pushes come last (AgPushWaits::at_end), or after
/// each hop's own steps (per_hop: every shard then waited for in ag_arrival order).
/// When a GPU waits for the shards its node's GPUs push to it over NVLink.
enum class AgPushWaits : int {
  at_end = 0,   ///< after all its own steps (the AllGather kernel: nothing reads the output before its end)
  per_hop = 1,  ///< hop by hop, after its own pushes of the hop: the waits then come in ag_arrival order, which
                ///< a GEMM reading each shard as it lands (AllGather+GEMM across nodes) needs
};

WEFT_HIERARCHY_WALK WEFT_HD void ag_walk(NodeGrid g, int gpu, F&& f, AgPushWaits push_waits = AgPushWaits::at_end) {
  const int N = g.nodes, L = g.local, l = g.local_of(gpu);
  const int rail_to = ag_rail_to(g, gpu), rail_from = ag_rail_from(g, gpu);
  // The shards of hop h that this node's GPUs push here, in turn order (l+1, l+2, ...).
  auto wait_pushes = [&](int h) {
    for (int t = 1; t < L; ++t) {
      const int from = ag_push_from(g, gpu, t);
      const int shard = ag_push_shard(g, from, h);
      f(Step{Act::wait, from, shard, ag_push_flag(g, h, g.local_of(from)), shard});
    }
  };
  if (N > 1) f(Step{Act::signal, rail_from, -1, ag_ready_flag(g, gpu), -1});
  for (int t = 1; t < L; ++t) f(Step{Act::signal, ag_push_from(g, gpu, t), -1, ag_ready_flag(g, gpu), -1});
  for (int h = 0; h < N; ++h) {
    const int shard = ag_push_shard(g, gpu, h);
    if (h > 0) f(Step{Act::wait, rail_from, shard, ag_rail_flag(g, h), shard});
    const bool rail = h + 1 < N;
    if (rail && h > 0) f(Step{Act::put, rail_to, shard, ag_rail_flag(g, h + 1), shard});
    for (int t = 1; t < L; ++t) {
      const int to = ag_push_to(g, gpu, t);
      if (h == 0) f(Step{Act::wait, to, -1, ag_ready_flag(g, to), -1});
      f(Step{Act::put, to, shard, ag_push_flag(g, h, l), shard});
    }
    if (rail && h == 0) {
      f(Step{Act::wait, rail_to, -1, ag_ready_flag(g, rail_to), -1});
      f(Step{Act::put, rail_to, shard, ag_rail_flag(g, 1), shard});
    }
    if (push_waits == AgPushWaits::per_hop) wait_pushes(h);
  }
  if (push_waits == AgPushWaits::at_end)
    for (int h = 0; h < N; ++h) wait_pushes(h);
}

// ReduceScatter. Buffers, each per parity: the peers' partials, slot
// rs_peer_buffer(node of the block, sender's local rank) (nodes x L; the
// receiver's own local rank unused), then the node sums of the own block, slot
// nodes x L + node. Flags: the same slots.

/// Buffer and flag slots of the ReduceScatter kernel, per parity.
WEFT_HD int rs_slots(NodeGrid g) { return g.nodes * g.local + g.nodes; }
/// Where the partial of a block of node `node`, from the local peer of local rank `sender_local`, lands.
WEFT_HD int rs_peer_buffer(NodeGrid g, int node, int sender_local) { return node * g.local + sender_local; }
/// Where node `node`'s sum of the owner's block lands.
WEFT_HD int rs_node_buffer(NodeGrid g, int node) { return g.nodes * g.local + node; }

/// The steps of `gpu`'s ReduceScatter kernel, in rs_block's order: a block
/// of another rail is put to that rail's GPU of this node; a block of its own
/// rail waits for the L-1 peers' partials, is summed, and its node sum is put
/// to the block's owner (its own block: kept). Last, the other nodes' sums of
/// its own block, and the final sum.
WEFT_HIERARCHY_WALK WEFT_HD void rs_walk(NodeGrid g, int gpu, F&& f) {
  const int W = g.world(), L = g.local, N = g.nodes, n = g.node_of(gpu), l = g.local_of(gpu);
  for (int t = 0; t < W; ++t) {
    const int b = rs_block(g, gpu, t);
    const RsRoute route = rs_route(g, gpu, b);
    if (route.via == Via::nvlink) {
      const int slot = rs_peer_buffer(g, g.node_of(b), l);
      f(Step{Act::put, route.to, b, slot, slot});
      continue;
    }
    for (int i = 1; i < L; ++i) {
      const int from = rs_peer_partial_from(g, gpu, i);
      const int slot = rs_peer_buffer(g, g.node_of(b), g.local_of(from));
      f(Step{Act::wait, from, b, slot, slot});
    }
    f(Step{Act::sum_node, gpu, b, -1, -1});
    if (route.via == Via::rail) f(Step{Act::put_sum, route.to, b, rs_node_buffer(g, n), rs_node_buffer(g, n)});
  }
  for (int i = 1; i < N; ++i) {
    const int from = rs_node_partial_from(g, gpu, i);
    const int slot = rs_node_buffer(g, g.node_of(from));
    f(Step{Act::wait, from, gpu, slot, slot});
  }
  f(Step{Act::sum_final, gpu, gpu, -1, -1});
}

// AllReduce. Buffers, per parity: the peers' contributions to the own slice,
// slot = sender's local rank (L); the nodes' sums of it, slot L + node
// (nodes; the own node's is this GPU's node sum); the result of the own
// slice, slot L + nodes (one, read by the local peers). Flags: the first
// L + nodes slots as the buffers, then "result ready" from each local peer,
// slot L + nodes + its local rank (L); halving-doubling adds its doubling
// flags, slot 2 L + nodes + the sender's node (nodes).

/// Buffer slots of the AllReduce kernel, per parity; and its flag slots, per parity, for the rail way
/// that runs (ar_rail_way).
WEFT_HD int ar_buffer_slots(NodeGrid g) { return g.local + g.nodes + 1; }
WEFT_HD int ar_flag_slots(NodeGrid g, RailWay way = RailWay::direct) {
  return 2 * g.local + g.nodes + (ar_rail_way(g.nodes, way) == RailWay::halving_doubling ? g.nodes : 0);
}
/// Where the local peer of local rank `sender_local` puts its contribution to the receiver's slice.
WEFT_HD int ar_peer_buffer(NodeGrid, int sender_local) { return sender_local; }
/// Where node `node`'s sum of a rail's slice lands.
WEFT_HD int ar_node_buffer(NodeGrid g, int node) { return g.local + node; }
/// The result of the own slice, which the local peers fetch.
WEFT_HD int ar_result_buffer(NodeGrid g) { return g.local + g.nodes; }
/// "The result of local rank `owner_local`'s slice is ready", raised by its owner on its local peers.
WEFT_HD int ar_result_flag(NodeGrid g, int owner_local) { return g.local + g.nodes + owner_local; }
/// Halving-doubling: "the doubling round's sub-chunks from node `node` have landed in this GPU's node sum".
/// Slots of their own: halving and doubling pair the same nodes (at mirrored rounds), and the halving
/// flag (the sender's ar_node_buffer) already holds the launch's epoch when doubling begins.
WEFT_HD int ar_doubling_flag(NodeGrid g, int node) { return 2 * g.local + g.nodes + node; }

/// The steps of `gpu`'s AllReduce kernel: the in-node ReduceScatter (push each
/// peer its slice, wait for the peers' contributions to its own, sum them),
/// the rail AllReduce of its slice, then the in-node AllGather (announce the
/// result, fetch each peer's). The rail runs `way` where it applies
/// (ar_rail_way), else direct:
///   direct: put the node sum to every rail peer, wait for theirs, sum in
///     node order, round once.
///   halving-doubling: halving round r puts the node sum's sub-chunks
///     hd_held(partner, r+1) into the partner's slot of this node,
///     ar_node_buffer(sender's node) (where the direct way puts too), raising
///     that slot's flag; the partner waits and adds them into its own node
///     sum, in place. Doubling round d puts hd_held(n, rounds-d), final, into
///     the partner's own node sum at the same offsets (sub-chunks the partner
///     sent away while halving), raising ar_doubling_flag; after the last
///     round the node sum is the whole slice's, rounded once.
/// Double-buffering holds for halving-doubling too: a rail GPU writes a
/// peer's buffers of launch e + 2 only after finishing e + 1, in whose
/// halving it waited for that peer's put (halving pairs both ways), which
/// the peer sent after finishing launch e, its reads included. Within a
/// launch, a doubling put overwrites sub-chunks of the receiver's node sum
/// that the receiver sent to the writer in the mirrored halving round, and
/// the writer waited for that put's flag first, so it had been read. No GPU
/// rewrites a put's source itself within the launch (its adds go into the
/// half it keeps), so the puts need not complete before the kernel's quiet.
/// The CPU tests check all of it, sub-chunk by sub-chunk.
WEFT_HIERARCHY_WALK WEFT_HD void ar_walk(NodeGrid g, int gpu, F&& f, RailWay way = RailWay::direct) {
  const int L = g.local, N = g.nodes, n = g.node_of(gpu), l = g.local_of(gpu);
  for (int t = 1; t < L; ++t)
    f(Step{Act::put, ar_node_to(g, gpu, t), ar_rs_slice(g, gpu, t), ar_peer_buffer(g, l), ar_peer_buffer(g, l)});
  for (int t = 1; t < L; ++t) {
    const int from = ar_node_from(g, gpu, t);
    const int slot = ar_peer_buffer(g, g.local_of(from));
    f(Step{Act::wait, from, l, slot, slot});
  }
  f(Step{Act::sum_node, gpu, l, -1, -1});
  if (ar_rail_way(N, way) == RailWay::halving_doubling) {
    const int rounds = hd_rounds(N);
    for (int r = 0; r < rounds; ++r) {
      const int p = hd_halving_partner(n, r, N), partner = g.rank(p, l);
      int first, last;
      hd_held(p, r + 1, N, first, last);  // the partner's half of what this node holds
      f(Step{Act::put_part, partner, l, ar_node_buffer(g, n), ar_node_buffer(g, n), first, last});
      hd_held(n, r + 1, N, first, last);  // this node's half, which the partner sent
      f(Step{Act::wait, partner, l, ar_node_buffer(g, p), ar_node_buffer(g, p), first, last});
      f(Step{Act::add_part, gpu, l, -1, ar_node_buffer(g, p), first, last});
    }
    for (int d = 0; d < rounds; ++d) {
      const int p = hd_doubling_partner(n, d), partner = g.rank(p, l);
      int first, last;
      hd_held(n, rounds - d, N, first, last);  // all this node holds, summed
      f(Step{Act::put_part, partner, l, ar_doubling_flag(g, n), ar_node_buffer(g, p), first, last});
      hd_held(p, rounds - d, N, first, last);  // all the partner holds, into this node sum
      f(Step{Act::wait, partner, l, ar_doubling_flag(g, p), ar_node_buffer(g, n), first, last});
    }
    f(Step{Act::round_result, gpu, l, -1, -1});
  } else {
    for (int i = 1; i < N; ++i)
      f(Step{Act::put_sum, ar_direct_to(g, gpu, i), l, ar_node_buffer(g, n), ar_node_buffer(g, n)});
    for (int i = 1; i < N; ++i) {
      const int from = ar_direct_from(g, gpu, i);
      const int slot = ar_node_buffer(g, g.node_of(from));
      f(Step{Act::wait, from, l, slot, slot});
    }
    f(Step{Act::sum_final, gpu, l, -1, -1});
  }
  for (int t = 1; t < L; ++t) f(Step{Act::signal, ar_node_to(g, gpu, t), l, ar_result_flag(g, l), -1});
  for (int t = 1; t < L; ++t) {
    const int from = ar_node_from(g, gpu, t);
    f(Step{Act::wait, from, g.local_of(from), ar_result_flag(g, g.local_of(from)), ar_result_buffer(g)});
    f(Step{Act::get, from, g.local_of(from), -1, ar_result_buffer(g)});
  }
}

// ---- EP dispatch, two hops (scale_model.py: ep_two_hop) ----
//
// A token on (n_s, l_s) goes to the distinct ranks R holding its top-k experts
// (moe/ep_layout.hpp: token_destinations, ascending). For each node those
// ranks are on, one hop: to a remote node d it crosses the NIC once, to
// (d, l_s), the GPU of its own local rank there, which forwards it over NVLink
// to each rank of R on d (one of which may be itself: it keeps the token
// where it landed); to its own node it goes over NVLink directly (the "rail
// target" is the source itself, and a source in R keeps its token). Hops come
// in ascending node order, as R does. Combine is the same route backwards,
// summed on the rail GPU: per node, then across nodes.

/// One hop of a token: the rank it lands on in `node`, and the
/// ranks[begin..end) forwarded from there.
struct EpHop {
  int node;         ///< the destination node
  int rail_target;  ///< (node, l_s) for a remote node (one NIC crossing), the source for its own
  int begin;        ///< the ranks of R on this node: ranks[begin..end) of the token's
  int end;
};

/// The hops of a token of `source` to the ascending, distinct `ranks[0..n)`,
/// written to hops[0..) (room for n); returns how many (the distinct nodes).
WEFT_HD int ep_two_hop(NodeGrid g, int source, const int* ranks, int n, EpHop* hops) {
  int count = 0;
  for (int i = 0; i < n; ++i) {
    const int node = g.node_of(ranks[i]);
    if (count > 0 && hops[count - 1].node == node) {
      hops[count - 1].end = i + 1;
      continue;
    }
    const int target = node == g.node_of(source) ? source : g.rank(node, g.local_of(source));
    hops[count++] = EpHop{node, target, i, i + 1};
  }
  return count;
}

/// NIC crossings of a token of `source` to the ascending, distinct
/// `ranks[0..n)`: its distinct remote nodes.
WEFT_HD int ep_nic_crossings(NodeGrid g, int source, const int* ranks, int n) {
  int crossings = 0, last = -1;
  for (int i = 0; i < n; ++i) {
    const int node = g.node_of(ranks[i]);
    if (node != last && node != g.node_of(source)) ++crossings;
    last = node;
  }
  return crossings;
}

// ---- EP dispatch and combine across nodes, as a step list ----
//
// One call of an EP plan (layout, dispatch, combine) on GPU (n, l), in the
// order its kernels run. Every token takes ep_two_hop's route; a receiver's
// staging, meta and recv_x rows are the one-node plan's (moe/ep_layout.hpp),
// so everything after the data lands is the one-node code. Flags (one epoch
// per call; a GPU's own slot, which a kernel's last block raises for its other
// blocks, is not listed: the list is one GPU's order):
//   counts [p]     p's counts row is here (the exchange: a barrier per call, which
//                  is what lets every buffer be reused without a reset)
//   dispatch [s]   all of source s's tokens for this GPU are here: raised by s on this
//                  node, else by the rail GPU that forwarded them, (n, local_of(s))
//   rail [m]       all of (m, l)'s tokens for this node are in this GPU's rail staging
//   partial [l']   (n, l')'s partials are ready (its ep_reduce is done)
//   return [m]     (m, l) has put the node-m sums of this GPU's tokens in its return rows
// Combine returns each token's sum of a remote node as one bf16 row: a token
// crosses the NIC once each way, and its output is
//   round(sum over its nodes m ascending of (m own ? its partials there, one by one, ascending
//                                               : round(their sum, ascending))), in fp32,
// which on one node is the one-node combine's sum, bit for bit.

/// Flag slots of the EP plan across nodes, ep_flag_slots() in all.
WEFT_HD int ep_counts_flag(NodeGrid, int from) { return from; }
WEFT_HD int ep_dispatch_flag(NodeGrid g, int source) { return g.world() + source; }
WEFT_HD int ep_rail_flag(NodeGrid g, int from_node) { return 2 * g.world() + from_node; }
WEFT_HD int ep_partial_flag(NodeGrid g, int from_local) { return 2 * g.world() + g.nodes + from_local; }
WEFT_HD int ep_return_flag(NodeGrid g, int from_node) { return 2 * g.world() + g.nodes + g.local + from_node; }
WEFT_HD int ep_flag_slots(NodeGrid g) { return 2 * g.world() + 2 * g.nodes + g.local; }

/// Calls f(Step) for each step of one EP call on `gpu`: the exchange, dispatch, combine.
WEFT_HIERARCHY_WALK WEFT_HD void ep_walk(NodeGrid g, int gpu, F&& f) {
  const int n = g.node_of(gpu), l = g.local_of(gpu), W = g.world();
  // layout: the counts exchange.
  for (int p = 0; p < W; ++p)
    if (p != gpu) f(Step{Act::signal, p, -1, ep_counts_flag(g, gpu), -1});
  for (int p = 0; p < W; ++p)
    if (p != gpu) f(Step{Act::wait, p, -1, ep_counts_flag(g, p), -1});
  // dispatch.
  f(Step{Act::ep_send, gpu, -1, -1, -1});
  for (int m = 0; m < g.nodes; ++m)
    if (m != n) f(Step{Act::signal, g.rank(m, l), -1, ep_rail_flag(g, n), -1});
  for (int i = 0; i < g.local; ++i)
    if (i != l) f(Step{Act::signal, g.rank(n, i), -1, ep_dispatch_flag(g, gpu), -1});
  for (int m = 0; m < g.nodes; ++m)
    if (m != n) f(Step{Act::wait, g.rank(m, l), -1, ep_rail_flag(g, m), -1});
  f(Step{Act::ep_forward, gpu, -1, -1, -1});
  for (int m = 0; m < g.nodes; ++m) {
    if (m == n) continue;
    for (int i = 0; i < g.local; ++i)
      if (i != l) f(Step{Act::signal, g.rank(n, i), -1, ep_dispatch_flag(g, g.rank(m, l)), -1});
  }
  for (int s = 0; s < W; ++s) {
    const int raiser = g.node_of(s) == n ? s : g.rank(n, g.local_of(s));
    if (raiser != gpu) f(Step{Act::wait, raiser, -1, ep_dispatch_flag(g, s), -1});
  }
  f(Step{Act::ep_receive, gpu, -1, -1, -1});
  // combine.
  f(Step{Act::ep_reduce, gpu, -1, -1, -1});
  for (int i = 0; i < g.local; ++i)
    if (i != l) f(Step{Act::signal, g.rank(n, i), -1, ep_partial_flag(g, l), -1});
  for (int i = 0; i < g.local; ++i)
    if (i != l) f(Step{Act::wait, g.rank(n, i), -1, ep_partial_flag(g, i), -1});
  f(Step{Act::ep_return, gpu, -1, -1, -1});
  for (int m = 0; m < g.nodes; ++m)
    if (m != n) f(Step{Act::signal, g.rank(m, l), -1, ep_return_flag(g, n), -1});
  for (int m = 0; m < g.nodes; ++m)
    if (m != n) f(Step{Act::wait, g.rank(m, l), -1, ep_return_flag(g, m), -1});
  f(Step{Act::ep_gather, gpu, -1, -1, -1});
}

#undef WEFT_HIERARCHY_WALK

}  // namespace weft::hierarchy
