#include "nvml_links.hpp"

#include <dlfcn.h>
#include <nvml.h>

#include <cstdio>

namespace weft {

std::string normalise_bus_id(const std::string& bus_id) {
  unsigned domain = 0, bus = 0, dev = 0, fn = 0;
  if (std::sscanf(bus_id.c_str(), "%x:%x:%x.%x", &domain, &bus, &dev, &fn) != 4) return bus_id;
  char out[32];
  std::snprintf(out, sizeof(out), "%04x:%02x:%02x.%x", domain & 0xffffu, bus, dev, fn);
  return out;
}

int NvLinkInfo::links_to(const std::string& bus_id) const {
  std::string want = normalise_bus_id(bus_id);
  int n = 0;
  for (auto& e : active) n += e.remote_bus_id == want;
  return n;
}

NvLinkInfo nvml_links(const std::string& bus_id) {
  NvLinkInfo info;
  void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    info.unavailable = "libnvidia-ml.so.1 not found";
    return info;
  }
  auto sym = [&](const char* name) { return dlsym(lib, name); };
  auto init = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlInit_v2"));
  auto shutdown = reinterpret_cast<nvmlReturn_t (*)()>(sym("nvmlShutdown"));
  auto by_bus = reinterpret_cast<nvmlReturn_t (*)(const char*, nvmlDevice_t*)>(sym("nvmlDeviceGetHandleByPciBusId_v2"));
  auto state = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlEnableState_t*)>(sym("nvmlDeviceGetNvLinkState"));
  auto remote_pci = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlPciInfo_t*)>(sym("nvmlDeviceGetNvLinkRemotePciInfo_v2"));
  auto remote_type = reinterpret_cast<nvmlReturn_t (*)(nvmlDevice_t, unsigned, nvmlIntNvLinkDeviceType_t*)>(sym("nvmlDeviceGetNvLinkRemoteDeviceType"));
  if (!init || !shutdown || !by_bus || !state || !remote_pci) {
    info.unavailable = "NVML lacks the NVLink queries";
    dlclose(lib);
    return info;
  }
  if (init() != NVML_SUCCESS) {
    info.unavailable = "nvmlInit failed";
    dlclose(lib);
    return info;
  }
  nvmlDevice_t dev{};
  if (by_bus(bus_id.c_str(), &dev) != NVML_SUCCESS) {
    info.unavailable = "NVML does not know GPU " + bus_id;
  } else {
    for (unsigned link = 0; link < NVML_NVLINK_MAX_LINKS; ++link) {
      nvmlEnableState_t on = NVML_FEATURE_DISABLED;
      if (state(dev, link, &on) != NVML_SUCCESS || on != NVML_FEATURE_ENABLED) continue;
      NvLinkEnd end;
      end.link = link;
      nvmlPciInfo_t pci{};
      if (remote_pci(dev, link, &pci) == NVML_SUCCESS) end.remote_bus_id = normalise_bus_id(pci.busId);
      nvmlIntNvLinkDeviceType_t type = NVML_NVLINK_DEVICE_TYPE_UNKNOWN;
      if (remote_type && remote_type(dev, link, &type) == NVML_SUCCESS) {
        end.remote_type = type == NVML_NVLINK_DEVICE_TYPE_GPU      ? "GPU"
                          : type == NVML_NVLINK_DEVICE_TYPE_SWITCH ? "NVSwitch"
                          : type == NVML_NVLINK_DEVICE_TYPE_IBMNPU ? "NPU"
                                                                   : "unknown";
      } else {
        end.remote_type = "unknown";
      }
      info.switch_links += end.remote_type == "NVSwitch";
      info.active.push_back(end);
    }
  }
  shutdown();
  dlclose(lib);
  return info;
}

}  // namespace weft
