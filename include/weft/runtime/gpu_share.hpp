// weft/runtime/gpu_share.hpp - ranks that share one GPU: the setting, each rank's share of
// the SMs, and the GPUs visible before CUDA starts.
//
// Several ranks may run on one GPU (correctness runs at world 4 or 8 on one
// GPU; a distributed kernel debugged on a workstation). They need NVIDIA MPS:
// without it the GPU time-slices between the ranks' contexts and every wait on
// another rank costs milliseconds. Under MPS the ranks' kernels run at once,
// placed on the SMs as one process's streams would be, and one more rule keeps
// them from deadlocking: a kernel that spins until another rank writes a flag
// holds its SMs while it spins, so the spinning grids of all the ranks on a GPU
// must fit on it together. Each rank's share is the GPU's SMs / ranks on it
// (Team::sm_count), and every kernel that waits on another rank sizes its grid
// from that share, never from the GPU's count or a constant. MPS's own cap
// (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE) does not give that guarantee: it limits
// how many SMs a rank uses, not which, so capped ranks can land on the same
// SMs; weft leaves it unset. And where ranks share a GPU, weft launches
// without programmatic dependent launch (gpu_shared_in_process(), team.hpp):
// under it a kernel's successor in the stream is scheduled while the kernel
// still runs, and its blocks sit resident until the kernel ends. Behind a
// kernel that spins on other ranks, a successor of any size (FlashDecode's
// grid, EP's combine) would take SMs that a later rank's kernels need before
// they can raise the flags it spins on: a deadlock no grid sizing bounds.
//
// Header-only and libc-only: weftrun (which links nothing else) and the
// runtime both use it.
#pragma once

#include <dlfcn.h>
#include <sys/stat.h>

#include <cctype>
#include <cstdlib>
#include <optional>
#include <string>
#include <string_view>

namespace weft {

/// How ranks placed on the same GPU run (WEFT_SHARE_GPU; weftrun --share-gpu
/// sets it for its ranks): never (an error); automatically, through MPS where
/// an MPS daemon is running (the default: torchrun and mpirun jobs need no
/// setting); through MPS, which must then be running; or time-sliced without
/// MPS (correct, slow).
enum class GpuSharing { off, automatic, mps, timeslice };

inline const char* to_string(GpuSharing s) {
  switch (s) {
    case GpuSharing::off: return "off";
    case GpuSharing::automatic: return "auto";
    case GpuSharing::mps: return "mps";
    case GpuSharing::timeslice: return "timeslice";
  }
  return "?";
}

/// Parses a WEFT_SHARE_GPU value: "0", "off" -> off; "" (unset), "auto" ->
/// automatic; "1", "mps" -> mps; "timeslice" -> timeslice; else nullopt.
inline std::optional<GpuSharing> parse_gpu_sharing(std::string_view v) {
  if (v == "0" || v == "off") return GpuSharing::off;
  if (v.empty() || v == "auto") return GpuSharing::automatic;
  if (v == "1" || v == "mps") return GpuSharing::mps;
  if (v == "timeslice") return GpuSharing::timeslice;
  return std::nullopt;
}

/// The MPS control daemon's pipe directory for this environment
/// (CUDA_MPS_PIPE_DIRECTORY, else MPS's default).
inline std::string mps_pipe_directory(const char* cuda_mps_pipe_directory) {
  return cuda_mps_pipe_directory && *cuda_mps_pipe_directory ? cuda_mps_pipe_directory : "/tmp/nvidia-mps";
}

/// Whether an MPS control daemon's pipe is there (a daemon runs, or ran and
/// died: CUDA's own connection tells those apart).
inline bool mps_pipe_present(const char* cuda_mps_pipe_directory) {
  struct stat st {};
  return ::stat((mps_pipe_directory(cuda_mps_pipe_directory) + "/control").c_str(), &st) == 0;
}

/// A rank's share of a GPU's SMs when `ranks_on_gpu` ranks run on it: the
/// most SMs its waiting kernels may hold, so that all ranks' fit at once.
inline int sm_share(int gpu_sms, int ranks_on_gpu) {
  return ranks_on_gpu <= 1 ? gpu_sms : (gpu_sms / ranks_on_gpu > 0 ? gpu_sms / ranks_on_gpu : 1);
}

/// The GPUs CUDA would show this process, counted without starting CUDA
/// (so that MPS settings made afterwards still apply).
struct VisibleGpus {
  int count = 0;
  std::string why;  ///< when count is 0: why none is visible
};

namespace gpu_share_detail {
/// NVML's device count, or -1 with `why` set. NVML is opened at run time, so
/// this works (and answers "no driver") on machines without NVIDIA's libraries.
inline int nvml_device_count(std::string& why) {
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    why = "libnvidia-ml.so.1 is not installed: no NVIDIA driver on this machine";
    return -1;
  }
  using Init = int (*)();
  using Count = int (*)(unsigned*);
  auto init = reinterpret_cast<Init>(dlsym(lib, "nvmlInit_v2"));
  auto count = reinterpret_cast<Count>(dlsym(lib, "nvmlDeviceGetCount_v2"));
  auto shutdown = reinterpret_cast<Init>(dlsym(lib, "nvmlShutdown"));
  int n = -1;
  if (!init || !count || !shutdown) {
    why = "libnvidia-ml.so.1 lacks nvmlDeviceGetCount_v2";
  } else if (int rc = init(); rc != 0) {
    why = "nvmlInit failed (NVML error " + std::to_string(rc) + "): the NVIDIA driver is not loaded";
  } else {
    unsigned c = 0;
    if (int rc2 = count(&c); rc2 == 0) n = static_cast<int>(c);
    else why = "nvmlDeviceGetCount failed (NVML error " + std::to_string(rc2) + ")";
    shutdown();
  }
  dlclose(lib);
  return n;
}
}  // namespace gpu_share_detail

/// Counts the GPUs visible to CUDA: NVML's count, narrowed by
/// CUDA_VISIBLE_DEVICES (`cuda_visible_devices`, nullptr when unset) the way
/// CUDA reads it: entries up to the first that is not a device index or UUID.
inline VisibleGpus count_visible_gpus(const char* cuda_visible_devices) {
  VisibleGpus v;
  std::string why;
  const int present = gpu_share_detail::nvml_device_count(why);
  if (present == 0) why = "NVML lists no GPU";
  if (!cuda_visible_devices) {
    v.count = present > 0 ? present : 0;
    v.why = why;
    return v;
  }
  int listed = 0;
  std::string_view rest(cuda_visible_devices);
  while (!rest.empty()) {
    auto comma = rest.find(',');
    std::string_view e = rest.substr(0, comma);
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.front()))) e.remove_prefix(1);
    while (!e.empty() && std::isspace(static_cast<unsigned char>(e.back()))) e.remove_suffix(1);
    bool index = !e.empty();
    for (char c : e) index = index && std::isdigit(static_cast<unsigned char>(c));
    bool uuid = e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0;
    if (!index && !uuid) break;
    ++listed;
    if (comma == std::string_view::npos) break;
    rest.remove_prefix(comma + 1);
  }
  v.count = present >= 0 && present < listed ? present : listed;
  if (v.count == 0)
    v.why = listed == 0 ? "CUDA_VISIBLE_DEVICES='" + std::string(cuda_visible_devices) + "' hides every GPU" : why;
  return v;
}

}  // namespace weft
