#include "weft/runtime/team.hpp"

#include <cuda_runtime_api.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <map>
#include <sstream>

#include "weft/core/driver.hpp"
#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/core/gpu_diagnosis.hpp"
#include "weft/core/log.hpp"
#include "weft/core/rank_text.hpp"
#include "nvml_links.hpp"  // private header in src/runtime

namespace weft {

std::string PeerLink::describe() const {
  if (!same_host) return "other node";
  std::string link;
  if (performance_rank == -2) link = "self";
  else if (same_gpu) link = "same GPU";
  else if (nvlinks > 0) link = str("NV", nvlinks);
  else if (nvlinks_via_switch > 0 && peer_access) link = str("NV", nvlinks_via_switch, " via NVSwitch");
  else if (peer_access) link = "P2P (PCIe)";
  else link = "no P2P";
  return same_node ? link : str("other virtual node (", link, ")");
}

int parse_virtual_nodes(std::optional<int> option, const EnvMap& env) {
  if (option) {
    WEFT_REQUIRE(*option >= 1, "ContextOptions::virtual_nodes=", *option, " is not a node count: use 1 (no split) ",
                 "or N >= 2 to split this machine's ranks into N nodes");
    return *option;
  }
  const std::int64_t n = env_int(env, "WEFT_VIRTUAL_NODES", 1);
  WEFT_REQUIRE(n >= 1 && n <= (1 << 20), "WEFT_VIRTUAL_NODES=", n, " is not a node count: use 1 (no split) or N >= 2 ",
               "to split this machine's ranks into N nodes of contiguous ranks");
  return static_cast<int>(n);
}

std::vector<int> virtual_node_of(int world_size, int virtual_nodes, int hosts) {
  WEFT_REQUIRE(virtual_nodes >= 1, "virtual nodes: ", virtual_nodes, " nodes asked for; expected 1 or more");
  WEFT_REQUIRE(hosts == 1 || virtual_nodes == 1, "WEFT_VIRTUAL_NODES=", virtual_nodes, " splits the ranks of one ",
               "machine into nodes, but this job's ", world_size, " ranks already run on ", hosts,
               " machines: unset WEFT_VIRTUAL_NODES (real nodes take the inter-node paths by themselves)");
  if (world_size % virtual_nodes != 0) {
    std::string divisors;
    for (int d = 1; d <= world_size; ++d)
      if (world_size % d == 0) divisors += str(divisors.empty() ? "" : ", ", d);
    WEFT_FAIL("WEFT_VIRTUAL_NODES=", virtual_nodes, " does not divide the job's ", world_size, " ranks: virtual nodes ",
              "are blocks of world_size / N contiguous ranks, so N must be one of ", divisors);
  }
  const int per_node = world_size / virtual_nodes;
  std::vector<int> node_of(world_size);
  for (int r = 0; r < world_size; ++r) node_of[r] = r / per_node;
  return node_of;
}

void split_into_virtual_nodes(Team& t, int virtual_nodes) {
  t.node_of.resize(t.world_size, 0);
  std::vector<int> node_of = virtual_node_of(t.world_size, virtual_nodes, t.hosts);
  t.virtual_nodes = virtual_nodes;
  if (virtual_nodes == 1) return;
  t.node_of = std::move(node_of);
  t.num_nodes = virtual_nodes;
  t.node_id = t.node_of[t.rank];
  t.local_ranks.clear();
  for (int r = 0; r < t.world_size; ++r)
    if (t.node_of[r] == t.node_id) t.local_ranks.push_back(r);
  t.local_world_size = static_cast<int>(t.local_ranks.size());
  t.local_rank = t.rank - t.local_ranks.front();
}

namespace {

std::string join_fields(const std::vector<std::string>& fields) {
  std::string out;
  for (auto& f : fields) {
    out += std::to_string(f.size());
    out += ':';
    out += f;
  }
  return out;
}

std::vector<std::string> split_fields(const std::string& blob) {
  std::vector<std::string> out;
  std::size_t pos = 0;
  while (pos < blob.size()) {
    std::size_t colon = blob.find(':', pos);
    WEFT_REQUIRE(colon != std::string::npos, "corrupt team record from a peer");
    std::size_t n = std::stoul(blob.substr(pos, colon - pos));
    out.push_back(blob.substr(colon + 1, n));
    pos = colon + 1 + n;
  }
  return out;
}

using detail::ranks_text;
using GpuRanks = std::map<std::pair<std::string, std::string>, std::vector<int>>;  // (host, bus) -> ranks

// The checks on ranks that share a GPU, made alike on every rank (from what
// every rank reported), so every rank throws the same error.
void check_shared_gpus(const Team& t, const GpuRanks& by_gpu, const std::vector<int>& mps) {
  for (const auto& [gpu, ranks] : by_gpu) {
    if (ranks.size() < 2) continue;
    const std::string where = str("GPU ", gpu.second, " on ", gpu.first);
    WEFT_REQUIRE(t.sharing != GpuSharing::off, ranks_text(ranks), " would share ", where,
                 " but WEFT_SHARE_GPU=off: run at most one rank per GPU (or set WEFT_DEVICE per rank)");
    if (t.sharing == GpuSharing::timeslice) continue;
    std::vector<int> outside;
    for (int r : ranks)
      if (!mps[r]) outside.push_back(r);
    WEFT_REQUIRE(outside.empty(), ranks_text(ranks), " would share ", where,
                 ", which needs NVIDIA MPS, but no MPS daemon serves ", ranks_text(outside),
                 " (its pipe directory: ", mps_pipe_directory(std::getenv("CUDA_MPS_PIPE_DIRECTORY")),
                 "). Run one rank per GPU; or start an MPS daemon first (nvidia-cuda-mps-control -d), or launch with "
                 "weftrun --share-gpu, which starts one; or set WEFT_SHARE_GPU=timeslice to share without MPS "
                 "(correct, but each wait on another rank costs milliseconds)");
  }
}

std::atomic<bool>& gpu_shared_flag() {
  static std::atomic<bool> shared{false};
  return shared;
}

}  // namespace

bool gpu_shared_in_process() { return gpu_shared_flag().load(std::memory_order_relaxed); }

Team Team::discover(const LaunchEnv& env, Store& store, std::optional<int> virtual_nodes) {
  Team t;
  t.rank = env.rank;
  t.world_size = env.world_size;
  t.local_rank = env.local_rank;
  t.local_world_size = env.local_world_size;
  t.sharing = env.gpu_sharing;

  const GpuDiagnosis gpus = diagnose_gpus();
  WEFT_REQUIRE(gpus.verdict == GpuVerdict::ready, "rank ", env.rank, " cannot use a GPU: ", gpus.message);
  const int count = gpus.gpus;
  EnvMap penv = process_env();
  t.device = static_cast<int>(env_int(penv, "WEFT_DEVICE", env.local_rank % count));
  WEFT_REQUIRE(t.device >= 0 && t.device < count, "WEFT_DEVICE=", t.device, " but only ", count,
               " GPUs are visible");
  WEFT_CUDA(cudaSetDevice(t.device));
  WEFT_CUDA(cudaFree(nullptr));  // create the context now, not inside a timed region

  char host[256] = {};
  gethostname(host, sizeof(host) - 1);
  char bus[64] = {};
  WEFT_CUDA(cudaDeviceGetPCIBusId(bus, sizeof(bus), t.device));
  cudaDeviceProp prop{};
  WEFT_CUDA(cudaGetDeviceProperties(&prop, t.device));
  t.gpu_sm_count = prop.multiProcessorCount;

  CUdevice cu_dev = 0;
  WEFT_CU(driver().cuDeviceGet(&cu_dev, t.device));
  int vmm = 0, fd = 0;
  WEFT_CU(driver().cuDeviceGetAttribute(&vmm, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED, cu_dev));
  WEFT_CU(driver().cuDeviceGetAttribute(&fd, CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED, cu_dev));
  t.vmm_supported = vmm != 0;
  t.vmm_fd_supported = fd != 0;
  int mps = 0;
  WEFT_CU(driver().cuDeviceGetAttribute(&mps, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, cu_dev));
  t.mps_client = mps != 0;

  // The virtual-node split each rank asks for travels with its record, so a
  // malformed or differing request fails every rank alike instead of leaving
  // the others waiting.
  std::string split = "?";
  std::exception_ptr split_error;
  try {
    split = std::to_string(parse_virtual_nodes(virtual_nodes, penv));
  } catch (const Error&) {
    split_error = std::current_exception();
  }
  auto all = store.all_gather(
      join_fields({host, bus, prop.name, std::to_string(t.device), std::to_string(mps), split}), "team discovery");
  t.hostname.resize(t.world_size);
  t.pci_bus_id.resize(t.world_size);
  t.gpu_name.resize(t.world_size);
  std::vector<int> device_of(t.world_size), mps_of(t.world_size);
  t.node_of.assign(t.world_size, -1);
  std::vector<std::string> nodes;
  for (int r = 0; r < t.world_size; ++r) {
    auto f = split_fields(all[r]);
    WEFT_REQUIRE(f.size() == 6, "corrupt team record from rank ", r);
    t.hostname[r] = f[0];
    t.pci_bus_id[r] = f[1];
    t.gpu_name[r] = f[2];
    device_of[r] = std::stoi(f[3]);
    mps_of[r] = std::stoi(f[4]);
    auto it = std::find(nodes.begin(), nodes.end(), f[0]);
    t.node_of[r] = static_cast<int>(it - nodes.begin());
    if (it == nodes.end()) nodes.push_back(f[0]);
  }
  t.num_nodes = static_cast<int>(nodes.size());
  t.hosts = t.num_nodes;
  t.node_id = t.node_of[t.rank];
  for (int r = 0; r < t.world_size; ++r)
    if (t.node_of[r] == t.node_id) t.local_ranks.push_back(r);
  WEFT_REQUIRE(static_cast<int>(t.local_ranks.size()) == t.local_world_size, "the launcher says ",
               t.local_world_size, " ranks run on this node (", host, ") but ", t.local_ranks.size(),
               " ranks reported this host name");
  const std::vector<int> host_of = t.node_of;  // physical: what the links below are measured over

  // Virtual nodes: every rank asked for the same split, which must fit the job.
  if (split_error) std::rethrow_exception(split_error);
  std::vector<std::string> splits;
  for (const std::string& record : all) splits.push_back(split_fields(record)[5]);
  if (std::string why = detail::disagreement(splits, "virtual nodes", "set WEFT_VIRTUAL_NODES the same on every rank");
      !why.empty())
    WEFT_FAIL(why);
  split_into_virtual_nodes(t, std::stoi(split));
  if (t.virtual_nodes > 1 && t.rank == 0)
    WEFT_LOG(info, "virtual nodes: ", t.world_size, " ranks on one machine split into ", t.num_nodes, " nodes of ",
             t.local_world_size, " (WEFT_VIRTUAL_NODES); peers in another node are reached through NVSHMEM only");
  GpuRanks by_gpu;
  for (int r = 0; r < t.world_size; ++r) by_gpu[{t.hostname[r], t.pci_bus_id[r]}].push_back(r);
  check_shared_gpus(t, by_gpu, mps_of);
  if (t.sharing == GpuSharing::automatic) t.sharing = GpuSharing::mps;  // where ranks share, they do through MPS
  t.same_gpu_ranks = by_gpu.at({host, bus});
  t.sm_count = sm_share(t.gpu_sm_count, static_cast<int>(t.same_gpu_ranks.size()));
  for (const auto& [gpu, ranks] : by_gpu) t.ranks_per_gpu = std::max(t.ranks_per_gpu, static_cast<int>(ranks.size()));
  if (t.shares_gpus()) gpu_shared_flag().store(true, std::memory_order_relaxed);
  if (t.sharing == GpuSharing::timeslice && t.shares_gpus() && t.rank == 0)
    WEFT_LOG(warn, "ranks share GPUs by time slicing (WEFT_SHARE_GPU=timeslice): correct, but every wait on "
                   "another rank costs milliseconds; times are not performance figures");

  auto links = nvml_links(bus);
  t.links.resize(t.world_size);
  for (int r = 0; r < t.world_size; ++r) {
    PeerLink& l = t.links[r];
    l.same_node = t.node_of[r] == t.node_id;
    l.same_host = host_of[r] == host_of[t.rank];
    if (!l.same_host) continue;
    if (r == t.rank) {
      l.same_gpu = true;
      l.peer_access = true;
      l.native_atomics = true;
      l.performance_rank = -2;  // marks "self" for describe()
      continue;
    }
    if (t.pci_bus_id[r] == bus) {  // a rank sharing this GPU: its memory is this GPU's
      l.same_gpu = true;
      l.peer_access = true;
      l.native_atomics = true;
      continue;
    }
    int access = 0;
    WEFT_CUDA(cudaDeviceCanAccessPeer(&access, t.device, device_of[r]));
    l.peer_access = access != 0;
    int v = 0;
    if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrNativeAtomicSupported, t.device, device_of[r]) == cudaSuccess)
      l.native_atomics = v != 0;
    if (cudaDeviceGetP2PAttribute(&v, cudaDevP2PAttrPerformanceRank, t.device, device_of[r]) == cudaSuccess)
      l.performance_rank = v;
    l.nvlinks = links.links_to(t.pci_bus_id[r]);
    l.nvlinks_via_switch = links.switch_links;
  }
  if (!links.unavailable.empty()) {
    t.nvlink_summary = "NVML: " + links.unavailable;
  } else {
    std::map<std::string, int> by_far_end;
    for (auto& e : links.active) by_far_end[e.remote_type + " " + e.remote_bus_id]++;
    t.nvlink_summary = str(links.active.size(), " active NVLinks");
    for (auto& [end, n] : by_far_end) t.nvlink_summary += str(", ", n, " to ", end);
  }

  // Every rank's row of the link matrix, so any rank can print the whole of it.
  std::vector<std::string> row;
  for (int r = 0; r < t.world_size; ++r)
    row.push_back(std::string(t.links[r].peer_access ? "1" : "0") + t.links[r].describe());
  auto rows = store.all_gather(join_fields(row), "team link matrix");
  t.link_matrix.assign(t.world_size, std::vector<std::string>(t.world_size));
  t.peer_access_matrix.assign(t.world_size, std::vector<bool>(t.world_size));
  for (int from = 0; from < t.world_size; ++from) {
    auto cells = split_fields(rows[from]);
    WEFT_REQUIRE(static_cast<int>(cells.size()) == t.world_size, "corrupt link row from rank ", from);
    for (int to = 0; to < t.world_size; ++to) {
      t.peer_access_matrix[from][to] = cells[to][0] == '1';
      t.link_matrix[from][to] = cells[to].substr(1);
    }
  }
  return t;
}

}  // namespace weft
