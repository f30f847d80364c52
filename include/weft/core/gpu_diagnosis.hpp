// weft/core/gpu_diagnosis.hpp - can this process use the GPUs here, and if not, why not.
//
// Every weft program and the GPU tests ask this first, so each failure is
// named the same plain way: no GPU (the GPU tests then skip), or a GPU that
// weft cannot use - a driver too old for the CUDA runtime weft was built with,
// a GPU that is not Hopper, any other CUDA start-up error (the GPU tests then
// fail: on a GPU machine these are faults, never skips).
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace weft {

/// What CUDA says about the GPUs here, read without using any of them.
struct GpuFacts {
  bool driver_present = false;  ///< libcuda.so.1 could be opened
  int driver_version = 0;       ///< cuDriverGetVersion (e.g. 13000), 0 if unknown
  int runtime_version = 0;      ///< the CUDA runtime weft was built with (CUDART_VERSION)
  int count_error = 0;          ///< cudaGetDeviceCount's cudaError_t
  std::string count_error_name; ///< its name ("cudaErrorInsufficientDriver")
  int device_count = 0;
  std::vector<std::pair<int, int>> capability;  ///< per visible GPU: compute capability (major, minor)
  std::vector<std::string> names;               ///< per visible GPU
  std::string visible_devices;  ///< CUDA_VISIBLE_DEVICES, or "" when unset
  bool visible_devices_set = false;
};

enum class GpuVerdict {
  ready,   ///< at least one GPU, all of them usable
  none,    ///< no GPU here (no driver, none visible): GPU work cannot run, GPU tests skip
  broken,  ///< GPUs are here but weft cannot use them: a fault to report
};

struct GpuDiagnosis {
  GpuVerdict verdict = GpuVerdict::none;
  int gpus = 0;
  std::string message;  ///< one plain sentence for none and broken; "" when ready
};

/// Decides from `facts` alone (pure, CPU-testable with made-up facts).
GpuDiagnosis judge_gpus(const GpuFacts& facts);

/// Reads the facts of this machine (starts the CUDA runtime, creates no context).
GpuFacts read_gpu_facts();

/// judge_gpus(read_gpu_facts()).
inline GpuDiagnosis diagnose_gpus() { return judge_gpus(read_gpu_facts()); }

}  // namespace weft
