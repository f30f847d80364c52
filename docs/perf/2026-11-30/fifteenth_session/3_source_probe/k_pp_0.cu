#include "probe_kernel.cuh"
probe::RunFn pp_0() { return &probe::K<128, 128, 1, 2, false, 0>::run; }
