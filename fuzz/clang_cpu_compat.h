// Force-included (-include) into the libnexus sources for the fuzz build only.
// clang 14 (Debian 12's clang) does not know __builtin_cpu_supports("f16c"), which libnexus/src/api.cpp asks for
// (GCC and clang >= 16 do). This answers "f16c" from CPUID (leaf 1, ECX bit 29, and only when the OS saves AVX
// state, as the builtin's AVX answer already says) and passes every other feature to the builtin.
#pragma once
#if defined(__x86_64__) && defined(__clang__)
#include <cpuid.h>
#include <cstring>
static inline bool nexus_fuzz_cpu_supports(const char *f) {
    if (std::strcmp(f, "f16c") == 0) {
        unsigned a = 0, b = 0, c = 0, d = 0;
        if (!__get_cpuid(1, &a, &b, &c, &d)) return false;
        return ((c >> 29) & 1u) != 0 && __builtin_cpu_supports("avx");
    }
    if (std::strcmp(f, "avx512f") == 0) return __builtin_cpu_supports("avx512f");
    if (std::strcmp(f, "avx512bw") == 0) return __builtin_cpu_supports("avx512bw");
    if (std::strcmp(f, "avx512vl") == 0) return __builtin_cpu_supports("avx512vl");
    if (std::strcmp(f, "avx512vnni") == 0) return __builtin_cpu_supports("avx512vnni");
    if (std::strcmp(f, "avx2") == 0) return __builtin_cpu_supports("avx2");
    if (std::strcmp(f, "fma") == 0) return __builtin_cpu_supports("fma");
    return false;
}
#define __builtin_cpu_supports(f) nexus_fuzz_cpu_supports(f)
#endif
