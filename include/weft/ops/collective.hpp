// weft/ops/collective.hpp - what every collective plan shares: element types and limits.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace weft {

/// Element types the reducing collectives accept (sums accumulate in fp32).
enum class DType { bf16, fp16, fp32 };

/// Bytes per element.
std::size_t dtype_size(DType t);
/// "bf16", "fp16", "fp32".
const char* to_string(DType t);
/// Parses the names above; throws naming the accepted ones.
DType parse_dtype(const std::string& name);

/// How a plan orders its peers' traffic.
enum class PeerOrder {
  mesh,  ///< every rank talks to every peer at once (NVLink full mesh / NVSwitch)
  ring   ///< data travels rank -> rank + 1 in W - 1 steps (links between neighbours only)
};

}  // namespace weft
