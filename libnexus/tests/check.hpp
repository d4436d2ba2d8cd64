// A tiny test harness: CHECK records a failure and keeps going; main returns non-zero if anything failed.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "nexus.h"

static int g_failures = 0;

#define CHECK(cond)                                                                   \
    do {                                                                              \
        if (!(cond)) {                                                                \
            std::fprintf(stderr, "%s:%d: CHECK failed: %s\n", __FILE__, __LINE__, #cond); \
            ++g_failures;                                                             \
        }                                                                             \
    } while (0)

#define CHECK_OK(expr)                                                                                   \
    do {                                                                                                 \
        const int32_t st_ = (expr);                                                                      \
        if (st_ != NEXUS_OK) {                                                                           \
            std::fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__, __LINE__, #expr, st_, nexus_last_error()); \
            ++g_failures;                                                                                \
        }                                                                                                \
    } while (0)

// The call fails with `status` and its message contains `needle`.
#define CHECK_ERR(expr, status, needle)                                                                         \
    do {                                                                                                        \
        const int32_t st_ = (expr);                                                                             \
        const std::string msg_ = nexus_last_error();                                                            \
        if (st_ != (status) || msg_.find(needle) == std::string::npos) {                                        \
            std::fprintf(stderr, "%s:%d: %s: expected status %d with \"%s\", got %d \"%s\"\n", __FILE__, __LINE__, \
                         #expr, (int)(status), needle, st_, msg_.c_str());                                       \
            ++g_failures;                                                                                       \
        }                                                                                                       \
    } while (0)

inline int finish(const char *name) {
    if (g_failures) {
        std::fprintf(stderr, "%s: %d check(s) failed\n", name, g_failures);
        return 1;
    }
    std::printf("%s: all checks passed (simd level %s)\n", name, nexus_simd_name(nexus_simd_level()));
    return 0;
}

// Levels this CPU can run, scalar first.
inline std::vector<int32_t> runnable_levels() {
    std::vector<int32_t> out;
    const int32_t saved = nexus_simd_level();
    for (int32_t l = NEXUS_SIMD_SCALAR; l <= NEXUS_SIMD_NEON; ++l)
        if (nexus_simd_set_level(l) == NEXUS_OK) out.push_back(l);
    nexus_simd_set_level(saved);
    return out;
}

// xorshift64*: deterministic and the same everywhere.
struct Rng {
    uint64_t s;
    explicit Rng(uint64_t seed) : s(seed ? seed : 1) {}
    uint64_t next() {
        s ^= s >> 12;
        s ^= s << 25;
        s ^= s >> 27;
        return s * 2685821657736338717ull;
    }
    double uniform() { return (next() >> 11) * (1.0 / 9007199254740992.0); }
    int8_t i8() { return static_cast<int8_t>(next() >> 56); }
};
