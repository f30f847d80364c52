// ring_step.hpp (private) - the GEMM configuration GemmRs's ring steps force by name.
//
// A forced name that stopped resolving would fall back to the tuner's pick
// without a word, so the CPU tests (tests/cpu/test_gemm_configs.cpp) check
// that this very name resolves for each hook and B layout.
#pragma once

#include <string>

#include "weft/gemm/gemm.hpp"

namespace weft::ops_detail {

/// The configuration a ring step with `hook` asks for: CUTLASS's cooperative
/// 128x256 c2x1 kernel, plain (GemmHook::none), hooked+source
/// (wait_source_rows), hooked+add (add_rows) or hooked (the other hooks). A bare name: its
/// tile-scheduler settings are tuned.
std::string ring_step_config(GemmHook hook);

}  // namespace weft::ops_detail
