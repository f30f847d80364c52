// weft/runtime/team.hpp - the ranks of a job, where they run, and how their GPUs are linked.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "weft/runtime/launch_env.hpp"
#include "weft/runtime/store.hpp"

namespace weft {

/// How this rank's GPU reaches another rank's GPU.
struct PeerLink {
  bool same_node = false;      ///< both ranks on this node (a virtual node where WEFT_VIRTUAL_NODES splits the host)
  bool same_host = false;      ///< both ranks on this machine (the fields below are measured for such peers)
  bool same_gpu = false;       ///< both ranks on this very GPU (ranks sharing it; itself included)
  bool peer_access = false;    ///< cudaDeviceCanAccessPeer (always true for itself and the same GPU)
  bool native_atomics = false; ///< cudaDevP2PAttrNativeAtomicSupported
  int performance_rank = -1;   ///< cudaDevP2PAttrPerformanceRank (lower is better), -1 unknown
  int nvlinks = 0;             ///< active NVLinks from this GPU straight to that GPU (NVML)
  int nvlinks_via_switch = 0;  ///< active NVLinks from this GPU to NVSwitches, if any (NVML)
  /// "self", "same GPU", "NV18", "NV18 via NVSwitch", "P2P (PCIe)", "no P2P", "other node",
  /// "other virtual node (same GPU)" (or "(NV18)", ...: the physical link beneath the split).
  std::string describe() const;
};

/// Everything weft knows about the job's ranks after rendezvous.
struct Team {
  int rank = 0, world_size = 1;
  /// This rank's place in its node. Under virtual nodes, the node is the
  /// virtual one (the launcher's local rank still picks the GPU).
  int local_rank = 0, local_world_size = 1;
  int node_id = 0, num_nodes = 1;
  int device = 0;                        ///< CUDA device index this rank uses
  std::vector<int> node_of;              ///< per rank: node id (order of first appearance; virtual nodes: rank / (W / N))
  std::vector<int> local_ranks;          ///< the global ranks on this node, by local rank
  /// Machines the ranks run on (distinct host names). num_nodes equals it
  /// unless virtual nodes split one host.
  int hosts = 1;
  /// WEFT_VIRTUAL_NODES / ContextOptions::virtual_nodes: 1, or the N nodes one
  /// host's ranks were split into (contiguous blocks of W / N ranks). Peers in
  /// another virtual node are treated as another node's: weft reaches them only
  /// through NVSHMEM (the NVSHMEM heap leaves them unmapped), so the inter-node
  /// paths run on one machine, over NVSHMEM's P2P transport. For tests.
  int virtual_nodes = 1;
  std::vector<std::string> hostname;     ///< per rank
  std::vector<std::string> pci_bus_id;   ///< per rank: its GPU's PCI bus id
  std::vector<std::string> gpu_name;     ///< per rank
  std::vector<PeerLink> links;           ///< per rank: how this rank's GPU reaches it
  /// [from][to] for every pair of ranks: PeerLink::describe() as seen from `from`.
  std::vector<std::vector<std::string>> link_matrix;
  /// [from][to]: peer access between the two ranks' GPUs.
  std::vector<std::vector<bool>> peer_access_matrix;
  std::string nvlink_summary;            ///< this GPU's active NVLinks, or why NVML could not tell
  bool vmm_supported = false;            ///< this GPU supports CUDA virtual memory management
  bool vmm_fd_supported = false;         ///< ...with POSIX file-descriptor handles (native heap needs it)
  /// Multiprocessors this rank's waiting kernels may hold: the GPU's, or where
  /// ranks share it, its share (gpu_sm_count / ranks on the GPU). Kernels that
  /// wait on other ranks size their grids from it (gpu_share.hpp says why).
  int sm_count = 0;
  int gpu_sm_count = 0;                  ///< multiprocessors of this rank's GPU

  /// How ranks placed on one GPU run: LaunchEnv::gpu_sharing, with automatic
  /// resolved to mps (the only way it lets ranks share).
  GpuSharing sharing = GpuSharing::mps;
  bool mps_client = false;               ///< this rank's CUDA context is served by NVIDIA MPS
  std::vector<int> same_gpu_ranks;       ///< the ranks on this rank's GPU, itself included, in order
  int ranks_per_gpu = 1;                 ///< the most ranks on any one GPU of the job

  /// Picks the GPU (WEFT_DEVICE, else local_rank modulo the visible devices),
  /// makes it current, and exchanges what each rank sees through `store`.
  /// Collective. Throws, on every rank alike, if no GPU is visible, or if
  /// ranks would share a GPU with WEFT_SHARE_GPU=off, or (unless time-sliced)
  /// without an MPS daemon serving them.
  /// `virtual_nodes`: ContextOptions::virtual_nodes; unset, WEFT_VIRTUAL_NODES
  /// (parse_virtual_nodes). Every rank must ask for the same split, of a job on
  /// one host, into a divisor of its ranks; otherwise every rank throws alike,
  /// naming what was expected.
  static Team discover(const LaunchEnv& env, Store& store, std::optional<int> virtual_nodes = std::nullopt);

  /// True when every rank runs on this node (NVLink/IPC only, no NVSHMEM needed).
  /// False under virtual nodes, although one machine holds every rank.
  bool single_node() const { return num_nodes == 1; }
  /// True when every rank runs on this machine (virtual nodes or not).
  bool single_host() const { return hosts == 1; }
  /// True when some GPU carries more than one rank of the job (NCCL then
  /// cannot run, and times are not performance figures).
  bool shares_gpus() const { return ranks_per_gpu > 1; }
};

/// Whether a Team discovered in this process has ranks sharing a GPU (set by
/// Team::discover, kept for the life of the process). weft's launches then
/// leave out programmatic dependent launch, unless WEFT_PDL=1 asks for it:
/// gpu_share.hpp gives the rule.
bool gpu_shared_in_process();

/// The virtual node count a rank asks for: `option` if set, else
/// WEFT_VIRTUAL_NODES from `env`, else 1 (no split). Throws weft::Error naming
/// the setting when it is not an integer of at least 1.
int parse_virtual_nodes(std::optional<int> option, const EnvMap& env);

/// Per rank, its virtual node when one host's `world_size` ranks are split into
/// `virtual_nodes` nodes of world_size / virtual_nodes contiguous ranks:
/// rank / (world_size / virtual_nodes). Pure. Throws weft::Error, naming what
/// was expected, when virtual_nodes < 1, when it does not divide world_size
/// (listing the divisors), or when the ranks already span `hosts` > 1 machines
/// (virtual nodes split one machine; real nodes need no help).
std::vector<int> virtual_node_of(int world_size, int virtual_nodes, int hosts);

/// Applies virtual_node_of to a team whose rank, world_size and host count are
/// set: node_of, num_nodes, node_id, local_ranks, local_rank, local_world_size
/// and virtual_nodes follow the split (links are left to the caller). Pure;
/// virtual_nodes == 1 leaves the team as it is. Throws as virtual_node_of.
void split_into_virtual_nodes(Team& team, int virtual_nodes);

}  // namespace weft
