// nvml_links.hpp (private) - NVLink facts of this GPU, read through NVML opened at run time.
#pragma once

#include <string>
#include <vector>

namespace weft {

/// One active NVLink of this GPU.
struct NvLinkEnd {
  unsigned link = 0;
  std::string remote_bus_id;  ///< normalised "dddd:bb:dd.f"
  std::string remote_type;    ///< "GPU", "NVSwitch", "NPU" or "unknown"
};

/// This GPU's active NVLinks, or why they could not be read.
struct NvLinkInfo {
  std::vector<NvLinkEnd> active;
  int switch_links = 0;      ///< active links whose far end is an NVSwitch
  std::string unavailable;   ///< non-empty if NVML could not be used (the reason)
  /// Active links whose far end is the GPU at `bus_id`.
  int links_to(const std::string& bus_id) const;
};

/// Reads the NVLinks of the GPU at PCI `bus_id`. Never throws: failures land in `unavailable`.
NvLinkInfo nvml_links(const std::string& bus_id);

/// "00000000:1B:00.0" and "0000:1b:00.0" -> "0000:1b:00.0".
std::string normalise_bus_id(const std::string& bus_id);

}  // namespace weft
