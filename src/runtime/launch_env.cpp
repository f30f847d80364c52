#include "weft/runtime/launch_env.hpp"

#include <algorithm>
#include <cctype>

#include "weft/core/error.hpp"

namespace weft {
namespace {

bool has(const EnvMap& env, const char* name) { return env_str(env, name).has_value(); }

int get_int(const EnvMap& env, const char* name) {
  return static_cast<int>(env_int(env, name, -1));
}

// Slurm's SLURM_TASKS_PER_NODE looks like "4(x2),3": the first entry is this
// job's first node; weft needs only local counts, which SLURM_NTASKS_PER_NODE
// or SLURM_STEP_TASKS_PER_NODE give directly when set.
int slurm_local_world(const EnvMap& env) {
  for (const char* name : {"SLURM_STEP_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"}) {
    auto v = env_str(env, name);
    if (!v) continue;
    std::size_t end = 0;
    while (end < v->size() && std::isdigit(static_cast<unsigned char>((*v)[end]))) ++end;
    if (end > 0) return std::stoi(v->substr(0, end));
  }
  return -1;
}

}  // namespace

LaunchEnv detect_launch_env(const EnvMap& env) {
  LaunchEnv le;
  auto need = [&](const char* name, const char* launcher) {
    int v = get_int(env, name);
    WEFT_REQUIRE(v >= 0, launcher, " environment is incomplete: ", name,
                 " is missing (weft found the launcher's other variables)");
    return v;
  };
  if (has(env, "WEFT_RANK")) {
    le.launcher = "weftrun";
    le.rank = need("WEFT_RANK", "weftrun");
    le.world_size = need("WEFT_WORLD_SIZE", "weftrun");
    le.local_rank = need("WEFT_LOCAL_RANK", "weftrun");
    le.local_world_size = need("WEFT_LOCAL_WORLD_SIZE", "weftrun");
    le.node_rank = static_cast<int>(env_int(env, "WEFT_NODE_RANK", 0));
  } else if (has(env, "RANK") && has(env, "WORLD_SIZE") && has(env, "LOCAL_RANK")) {
    le.launcher = "torchrun";
    le.rank = need("RANK", "torchrun");
    le.world_size = need("WORLD_SIZE", "torchrun");
    le.local_rank = need("LOCAL_RANK", "torchrun");
    le.local_world_size = static_cast<int>(env_int(env, "LOCAL_WORLD_SIZE", le.world_size));
    le.node_rank = static_cast<int>(env_int(env, "GROUP_RANK", le.rank / std::max(1, le.local_world_size)));
  } else if (has(env, "OMPI_COMM_WORLD_RANK")) {
    le.launcher = "mpirun";
    le.rank = need("OMPI_COMM_WORLD_RANK", "Open MPI");
    le.world_size = need("OMPI_COMM_WORLD_SIZE", "Open MPI");
    le.local_rank = need("OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI");
    le.local_world_size = need("OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI");
    le.node_rank = static_cast<int>(env_int(env, "OMPI_COMM_WORLD_NODE_RANK", le.rank / le.local_world_size));
  } else if (has(env, "SLURM_PROCID") && has(env, "SLURM_NTASKS")) {
    le.launcher = "slurm";
    le.rank = need("SLURM_PROCID", "Slurm");
    le.world_size = need("SLURM_NTASKS", "Slurm");
    le.local_rank = need("SLURM_LOCALID", "Slurm");
    le.local_world_size = slurm_local_world(env);
    WEFT_REQUIRE(le.local_world_size > 0,
                 "Slurm environment is incomplete: none of SLURM_STEP_TASKS_PER_NODE, "
                 "SLURM_NTASKS_PER_NODE, SLURM_TASKS_PER_NODE is set");
    le.node_rank = static_cast<int>(env_int(env, "SLURM_NODEID", 0));
  }
  WEFT_REQUIRE(le.world_size >= 1, le.launcher, ": world size ", le.world_size, " must be at least 1");
  WEFT_REQUIRE(le.rank >= 0 && le.rank < le.world_size, le.launcher, ": rank ", le.rank,
               " is outside the world of ", le.world_size, " ranks");
  WEFT_REQUIRE(le.local_world_size >= 1 && le.local_world_size <= le.world_size, le.launcher,
               ": local world size ", le.local_world_size, " must be between 1 and the world size ",
               le.world_size);
  WEFT_REQUIRE(le.local_rank >= 0 && le.local_rank < le.local_world_size, le.launcher,
               ": local rank ", le.local_rank, " is outside the node's ", le.local_world_size, " ranks");

  if (auto a = env_str(env, "WEFT_MASTER_ADDR")) le.master_addr = *a;
  else if (auto b = env_str(env, "MASTER_ADDR")) le.master_addr = *b;
  else if (le.world_size > le.local_world_size)
    WEFT_FAIL(le.launcher, ": the job spans several nodes (world ", le.world_size, ", ",
              le.local_world_size, " on this node) but no rendezvous host is set: export "
              "WEFT_MASTER_ADDR (or MASTER_ADDR) to the host of rank 0");
  // MASTER_PORT belongs to the launcher's own store (torchrun's, or PyTorch's
  // env:// rendezvous), which already listens there: weft's takes the next port.
  std::int64_t port = le.master_port;
  if (env_str(env, "WEFT_MASTER_PORT")) {
    port = env_int(env, "WEFT_MASTER_PORT", port);
    WEFT_REQUIRE(port > 0 && port < 65536, "WEFT_MASTER_PORT=", port, " is not a TCP port (1..65535)");
  } else if (env_str(env, "MASTER_PORT")) {
    port = env_int(env, "MASTER_PORT", port);
    WEFT_REQUIRE(port > 0 && port < 65535, "MASTER_PORT=", port,
                 " leaves no TCP port for weft's rendezvous, which listens on MASTER_PORT + 1 (set WEFT_MASTER_PORT)");
    ++port;
  }
  le.master_port = static_cast<int>(port);
  auto share = parse_gpu_sharing(env_str(env, "WEFT_SHARE_GPU").value_or(""));
  WEFT_REQUIRE(share, "WEFT_SHARE_GPU='", *env_str(env, "WEFT_SHARE_GPU"),
               "' is not a way to share a GPU: expected auto (the default: through NVIDIA MPS where a daemon runs), "
               "0 or off (one rank per GPU), 1 or mps (through MPS, which must run), or timeslice (without MPS: "
               "correct, but slow)");
  le.gpu_sharing = *share;
  return le;
}

std::string describe(const LaunchEnv& le) {
  return str("rank ", le.rank, "/", le.world_size, " (local ", le.local_rank, "/", le.local_world_size,
             ", node ", le.node_rank, ") via ", le.launcher, ", rendezvous ", le.master_addr, ":",
             le.master_port,
             le.gpu_sharing == GpuSharing::automatic ? "" : str(", WEFT_SHARE_GPU=", to_string(le.gpu_sharing)));
}

}  // namespace weft
