// The in-memory form of an opened .atb block, shared by atb.cpp (reader) and splice.cpp.
#pragma once

#include <cstdint>
#include <string>

#include "nexus.h"

struct nexus_atb {
    nexus_atb_header header{};
    const uint8_t *map = nullptr;  // the whole file, PROT_READ / MAP_PRIVATE
    uint64_t map_size = 0;
    uint64_t row = 0;           // n_head_kv * head_dim (F16 values per token per layer)
    uint64_t section_bytes = 0;  // bytes of K (and of V): n_layer * n_tokens * row * 2
    ~nexus_atb();
};

namespace nexus {
// Range checks of the caller-filled header fields; "bad header field <name>: <value> (<rule>)" on failure.
// Throws Error(status, ...).
void atb_validate_fields(const nexus_atb_header &h, int32_t status);
}  // namespace nexus
