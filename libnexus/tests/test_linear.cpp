// Dense layer with float16 weights (panel layout) and layer norm: every SIMD level against a double reference, panel
// edges, the GELU epilogue, errors.
#include <algorithm>
#include <cmath>
#include <vector>

#include "check.hpp"
#include "f16.hpp"
#include "kernels.hpp"

static double gelu_ref(double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); }

int main() {
    const auto levels = runnable_levels();
    const int32_t saved = nexus_simd_level();
    Rng rng(99);
    const int shapes[][3] = {{1, 1, 1}, {3, 7, 15}, {6, 16, 16}, {7, 17, 17}, {13, 33, 63}, {2, 384, 64}, {5, 65, 65},
                             {12, 40, 130}};
    for (const auto &sh : shapes) {
        const int m = sh[0], k = sh[1], n = sh[2];
        const int panels = (n + 63) / 64;
        std::vector<float> x(m * k), b(n), y(m * n);
        std::vector<double> wd(static_cast<size_t>(k) * n);
        std::vector<uint16_t> w(static_cast<size_t>(panels) * k * 64, 0);  // zero padding in the last panel
        for (auto &v : x) v = static_cast<float>(rng.uniform() * 4 - 2);
        for (auto &v : b) v = static_cast<float>(rng.uniform() - 0.5);
        for (int l = 0; l < k; ++l)
            for (int j = 0; j < n; ++j) {
                const uint16_t h = nexus::f32_to_f16(static_cast<float>(rng.uniform() * 2 - 1));
                w[(static_cast<size_t>(j / 64) * k + l) * 64 + j % 64] = h;
                wd[static_cast<size_t>(l) * n + j] = nexus::f16_to_f32(h);
            }
        for (int32_t act : {NEXUS_ACT_NONE, NEXUS_ACT_GELU})
            for (int32_t level : levels) {
                CHECK_OK(nexus_simd_set_level(level));
                CHECK_OK(nexus_linear_f16(x.data(), m, k, w.data(), n, b.data(), act, y.data()));
                bool close = true;
                for (int i = 0; i < m; ++i)
                    for (int j = 0; j < n; ++j) {
                        double s = b[j], mag = std::fabs(b[j]);
                        for (int l = 0; l < k; ++l) {
                            s += x[i * k + l] * wd[static_cast<size_t>(l) * n + j];
                            mag += std::fabs(x[i * k + l] * wd[static_cast<size_t>(l) * n + j]);
                        }
                        const double want = act == NEXUS_ACT_GELU ? gelu_ref(s) : s;
                        const double tol = mag * (k + 2) * std::ldexp(1.0, -24) + 3e-7 * (std::fabs(want) + 1);
                        close = close && std::fabs(y[i * n + j] - want) <= tol;
                    }
                CHECK(close);
            }
    }
    // a batch large enough to be split by rows over threads (nexus_linear_f16 on a machine with 2+ cores): the same
    // bits as one thread's pass, row blocks that do not divide evenly included
    {
        const int m = 601, k = 256, n = 448;
        std::vector<float> x(static_cast<size_t>(m) * k), b(n), split(static_cast<size_t>(m) * n),
            whole(static_cast<size_t>(m) * n);
        std::vector<uint16_t> w(static_cast<size_t>(n / 64) * k * 64);
        for (auto &v : x) v = static_cast<float>(rng.uniform() * 4 - 2);
        for (auto &v : b) v = static_cast<float>(rng.uniform() - 0.5);
        for (auto &v : w) v = nexus::f32_to_f16(static_cast<float>(rng.uniform() * 2 - 1));
        for (int32_t level : levels) {
            CHECK_OK(nexus_simd_set_level(level));
            CHECK_OK(nexus_linear_f16(x.data(), m, k, w.data(), n, b.data(), NEXUS_ACT_GELU, split.data()));
            nexus::linear_f16_level(x.data(), m, k, w.data(), n, b.data(), NEXUS_ACT_GELU, whole.data(), level);
            CHECK(split == whole);
        }
    }
    CHECK_OK(nexus_simd_set_level(saved));

    // layer norm, with and without a residual, in place
    {
        const int m = 3, n = 10;
        std::vector<float> x(m * n), r(m * n), g(n), be(n), y(m * n);
        for (auto &v : x) v = static_cast<float>(rng.uniform() * 6 - 2);
        for (auto &v : r) v = static_cast<float>(rng.uniform() - 0.5);
        for (int j = 0; j < n; ++j) {
            g[j] = static_cast<float>(0.5 + rng.uniform());
            be[j] = static_cast<float>(rng.uniform() - 0.5);
        }
        CHECK_OK(nexus_layer_norm(x.data(), r.data(), m, n, g.data(), be.data(), 1e-12f, y.data()));
        bool close = true;
        for (int i = 0; i < m; ++i) {
            double mu = 0, var = 0;
            for (int j = 0; j < n; ++j) mu += static_cast<double>(x[i * n + j] + r[i * n + j]);
            mu /= n;
            for (int j = 0; j < n; ++j) var += std::pow(static_cast<double>(x[i * n + j] + r[i * n + j]) - mu, 2);
            var /= n;
            for (int j = 0; j < n; ++j) {
                const double want = (x[i * n + j] + r[i * n + j] - mu) / std::sqrt(var + 1e-12) * g[j] + be[j];
                close = close && std::fabs(y[i * n + j] - want) <= 2e-6 * (1 + std::fabs(want));
            }
        }
        CHECK(close);
        std::vector<float> inplace = x;
        CHECK_OK(nexus_layer_norm(inplace.data(), nullptr, m, n, g.data(), be.data(), 1e-12f, inplace.data()));
        CHECK_OK(nexus_layer_norm(x.data(), nullptr, m, n, g.data(), be.data(), 1e-12f, y.data()));
        CHECK(inplace == y);
    }

    // nexus_pack_f16_rows: rows of several layers side by side (one starting inside a panel), against the layout
    // written element by element
    {
        const int k = 70, sizes[3] = {100, 37, 64}, n = 201, panels = (n + 63) / 64;
        std::vector<uint16_t> got(static_cast<size_t>(panels) * k * 64, 0), want(got.size(), 0);
        int col = 0;
        for (int r : sizes) {
            std::vector<uint16_t> rows(static_cast<size_t>(r) * k);
            for (auto &v : rows) v = static_cast<uint16_t>(rng.uniform() * 65535);
            CHECK_OK(nexus_pack_f16_rows(rows.data(), r, k, col, n, got.data()));
            for (int i = 0; i < r; ++i)
                for (int l = 0; l < k; ++l)
                    want[(static_cast<size_t>((col + i) / 64) * k + l) * 64 + (col + i) % 64] = rows[i * k + l];
            col += r;
        }
        CHECK(got == want);
        CHECK_ERR(nexus_pack_f16_rows(got.data(), 8, k, 200, n, got.data()), NEXUS_ERR_INVALID, "do not fit");
        CHECK_ERR(nexus_pack_f16_rows(nullptr, 8, k, 0, n, got.data()), NEXUS_ERR_INVALID, "rows is NULL");
    }

    // errors
    float xv[4] = {0}, yv[4];
    uint16_t wv[64] = {0};
    CHECK_ERR(nexus_linear_f16(xv, 1, 1, wv, 1, nullptr, 7, yv), NEXUS_ERR_INVALID, "activation must be");
    CHECK_ERR(nexus_linear_f16(xv, 1, 0, wv, 1, nullptr, NEXUS_ACT_NONE, yv), NEXUS_ERR_INVALID, "k must be >= 1");
    CHECK_ERR(nexus_linear_f16(xv, 1, 1, nullptr, 1, nullptr, NEXUS_ACT_NONE, yv), NEXUS_ERR_INVALID, "w is NULL");
    CHECK_OK(nexus_linear_f16(nullptr, 0, 1, nullptr, 1, nullptr, NEXUS_ACT_NONE, nullptr));  // nothing to do
    CHECK_ERR(nexus_layer_norm(xv, nullptr, 1, 0, xv, xv, 1e-5f, yv), NEXUS_ERR_INVALID, "n must be >= 1");
    CHECK_ERR(nexus_layer_norm(xv, nullptr, 1, 4, nullptr, xv, 1e-5f, yv), NEXUS_ERR_INVALID, "gamma is NULL");
    return finish("test_linear");
}
