// Buddy arena: alignment, splitting and merging, exhaustion, foreign and double frees, and a multi-threaded run
// that checks no two live blocks overlap and the statistics balance.
#include <algorithm>
#include <atomic>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#include "check.hpp"

int main() {
    nexus_arena *a = nullptr;
    CHECK_ERR(nexus_arena_create(100, 8, &a), NEXUS_ERR_INVALID, "slab_bytes must be a power of two >= 128");
    CHECK_ERR(nexus_arena_create(64, 8, &a), NEXUS_ERR_INVALID, "slab_bytes");
    CHECK_ERR(nexus_arena_create(128, 6, &a), NEXUS_ERR_INVALID, "n_slabs must be a power of two");
    CHECK_OK(nexus_arena_create(256, 16, &a));
    int64_t used = -1, total = -1, live = -1;
    CHECK_OK(nexus_arena_stats(a, &used, &total, &live));
    CHECK(used == 0 && total == 16 && live == 0);

    void *p1 = nullptr, *p2 = nullptr, *p3 = nullptr, *big = nullptr;
    CHECK_OK(nexus_arena_alloc(a, 1, &p1));            // 1 slab
    CHECK_OK(nexus_arena_alloc(a, 257, &p2));          // 2 slabs
    CHECK_OK(nexus_arena_alloc(a, 3 * 256, &p3));      // 4 slabs
    CHECK(reinterpret_cast<uintptr_t>(p1) % 128 == 0 && reinterpret_cast<uintptr_t>(p2) % 128 == 0);
    std::memset(p3, 0xAB, 3 * 256);
    CHECK_OK(nexus_arena_stats(a, &used, &total, &live));
    CHECK(used == 7 && live == 3);
    CHECK_ERR(nexus_arena_alloc(a, 16 * 256, &big), NEXUS_ERR_NOMEM, "arena exhausted");
    CHECK_ERR(nexus_arena_alloc(a, 17 * 256, &big), NEXUS_ERR_NOMEM, "exceeds the arena size");
    CHECK_ERR(nexus_arena_alloc(a, 0, &big), NEXUS_ERR_INVALID, "n_bytes must be >= 1");
    CHECK_OK(nexus_arena_alloc(a, 8 * 256, &big));  // the upper half is still whole
    void *last = nullptr;
    CHECK_OK(nexus_arena_alloc(a, 1, &last));  // the one slab left
    CHECK_OK(nexus_arena_stats(a, &used, &total, &live));
    CHECK(used == 16 && live == 5);
    int dummy = 0;
    CHECK_ERR(nexus_arena_free(a, &dummy), NEXUS_ERR_INVALID, "not allocated by this arena");
    CHECK_ERR(nexus_arena_free(a, static_cast<char *>(p2) + 8), NEXUS_ERR_INVALID, "not allocated by this arena");
    CHECK_ERR(nexus_arena_free(a, static_cast<char *>(p2) + 256), NEXUS_ERR_INVALID, "double free");
    CHECK_OK(nexus_arena_free(a, p2));
    CHECK_ERR(nexus_arena_free(a, p2), NEXUS_ERR_INVALID, "not a live allocation");
    CHECK_OK(nexus_arena_free(a, p3));
    CHECK_OK(nexus_arena_free(a, big));
    CHECK_OK(nexus_arena_free(a, p1));
    CHECK_OK(nexus_arena_stats(a, &used, &total, &live));
    CHECK(used == 1 && live == 1);
    CHECK_OK(nexus_arena_free(a, last));
    CHECK_OK(nexus_arena_stats(a, &used, &total, &live));
    CHECK(used == 0 && live == 0);
    nexus_arena_destroy(a);

    // after everything is freed the buddies merge back: one allocation of the whole arena fits
    CHECK_OK(nexus_arena_create(128, 8, &a));
    std::vector<void *> ps(8);
    for (auto &p : ps) CHECK_OK(nexus_arena_alloc(a, 100, &p));
    for (size_t i = 0; i < ps.size(); i += 2) CHECK_OK(nexus_arena_free(a, ps[i]));
    for (size_t i = 1; i < ps.size(); i += 2) CHECK_OK(nexus_arena_free(a, ps[i]));
    CHECK_OK(nexus_arena_alloc(a, 8 * 128, &big));
    CHECK_OK(nexus_arena_free(a, big));
    nexus_arena_destroy(a);

    // threads: each allocates random sizes, stamps its blocks, checks its stamps, frees; a shared registry of live
    // ranges catches any overlap between threads
    CHECK_OK(nexus_arena_create(128, 1024, &a));
    std::mutex reg_mu;
    std::vector<std::pair<uintptr_t, uintptr_t>> live_ranges;
    std::atomic<int> overlaps{0}, corrupt{0}, errors{0};
    auto worker = [&](int tid) {
        Rng rng(1000 + tid);
        std::vector<std::pair<void *, int64_t>> mine;
        for (int it = 0; it < 4000; ++it) {
            if (mine.size() < 8 && (rng.next() % 3 != 0 || mine.empty())) {
                const int64_t n = 1 + static_cast<int64_t>(rng.next() % 2048);
                void *p = nullptr;
                const int32_t st = nexus_arena_alloc(a, n, &p);
                if (st == NEXUS_ERR_NOMEM) continue;
                if (st != NEXUS_OK) { ++errors; continue; }
                const auto b = reinterpret_cast<uintptr_t>(p);
                {
                    std::lock_guard<std::mutex> g(reg_mu);
                    for (const auto &r : live_ranges)
                        if (b < r.second && r.first < b + static_cast<uintptr_t>(n)) ++overlaps;
                    live_ranges.emplace_back(b, b + static_cast<uintptr_t>(n));
                }
                std::memset(p, tid + 1, static_cast<size_t>(n));
                mine.emplace_back(p, n);
            } else {
                const size_t k = rng.next() % mine.size();
                auto [p, n] = mine[k];
                const auto *c = static_cast<const unsigned char *>(p);
                for (int64_t i = 0; i < n; ++i)
                    if (c[i] != tid + 1) { ++corrupt; break; }
                {
                    std::lock_guard<std::mutex> g(reg_mu);
                    auto it = std::find(live_ranges.begin(), live_ranges.end(),
                                        std::make_pair(reinterpret_cast<uintptr_t>(p),
                                                       reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(n)));
                    live_ranges.erase(it);
                }
                if (nexus_arena_free(a, p) != NEXUS_OK) ++errors;
                mine.erase(mine.begin() + static_cast<long>(k));
            }
        }
        for (auto [p, n] : mine) {
            {
                std::lock_guard<std::mutex> g(reg_mu);
                auto it = std::find(live_ranges.begin(), live_ranges.end(),
                                    std::make_pair(reinterpret_cast<uintptr_t>(p),
                                                   reinterpret_cast<uintptr_t>(p) + static_cast<uintptr_t>(n)));
                live_ranges.erase(it);
            }
            if (nexus_arena_free(a, p) != NEXUS_OK) ++errors;
        }
    };
    std::vector<std::thread> threads;
    for (int t = 0; t < 6; ++t) threads.emplace_back(worker, t);
    for (auto &th : threads) th.join();
    CHECK(overlaps == 0);
    CHECK(corrupt == 0);
    CHECK(errors == 0);
    CHECK_OK(nexus_arena_stats(a, &used, &total, &live));
    CHECK(used == 0 && live == 0 && total == 1024);
    CHECK_OK(nexus_arena_alloc(a, 1024 * 128, &big));  // fully merged again
    CHECK_OK(nexus_arena_free(a, big));
    nexus_arena_destroy(a);
    nexus_arena_destroy(nullptr);
    return finish("test_arena");
}
