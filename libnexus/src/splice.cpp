// The llama.cpp sequence-state blob that carries one .atb block into a live context.
//
// Layout checked against the llama.cpp vendored by llama-cpp-python 0.3.36 (commit 0c1e5709):
//  - llama_context::state_seq_get_data (src/llama-context.cpp) writes u32 io_magic = 0xaf143cd8 and the i32 seq_id
//    itself, then state_seq_write_data -> memory->state_write(io, seq_id, flags).
//    state_seq_set_data reads and checks that magic and skips the seq_id (the destination comes from the argument).
//  - llama_kv_cache::state_write (src/llama-kv-cache.cpp) writes u32 n_stream, then per stream u32 cell_count and,
//    when cell_count > 0, state_write_meta (per cell: i32 pos, u32 n_seq_id, [llama_kv_cell_ext only when
//    has_cell_ext(): M-RoPE or PLE models], n_seq_id x i32 seq_id) and state_write_data (u32 v_trans, u32 n_layer;
//    per layer i32 k_type, u64 k_row_bytes, rows; then V either per layer i32 type, u64 row bytes, rows, or, when
//    transposed, per layer i32 type, u32 element bytes, u32 n_embd_v_gqa, then per dim the cell_count elements).
//  - On read with a destination sequence, state_read_meta requires n_seq_id == 1 and ignores the stored seq_id.
//    n_stream must equal the context's stream count: 1 with kv_unified = true (which the splice recipe requires).
//  - Not covered: models with an iSWA cache (llama_kv_cache_iswa writes the base cache's state and then the SWA
//    cache's), hybrid/recurrent memories, and cell-ext models; for those the blob below would be rejected by
//    llama_state_seq_set_data, so callers must refuse them (an .atb block has no place for their extra state).
#include <cstring>
#include <string>

#include "atb_internal.hpp"
#include "common.hpp"
#include "kernels.hpp"

namespace nexus {
namespace {

constexpr uint32_t kSeqStateMagic = 0xaf143cd8u;

uint64_t blob_size(const nexus_atb &a) {
    const nexus_atb_header &h = a.header;
    const uint64_t n = h.n_tokens, L = h.n_layer, row_bytes = a.row * 2;
    uint64_t s = 4 + 4 + 4;         // magic, seq_id, n_stream
    s += 4 + n * (4 + 4 + 4);       // cell_count; per cell pos, n_seq_id, seq_id
    s += 4 + 4;                     // v_trans, n_layer
    s += L * (4 + 8 + n * row_bytes);  // K
    if (h.v_layout == NEXUS_V_LAYOUT_ROWS) s += L * (4 + 8 + n * row_bytes);
    else s += L * (4 + 4 + 4 + a.row * n * 2);
    return s;
}

}  // namespace
}  // namespace nexus

using namespace nexus;

extern "C" {

int32_t nexus_splice_blob_size(const nexus_atb *atb, uint64_t *size_out) {
    return guard([&] {
        require_ptr(atb, "atb");
        require_ptr(size_out, "size_out");
        *size_out = blob_size(*atb);
    });
}

int32_t nexus_splice_build_blob(const nexus_atb *atb, int64_t n_past, int32_t seq_id, uint8_t *buf,
                                uint64_t buf_size) {
    return guard([&] {
        require_ptr(atb, "atb");
        require_ptr(buf, "buf");
        const nexus_atb_header &h = atb->header;
        const uint64_t need = blob_size(*atb);
        if (buf_size < need)
            invalid("buf holds " + std::to_string(buf_size) + " bytes, the blob needs " + std::to_string(need));
        // every F16 run in the blob starts at a multiple of 4 bytes from its start, so a 4-aligned buf keeps the
        // K rows aligned for the rotation kernel
        if (reinterpret_cast<uintptr_t>(buf) % 4 != 0) invalid("buf must be 4-byte aligned");
        if (seq_id < 0) invalid("seq_id must be >= 0, got " + std::to_string(seq_id));
        if (n_past < 0 || n_past + static_cast<int64_t>(h.n_tokens) - 1 > INT32_MAX)
            invalid("n_past must be >= 0 with n_past + n_tokens - 1 <= 2^31 - 1, got " + std::to_string(n_past));

        const uint32_t n = h.n_tokens, L = h.n_layer;
        const uint64_t row_bytes = atb->row * 2;
        const uint64_t layer_bytes = static_cast<uint64_t>(n) * row_bytes;
        const RopeParams rp{static_cast<int32_t>(h.n_head_kv),
                            static_cast<int32_t>(h.head_dim),
                            static_cast<int32_t>(h.n_rot),
                            h.rope_type,
                            h.freq_base,
                            h.freq_scale,
                            n_past - static_cast<int64_t>(h.anchor_pos)};
        rope_validate(rp);
        const auto *k = atb->map + h.k_offset;
        const auto *v = atb->map + h.v_offset;

        uint8_t *p = buf;
        p = put<uint32_t>(p, kSeqStateMagic);
        p = put<int32_t>(p, seq_id);
        p = put<uint32_t>(p, 1);  // n_stream
        p = put<uint32_t>(p, n);  // cell_count
        for (uint32_t i = 0; i < n; ++i) {
            p = put<int32_t>(p, static_cast<int32_t>(n_past + i));
            p = put<uint32_t>(p, 1);  // n_seq_id
            p = put<int32_t>(p, seq_id);
        }
        p = put<uint32_t>(p, h.v_layout == NEXUS_V_LAYOUT_TRANSPOSED ? 1u : 0u);  // v_trans
        p = put<uint32_t>(p, L);
        for (uint32_t l = 0; l < L; ++l) {
            p = put<int32_t>(p, h.k_type);
            p = put<uint64_t>(p, row_bytes);
            // rotate straight from the mapping into the blob: no intermediate copy
            rope_rotate(reinterpret_cast<const uint16_t *>(k + l * layer_bytes), reinterpret_cast<uint16_t *>(p), n,
                        rp);
            p += layer_bytes;
        }
        for (uint32_t l = 0; l < L; ++l) {
            p = put<int32_t>(p, h.v_type);
            if (h.v_layout == NEXUS_V_LAYOUT_ROWS) {
                p = put<uint64_t>(p, row_bytes);
            } else {
                p = put<uint32_t>(p, 2);  // element bytes of F16
                p = put<uint32_t>(p, static_cast<uint32_t>(atb->row));
            }
            // the transposed layout is [dim][n_tokens] per layer: exactly the blob's per-dim order
            std::memcpy(p, v + l * layer_bytes, layer_bytes);
            p += layer_bytes;
        }
        if (static_cast<uint64_t>(p - buf) != need) fail(NEXUS_ERR_INTERNAL, "splice blob size mismatch");
    });
}

}  // extern "C"
