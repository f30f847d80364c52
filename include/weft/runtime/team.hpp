// weft/runtime/team.hpp - the ranks of a job, where they run, and how their GPUs are linked.
#pragma once

#include <string>
#include <vector>

#include "weft/runtime/launch_env.hpp"
#include "weft/runtime/store.hpp"

namespace weft {

/// How this rank's GPU reaches another rank's GPU.
struct PeerLink {
  bool same_node = false;      ///< both ranks on this node
  bool same_gpu = false;       ///< both ranks on this very GPU (ranks sharing it; itself included)
  bool peer_access = false;    ///< cudaDeviceCanAccessPeer (always true for itself and the same GPU)
  bool native_atomics = false; ///< cudaDevP2PAttrNativeAtomicSupported
  int performance_rank = -1;   ///< cudaDevP2PAttrPerformanceRank (lower is better), -1 unknown
  int nvlinks = 0;             ///< active NVLinks from this GPU straight to that GPU (NVML)
  int nvlinks_via_switch = 0;  ///< active NVLinks from this GPU to NVSwitches, if any (NVML)
  /// "self", "same GPU", "NV18", "NV18 via NVSwitch", "P2P (PCIe)", "no P2P", "other node".
  std::string describe() const;
};

/// Everything weft knows about the job's ranks after rendezvous.
struct Team {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  int node_id = 0, num_nodes = 1;
  int device = 0;                        ///< CUDA device index this rank uses
  std::vector<int> node_of;              ///< per rank: node id (order of first appearance)
  std::vector<int> local_ranks;          ///< the global ranks on this node, by local rank
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
  static Team discover(const LaunchEnv& env, Store& store);

  /// True when every rank runs on this node (NVLink/IPC only, no NVSHMEM needed).
  bool single_node() const { return num_nodes == 1; }
  /// True when some GPU carries more than one rank of the job (NCCL then
  /// cannot run, and times are not performance figures).
  bool shares_gpus() const { return ranks_per_gpu > 1; }
};

}  // namespace weft
