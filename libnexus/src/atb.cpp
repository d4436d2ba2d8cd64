// .atb tool blocks: atomic writer and validating mmap reader. The format is specified in docs/atb-format.md;
// nexus_cli/atb.py holds an independent pure-Python reader that must agree with this one (same checks, same order,
// same messages).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "atb_internal.hpp"
#include "common.hpp"
#include "crc32.hpp"

static_assert(sizeof(nexus_atb_header) == 128, "the .atb header is exactly 128 bytes");
static_assert(offsetof(nexus_atb_header, version) == 8 && offsetof(nexus_atb_header, header_crc32) == 12 &&
                  offsetof(nexus_atb_header, fingerprint) == 16 && offsetof(nexus_atb_header, arch) == 32 &&
                  offsetof(nexus_atb_header, tokens_offset) == 44 && offsetof(nexus_atb_header, rope_type) == 48 &&
                  offsetof(nexus_atb_header, v_layout) == 51 && offsetof(nexus_atb_header, n_rot) == 52 &&
                  offsetof(nexus_atb_header, head_dim) == 64 && offsetof(nexus_atb_header, freq_base) == 68 &&
                  offsetof(nexus_atb_header, yarn_beta_slow) == 88 && offsetof(nexus_atb_header, n_ctx_orig) == 92 &&
                  offsetof(nexus_atb_header, anchor_pos) == 96 && offsetof(nexus_atb_header, n_tokens) == 100 &&
                  offsetof(nexus_atb_header, payload_align) == 104 &&
                  offsetof(nexus_atb_header, payload_crc32) == 108 && offsetof(nexus_atb_header, k_offset) == 112 &&
                  offsetof(nexus_atb_header, v_offset) == 120,
              "header field offsets must match docs/atb-format.md");
static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the .atb format is little-endian; this build maps it raw");

nexus_atb::~nexus_atb() {
    if (map) munmap(const_cast<uint8_t *>(map), static_cast<size_t>(map_size));
}

namespace nexus {

namespace {

constexpr uint64_t kMaxAlign = uint64_t{1} << 30;

std::string fmt_g(double v) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%g", v);
    return buf;
}

[[noreturn]] void bad_field(int32_t status, const char *name, const std::string &value, const char *rule) {
    fail(status, std::string("bad header field ") + name + ": " + value + " (" + rule + ")");
}

std::string errno_text(int err) { return std::strerror(err); }

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

// Sizes derived from validated fields (cannot overflow: every factor is bounded by the field checks).
void derive_sizes(const nexus_atb_header &h, uint64_t *row, uint64_t *section_bytes, uint64_t *token_bytes) {
    *row = static_cast<uint64_t>(h.n_head_kv) * h.head_dim;
    *section_bytes = static_cast<uint64_t>(h.n_layer) * h.n_tokens * *row * 2;
    *token_bytes = static_cast<uint64_t>(h.n_tokens) * 4;
}

uint32_t header_crc(const nexus_atb_header &h) {
    nexus_atb_header c = h;
    c.header_crc32 = 0;
    return crc32(&c, sizeof c);
}

void pwrite_all(int fd, const void *data, uint64_t n, uint64_t off) {
    const auto *p = static_cast<const uint8_t *>(data);
    while (n > 0) {
        const size_t chunk = static_cast<size_t>(n < (uint64_t{1} << 30) ? n : (uint64_t{1} << 30));
        const ssize_t w = ::pwrite(fd, p, chunk, static_cast<off_t>(off));
        if (w < 0) {
            if (errno == EINTR) continue;
            throw errno;
        }
        if (w == 0) throw EIO;
        p += w;
        off += static_cast<uint64_t>(w);
        n -= static_cast<uint64_t>(w);
    }
}

}  // namespace

void atb_validate_fields(const nexus_atb_header &h, int32_t status) {
    if (h.rope_type != NEXUS_ROPE_NORM && h.rope_type != NEXUS_ROPE_NEOX)
        bad_field(status, "rope_type", std::to_string(h.rope_type), "must be 0 (NORM) or 2 (NEOX)");
    if (h.k_type != NEXUS_GGML_TYPE_F16) bad_field(status, "k_type", std::to_string(h.k_type), "must be 1 (F16)");
    if (h.v_type != NEXUS_GGML_TYPE_F16) bad_field(status, "v_type", std::to_string(h.v_type), "must be 1 (F16)");
    if (h.v_layout > NEXUS_V_LAYOUT_TRANSPOSED)
        bad_field(status, "v_layout", std::to_string(h.v_layout), "must be 0 (rows) or 1 (transposed)");
    if (h.n_layer < 1 || h.n_layer > 1024) bad_field(status, "n_layer", std::to_string(h.n_layer), "must be 1..1024");
    if (h.n_head_kv < 1 || h.n_head_kv > 1024)
        bad_field(status, "n_head_kv", std::to_string(h.n_head_kv), "must be 1..1024");
    if (h.head_dim < 1 || h.head_dim > 1024 || h.head_dim % 2 != 0)
        bad_field(status, "head_dim", std::to_string(h.head_dim), "must be even and 1..1024");
    if (h.n_rot % 2 != 0 || h.n_rot > h.head_dim)
        bad_field(status, "n_rot", std::to_string(h.n_rot), "must be even and <= head_dim");
    if (h.n_tokens < 1 || h.n_tokens > 1000000)
        bad_field(status, "n_tokens", std::to_string(h.n_tokens), "must be 1..1000000");
    if (h.payload_align < 64 || h.payload_align > kMaxAlign || (h.payload_align & (h.payload_align - 1)) != 0)
        bad_field(status, "payload_align", std::to_string(h.payload_align), "must be a power of two in 64..2^30");
    if (!std::isfinite(h.freq_base) || !(h.freq_base > 0.0f))
        bad_field(status, "freq_base", fmt_g(h.freq_base), "must be finite and > 0");
    if (!std::isfinite(h.freq_scale) || !(h.freq_scale > 0.0f))
        bad_field(status, "freq_scale", fmt_g(h.freq_scale), "must be finite and > 0");
    if (!std::isfinite(h.yarn_ext_factor) || !std::isfinite(h.yarn_attn_factor) || !std::isfinite(h.yarn_beta_fast) ||
        !std::isfinite(h.yarn_beta_slow))
        bad_field(status, "yarn_*", "non-finite", "must be finite");
    if (h.anchor_pos > 0x7FFFFFFFu)
        bad_field(status, "anchor_pos", std::to_string(h.anchor_pos), "must be < 2^31");
    size_t len = 0;
    while (len < sizeof h.arch && h.arch[len] != '\0') ++len;
    if (len == 0 || len == sizeof h.arch)
        bad_field(status, "arch", len == 0 ? "\"\"" : "unterminated", "must be 1..11 printable ASCII bytes, NUL-padded");
    for (size_t i = 0; i < sizeof h.arch; ++i) {
        const auto c = static_cast<unsigned char>(h.arch[i]);
        if (i < len ? (c < 0x20 || c > 0x7E) : c != 0)
            bad_field(status, "arch", "byte " + std::to_string(i) + " = " + std::to_string(c),
                      "must be 1..11 printable ASCII bytes, NUL-padded");
    }
}

}  // namespace nexus

using namespace nexus;

extern "C" {

int32_t nexus_atb_write(const char *path, const nexus_atb_header *header, const int32_t *tokens, const uint16_t *k,
                        const uint16_t *v, nexus_atb_header *written) {
    return guard([&] {
        require_ptr(path, "path");
        require_ptr(header, "header");
        require_ptr(tokens, "tokens");
        require_ptr(k, "k");
        require_ptr(v, "v");
        nexus_atb_header h = *header;
        std::memcpy(h.magic, NEXUS_ATB_MAGIC, 8);
        h.version = NEXUS_ATB_VERSION;
        h.header_size = NEXUS_ATB_HEADER_SIZE;
        if (h.payload_align == 0) h.payload_align = NEXUS_ATB_DEFAULT_ALIGN;
        atb_validate_fields(h, NEXUS_ERR_INVALID);
        uint64_t row, sec, tok_bytes;
        derive_sizes(h, &row, &sec, &tok_bytes);
        h.tokens_offset = NEXUS_ATB_HEADER_SIZE;
        h.k_offset = align_up(h.tokens_offset + tok_bytes, h.payload_align);
        h.v_offset = align_up(h.k_offset + sec, h.payload_align);
        const uint64_t file_end = h.v_offset + sec;
        uint32_t c = crc32(tokens, tok_bytes);
        c = crc32(k, sec, c);
        c = crc32(v, sec, c);
        h.payload_crc32 = c;
        h.header_crc32 = 0;
        h.header_crc32 = header_crc(h);

        const std::string final_path(path);
        const size_t slash = final_path.rfind('/');
        const std::string dir = slash == std::string::npos ? "." : (slash == 0 ? "/" : final_path.substr(0, slash));
        const std::string base = slash == std::string::npos ? final_path : final_path.substr(slash + 1);
        if (base.empty()) invalid("path names a directory, not a file: " + final_path);
        const auto nonce = static_cast<unsigned long long>(
            std::chrono::steady_clock::now().time_since_epoch().count() ^ reinterpret_cast<uintptr_t>(&h));
        char suffix[64];
        std::snprintf(suffix, sizeof suffix, ".tmp.%ld.%llx", static_cast<long>(getpid()), nonce & 0xFFFFFFFFFFull);
        const std::string tmp = dir + "/." + base + suffix;

        const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0) fail(NEXUS_ERR_IO, "cannot write " + final_path + ": " + errno_text(errno));
        int fd_open = fd;
        try {
            // padding between sections is never written, so it stays a hole in the file
            pwrite_all(fd, &h, sizeof h, 0);
            pwrite_all(fd, tokens, tok_bytes, h.tokens_offset);
            pwrite_all(fd, k, sec, h.k_offset);
            pwrite_all(fd, v, sec, h.v_offset);
            if (::ftruncate(fd, static_cast<off_t>(file_end)) != 0) throw errno;
            if (::fsync(fd) != 0) throw errno;
            fd_open = -1;
            if (::close(fd) != 0) throw errno;
            if (::rename(tmp.c_str(), final_path.c_str()) != 0) throw errno;
        } catch (int err) {
            if (fd_open >= 0) ::close(fd_open);
            ::unlink(tmp.c_str());
            fail(NEXUS_ERR_IO, "cannot write " + final_path + ": " + errno_text(err));
        } catch (...) {
            if (fd_open >= 0) ::close(fd_open);
            ::unlink(tmp.c_str());
            throw;
        }
        // make the rename itself durable; the file is already complete, so a failure here is not reported
        const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            ::fsync(dfd);
            ::close(dfd);
        }
        if (written) *written = h;
    });
}

int32_t nexus_atb_open(const char *path, int32_t verify_payload, nexus_atb **out) {
    return guard([&] {
        require_ptr(path, "path");
        require_ptr(out, "out");
        *out = nullptr;
        const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0) fail(NEXUS_ERR_IO, std::string("cannot open ") + path + ": " + errno_text(errno));
        struct stat st {};
        if (::fstat(fd, &st) != 0) {
            const int err = errno;
            ::close(fd);
            fail(NEXUS_ERR_IO, std::string("cannot stat ") + path + ": " + errno_text(err));
        }
        if (!S_ISREG(st.st_mode)) {
            ::close(fd);
            fail(NEXUS_ERR_IO, std::string("cannot open ") + path + ": not a regular file");
        }
        const auto size = static_cast<uint64_t>(st.st_size);
        if (size < NEXUS_ATB_HEADER_SIZE) {
            ::close(fd);
            fail(NEXUS_ERR_FORMAT, "truncated: file is " + std::to_string(size) + " bytes, header needs 128");
        }
        void *m = ::mmap(nullptr, static_cast<size_t>(size), PROT_READ, MAP_PRIVATE, fd, 0);
        const int map_err = errno;
        ::close(fd);  // the mapping keeps the file alive
        if (m == MAP_FAILED) fail(NEXUS_ERR_IO, std::string("cannot map ") + path + ": " + errno_text(map_err));
        auto atb = std::make_unique<nexus_atb>();
        atb->map = static_cast<const uint8_t *>(m);
        atb->map_size = size;

        nexus_atb_header &h = atb->header;
        std::memcpy(&h, atb->map, sizeof h);
        if (std::memcmp(h.magic, NEXUS_ATB_MAGIC, 8) != 0) fail(NEXUS_ERR_FORMAT, "not an .atb file (bad magic)");
        if (h.version != NEXUS_ATB_VERSION)
            fail(NEXUS_ERR_FORMAT,
                 "unsupported .atb version " + std::to_string(h.version) + " (this build reads 1)");
        if (h.header_size != NEXUS_ATB_HEADER_SIZE)
            fail(NEXUS_ERR_FORMAT, "bad header size " + std::to_string(h.header_size) + " (expected 128)");
        if (header_crc(h) != h.header_crc32) fail(NEXUS_ERR_FORMAT, "header checksum mismatch");
        atb_validate_fields(h, NEXUS_ERR_FORMAT);

        uint64_t row, sec, tok_bytes;
        derive_sizes(h, &row, &sec, &tok_bytes);
        const uint64_t align = h.payload_align;
        if (h.tokens_offset < NEXUS_ATB_HEADER_SIZE || h.tokens_offset % 4 != 0)
            fail(NEXUS_ERR_FORMAT, "bad tokens_offset " + std::to_string(h.tokens_offset) +
                                       " (must be >= 128 and a multiple of 4)");
        if (h.k_offset % align != 0)
            fail(NEXUS_ERR_FORMAT, "k_offset " + std::to_string(h.k_offset) + " is not aligned to " +
                                       std::to_string(align));
        if (h.v_offset % align != 0)
            fail(NEXUS_ERR_FORMAT, "v_offset " + std::to_string(h.v_offset) + " is not aligned to " +
                                       std::to_string(align));
        const uint64_t tokens_end = h.tokens_offset + tok_bytes;
        if (tokens_end > h.k_offset)
            fail(NEXUS_ERR_FORMAT, "tokens section ends at " + std::to_string(tokens_end) +
                                       ", after K section start " + std::to_string(h.k_offset));
        if (h.k_offset > UINT64_MAX - sec || h.v_offset > UINT64_MAX - sec)
            fail(NEXUS_ERR_FORMAT, "section offsets overflow");
        const uint64_t k_end = h.k_offset + sec;
        if (k_end > h.v_offset)
            fail(NEXUS_ERR_FORMAT, "K section ends at " + std::to_string(k_end) + ", after V section start " +
                                       std::to_string(h.v_offset));
        const uint64_t v_end = h.v_offset + sec;
        if (v_end > size)
            fail(NEXUS_ERR_FORMAT, "truncated: V section ends at " + std::to_string(v_end) + " but file is " +
                                       std::to_string(size) + " bytes");
        if (verify_payload) {
            uint32_t c = crc32(atb->map + h.tokens_offset, tok_bytes);
            c = crc32(atb->map + h.k_offset, sec, c);
            c = crc32(atb->map + h.v_offset, sec, c);
            if (c != h.payload_crc32) fail(NEXUS_ERR_FORMAT, "payload checksum mismatch");
        }
        atb->row = row;
        atb->section_bytes = sec;
        *out = atb.release();
    });
}

void nexus_atb_close(nexus_atb *atb) { delete atb; }

int32_t nexus_atb_get_header(const nexus_atb *atb, nexus_atb_header *out) {
    return guard([&] {
        require_ptr(atb, "atb");
        require_ptr(out, "out");
        *out = atb->header;
    });
}

int32_t nexus_atb_tokens(const nexus_atb *atb, const int32_t **out) {
    return guard([&] {
        require_ptr(atb, "atb");
        require_ptr(out, "out");
        *out = reinterpret_cast<const int32_t *>(atb->map + atb->header.tokens_offset);
    });
}

int32_t nexus_atb_k(const nexus_atb *atb, const uint16_t **out) {
    return guard([&] {
        require_ptr(atb, "atb");
        require_ptr(out, "out");
        *out = reinterpret_cast<const uint16_t *>(atb->map + atb->header.k_offset);
    });
}

int32_t nexus_atb_v(const nexus_atb *atb, const uint16_t **out) {
    return guard([&] {
        require_ptr(atb, "atb");
        require_ptr(out, "out");
        *out = reinterpret_cast<const uint16_t *>(atb->map + atb->header.v_offset);
    });
}

}  // extern "C"
