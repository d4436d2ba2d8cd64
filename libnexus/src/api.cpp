// The small entry points of the ABI: error message, version, SIMD dispatch, and the recompute schedule of eq. (2).
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <string>

#include "common.hpp"
#include "simd.hpp"

namespace nexus {

namespace {
thread_local std::string t_last_error;

std::atomic<int32_t> g_level{-1};

int32_t detect_max_level() noexcept {
#if defined(__x86_64__)
    __builtin_cpu_init();
    const bool f16c = __builtin_cpu_supports("f16c");
    const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                        __builtin_cpu_supports("avx512vl") && f16c;
    if (avx512 && __builtin_cpu_supports("avx512vnni")) return NEXUS_SIMD_AVX512_VNNI;
    if (avx512) return NEXUS_SIMD_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c) return NEXUS_SIMD_AVX2;
    return NEXUS_SIMD_SCALAR;
#elif defined(__aarch64__)
    return NEXUS_SIMD_NEON;  // Advanced SIMD (with FP16 conversions) is mandatory on AArch64
#else
    return NEXUS_SIMD_SCALAR;
#endif
}

bool force_scalar_from_env() noexcept {
    const char *v = std::getenv("NEXUS_FORCE_SCALAR");
    return v != nullptr && v[0] != '\0' && std::string(v) != "0";
}
}  // namespace

void set_last_error(const char *message) noexcept {
    try {
        t_last_error = message;
    } catch (...) {
        // out of memory while recording an error: keep whatever was there rather than throw across the ABI
    }
}

int32_t simd_max_level() noexcept {
    static const int32_t max_level = detect_max_level();
    return max_level;
}

int32_t simd_level() noexcept {
    int32_t level = g_level.load(std::memory_order_acquire);
    if (level >= 0) return level;
    const int32_t chosen = force_scalar_from_env() ? NEXUS_SIMD_SCALAR : simd_max_level();
    int32_t expected = -1;
    // the first caller wins; a concurrent set_level that got there first is kept
    g_level.compare_exchange_strong(expected, chosen, std::memory_order_acq_rel);
    return g_level.load(std::memory_order_acquire);
}

bool simd_level_runnable(int32_t level) noexcept {
    const int32_t max_level = simd_max_level();
    if (level == NEXUS_SIMD_SCALAR) return true;
#if defined(__x86_64__)
    return level >= NEXUS_SIMD_AVX2 && level <= NEXUS_SIMD_AVX512_VNNI && level <= max_level;
#else
    return level == max_level;
#endif
}

void simd_set_level(int32_t level) {
    if (level < NEXUS_SIMD_SCALAR || level > NEXUS_SIMD_NEON)
        invalid("unknown SIMD level " + std::to_string(level) + " (valid 0..4)");
    if (!simd_level_runnable(level))
        invalid(std::string("SIMD level ") + nexus_simd_name(level) + " is not supported by this CPU (best: " +
                nexus_simd_name(simd_max_level()) + ")");
    g_level.store(level, std::memory_order_release);
}

}  // namespace nexus

using namespace nexus;

extern "C" {

const char *nexus_last_error(void) { return t_last_error.c_str(); }

const char *nexus_version(void) { return "0.1.0"; }

int32_t nexus_simd_level(void) { return simd_level(); }

const char *nexus_simd_name(int32_t level) {
    switch (level) {
        case NEXUS_SIMD_SCALAR: return "scalar";
        case NEXUS_SIMD_AVX2: return "avx2";
        case NEXUS_SIMD_AVX512: return "avx512";
        case NEXUS_SIMD_AVX512_VNNI: return "avx512_vnni";
        case NEXUS_SIMD_NEON: return "neon";
        default: return "unknown";
    }
}

int32_t nexus_simd_set_level(int32_t level) {
    return guard([&] { simd_set_level(level); });
}

int32_t nexus_eff_pct(int64_t n_past, int64_t m, double r_base, double k, double *out_pct) {
    return guard([&] {
        require_ptr(out_pct, "out_pct");
        if (n_past < 0) invalid("n_past must be >= 0, got " + std::to_string(n_past));
        if (m <= 0) invalid("m must be > 0, got " + std::to_string(m));
        if (!std::isfinite(k) || k <= 1.0) invalid("k must be a finite number > 1, got " + std::to_string(k));
        if (!(r_base >= 0.0 && r_base <= 100.0)) invalid("r_base must be in [0, 100], got " + std::to_string(r_base));
        double pct = r_base;
        if (n_past > m) {
            const double md = static_cast<double>(m);
            pct = r_base + static_cast<double>(n_past - m) / (md * (k - 1.0)) * (100.0 - r_base);
        }
        if (pct > 100.0) pct = 100.0;
        if (pct < r_base) pct = r_base;
        *out_pct = pct;
    });
}

}  // extern "C"
