// weft/core/driver.hpp - the CUDA driver calls weft needs, resolved at run time.
//
// weft never links libcuda directly: the functions below are fetched through
// cudaGetDriverEntryPointByVersion on first use. A binary built with weft thus
// starts (and runs its CPU tests) on a machine with no NVIDIA driver at all.
#pragma once

#include <cuda.h>

namespace weft {

/// Function pointers to the driver API (same names and signatures as cuda.h).
struct Driver {
  decltype(&::cuGetErrorName) cuGetErrorName = nullptr;
  decltype(&::cuDeviceGet) cuDeviceGet = nullptr;
  decltype(&::cuDeviceGetAttribute) cuDeviceGetAttribute = nullptr;
  decltype(&::cuMemCreate) cuMemCreate = nullptr;
  decltype(&::cuMemRelease) cuMemRelease = nullptr;
  decltype(&::cuMemExportToShareableHandle) cuMemExportToShareableHandle = nullptr;
  decltype(&::cuMemImportFromShareableHandle) cuMemImportFromShareableHandle = nullptr;
  decltype(&::cuMemAddressReserve) cuMemAddressReserve = nullptr;
  decltype(&::cuMemAddressFree) cuMemAddressFree = nullptr;
  decltype(&::cuMemMap) cuMemMap = nullptr;
  decltype(&::cuMemUnmap) cuMemUnmap = nullptr;
  decltype(&::cuMemSetAccess) cuMemSetAccess = nullptr;
  decltype(&::cuMemGetAllocationGranularity) cuMemGetAllocationGranularity = nullptr;
  decltype(&::cuStreamWriteValue64) cuStreamWriteValue64 = nullptr;
  decltype(&::cuStreamWaitValue64) cuStreamWaitValue64 = nullptr;
  decltype(&::cuStreamBatchMemOp) cuStreamBatchMemOp = nullptr;
};

/// The resolved driver table. Throws weft::Error (naming the missing symbol)
/// if the driver is absent or too old; safe to call from several threads.
const Driver& driver();

/// The driver's name for a CUresult ("CUDA_ERROR_OUT_OF_MEMORY"), or "CUresult <n>"
/// when the driver cannot be asked.
const char* driver_error_name(int code);

}  // namespace weft
