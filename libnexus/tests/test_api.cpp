// Status/error model, version, SIMD dispatch and the eq. (2) recompute schedule.
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "check.hpp"

int main() {
    CHECK(std::strcmp(nexus_version(), "0.1.0") == 0);
    const int32_t level = nexus_simd_level();
    const char *forced = std::getenv("NEXUS_FORCE_SCALAR");
    if (forced && forced[0] && std::strcmp(forced, "0") != 0) CHECK(level == NEXUS_SIMD_SCALAR);
    CHECK(std::strcmp(nexus_simd_name(NEXUS_SIMD_SCALAR), "scalar") == 0);
    CHECK(std::strcmp(nexus_simd_name(NEXUS_SIMD_AVX512_VNNI), "avx512_vnni") == 0);
    CHECK(std::strcmp(nexus_simd_name(99), "unknown") == 0);
    CHECK_OK(nexus_simd_set_level(NEXUS_SIMD_SCALAR));
    CHECK(nexus_simd_level() == NEXUS_SIMD_SCALAR);
    CHECK_ERR(nexus_simd_set_level(7), NEXUS_ERR_INVALID, "unknown SIMD level 7");
#if defined(__x86_64__)
    CHECK_ERR(nexus_simd_set_level(NEXUS_SIMD_NEON), NEXUS_ERR_INVALID, "not supported by this CPU");
#endif
    CHECK_OK(nexus_simd_set_level(level));

    struct Row {
        int64_t n_past;
        double k, want;
    } table[] = {{0, 4, 5.0},     {256, 4, 5.0},      {512, 4, 36.666666666666664}, {1024, 4, 100.0},
                 {4096, 4, 100.0}, {512, 16, 11.333333333333334}, {1024, 16, 24.0}, {2048, 16, 49.333333333333336}};
    for (const auto &r : table) {
        double pct = -1;
        CHECK_OK(nexus_eff_pct(r.n_past, 256, 5.0, r.k, &pct));
        CHECK(std::fabs(pct - r.want) < 1e-9);
    }
    double pct = 0;
    CHECK_ERR(nexus_eff_pct(-1, 256, 5.0, 4.0, &pct), NEXUS_ERR_INVALID, "n_past must be >= 0");
    CHECK_ERR(nexus_eff_pct(10, 0, 5.0, 4.0, &pct), NEXUS_ERR_INVALID, "m must be > 0");
    CHECK_ERR(nexus_eff_pct(10, 256, 5.0, 1.0, &pct), NEXUS_ERR_INVALID, "k must be a finite number > 1");
    CHECK_ERR(nexus_eff_pct(10, 256, 101.0, 4.0, &pct), NEXUS_ERR_INVALID, "r_base must be in [0, 100]");
    CHECK_ERR(nexus_eff_pct(10, 256, NAN, 4.0, &pct), NEXUS_ERR_INVALID, "r_base");
    CHECK_ERR(nexus_eff_pct(10, 256, 5.0, 4.0, nullptr), NEXUS_ERR_INVALID, "out_pct is NULL");
    // the message stays until the next failure
    CHECK_OK(nexus_eff_pct(10, 256, 5.0, 4.0, &pct));
    CHECK(std::strstr(nexus_last_error(), "out_pct") != nullptr);
    return finish("test_api");
}
