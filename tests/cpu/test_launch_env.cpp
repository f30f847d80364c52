// Launch-environment detection for every launcher weft accepts, and its errors.
#include <gtest/gtest.h>

#include "weft/core/env.hpp"
#include "weft/core/error.hpp"
#include "weft/runtime/launch_env.hpp"

using namespace weft;

namespace {
std::string error_of(const EnvMap& env) {
  try {
    detect_launch_env(env);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}
}  // namespace

TEST(LaunchEnv, AloneIsAJobOfOne) {
  LaunchEnv le = detect_launch_env({});
  EXPECT_EQ(le.rank, 0);
  EXPECT_EQ(le.world_size, 1);
  EXPECT_EQ(le.launcher, "none");
}

TEST(LaunchEnv, Weftrun) {
  LaunchEnv le = detect_launch_env({{"WEFT_RANK", "1"}, {"WEFT_WORLD_SIZE", "2"}, {"WEFT_LOCAL_RANK", "1"},
                                    {"WEFT_LOCAL_WORLD_SIZE", "2"}, {"WEFT_MASTER_PORT", "4242"}});
  EXPECT_EQ(le.launcher, "weftrun");
  EXPECT_EQ(le.rank, 1);
  EXPECT_EQ(le.local_rank, 1);
  EXPECT_EQ(le.master_port, 4242);
  EXPECT_EQ(le.master_addr, "127.0.0.1");
}

TEST(LaunchEnv, Torchrun) {
  LaunchEnv le = detect_launch_env({{"RANK", "5"}, {"WORLD_SIZE", "8"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"},
                                    {"GROUP_RANK", "1"}, {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29500"}});
  EXPECT_EQ(le.launcher, "torchrun");
  EXPECT_EQ(le.rank, 5);
  EXPECT_EQ(le.node_rank, 1);
  EXPECT_EQ(le.master_addr, "node0");
  EXPECT_EQ(le.master_port, 29501) << "torchrun's own store holds MASTER_PORT: weft's listens on the next";
}

TEST(LaunchEnv, OpenMpi) {
  LaunchEnv le = detect_launch_env({{"OMPI_COMM_WORLD_RANK", "3"}, {"OMPI_COMM_WORLD_SIZE", "4"},
                                    {"OMPI_COMM_WORLD_LOCAL_RANK", "3"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"}});
  EXPECT_EQ(le.launcher, "mpirun");
  EXPECT_EQ(le.rank, 3);
  EXPECT_EQ(le.local_world_size, 4);
}

TEST(LaunchEnv, Slurm) {
  LaunchEnv le = detect_launch_env({{"SLURM_PROCID", "2"}, {"SLURM_NTASKS", "4"}, {"SLURM_LOCALID", "0"},
                                    {"SLURM_TASKS_PER_NODE", "2(x2)"}, {"SLURM_NODEID", "1"},
                                    {"WEFT_MASTER_ADDR", "10.0.0.1"}});
  EXPECT_EQ(le.launcher, "slurm");
  EXPECT_EQ(le.local_world_size, 2);
  EXPECT_EQ(le.node_rank, 1);
  EXPECT_EQ(le.master_addr, "10.0.0.1");
}

TEST(LaunchEnv, WeftVariablesOverrideOtherLaunchers) {
  LaunchEnv le = detect_launch_env({{"WEFT_RANK", "0"}, {"WEFT_WORLD_SIZE", "1"}, {"WEFT_LOCAL_RANK", "0"},
                                    {"WEFT_LOCAL_WORLD_SIZE", "1"}, {"RANK", "3"}, {"WORLD_SIZE", "4"},
                                    {"LOCAL_RANK", "3"}});
  EXPECT_EQ(le.launcher, "weftrun");
  EXPECT_EQ(le.world_size, 1);
}

TEST(LaunchEnv, ErrorsNameTheVariables) {
  EXPECT_NE(error_of({{"WEFT_RANK", "0"}}).find("WEFT_WORLD_SIZE is missing"), std::string::npos);
  EXPECT_NE(error_of({{"RANK", "4"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}).find("rank 4 is outside the world of 4"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "x"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}}).find("RANK='x' is not an integer"),
            std::string::npos);
  EXPECT_NE(error_of({{"RANK", "0"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "0"}, {"LOCAL_WORLD_SIZE", "2"}})
                .find("WEFT_MASTER_ADDR"),
            std::string::npos)
      << "a multi-node job needs a rendezvous host";
  EXPECT_NE(error_of({{"MASTER_PORT", "70000"}}).find("leaves no TCP port"), std::string::npos);
  EXPECT_NE(error_of({{"MASTER_PORT", "65535"}}).find("set WEFT_MASTER_PORT"), std::string::npos);
  EXPECT_NE(error_of({{"WEFT_MASTER_PORT", "0"}}).find("not a TCP port"), std::string::npos);
}

TEST(LaunchEnv, TheRendezvousPortNeverTakesTheLaunchersOwn) {
  const EnvMap torchrun = {{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCAL_RANK", "0"}, {"MASTER_PORT", "29500"}};
  EXPECT_EQ(detect_launch_env(torchrun).master_port, 29501);
  EnvMap chosen = torchrun;
  chosen["WEFT_MASTER_PORT"] = "31000";
  EXPECT_EQ(detect_launch_env(chosen).master_port, 31000);
  EXPECT_EQ(detect_launch_env({}).master_port, 29517);
}

TEST(LaunchEnv, GpuSharingComesFromWeftShareGpu) {
  EXPECT_EQ(detect_launch_env({}).gpu_sharing, GpuSharing::automatic);
  EXPECT_EQ(detect_launch_env({{"WEFT_SHARE_GPU", "mps"}}).gpu_sharing, GpuSharing::mps);
  EXPECT_EQ(detect_launch_env({{"WEFT_SHARE_GPU", "0"}}).gpu_sharing, GpuSharing::off);
  EXPECT_EQ(detect_launch_env({{"WEFT_SHARE_GPU", "timeslice"}}).gpu_sharing, GpuSharing::timeslice);
  const std::string e = error_of({{"WEFT_SHARE_GPU", "always"}});
  EXPECT_NE(e.find("WEFT_SHARE_GPU='always' is not a way to share a GPU"), std::string::npos) << e;
  EXPECT_NE(e.find("timeslice"), std::string::npos) << e;
}

TEST(Env, ParsesAndFormatsByteCounts) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("64K"), 65536u);
  EXPECT_EQ(parse_bytes("256m"), 256u << 20);
  EXPECT_EQ(parse_bytes("2GiB"), 2ull << 30);
  EXPECT_THROW(parse_bytes("12Q"), Error);
  EXPECT_THROW(parse_bytes(""), Error);
  EXPECT_THROW(parse_bytes("99999999999999999999"), Error);
  EXPECT_EQ(format_bytes(1024), "1K");
  EXPECT_EQ(format_bytes(256u << 20), "256M");
  EXPECT_EQ(format_bytes(1000), "1000");
  EXPECT_EQ(env_seconds({{"T", "0.5"}}, "T", std::chrono::milliseconds(0)).count(), 500);
  EXPECT_THROW(env_seconds({{"T", "-1"}}, "T", std::chrono::milliseconds(0)), Error);
}
