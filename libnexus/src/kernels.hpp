// Internal kernel entry points shared between modules (the C ABI wrappers validate and then call these).
#pragma once

#include <cstdint>

namespace nexus {

struct RopeParams {
    int32_t n_heads;
    int32_t head_dim;
    int32_t n_rot;
    int32_t rope_type;
    float freq_base;
    float freq_scale;
    int64_t delta;
};

// Throws Error(INVALID) with a precise message when the parameters are unusable.
void rope_validate(const RopeParams &p);
// Rotates n_rows rows (validated parameters; in == out allowed) with the active SIMD level.
void rope_rotate(const uint16_t *in, uint16_t *out, int64_t n_rows, const RopeParams &p);
// Same, on a chosen level (tests and benchmarks compare levels).
void rope_rotate_level(const uint16_t *in, uint16_t *out, int64_t n_rows, const RopeParams &p, int32_t level);

// Exact int32 dots of one query against n rows, on a chosen SIMD level.
void slb_dots_level(const int8_t *db, int64_t n, int32_t dim, const int8_t *query, int32_t *out, int32_t level);

// y = x @ W + b with float16 W [k, n] (nexus_linear_f16), on a chosen SIMD level.
void linear_f16_level(const float *x, int64_t m, int32_t k, const uint16_t *w, int32_t n, const float *b, int32_t act,
                      float *y, int32_t level);

}  // namespace nexus
