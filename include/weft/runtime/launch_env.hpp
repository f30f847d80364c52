// weft/runtime/launch_env.hpp - who am I? Rank and rendezvous settings from the launcher's environment.
//
// weft programs start under weftrun, torchrun, mpirun (Open MPI) or Slurm's srun,
// or alone. Each launcher names the same facts differently; detect_launch_env
// reads whichever is present, in that order of precedence.
#pragma once

#include <string>

#include "weft/core/env.hpp"
#include "weft/runtime/gpu_share.hpp"

namespace weft {

/// Where a process sits in the job, and where to meet the others.
struct LaunchEnv {
  int rank = 0;              ///< global rank, 0..world_size-1
  int world_size = 1;        ///< number of processes in the job
  int local_rank = 0;        ///< rank among the processes of this node
  int local_world_size = 1;  ///< processes on this node
  int node_rank = 0;         ///< index of this node, 0..nodes-1
  std::string master_addr = "127.0.0.1";  ///< host of rank 0's rendezvous store
  int master_port = 29517;                ///< its TCP port (WEFT_MASTER_PORT, else MASTER_PORT + 1)
  std::string launcher = "none";  ///< "weftrun", "torchrun", "mpirun", "slurm" or "none"
  /// WEFT_SHARE_GPU: whether ranks may share a GPU, and how (weftrun --share-gpu sets it).
  GpuSharing gpu_sharing = GpuSharing::automatic;
};

/// Reads the launch environment from `env`. Precedence: WEFT_* (weftrun), then
/// torchrun (RANK/WORLD_SIZE/LOCAL_RANK...), Open MPI (OMPI_COMM_WORLD_*), Slurm
/// (SLURM_PROCID/SLURM_NTASKS/...). WEFT_MASTER_ADDR, then MASTER_ADDR, name
/// the rendezvous host; its port is WEFT_MASTER_PORT, else MASTER_PORT + 1
/// (MASTER_PORT itself is the launcher's or PyTorch's own store), else 29517.
/// With none present the process is a job of one. WEFT_SHARE_GPU (auto, off,
/// mps or 1, timeslice) says whether ranks may share a GPU. Throws weft::Error naming the
/// variables when they are inconsistent (rank outside the world, missing partner variables).
LaunchEnv detect_launch_env(const EnvMap& env);

/// One line describing the environment, for logs and errors.
std::string describe(const LaunchEnv& le);

}  // namespace weft
