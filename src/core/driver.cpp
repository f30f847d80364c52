#include "weft/core/driver.hpp"

#include <cuda_runtime_api.h>

#include <mutex>
#include <string>

#include "weft/core/error.hpp"

namespace weft {
namespace {

template <class Fn>
void resolve(Fn& slot, const char* symbol) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status{};
  cudaError_t rc = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status);
  WEFT_REQUIRE(rc == cudaSuccess && status == cudaDriverEntryPointSuccess && fn,
               "cannot resolve CUDA driver function ", symbol, " (", cudaGetErrorName(rc),
               "): is an NVIDIA driver for CUDA 12 or newer installed?");
  slot = reinterpret_cast<Fn>(fn);
}

Driver load() {
  Driver d;
  resolve(d.cuGetErrorName, "cuGetErrorName");
  resolve(d.cuDeviceGet, "cuDeviceGet");
  resolve(d.cuDeviceGetAttribute, "cuDeviceGetAttribute");
  resolve(d.cuMemCreate, "cuMemCreate");
  resolve(d.cuMemRelease, "cuMemRelease");
  resolve(d.cuMemExportToShareableHandle, "cuMemExportToShareableHandle");
  resolve(d.cuMemImportFromShareableHandle, "cuMemImportFromShareableHandle");
  resolve(d.cuMemAddressReserve, "cuMemAddressReserve");
  resolve(d.cuMemAddressFree, "cuMemAddressFree");
  resolve(d.cuMemMap, "cuMemMap");
  resolve(d.cuMemUnmap, "cuMemUnmap");
  resolve(d.cuMemSetAccess, "cuMemSetAccess");
  resolve(d.cuMemGetAllocationGranularity, "cuMemGetAllocationGranularity");
  resolve(d.cuStreamWriteValue64, "cuStreamWriteValue64");
  resolve(d.cuStreamWaitValue64, "cuStreamWaitValue64");
  resolve(d.cuStreamBatchMemOp, "cuStreamBatchMemOp");
  return d;
}

}  // namespace

const Driver& driver() {
  static std::once_flag once;
  static Driver table;
  static std::string failure;
  std::call_once(once, [] {
    try {
      table = load();
    } catch (const Error& e) {
      failure = e.what();
    }
  });
  if (!failure.empty()) throw Error(failure);
  return table;
}

const char* driver_error_name(int code) {
  static thread_local std::string fallback;
  try {
    const char* name = nullptr;
    if (driver().cuGetErrorName(static_cast<CUresult>(code), &name) == CUDA_SUCCESS && name)
      return name;
  } catch (const Error&) {
  }
  fallback = "CUresult " + std::to_string(code);
  return fallback.c_str();
}

}  // namespace weft
