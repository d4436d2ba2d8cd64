// Slice-by-8 CRC-32: eight table lookups per 8 input bytes (about 1-2 GB/s per core, enough to verify a block
// while it is paged in).
#include "crc32.hpp"

#include <cstring>

namespace nexus {

namespace {
struct Tables {
    uint32_t t[8][256];
    Tables() noexcept {
        for (uint32_t i = 0; i < 256; ++i) {
            uint32_t c = i;
            for (int k = 0; k < 8; ++k) c = (c & 1u) ? (c >> 1) ^ 0xEDB88320u : c >> 1;
            t[0][i] = c;
        }
        for (uint32_t i = 0; i < 256; ++i)
            for (int s = 1; s < 8; ++s) t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFFu];
    }
};
const Tables &tables() noexcept {
    static const Tables tb;
    return tb;
}
}  // namespace

uint32_t crc32(const void *data, size_t n, uint32_t prev) noexcept {
    const auto &t = tables().t;
    const auto *p = static_cast<const uint8_t *>(data);
    uint32_t c = ~prev;
    while (n >= 8) {
        uint32_t lo, hi;
        std::memcpy(&lo, p, 4);  // little-endian host (asserted in atb.cpp)
        std::memcpy(&hi, p + 4, 4);
        lo ^= c;
        c = t[7][lo & 0xFF] ^ t[6][(lo >> 8) & 0xFF] ^ t[5][(lo >> 16) & 0xFF] ^ t[4][lo >> 24] ^
            t[3][hi & 0xFF] ^ t[2][(hi >> 8) & 0xFF] ^ t[1][(hi >> 16) & 0xFF] ^ t[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ t[0][(c ^ *p++) & 0xFFu];
    return ~c;
}

}  // namespace nexus
