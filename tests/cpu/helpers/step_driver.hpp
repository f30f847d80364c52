// step_driver.hpp - runs the step lists of src/ops/hierarchy.hpp (ag_walk, rs_walk, ar_walk,
// ep_walk) on the CPU: every GPU of a grid runs its list for several launches back to back,
// one step at a time in a random interleaving (each GPU's launches in order, as on its
// stream), with the flags as integers. A wait proceeds only once its flag holds the launch's
// epoch, and the flag must then hold exactly that epoch and have been raised by the GPU the
// wait names (the one a timeout report names); a flag has one writer and is raised once a
// launch. A schedule that deadlocks leaves GPUs whose next wait never comes true, and the
// driver names each of them. What each step does with data is the caller's Semantics.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "ops/hierarchy.hpp"

namespace step_driver {

using weft::hierarchy::Act;
using weft::hierarchy::NodeGrid;
using weft::hierarchy::Step;

/// "2 x 4": a grid as the tests' messages name it.
inline std::string name(NodeGrid g) { return std::to_string(g.nodes) + " x " + std::to_string(g.local); }

/// Grids of 1 to 8 nodes of 1 to 8 GPUs.
inline std::vector<NodeGrid> every_grid() {
  std::vector<NodeGrid> grids;
  for (int nodes = 1; nodes <= 8; ++nodes)
    for (int local = 1; local <= 8; ++local) grids.push_back({nodes, local});
  return grids;
}

struct Flag {
  std::uint64_t value = 0;
  int writer = -1;
};

/// What a collective does with each step's data; the driver below moves the flags.
class Semantics {
 public:
  virtual ~Semantics() = default;
  virtual int flag_slots() const = 0;
  virtual bool parity_flags() const = 0;
  /// Launch `e` begins on `gpu` ("" or what went wrong).
  virtual std::string start(int gpu, int e) = 0;
  /// The data side of a step (the driver has checked and raised or consumed the flag).
  virtual std::string apply(int gpu, int e, const Step& s) = 0;
  /// Launch `e` ends on `gpu`: its result is complete.
  virtual std::string finish(int gpu, int e) = 0;
};

inline std::string act_name(Act a) {
  switch (a) {
    case Act::signal: return "signal";
    case Act::wait: return "wait";
    case Act::put: return "put";
    case Act::sum_node: return "sum_node";
    case Act::put_sum: return "put_sum";
    case Act::sum_final: return "sum_final";
    case Act::get: return "get";
    case Act::put_part: return "put_part";
    case Act::add_part: return "add_part";
    case Act::round_result: return "round_result";
    case Act::ep_send: return "ep_send";
    case Act::ep_forward: return "ep_forward";
    case Act::ep_receive: return "ep_receive";
    case Act::ep_reduce: return "ep_reduce";
    case Act::ep_return: return "ep_return";
    case Act::ep_gather: return "ep_gather";
  }
  return "?";
}

inline std::string describe(int gpu, int e, const Step& s) {
  return "GPU " + std::to_string(gpu) + ", launch " + std::to_string(e) + ", " + act_name(s.act) + " peer " +
         std::to_string(s.peer) + " index " + std::to_string(s.index) + " flag " + std::to_string(s.flag) +
         " buffer " + std::to_string(s.buffer) +
         (s.last > s.first ? " sub-chunks [" + std::to_string(s.first) + ", " + std::to_string(s.last) + ")" : "");
}

/// Runs every GPU's `steps` for `launches` launches in a random interleaving drawn from `seed`;
/// "" when every launch completed with every check passing, else the first failure.
inline std::string run_launches(NodeGrid g, const std::vector<std::vector<Step>>& steps, Semantics& sem, int launches,
                         std::uint64_t seed) {
  const int W = g.world(), slots = sem.flag_slots(), parities = sem.parity_flags() ? 2 : 1;
  std::vector<std::vector<Flag>> flags(W, std::vector<Flag>(static_cast<std::size_t>(parities * slots)));
  std::vector<int> epoch(W, 1), pc(W, 0);
  std::mt19937_64 rng(seed);
  auto flag_at = [&](int gpu, int e, int slot) -> Flag& { return flags[gpu][(parities == 2 ? (e & 1) : 0) * slots + slot]; };
  for (int r = 0; r < W; ++r)
    if (auto err = sem.start(r, 1); !err.empty()) return err;
  auto finished = [&](int r) { return epoch[r] > launches; };
  auto runnable = [&](int r) {
    if (finished(r)) return false;
    if (steps[r].empty()) return true;  // a grid of one GPU: nothing to do
    const Step& s = steps[r][pc[r]];
    return s.act != Act::wait || flag_at(r, epoch[r], s.flag).value >= static_cast<std::uint64_t>(epoch[r]);
  };
  for (;;) {
    std::vector<int> ready;
    bool all_done = true;
    for (int r = 0; r < W; ++r) {
      all_done = all_done && finished(r);
      if (runnable(r)) ready.push_back(r);
    }
    if (all_done) return "";
    if (ready.empty()) {
      std::string blocked = "deadlock:";
      for (int r = 0; r < W; ++r)
        if (!finished(r)) blocked += "\n  " + describe(r, epoch[r], steps[r][pc[r]]);
      return blocked;
    }
    const int r = ready[rng() % ready.size()], e = epoch[r];
    auto end_launch = [&]() -> std::string {
      if (auto err = sem.finish(r, e); !err.empty())
        return "GPU " + std::to_string(r) + ", end of launch " + std::to_string(e) + ": " + err;
      pc[r] = 0;
      if (++epoch[r] <= launches) return sem.start(r, epoch[r]);
      return "";
    };
    if (steps[r].empty()) {
      if (auto err = end_launch(); !err.empty()) return err;
      continue;
    }
    const Step& s = steps[r][pc[r]];
    const std::string at = describe(r, e, s);
    const auto ue = static_cast<std::uint64_t>(e);
    if (s.peer < 0 || s.peer >= W) return at + ": no such peer";
    const bool raises = s.act == Act::signal || s.act == Act::put || s.act == Act::put_sum || s.act == Act::put_part;
    if (raises || s.act == Act::wait) {
      if (s.flag < 0 || s.flag >= slots) return at + ": flag slot out of range";
      if (s.peer == r) return at + ": a flag to or from itself";
    }
    if (raises) {
      Flag& f = flag_at(s.peer, e, s.flag);
      if (f.writer >= 0 && f.writer != r)
        return at + ": the flag is also raised by GPU " + std::to_string(f.writer) + ", one writer per flag";
      if (f.value >= ue) return at + ": raised twice for launch " + std::to_string(e) + " (it holds " +
                                std::to_string(f.value) + ")";
      f.writer = r;
      f.value = ue;
    }
    if (s.act == Act::wait) {
      const Flag& f = flag_at(r, e, s.flag);
      if (f.value != ue) return at + ": the flag holds launch " + std::to_string(f.value) + "'s epoch, not this one's";
      if (f.writer != s.peer) return at + ": raised by GPU " + std::to_string(f.writer) + ", but the wait names GPU " +
                                     std::to_string(s.peer);
    }
    if (auto err = sem.apply(r, e, s); !err.empty()) return at + ": " + err;
    if (++pc[r] == static_cast<int>(steps[r].size()))
      if (auto err = end_launch(); !err.empty()) return err;
  }
}

template <class Walk>
std::vector<std::vector<Step>> step_lists(NodeGrid g, Walk walk) {
  std::vector<std::vector<Step>> steps(g.world());
  for (int r = 0; r < g.world(); ++r) walk(g, r, [&](const Step& s) { steps[r].push_back(s); });
  return steps;
}

}  // namespace step_driver
