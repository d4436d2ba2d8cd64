// INT8 SLB: quantization rule, exact dots on every SIMD level at awkward lengths, top-k order and ties, errors.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "check.hpp"

static std::vector<int32_t> ref_dots(const std::vector<int8_t> &db, int64_t n, int dim, const int8_t *q) {
    std::vector<int32_t> out(n);
    for (int64_t i = 0; i < n; ++i) {
        int64_t s = 0;
        for (int j = 0; j < dim; ++j) s += int64_t{db[i * dim + j]} * q[j];
        out[i] = static_cast<int32_t>(s);
    }
    return out;
}

int main() {
    const auto levels = runnable_levels();
    const int32_t saved = nexus_simd_level();
    Rng rng(1234);

    // quantization: scale = max|x| / 127, half away from zero, zero row -> scale 1
    {
        const float x[2 * 4] = {1.0f, -0.5f, 0.25f, -1.0f, 0, 0, 0, 0};
        int8_t q[8];
        float s[2];
        CHECK_OK(nexus_quantize_i8(x, 2, 4, q, s));
        CHECK(s[0] == 1.0f / 127.0f);
        CHECK(q[0] == 127 && q[3] == -127);
        CHECK(q[1] == static_cast<int8_t>(std::round(-0.5f / s[0])));  // -63.5 -> -64
        CHECK(q[1] == -64);
        CHECK(q[2] == 32);  // 31.75 -> 32
        CHECK(s[1] == 1.0f && q[4] == 0 && q[7] == 0);
        const float bad[2] = {1.0f, NAN};
        CHECK_ERR(nexus_quantize_i8(bad, 1, 2, q, s), NEXUS_ERR_INVALID, "x[0, 1] is not finite");
    }

    // exact dots, every level, lengths around every vector width; extreme values included
    const int dims[] = {1, 3, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 128, 129, 384, 1000};
    for (int dim : dims) {
        for (int64_t n : {1, 7, 8, 9, 33}) {
            std::vector<int8_t> db(n * dim), q(dim);
            for (auto &v : db) v = rng.i8();
            for (auto &v : q) v = rng.i8();
            if (n > 1) {  // worst cases for saturation and for the VNNI offset trick
                std::fill(db.begin(), db.begin() + dim, -128);
                std::fill(db.begin() + dim, db.begin() + 2 * dim, 127);
            }
            q[0] = -128;
            const auto want = ref_dots(db, n, dim, q.data());
            for (int32_t level : levels) {
                CHECK_OK(nexus_simd_set_level(level));
                std::vector<int32_t> got(n, 12345);
                CHECK_OK(nexus_slb_dots(db.data(), n, dim, q.data(), got.data()));
                if (got != want) std::fprintf(stderr, "dots mismatch: level %d dim %d n %lld\n", level, dim, (long long)n);
                CHECK(got == want);
            }
        }
    }
    {  // all -128 against all -128: the largest positive dot
        const int dim = 384;
        std::vector<int8_t> db(dim, -128), q(dim, -128);
        for (int32_t level : levels) {
            CHECK_OK(nexus_simd_set_level(level));
            int32_t d = 0;
            CHECK_OK(nexus_slb_dots(db.data(), 1, dim, q.data(), &d));
            CHECK(d == 128 * 128 * dim);
        }
    }

    // top-k: order by score desc, ties by lower index, same on every level; k > n; NULL scales; big k path
    {
        const int dim = 384;
        const int64_t n = 1000;
        std::vector<float> x(n * dim);
        for (auto &v : x) v = static_cast<float>(rng.uniform() * 2 - 1);
        for (int j = 0; j < dim; ++j) {  // duplicate rows: exact ties
            x[500 * dim + j] = x[100 * dim + j];
            x[900 * dim + j] = x[100 * dim + j];
        }
        std::vector<int8_t> db(n * dim);
        std::vector<float> scales(n);
        CHECK_OK(nexus_quantize_i8(x.data(), n, dim, db.data(), scales.data()));
        std::vector<int8_t> q(db.begin() + 100 * dim, db.begin() + 101 * dim);  // the query is row 100 itself
        const float qs = scales[100];
        const auto dots = ref_dots(db, n, dim, q.data());
        std::vector<float> score(n);
        for (int64_t i = 0; i < n; ++i) score[i] = static_cast<float>(dots[i]) * scales[i] * qs;
        std::vector<int64_t> order(n);
        std::iota(order.begin(), order.end(), 0);
        std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return score[a] > score[b]; });
        CHECK(order[0] == 100 && order[1] == 500 && order[2] == 900);
        for (int32_t k : {1, 3, 10, 64, 65, 200, 1000, 5000}) {
            for (int32_t level : levels) {
                CHECK_OK(nexus_simd_set_level(level));
                std::vector<int64_t> idx(k, -1);
                std::vector<float> sc(k);
                int32_t got = -1;
                CHECK_OK(nexus_slb_topk(db.data(), scales.data(), n, dim, q.data(), qs, k, idx.data(), sc.data(), &got));
                CHECK(got == std::min<int64_t>(k, n));
                bool same = true;
                for (int32_t r = 0; r < got; ++r) same = same && idx[r] == order[r] && sc[r] == score[order[r]];
                CHECK(same);
            }
        }
        int64_t idx[4];
        float sc[4];
        int32_t got = 0;
        CHECK_OK(nexus_slb_topk(db.data(), nullptr, n, dim, q.data(), 1.0f, 4, idx, sc, &got));
        CHECK(got == 4 && sc[0] == static_cast<float>(dots[idx[0]]));
        CHECK_OK(nexus_slb_topk(db.data(), nullptr, 0, dim, q.data(), 1.0f, 4, idx, sc, &got));
        CHECK(got == 0);
        std::vector<double> ns(5, -1);
        CHECK_OK(nexus_slb_topk_timed(db.data(), scales.data(), n, dim, q.data(), qs, 5, 2, 5, ns.data()));
        CHECK(std::all_of(ns.begin(), ns.end(), [](double v) { return v >= 0; }));
        CHECK_ERR(nexus_slb_topk(db.data(), nullptr, n, dim, q.data(), 1.0f, 0, idx, sc, &got), NEXUS_ERR_INVALID,
                  "k must be >= 1");
        CHECK_ERR(nexus_slb_topk(db.data(), nullptr, n, 0, q.data(), 1.0f, 1, idx, sc, &got), NEXUS_ERR_INVALID,
                  "dim must be in 1..65536");
        CHECK_ERR(nexus_slb_topk(db.data(), nullptr, n, dim, nullptr, 1.0f, 1, idx, sc, &got), NEXUS_ERR_INVALID,
                  "query is NULL");
        CHECK_ERR(nexus_slb_topk_timed(db.data(), nullptr, n, dim, q.data(), 1.0f, 1, 0, 0, ns.data()),
                  NEXUS_ERR_INVALID, "n_reps must be >= 1");
    }
    // top-k where a block's selection first filters rows by its 16 lane maxima: few distinct scores (ties inside and
    // across lanes), NaN scores (a NaN scale) ranked as -inf, blocks shorter than 16 rows, k around the 16 lanes
    {
        const int dim = 8;
        for (int64_t n : {1, 4, 5, 15, 16, 17, 31, 250, 256, 257, 600}) {
            std::vector<int8_t> db(n * dim);
            std::vector<float> scales(n);
            for (int64_t i = 0; i < n; ++i) {
                for (int j = 0; j < dim; ++j) db[i * dim + j] = static_cast<int8_t>((i * 7 % 3) + j % 2);  // 3 rows
                scales[i] = i % 11 == 4 ? NAN : 1.0f;
            }
            std::vector<int8_t> q(dim, 1);
            const auto dots = ref_dots(db, n, dim, q.data());
            std::vector<float> key(n);
            for (int64_t i = 0; i < n; ++i) {
                const float sc = static_cast<float>(dots[i]) * scales[i] * 0.5f;
                key[i] = std::isnan(sc) ? -INFINITY : sc;
            }
            std::vector<int64_t> order(n);
            std::iota(order.begin(), order.end(), 0);
            std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return key[a] > key[b]; });
            for (int32_t k : {1, 5, 15, 16, 17}) {
                for (int32_t level : levels) {
                    CHECK_OK(nexus_simd_set_level(level));
                    std::vector<int64_t> idx(k, -1);
                    std::vector<float> sc(k);
                    int32_t got = -1;
                    CHECK_OK(nexus_slb_topk(db.data(), scales.data(), n, dim, q.data(), 0.5f, k, idx.data(), sc.data(),
                                            &got));
                    bool same = got == std::min<int64_t>(k, n);
                    for (int32_t r = 0; same && r < got; ++r) same = idx[r] == order[r];
                    if (!same) std::fprintf(stderr, "lane filter: level %d n %lld k %d\n", level, (long long)n, k);
                    CHECK(same);
                }
            }
        }
    }
    // per-tool scores: each tool's best row, raised to the floor_k-th best row score (or base), on every level
    {
        const int64_t n = 700;
        const int32_t dim = 37, n_tools = 90;
        std::vector<float> x(n * dim), qf(dim);
        for (auto &v : x) v = static_cast<float>(rng.uniform() * 2 - 1);
        for (auto &v : qf) v = static_cast<float>(rng.uniform() * 2 - 1);
        std::vector<int8_t> db(n * dim), q(dim);
        std::vector<float> scales(n);
        float qs = 0;
        CHECK_OK(nexus_quantize_i8(x.data(), n, dim, db.data(), scales.data()));
        CHECK_OK(nexus_quantize_i8(qf.data(), 1, dim, q.data(), &qs));
        // tool t owns rows [offsets[t], offsets[t+1]): lengths that vary from tool to tool, none, one, and more than
        // a vector's 16 or 32 lanes among them; the tools past the last row own none, the last one the rest
        const int64_t lengths[] = {8, 1, 17, 40, 3, 0, 33, 16, 5, 2};
        std::vector<int64_t> offsets(n_tools + 1, 0);
        for (int32_t t = 1; t <= n_tools; ++t) offsets[t] = std::min<int64_t>(n, offsets[t - 1] + lengths[(t - 1) % 10]);
        offsets[n_tools] = n;
        const auto dots = ref_dots(db, n, dim, q.data());
        std::vector<float> score(n);
        for (int64_t i = 0; i < n; ++i) score[i] = static_cast<float>(dots[i]) * scales[i] * qs;
        std::vector<float> sorted = score;
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        for (int32_t floor_k : {0, 1, 256, 699, 700}) {
            const float lowest = floor_k > 0 && floor_k < n ? sorted[floor_k - 1] : -2.0f;
            for (int32_t level : levels) {
                CHECK_OK(nexus_simd_set_level(level));
                std::vector<float> out(n_tools);
                CHECK_OK(nexus_slb_tool_scores(db.data(), scales.data(), n, dim, qf.data(), offsets.data(), n_tools,
                                               floor_k, -2.0f, out.data()));
                bool same = true;
                for (int32_t t = 0; t < n_tools; ++t) {
                    float best = -INFINITY;
                    for (int64_t r = offsets[t]; r < offsets[t + 1]; ++r) best = std::max(best, score[r]);
                    same = same && out[t] == std::max(best, lowest);
                }
                CHECK(same);
            }
        }
        std::vector<float> out(n_tools);
        std::vector<int64_t> bad = offsets;
        bad[5] = bad[4] - 1;
        CHECK_ERR(nexus_slb_tool_scores(db.data(), scales.data(), n, dim, qf.data(), bad.data(), n_tools, 0, 0.0f,
                                        out.data()), NEXUS_ERR_INVALID, "non-decreasing");
        bad = offsets;
        bad[n_tools] = n - 1;
        CHECK_ERR(nexus_slb_tool_scores(db.data(), scales.data(), n, dim, qf.data(), bad.data(), n_tools, 0, 0.0f,
                                        out.data()), NEXUS_ERR_INVALID, "from 0 to n");
        CHECK_ERR(nexus_slb_tool_scores(db.data(), scales.data(), n, dim, qf.data(), offsets.data(), n_tools, -1, 0.0f,
                                        out.data()), NEXUS_ERR_INVALID, "floor_k must be >= 0");
    }
    // the floor's selection with many tied scores (rows repeated from a few distinct ones), at every rank
    {
        const int64_t n = 301;
        const int32_t dim = 40;
        std::vector<float> distinct(7 * dim), x(n * dim), qf(dim);
        for (auto &v : distinct) v = static_cast<float>(rng.uniform() * 2 - 1);
        for (auto &v : qf) v = static_cast<float>(rng.uniform() * 2 - 1);
        for (int64_t i = 0; i < n; ++i) {
            const int64_t src = static_cast<int64_t>(rng.uniform() * 7) % 7;
            std::copy(distinct.begin() + src * dim, distinct.begin() + (src + 1) * dim, x.begin() + i * dim);
        }
        std::vector<int8_t> db(n * dim), q(dim);
        std::vector<float> scales(n);
        float qs = 0;
        CHECK_OK(nexus_quantize_i8(x.data(), n, dim, db.data(), scales.data()));
        CHECK_OK(nexus_quantize_i8(qf.data(), 1, dim, q.data(), &qs));
        std::vector<int64_t> offsets(n + 1);  // one row per tool: each tool's score is its row's, raised to the floor
        for (int64_t t = 0; t <= n; ++t) offsets[t] = t;
        const auto dots = ref_dots(db, n, dim, q.data());
        std::vector<float> score(n);
        for (int64_t i = 0; i < n; ++i) score[i] = static_cast<float>(dots[i]) * scales[i] * qs;
        std::vector<float> sorted = score;
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        for (int32_t level : levels) {
            CHECK_OK(nexus_simd_set_level(level));
            bool same = true;
            std::vector<float> out(n);
            for (int32_t floor_k = 1; floor_k < n; ++floor_k) {
                CHECK_OK(nexus_slb_tool_scores(db.data(), scales.data(), n, dim, qf.data(), offsets.data(), n,
                                               floor_k, -2.0f, out.data()));
                for (int64_t t = 0; t < n; ++t) same = same && out[t] == std::max(score[t], sorted[floor_k - 1]);
            }
            CHECK(same);
        }
    }
    // exact top-k: equals a brute-force float64 ranking of the float32 rows on every level, k past n included
    {
        const int64_t n = 203;
        const int32_t dim = 97;
        std::vector<float> x(n * dim), qf(dim);
        for (auto &v : x) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
        for (int j = 0; j < dim; ++j) x[17 * dim + j] = x[3 * dim + j] + 1e-5f * static_cast<float>(rng.uniform());
        for (int j = 0; j < dim; ++j) x[88 * dim + j] = x[3 * dim + j];  // an exact tie with row 3
        std::vector<int8_t> db(n * dim);
        std::vector<float> scales(n), norms(2 * n);
        CHECK_OK(nexus_quantize_i8(x.data(), n, dim, db.data(), scales.data()));
        CHECK_OK(nexus_slb_row_norms(db.data(), scales.data(), x.data(), n, dim, norms.data()));
        for (int32_t level : levels) {  // the same bits on every level (lane j % 8 holds partial sum j % 8)
            CHECK_OK(nexus_simd_set_level(level));
            std::vector<float> again(2 * n);
            CHECK_OK(nexus_slb_row_norms(db.data(), scales.data(), x.data(), n, dim, again.data()));
            CHECK(std::memcmp(again.data(), norms.data(), again.size() * sizeof(float)) == 0);
        }
        for (int trial = 0; trial < 20; ++trial) {
            for (int j = 0; j < dim; ++j)
                qf[j] = trial == 0 ? x[3 * dim + j] : static_cast<float>(rng.uniform() * 2.0 - 1.0);
            std::vector<std::pair<double, int64_t>> want(n);
            for (int64_t i = 0; i < n; ++i) {
                double d = 0.0;
                for (int j = 0; j < dim; ++j) d += double{x[i * dim + j]} * double{qf[j]};
                want[i] = {d, i};
            }
            std::sort(want.begin(), want.end(), [](const auto &a, const auto &b) {
                return a.first > b.first || (a.first == b.first && a.second < b.second);
            });
            for (int32_t k : {1, 5, 70, 300}) {
                const int32_t m = std::min<int32_t>(k, static_cast<int32_t>(n));
                for (int32_t level : levels) {
                    CHECK_OK(nexus_simd_set_level(level));
                    std::vector<int64_t> idx(m);
                    std::vector<float> sc(m);
                    int32_t got = 0;
                    int64_t rescored = 0;
                    CHECK_OK(nexus_slb_topk_exact(db.data(), scales.data(), x.data(), norms.data(), n, dim, qf.data(),
                                                  k, idx.data(), sc.data(), &got, &rescored));
                    bool same = got == m && rescored >= m && rescored <= n;
                    for (int32_t r = 0; r < m && same; ++r)
                        same = idx[r] == want[r].second && sc[r] == static_cast<float>(want[r].first);
                    CHECK(same);
                }
            }
        }
        std::vector<int64_t> idx(1);
        std::vector<float> sc(1);
        int32_t got = 0;
        CHECK_ERR(nexus_slb_topk_exact(db.data(), scales.data(), x.data(), norms.data(), n, dim, qf.data(), 0,
                                       idx.data(), sc.data(), &got, nullptr), NEXUS_ERR_INVALID, "k must be >= 1");
        CHECK_ERR(nexus_slb_topk_exact(db.data(), scales.data(), x.data(), nullptr, n, dim, qf.data(), 1, idx.data(),
                                       sc.data(), &got, nullptr), NEXUS_ERR_INVALID, "row_norms");
    }
    // a prepared SLB (panels on a VNNI CPU) scans exactly like the plain calls: awkward row counts and dims, extreme
    // values, every level, top-k, exact top-k and per-tool scores
    for (int dim : {1, 3, 5, 64, 383, 384}) {
        for (int64_t n : {1, 63, 64, 65, 300}) {
            std::vector<float> x(n * dim);
            for (auto &v : x) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
            std::vector<int8_t> db(n * dim);
            std::vector<float> scales(n), norms(2 * n);
            CHECK_OK(nexus_quantize_i8(x.data(), n, dim, db.data(), scales.data()));
            CHECK_OK(nexus_slb_row_norms(db.data(), scales.data(), x.data(), n, dim, norms.data()));
            nexus_slb *slb = nullptr;
            CHECK_OK(nexus_slb_create(db.data(), scales.data(), x.data(), norms.data(), n, dim, &slb));
            std::vector<int8_t> q(dim);
            for (auto &v : q) v = rng.i8();
            q[0] = -128;
            std::vector<float> qf(dim);
            for (auto &v : qf) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
            const std::vector<int64_t> offsets = {0, n / 2, n};
            for (int32_t level : levels) {
                CHECK_OK(nexus_simd_set_level(level));
                for (int32_t k : {1, 5, 65}) {
                    std::vector<int64_t> i1(k), i2(k);
                    std::vector<float> s1(k), s2(k);
                    int32_t m1 = 0, m2 = 0;
                    CHECK_OK(nexus_slb_topk(db.data(), scales.data(), n, dim, q.data(), 0.01f, k, i1.data(), s1.data(), &m1));
                    CHECK_OK(nexus_slb_scan_topk(slb, q.data(), 0.01f, k, i2.data(), s2.data(), &m2));
                    CHECK(m1 == m2 && i1 == i2 && s1 == s2);
                    std::vector<int64_t> i3(k);
                    std::vector<float> s3(k);
                    int32_t m3 = 0;
                    const nexus_scan_topk_args packed{slb, q.data(), 0.01f, k, i3.data(), s3.data(), &m3};
                    CHECK_OK(nexus_slb_scan_topk_packed(&packed));
                    CHECK(m3 == m2 && i3 == i2 && s3 == s2);
                    int64_t r1 = 0, r2 = 0;
                    CHECK_OK(nexus_slb_topk_exact(db.data(), scales.data(), x.data(), norms.data(), n, dim, qf.data(), k,
                                                  i1.data(), s1.data(), &m1, &r1));
                    CHECK_OK(nexus_slb_scan_topk_exact(slb, qf.data(), k, i2.data(), s2.data(), &m2, &r2));
                    CHECK(m1 == m2 && i1 == i2 && s1 == s2 && r1 == r2);
                    std::vector<int64_t> i4(k);
                    std::vector<float> s4(k);
                    int32_t m4 = 0;
                    int64_t r4 = 0;
                    const nexus_scan_topk_exact_args exact_packed{slb, qf.data(), k, i4.data(), s4.data(), &m4, &r4};
                    CHECK_OK(nexus_slb_scan_topk_exact_packed(&exact_packed));
                    CHECK(m4 == m2 && i4 == i2 && s4 == s2 && r4 == r2);
                }
                std::vector<float> t1(2), t2(2);
                CHECK_OK(nexus_slb_tool_scores(db.data(), scales.data(), n, dim, qf.data(), offsets.data(), 2, 3, -1.0f,
                                               t1.data()));
                CHECK_OK(nexus_slb_scan_tool_scores(slb, qf.data(), offsets.data(), 2, 3, -1.0f, t2.data()));
                CHECK(t1 == t2);
            }
            nexus_slb_free(slb);
        }
    }
    // the request scan: texts in pairs through one pass (and a third alone), the lexical sum, fusion and the mean,
    // against the per-text calls; the ranking on its own
    for (int dim : {5, 384}) {
        for (int64_t n : {63, 130}) {
            const int64_t n_tools = 7;
            std::vector<float> x(n * dim);
            for (auto &v : x) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
            std::vector<int8_t> db(n * dim);
            std::vector<float> scales(n);
            CHECK_OK(nexus_quantize_i8(x.data(), n, dim, db.data(), scales.data()));
            std::vector<int64_t> offsets(n_tools + 1);
            for (int64_t t = 0; t <= n_tools; ++t) offsets[t] = n * t / n_tools;
            nexus_slb *slb = nullptr;
            CHECK_OK(nexus_slb_create(db.data(), scales.data(), nullptr, nullptr, n, dim, &slb));
            // BM25 postings as the caller's cache holds them: token 0 in tools 1 and 5, token 1 in tool 5
            const int64_t docs0[2] = {1, 5}, docs1[1] = {5};
            const double terms0[2] = {0.75, 2.0}, terms1[1] = {0.5};
            const int64_t *token_docs[3] = {docs0, docs1, docs1};
            const double *token_terms[3] = {terms0, terms1, terms1};
            const int64_t token_counts[3] = {2, 1, 1};
            const nexus_postings post0{docs0, terms0, 2}, post1{docs1, terms1, 1};
            const nexus_postings *tokens[3] = {&post0, &post1, &post1};
            const auto bm25_of = [&](int32_t t, std::vector<double> &b, const int64_t *offs) {
                std::fill(b.begin(), b.end(), 0.0);
                for (int64_t j = offs[t]; j < offs[t + 1]; ++j)
                    for (int64_t e = 0; e < token_counts[j]; ++e) b[token_docs[j][e]] += token_terms[j][e];
            };
            std::vector<double> b(n_tools);
            std::vector<float> qf(3 * dim);
            for (auto &v : qf) v = static_cast<float>(rng.uniform() * 2.0 - 1.0);
            const int64_t token_offsets[4] = {0, 2, 2, 3};
            for (int32_t level : levels) {
                CHECK_OK(nexus_simd_set_level(level));
                for (int rep = 0; rep < 3; ++rep) {  // before and after the panels are made
                    for (int32_t texts = 1; texts <= 3; ++texts) {
                        std::vector<double> want(n_tools, 0.0), got(n_tools);
                        for (int32_t t = 0; t < texts; ++t) {
                            std::vector<float> d(n_tools);
                            CHECK_OK(nexus_slb_tool_scores(db.data(), scales.data(), n, dim, qf.data() + t * dim,
                                                           offsets.data(), n_tools, 4, -1.0f, d.data()));
                            bm25_of(t, b, token_offsets);
                            const double m = *std::max_element(b.begin(), b.end());
                            for (int64_t i = 0; i < n_tools; ++i) {
                                const double v = static_cast<double>(d[i]) + (m > 0 ? (0.3 * b[i]) / m : 0.0);
                                want[i] = t == 0 ? v : want[i] + v;
                            }
                        }
                        if (texts > 1)
                            for (auto &v : want) v = v / texts;
                        CHECK_OK(nexus_slb_scan_request(slb, qf.data(), texts, offsets.data(), n_tools, 4, -1.0f,
                                                        tokens, token_offsets, 0.3, got.data()));
                        CHECK(got == want);
                        std::vector<double> packed_out(n_tools);
                        const nexus_scan_request_args packed{slb, qf.data(), texts, 4, offsets.data(), n_tools, -1.0f,
                                                             tokens, token_offsets, 0.3, packed_out.data()};
                        CHECK_OK(nexus_slb_scan_request_packed(&packed));
                        CHECK(packed_out == want);
                    }
                }
            }
            CHECK_ERR(nexus_slb_scan_request(slb, qf.data(), 0, offsets.data(), n_tools, 4, -1.0f, nullptr, nullptr,
                                             0.0, b.data()), NEXUS_ERR_INVALID, "n_texts must be >= 1");
            const int64_t bad_docs[1] = {7};
            const nexus_postings bad_post{bad_docs, terms1, 1}, negative{docs1, terms1, -1};
            const nexus_postings *bad_token[1] = {&bad_post}, *negative_token[1] = {&negative}, *none[1] = {nullptr};
            const int64_t one_offsets[2] = {0, 1};
            CHECK_ERR(nexus_slb_scan_request(slb, qf.data(), 1, offsets.data(), n_tools, 4, -1.0f, bad_token,
                                             one_offsets, 0.3, b.data()),
                      NEXUS_ERR_INVALID, "names tool 7 outside 0..6");
            CHECK_ERR(nexus_slb_scan_request(slb, qf.data(), 1, offsets.data(), n_tools, 4, -1.0f, negative_token,
                                             one_offsets, 0.3, b.data()),
                      NEXUS_ERR_INVALID, "count must be >= 0");
            // a NULL record is a token no tool holds: nothing added (as a text without tokens)
            std::vector<double> with_none(n_tools), without(n_tools);
            const int64_t no_tokens[2] = {0, 0};
            CHECK_OK(nexus_slb_scan_request(slb, qf.data(), 1, offsets.data(), n_tools, 4, -1.0f, none, one_offsets,
                                            0.3, with_none.data()));
            CHECK_OK(nexus_slb_scan_request(slb, qf.data(), 1, offsets.data(), n_tools, 4, -1.0f, none, no_tokens,
                                            0.3, without.data()));
            CHECK(with_none == without);
            const int64_t bad_offsets[2] = {1, 1};
            CHECK_ERR(nexus_slb_scan_request(slb, qf.data(), 1, offsets.data(), n_tools, 4, -1.0f, tokens,
                                             bad_offsets, 0.3, b.data()),
                      NEXUS_ERR_INVALID, "token_offsets must start at 0");
            nexus_slb_free(slb);
        }
    }
    {
        const double scores[6] = {0.5, 0.9, 0.9, NAN, 0.7, 0.1};
        const int32_t groups[6] = {-1, 0, 0, -1, -1, -1};
        int64_t order[6];
        int32_t got = 0;
        double margin = 0;
        CHECK_OK(nexus_rank_tools(scores, 6, 6, groups, order, &got, &margin));
        CHECK(got == 6 && order[0] == 1 && order[1] == 2 && order[2] == 4 && order[3] == 0 && order[4] == 5 &&
              order[5] == 3);
        CHECK(std::isinf(margin));  // the NaN outside the top one's group: no finite margin
        const double clean[4] = {0.5, 0.9, 0.9, 0.7};
        CHECK_OK(nexus_rank_tools(clean, 4, 2, groups, order, &got, &margin));
        CHECK(got == 2 && order[0] == 1 && order[1] == 2 && std::fabs(margin - 0.2) < 1e-12);  // its copy skipped
        CHECK_OK(nexus_rank_tools(clean, 4, 2, nullptr, order, &got, &margin));
        CHECK(margin == 0.0);
        CHECK_ERR(nexus_rank_tools(clean, 0, 2, nullptr, order, &got, &margin), NEXUS_ERR_INVALID, "n must be >= 1");
        int64_t packed_order[2];
        int32_t packed_got = 0;
        double packed_margin = 0;
        const nexus_rank_args packed{clean, 4, 2, groups, packed_order, &packed_got, &packed_margin};
        CHECK_OK(nexus_rank_tools_packed(&packed));
        CHECK(packed_got == 2 && packed_order[0] == 1 && packed_order[1] == 2 && std::fabs(packed_margin - 0.2) < 1e-12);
        CHECK_ERR(nexus_rank_tools_packed(nullptr), NEXUS_ERR_INVALID, "args is NULL");
        CHECK_ERR(nexus_slb_scan_topk_packed(nullptr), NEXUS_ERR_INVALID, "args is NULL");
        CHECK_ERR(nexus_slb_scan_topk_exact_packed(nullptr), NEXUS_ERR_INVALID, "args is NULL");
        CHECK_ERR(nexus_slb_scan_request_packed(nullptr), NEXUS_ERR_INVALID, "args is NULL");
    }
    {
        const int8_t db[4] = {1, 2, 3, 4};
        const float f[4] = {1, 2, 3, 4};
        nexus_slb *slb = nullptr;
        CHECK_ERR(nexus_slb_create(db, nullptr, f, nullptr, 1, 4, &slb), NEXUS_ERR_INVALID, "both or neither");
        CHECK(slb == nullptr);
        CHECK_OK(nexus_slb_create(db, nullptr, nullptr, nullptr, 1, 4, &slb));
        int64_t idx[1];
        float sc[1];
        int32_t got = 0;
        CHECK_ERR(nexus_slb_scan_topk_exact(slb, f, 1, idx, sc, &got, nullptr), NEXUS_ERR_INVALID, "float32 rows");
        CHECK_ERR(nexus_slb_scan_topk(nullptr, db, 1.0f, 1, idx, sc, &got), NEXUS_ERR_INVALID, "slb is NULL");
        double ns[3];
        CHECK_OK(nexus_slb_scan_topk_timed(slb, db, 1.0f, 1, 1, 3, ns));
        CHECK(ns[0] >= 0 && ns[2] >= 0);
        double rd[3], dt[3];
        CHECK_OK(nexus_slb_floor_timed(slb, 1, 3, rd, dt));  // one row: its panel is 256 bytes, read to the end
        CHECK(rd[2] >= 0 && dt[2] >= 0);
        CHECK_ERR(nexus_slb_floor_timed(slb, 0, 0, rd, dt), NEXUS_ERR_INVALID, "n_reps must be >= 1");
        CHECK_ERR(nexus_slb_floor_timed(slb, 0, 1, nullptr, dt), NEXUS_ERR_INVALID, "read_ns_out is NULL");
        nexus_slb_free(slb);
        nexus_slb_free(nullptr);
    }

    CHECK_OK(nexus_simd_set_level(saved));
    return finish("test_slb");
}
