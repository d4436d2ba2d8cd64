// libFuzzer target for the .atb reader (nexus_atb_open) and the splice-blob builder that consumes what it accepts.
//
// Every input is tried twice:
//   1. as is: the raw bytes, exactly as a hostile or damaged file would hold them;
//   2. "repaired": when the input is at least a header long, a copy whose header CRC (and, when the offsets fit the
//      file, payload CRC) are recomputed, so that mutations of header fields get past the checksum and reach the
//      field, offset and size checks and the splice builder behind them (random bytes almost never carry a valid CRC).
// Each try opens the file with payload verification on and off. When a block opens, every byte of the header, token,
// K and V views is read (ASan catches a view that runs past the mapping), and the splice blob is sized and built at a
// few positions (n_past = anchor, 0, a large one, an out-of-range one). Any sanitizer report, crash, or an
// inconsistent answer (a view outside the mapping, a blob size that disagrees with the header) aborts.
//
// The bytes go to a memfd and the reader opens /proc/self/fd/N: the real open/fstat/mmap path, no disk I/O.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "crc32.hpp"
#include "nexus.h"

namespace {

int g_fd = -1;
char g_path[64];

void die(const char *what) {
    std::fprintf(stderr, "atb_reader_fuzz: invariant broken: %s (last error: %s)\n", what, nexus_last_error());
    std::abort();
}

void put_file(const uint8_t *data, size_t size) {
    if (::ftruncate(g_fd, 0) != 0) die("ftruncate");
    size_t off = 0;
    while (off < size) {
        const ssize_t w = ::pwrite(g_fd, data + off, size - off, static_cast<off_t>(off));
        if (w <= 0) die("pwrite");
        off += static_cast<size_t>(w);
    }
}

volatile uint32_t g_sink;

void touch(const void *p, uint64_t n) {
    const auto *b = static_cast<const volatile uint8_t *>(p);
    uint32_t acc = 0;
    for (uint64_t i = 0; i < n; ++i) acc += b[i];
    g_sink = g_sink + acc;
}

void exercise(const uint8_t *data, size_t size, int verify) {
    nexus_atb *atb = nullptr;
    const int32_t st = nexus_atb_open(g_path, verify, &atb);
    if (st != NEXUS_OK) {
        if (atb != nullptr) die("failed open left a handle");
        if (st != NEXUS_ERR_FORMAT && st != NEXUS_ERR_IO) die("open failed with an unexpected status");
        if (nexus_last_error()[0] == '\0') die("open failed with no message");
        return;
    }
    if (atb == nullptr) die("open succeeded with no handle");
    nexus_atb_header h{};
    if (nexus_atb_get_header(atb, &h) != NEXUS_OK) die("get_header");
    if (std::memcmp(&h, data, sizeof h) != 0) die("header differs from the file's first 128 bytes");
    const int32_t *tokens = nullptr;
    const uint16_t *k = nullptr, *v = nullptr;
    if (nexus_atb_tokens(atb, &tokens) != NEXUS_OK || nexus_atb_k(atb, &k) != NEXUS_OK ||
        nexus_atb_v(atb, &v) != NEXUS_OK)
        die("views");
    const uint64_t row = static_cast<uint64_t>(h.n_head_kv) * h.head_dim;
    const uint64_t sec = static_cast<uint64_t>(h.n_layer) * h.n_tokens * row * 2;
    // The views must lie inside the file (the mapping is exactly the file: touching them checks it under ASan,
    // and these bounds check it without ASan too).
    const auto *base = reinterpret_cast<const uint8_t *>(tokens) - h.tokens_offset;
    if (reinterpret_cast<const uint8_t *>(k) != base + h.k_offset) die("k view offset");
    if (reinterpret_cast<const uint8_t *>(v) != base + h.v_offset) die("v view offset");
    if (h.tokens_offset + 4ull * h.n_tokens > size || h.k_offset + sec > size || h.v_offset + sec > size)
        die("a section runs past the end of the file");
    touch(tokens, 4ull * h.n_tokens);
    touch(k, sec);
    touch(v, sec);

    uint64_t blob = 0;
    if (nexus_splice_blob_size(atb, &blob) != NEXUS_OK) die("blob size");
    if (blob < 2 * sec || blob > 2 * sec + 64 + 12ull * h.n_tokens + 32ull * h.n_layer) die("blob size out of range");
    std::vector<uint32_t> buf(blob / 4 + 2);  // 4-byte aligned, one spare word to catch overruns
    auto *p = reinterpret_cast<uint8_t *>(buf.data());
    const uint32_t canary = 0xA5A5A5A5u;
    buf.back() = canary;
    const int64_t positions[] = {static_cast<int64_t>(h.anchor_pos), 0, 1000003, INT32_MAX};
    for (int64_t n_past : positions) {
        const int32_t s = nexus_splice_build_blob(atb, n_past, 0, p, blob);
        const bool in_range = n_past + static_cast<int64_t>(h.n_tokens) - 1 <= INT32_MAX;
        if (in_range && s != NEXUS_OK) die("build refused an in-range n_past");
        if (!in_range && s != NEXUS_ERR_INVALID) die("build accepted an out-of-range n_past");
        if (s == NEXUS_OK) touch(p, blob);
    }
    if (buf.back() != canary) die("blob overran its buffer");
    if (nexus_splice_build_blob(atb, 0, 0, p, blob - 1) != NEXUS_ERR_INVALID) die("build accepted a short buffer");
    nexus_atb_close(atb);
}

void try_bytes(const uint8_t *data, size_t size) {
    put_file(data, size);
    exercise(data, size, 1);
    exercise(data, size, 0);
}

// Recompute the header CRC and, when the sections fit in the file, the payload CRC (without trusting any field).
void repair(std::vector<uint8_t> &b) {
    nexus_atb_header h;
    std::memcpy(&h, b.data(), sizeof h);
    const uint64_t size = b.size();
    const uint64_t row = static_cast<uint64_t>(h.n_head_kv) * h.head_dim;
    const uint64_t n = h.n_tokens;
    // each factor < 2^32: the product of layer * tokens fits, and * row * 2 may not, so check step by step
    const uint64_t lt = static_cast<uint64_t>(h.n_layer) * n;
    const bool small = row != 0 && lt <= size && lt * row <= size && h.tokens_offset <= size &&
                       h.k_offset <= size && h.v_offset <= size;
    if (small) {
        const uint64_t sec = lt * row * 2, tok = 4 * n;
        if (h.tokens_offset + tok <= size && h.k_offset + sec <= size && h.v_offset + sec <= size) {
            uint32_t c = nexus::crc32(b.data() + h.tokens_offset, tok);
            c = nexus::crc32(b.data() + h.k_offset, sec, c);
            c = nexus::crc32(b.data() + h.v_offset, sec, c);
            h.payload_crc32 = c;
        }
    }
    h.header_crc32 = 0;
    std::memcpy(b.data(), &h, sizeof h);
    h.header_crc32 = nexus::crc32(b.data(), sizeof h);
    std::memcpy(b.data(), &h, sizeof h);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    g_fd = ::memfd_create("atb_fuzz", MFD_CLOEXEC);
    if (g_fd < 0) die("memfd_create");
    std::snprintf(g_path, sizeof g_path, "/proc/self/fd/%d", g_fd);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    try_bytes(data, size);
    if (size >= sizeof(nexus_atb_header)) {
        std::vector<uint8_t> fixed(data, data + size);
        repair(fixed);
        if (std::memcmp(fixed.data(), data, size) != 0) try_bytes(fixed.data(), fixed.size());
    }
    return 0;
}
