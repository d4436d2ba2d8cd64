// RoPE re-rotation: against a float64 reference (within one F16 ulp), every SIMD level bit-identical to scalar,
// in place == out of place, partial rotation, NORM and NEOX layouts, argument errors.
#include <cmath>
#include <cstring>
#include <vector>

#include "check.hpp"
#include "f16.hpp"

using nexus::f16_to_f32;
using nexus::f32_to_f16;

static int ordered(uint16_t h) { return (h & 0x8000) ? -static_cast<int>(h & 0x7FFF) : static_cast<int>(h); }

static std::vector<uint16_t> reference(const std::vector<uint16_t> &in, int64_t n_rows, int n_heads, int head_dim,
                                       int n_rot, int type, double base, double scale, int64_t delta) {
    std::vector<uint16_t> out(in);
    const int half = n_rot / 2;
    for (int64_t r = 0; r < n_rows * n_heads; ++r) {
        const uint16_t *x = in.data() + r * head_dim;
        uint16_t *y = out.data() + r * head_dim;
        for (int i = 0; i < half; ++i) {
            const double th = static_cast<double>(delta) * scale * std::pow(base, -2.0 * i / n_rot);
            const int a = type == NEXUS_ROPE_NORM ? 2 * i : i, b = type == NEXUS_ROPE_NORM ? 2 * i + 1 : i + half;
            const double x0 = f16_to_f32(x[a]), x1 = f16_to_f32(x[b]);
            y[a] = f32_to_f16(static_cast<float>(x0 * std::cos(th) - x1 * std::sin(th)));
            y[b] = f32_to_f16(static_cast<float>(x0 * std::sin(th) + x1 * std::cos(th)));
        }
    }
    return out;
}

static std::vector<uint16_t> random_rows(Rng &rng, size_t n) {
    std::vector<uint16_t> v(n);
    for (auto &h : v) h = f32_to_f16(static_cast<float>((rng.uniform() * 2 - 1) * 4));
    return v;
}

int main() {
    const auto levels = runnable_levels();
    const int32_t saved = nexus_simd_level();
    Rng rng(7);
    struct Case {
        int n_heads, head_dim, n_rot, type;
        float base, scale;
        int64_t delta;
    } cases[] = {
        {1, 2, 2, NEXUS_ROPE_NORM, 10000.f, 1.f, 1},       {2, 64, 64, NEXUS_ROPE_NORM, 10000.f, 1.f, 37},
        {2, 64, 64, NEXUS_ROPE_NEOX, 1000000.f, 1.f, 1500}, {3, 128, 64, NEXUS_ROPE_NEOX, 10000.f, 0.25f, 300},
        {2, 80, 40, NEXUS_ROPE_NORM, 10000.f, 1.f, -123},  {4, 34, 34, NEXUS_ROPE_NEOX, 500000.f, 1.f, 2047},
        {1, 6, 2, NEXUS_ROPE_NORM, 10000.f, 1.f, 5},       {2, 256, 256, NEXUS_ROPE_NEOX, 10000.f, 0.5f, 100000},
        {1, 30, 30, NEXUS_ROPE_NORM, 10000.f, 2.f, 9},     {1, 66, 62, NEXUS_ROPE_NEOX, 10000.f, 1.f, 77},
    };
    for (const auto &c : cases) {
        const int64_t n_rows = 5;
        const auto in = random_rows(rng, n_rows * c.n_heads * c.head_dim);
        const auto ref = reference(in, n_rows, c.n_heads, c.head_dim, c.n_rot, c.type, c.base, c.scale, c.delta);
        std::vector<uint16_t> scalar_out;
        for (int32_t level : levels) {
            CHECK_OK(nexus_simd_set_level(level));
            std::vector<uint16_t> out(in.size());
            CHECK_OK(nexus_rope_rotate_f16(in.data(), out.data(), n_rows, c.n_heads, c.head_dim, c.n_rot, c.type,
                                           c.base, c.scale, c.delta));
            int worst = 0;
            for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::abs(ordered(out[i]) - ordered(ref[i])));
            CHECK(worst <= 1);
            for (int64_t r = 0; r < n_rows * c.n_heads; ++r)  // dims past n_rot are copied bit for bit
                CHECK(std::memcmp(out.data() + r * c.head_dim + c.n_rot, in.data() + r * c.head_dim + c.n_rot,
                                  (c.head_dim - c.n_rot) * 2) == 0);
            if (level == NEXUS_SIMD_SCALAR) scalar_out = out;
            else CHECK(out == scalar_out);
            std::vector<uint16_t> inplace(in);
            CHECK_OK(nexus_rope_rotate_f16(inplace.data(), inplace.data(), n_rows, c.n_heads, c.head_dim, c.n_rot,
                                           c.type, c.base, c.scale, c.delta));
            CHECK(inplace == out);
        }
    }
    // rotating by +d then -d comes back to the input within the F16 rounding of the pair's magnitude (|x| < 4*sqrt2)
    {
        const auto in = random_rows(rng, 4 * 128);
        std::vector<uint16_t> y(in.size());
        CHECK_OK(nexus_rope_rotate_f16(in.data(), y.data(), 4, 1, 128, 128, NEXUS_ROPE_NEOX, 10000.f, 1.f, 200));
        CHECK(y != in);
        CHECK_OK(nexus_rope_rotate_f16(y.data(), y.data(), 4, 1, 128, 128, NEXUS_ROPE_NEOX, 10000.f, 1.f, -200));
        float worst = 0;
        for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(f16_to_f32(y[i]) - f16_to_f32(in[i])));
        CHECK(worst > 0.0f && worst <= 2 * 0.00390625f);  // two roundings at F16 ulp(4..8) / 2
    }
    // a quarter turn by hand: pair (1, 0) rotated by theta = delta*scale = pi/2 (float) is (~0, 1)
    {
        uint16_t x[2] = {0x3C00, 0x0000}, y[2];
        CHECK_OK(nexus_rope_rotate_f16(x, y, 1, 1, 2, 2, NEXUS_ROPE_NORM, 10000.f, 1.5707963705062866f, 1));
        CHECK(y[1] == 0x3C00);
        CHECK(std::fabs(f16_to_f32(y[0])) < 1e-7f);
    }
    // delta = 0 is an exact copy, NaN and Inf included; n_rows = 0 touches nothing
    {
        uint16_t x[4] = {0x7E01, 0x7C00, 0xFC00, 0x3555}, y[4] = {};
        CHECK_OK(nexus_rope_rotate_f16(x, y, 1, 1, 4, 4, NEXUS_ROPE_NORM, 10000.f, 1.f, 0));
        CHECK(std::memcmp(x, y, sizeof x) == 0);
        CHECK_OK(nexus_rope_rotate_f16(nullptr, nullptr, 0, 1, 4, 4, NEXUS_ROPE_NORM, 10000.f, 1.f, 3));
    }
    // argument errors
    uint16_t buf[16] = {};
    CHECK_ERR(nexus_rope_rotate_f16(buf, buf, 1, 1, 8, 3, 0, 10000.f, 1.f, 1), NEXUS_ERR_INVALID, "n_rot must be even");
    CHECK_ERR(nexus_rope_rotate_f16(buf, buf, 1, 1, 8, 10, 0, 10000.f, 1.f, 1), NEXUS_ERR_INVALID, "n_rot");
    CHECK_ERR(nexus_rope_rotate_f16(buf, buf, 1, 1, 8, 8, 1, 10000.f, 1.f, 1), NEXUS_ERR_INVALID, "rope_type");
    CHECK_ERR(nexus_rope_rotate_f16(buf, buf, 1, 1, 8, 8, 0, -1.f, 1.f, 1), NEXUS_ERR_INVALID, "freq_base");
    CHECK_ERR(nexus_rope_rotate_f16(buf, buf, 1, 1, 8, 8, 0, 10000.f, NAN, 1), NEXUS_ERR_INVALID, "freq_scale");
    CHECK_ERR(nexus_rope_rotate_f16(buf, buf, -1, 1, 8, 8, 0, 10000.f, 1.f, 1), NEXUS_ERR_INVALID, "n_rows");
    CHECK_ERR(nexus_rope_rotate_f16(nullptr, buf, 1, 1, 8, 8, 0, 10000.f, 1.f, 1), NEXUS_ERR_INVALID, "in is NULL");
    CHECK_ERR(nexus_rope_rotate_f16(buf, buf + 1, 1, 1, 8, 8, 0, 10000.f, 1.f, 1), NEXUS_ERR_INVALID, "overlap");
    CHECK_OK(nexus_simd_set_level(saved));
    return finish("test_rope");
}
