// CRC-32 as in zlib (reflected polynomial 0xEDB88320, init and final xor 0xFFFFFFFF), chainable like
// zlib.crc32(data, prev): crc32(b, crc32(a)) == crc32(a + b).
#pragma once

#include <cstddef>
#include <cstdint>

namespace nexus {
uint32_t crc32(const void *data, size_t n, uint32_t prev = 0) noexcept;
}
