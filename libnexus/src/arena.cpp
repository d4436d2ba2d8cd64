// Block arena: a binary buddy allocator over n_slabs slabs of slab_bytes each, in one 128-byte aligned region.
// Bookkeeping lives beside the memory (never inside the caller's blocks): per order an intrusive doubly linked
// free list threaded through per-slab arrays, plus the order of each live allocation, so free() can tell a
// foreign or already-freed pointer from a live one. All operations take one mutex.
#include <cstddef>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "common.hpp"

namespace {

constexpr size_t kLine = 128;  // two 64-byte lines: also keeps the adjacent-line prefetcher from pairing them

struct alignas(kLine) PaddedMutex {
    std::mutex m;
};
static_assert(alignof(PaddedMutex) == kLine && sizeof(PaddedMutex) % kLine == 0,
              "the arena lock must own its cache lines");

inline bool is_pow2(int64_t x) { return x > 0 && (x & (x - 1)) == 0; }

inline int32_t log2_exact(int64_t x) {
    int32_t r = 0;
    while ((int64_t{1} << r) < x) ++r;
    return r;
}

}  // namespace

struct alignas(kLine) nexus_arena {
    mutable PaddedMutex lock;  // first member, own lines: threads spinning on it do not false-share the state below

    alignas(kLine) uint8_t *base = nullptr;
    int64_t slab_bytes = 0;
    int64_t n_slabs = 0;
    int32_t max_order = 0;
    int64_t used_slabs = 0;
    int64_t n_allocs = 0;
    std::vector<int32_t> head;        // [max_order + 1]: first free block (slab index) of each order, -1 if none
    std::vector<int32_t> next, prev;  // [n_slabs]: free-list links, valid for free block heads
    std::vector<int8_t> free_order;   // [n_slabs]: order of the free block starting here, -1 if none
    std::vector<int8_t> live_order;   // [n_slabs]: order of the live allocation starting here, -1 if none

    ~nexus_arena() { std::free(base); }

    void push(int32_t slab, int32_t order) {
        free_order[slab] = static_cast<int8_t>(order);
        prev[slab] = -1;
        next[slab] = head[order];
        if (head[order] >= 0) prev[head[order]] = slab;
        head[order] = slab;
    }
    void unlink(int32_t slab, int32_t order) {
        if (prev[slab] >= 0) next[prev[slab]] = next[slab];
        else head[order] = next[slab];
        if (next[slab] >= 0) prev[next[slab]] = prev[slab];
        free_order[slab] = -1;
    }
};
static_assert(alignof(nexus_arena) % 128 == 0, "the arena must be 128-byte aligned");
static_assert(offsetof(nexus_arena, lock) == 0 && sizeof(PaddedMutex) == 128,
              "the mutex must sit alone in the first 128 bytes");

using namespace nexus;

extern "C" {

int32_t nexus_arena_create(int64_t slab_bytes, int64_t n_slabs, nexus_arena **out) {
    return guard([&] {
        require_ptr(out, "out");
        if (!is_pow2(slab_bytes) || slab_bytes < 128)
            invalid("slab_bytes must be a power of two >= 128, got " + std::to_string(slab_bytes));
        if (!is_pow2(n_slabs) || n_slabs > (int64_t{1} << 30))
            invalid("n_slabs must be a power of two in 1..2^30, got " + std::to_string(n_slabs));
        if (slab_bytes > (int64_t{1} << 62) / n_slabs) invalid("slab_bytes * n_slabs overflows");
        const int64_t total = slab_bytes * n_slabs;
        auto arena = std::make_unique<nexus_arena>();
        arena->base = static_cast<uint8_t *>(std::aligned_alloc(kLine, static_cast<size_t>(total)));
        if (!arena->base) fail(NEXUS_ERR_NOMEM, "cannot allocate an arena of " + std::to_string(total) + " bytes");
        arena->slab_bytes = slab_bytes;
        arena->n_slabs = n_slabs;
        arena->max_order = log2_exact(n_slabs);
        arena->head.assign(arena->max_order + 1, -1);
        arena->next.assign(n_slabs, -1);
        arena->prev.assign(n_slabs, -1);
        arena->free_order.assign(n_slabs, -1);
        arena->live_order.assign(n_slabs, -1);
        arena->push(0, arena->max_order);
        *out = arena.release();
    });
}

void nexus_arena_destroy(nexus_arena *arena) { delete arena; }

int32_t nexus_arena_alloc(nexus_arena *arena, int64_t n_bytes, void **out) {
    return guard([&] {
        require_ptr(arena, "arena");
        require_ptr(out, "out");
        if (n_bytes < 1) invalid("n_bytes must be >= 1, got " + std::to_string(n_bytes));
        const int64_t total = arena->slab_bytes * arena->n_slabs;
        if (n_bytes > total)
            fail(NEXUS_ERR_NOMEM, "request of " + std::to_string(n_bytes) + " bytes exceeds the arena size (" +
                                      std::to_string(total) + " bytes)");
        const int64_t slabs = (n_bytes + arena->slab_bytes - 1) / arena->slab_bytes;
        const int32_t order = log2_exact(slabs);
        std::lock_guard<std::mutex> g(arena->lock.m);
        int32_t o = order;
        while (o <= arena->max_order && arena->head[o] < 0) ++o;
        if (o > arena->max_order)
            fail(NEXUS_ERR_NOMEM, "arena exhausted: no free block of " + std::to_string(int64_t{1} << order) +
                                      " slabs (" + std::to_string(arena->used_slabs) + " of " +
                                      std::to_string(arena->n_slabs) + " slabs in use)");
        const int32_t slab = arena->head[o];
        arena->unlink(slab, o);
        while (o > order) {  // split, keeping the lower half and freeing the upper buddy
            --o;
            arena->push(slab + (1 << o), o);
        }
        arena->live_order[slab] = static_cast<int8_t>(order);
        arena->used_slabs += int64_t{1} << order;
        arena->n_allocs += 1;
        *out = arena->base + static_cast<int64_t>(slab) * arena->slab_bytes;
    });
}

int32_t nexus_arena_free(nexus_arena *arena, void *ptr) {
    return guard([&] {
        require_ptr(arena, "arena");
        require_ptr(ptr, "ptr");
        const auto p = reinterpret_cast<uintptr_t>(ptr), b = reinterpret_cast<uintptr_t>(arena->base);
        const uint64_t total = static_cast<uint64_t>(arena->slab_bytes * arena->n_slabs);
        if (p < b || p - b >= total || (p - b) % static_cast<uint64_t>(arena->slab_bytes) != 0)
            invalid("pointer was not allocated by this arena");
        auto slab = static_cast<int32_t>((p - b) / static_cast<uint64_t>(arena->slab_bytes));
        std::lock_guard<std::mutex> g(arena->lock.m);
        int32_t order = arena->live_order[slab];
        if (order < 0) invalid("pointer is not a live allocation of this arena (double free?)");
        arena->live_order[slab] = -1;
        arena->used_slabs -= int64_t{1} << order;
        arena->n_allocs -= 1;
        while (order < arena->max_order) {  // merge with the buddy while it is wholly free
            const int32_t buddy = slab ^ (1 << order);
            if (arena->free_order[buddy] != order) break;
            arena->unlink(buddy, order);
            slab = slab < buddy ? slab : buddy;
            ++order;
        }
        arena->push(slab, order);
    });
}

int32_t nexus_arena_stats(const nexus_arena *arena, int64_t *used_slabs, int64_t *total_slabs, int64_t *n_allocs) {
    return guard([&] {
        require_ptr(arena, "arena");
        std::lock_guard<std::mutex> g(arena->lock.m);
        if (used_slabs) *used_slabs = arena->used_slabs;
        if (total_slabs) *total_slabs = arena->n_slabs;
        if (n_allocs) *n_allocs = arena->n_allocs;
    });
}

}  // extern "C"
