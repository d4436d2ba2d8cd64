// Run-time SIMD dispatch. The level is chosen once from CPUID (or forced to scalar by NEXUS_FORCE_SCALAR) and can
// be overridden for tests; kernels read it on every call, so an override takes effect immediately.
#pragma once

#include <cstdint>

namespace nexus {

int32_t simd_level() noexcept;          // the level in use
int32_t simd_max_level() noexcept;      // the best level this CPU can run
bool simd_level_runnable(int32_t level) noexcept;
void simd_set_level(int32_t level);     // throws Error(INVALID) for a level the CPU cannot run

}  // namespace nexus
