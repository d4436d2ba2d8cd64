// Work split over the CPU's threads, for the kernels whose large inputs one core cannot keep up with (the SLB scan
// past 16 MiB of rows, a dense layer over a batch of texts). A thread costs tens of µs, so callers split only work
// far larger than that.
#pragma once

#include <algorithm>
#include <cstdint>
#include <system_error>
#include <thread>
#include <vector>

namespace nexus {

// The CPU's hardware threads, asked once: hardware_concurrency reads the CPU list from the system, microseconds a
// call.
inline int64_t hardware_threads() {
    static const int64_t hw = std::max<int64_t>(1, static_cast<int64_t>(std::thread::hardware_concurrency()));
    return hw;
}

// part(p) for every part p in [0, parts): parts 1.. on threads of their own, part 0 (and any part no thread could be
// had for) on the caller's. One part runs on the caller's thread alone.
template <typename Part>
void run_on_threads(int64_t parts, const Part &part) {
    std::vector<std::thread> threads;
    int64_t p = 1;
    try {
        for (; p < parts; ++p) threads.emplace_back(part, p);
    } catch (const std::system_error &) {
        // no thread to be had: the caller runs the rest
    }
    for (int64_t rest = p; rest < parts; ++rest) part(rest);
    part(0);
    for (auto &t : threads) t.join();
}

}  // namespace nexus
