// weft/core/signal_types.hpp - the vocabulary every signal is spelled in: scope, comparison, signal op.
//
// Plain enums and one comparison, for host and device alike: the runtime
// (wait reports, host-side checks) and the device language (weft/device/)
// both speak them, so they live at the bottom layer.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define WEFT_HD __host__ __device__ __forceinline__
#define WEFT_DEVICE __device__ __forceinline__
#else
#define WEFT_HD inline
#endif

namespace weft::dev {

/// Which threads a memory operation synchronises with.
///  - cta: threads of the same thread block;
///  - gpu: threads of the same GPU;
///  - sys: every GPU of this node (NVLink peers) and the host. Any flag that a
///    peer reads or writes must use sys.
enum class Scope : std::uint8_t { cta, gpu, sys };

/// The six OpenSHMEM comparisons, as in shmem_signal_wait_until: the wait ends
/// when (flag CMP value) holds.
enum class Cmp : std::uint8_t { eq, ne, gt, ge, lt, le };

/// How a signal update combines with the flag: overwrite or atomic add.
enum class SignalOp : std::uint8_t { set, add };

/// Evaluates (lhs CMP rhs); host and device.
WEFT_HD bool compare(std::uint64_t lhs, Cmp cmp, std::uint64_t rhs) {
  switch (cmp) {
    case Cmp::eq: return lhs == rhs;
    case Cmp::ne: return lhs != rhs;
    case Cmp::gt: return lhs > rhs;
    case Cmp::ge: return lhs >= rhs;
    case Cmp::lt: return lhs < rhs;
    case Cmp::le: return lhs <= rhs;
  }
  return false;
}

/// "eq", "ge", ... for messages.
inline const char* cmp_name(Cmp cmp) {
  constexpr const char* names[] = {"==", "!=", ">", ">=", "<", "<="};
  return names[static_cast<int>(cmp)];
}

}  // namespace weft::dev
