// .atb: write/read round trip, sparse padding, every refusal of the reader with its message, writer failures that
// leave no temp file, and the llama.cpp sequence-state blob built from a block (both V layouts).
#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "check.hpp"
#include "crc32.hpp"

namespace {

std::string g_dir;

struct Block {
    nexus_atb_header h{};
    std::vector<int32_t> tokens;
    std::vector<uint16_t> k, v;
};

Block make_block(uint8_t v_layout, uint32_t align) {
    Block b;
    std::memcpy(b.h.arch, "qwen2", 5);
    for (int i = 0; i < 16; ++i) b.h.fingerprint[i] = static_cast<uint8_t>(i * 17);
    b.h.rope_type = NEXUS_ROPE_NEOX;
    b.h.k_type = b.h.v_type = NEXUS_GGML_TYPE_F16;
    b.h.v_layout = v_layout;
    b.h.n_rot = 4;
    b.h.n_layer = 2;
    b.h.n_head_kv = 2;
    b.h.head_dim = 4;
    b.h.freq_base = 1000000.0f;
    b.h.freq_scale = 1.0f;
    b.h.yarn_attn_factor = 1.0f;
    b.h.yarn_beta_fast = 32.0f;
    b.h.yarn_beta_slow = 1.0f;
    b.h.n_ctx_orig = 32768;
    b.h.anchor_pos = 10;
    b.h.n_tokens = 3;
    b.h.payload_align = align;
    b.tokens = {151644, 8948, -1};
    const size_t n = 2 * 3 * 8;
    for (size_t i = 0; i < n; ++i) {
        b.k.push_back(static_cast<uint16_t>(0x3C00 + i));  // 1.0 + i ulps
        b.v.push_back(static_cast<uint16_t>(0xBC00 + 3 * i));
    }
    return b;
}

std::vector<uint8_t> slurp(const std::string &p) {
    std::vector<uint8_t> out;
    FILE *f = std::fopen(p.c_str(), "rb");
    if (!f) return out;
    uint8_t buf[4096];
    size_t r;
    while ((r = std::fread(buf, 1, sizeof buf, f)) > 0) out.insert(out.end(), buf, buf + r);
    std::fclose(f);
    return out;
}

void spit(const std::string &p, const std::vector<uint8_t> &bytes) {
    FILE *f = std::fopen(p.c_str(), "wb");
    if (!bytes.empty()) std::fwrite(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
}

void fix_header_crc(std::vector<uint8_t> &bytes) {
    std::memset(bytes.data() + 12, 0, 4);
    const uint32_t c = nexus::crc32(bytes.data(), 128);
    std::memcpy(bytes.data() + 12, &c, 4);
}

// Corrupt a copy of the good file with `edit`, optionally re-seal the header CRC, and expect `needle` from open.
void expect_refusal(const std::vector<uint8_t> &good, const std::function<void(std::vector<uint8_t> &)> &edit,
                    bool reseal, int32_t status, const char *needle, int line) {
    std::vector<uint8_t> bytes = good;
    edit(bytes);
    if (reseal) fix_header_crc(bytes);
    const std::string p = g_dir + "/bad.atb";
    spit(p, bytes);
    nexus_atb *a = nullptr;
    const int32_t st = nexus_atb_open(p.c_str(), 1, &a);
    const std::string msg = nexus_last_error();
    if (st != status || msg.find(needle) == std::string::npos) {
        std::fprintf(stderr, "line %d: expected %d \"%s\", got %d \"%s\"\n", line, status, needle, st, msg.c_str());
        ++g_failures;
    }
    CHECK(a == nullptr);
    nexus_atb_close(a);
}

template <class T>
void put_at(std::vector<uint8_t> &b, size_t off, T v) {
    std::memcpy(b.data() + off, &v, sizeof v);
}

size_t count_entries(const std::string &dir) {
    size_t n = 0;
    DIR *d = opendir(dir.c_str());
    while (dirent *e = readdir(d))
        if (std::strcmp(e->d_name, ".") && std::strcmp(e->d_name, "..")) ++n;
    closedir(d);
    return n;
}

}  // namespace

int main() {
    char tmpl[] = "/tmp/nexus-test-atb-XXXXXX";
    g_dir = mkdtemp(tmpl);
    const std::string path = g_dir + "/block.atb";

    // ---- round trip
    Block b = make_block(NEXUS_V_LAYOUT_ROWS, 64);
    nexus_atb_header w{};
    CHECK_OK(nexus_atb_write(path.c_str(), &b.h, b.tokens.data(), b.k.data(), b.v.data(), &w));
    CHECK(std::memcmp(w.magic, NEXUS_ATB_MAGIC, 8) == 0 && w.version == 1 && w.header_size == 128);
    CHECK(w.tokens_offset == 128 && w.k_offset == 192 && w.v_offset == 320);
    const std::vector<uint8_t> good = slurp(path);
    CHECK(good.size() == 320 + 96);
    CHECK(std::memcmp(good.data(), &w, 128) == 0);
    {
        uint32_t c = nexus::crc32(b.tokens.data(), 12);
        c = nexus::crc32(b.k.data(), 96, c);
        c = nexus::crc32(b.v.data(), 96, c);
        CHECK(c == w.payload_crc32);
        CHECK(nexus::crc32("123456789", 9) == 0xCBF43926u);  // the CRC-32 check value
    }
    CHECK(count_entries(g_dir) == 1);  // no temp file left behind

    nexus_atb *a = nullptr;
    CHECK_OK(nexus_atb_open(path.c_str(), 1, &a));
    nexus_atb_header r{};
    CHECK_OK(nexus_atb_get_header(a, &r));
    CHECK(std::memcmp(&r, &w, sizeof r) == 0);
    const int32_t *tok = nullptr;
    const uint16_t *kp = nullptr, *vp = nullptr;
    CHECK_OK(nexus_atb_tokens(a, &tok));
    CHECK_OK(nexus_atb_k(a, &kp));
    CHECK_OK(nexus_atb_v(a, &vp));
    CHECK(std::memcmp(tok, b.tokens.data(), 12) == 0);
    CHECK(std::memcmp(kp, b.k.data(), 96) == 0 && std::memcmp(vp, b.v.data(), 96) == 0);

    // ---- splice blob, V in rows
    for (uint8_t layout : {NEXUS_V_LAYOUT_ROWS, NEXUS_V_LAYOUT_TRANSPOSED}) {
        Block bl = make_block(layout, 64);
        const std::string lp = g_dir + "/layout.atb";
        CHECK_OK(nexus_atb_write(lp.c_str(), &bl.h, bl.tokens.data(), bl.k.data(), bl.v.data(), nullptr));
        nexus_atb *la = nullptr;
        CHECK_OK(nexus_atb_open(lp.c_str(), 1, &la));
        uint64_t size = 0;
        CHECK_OK(nexus_splice_blob_size(la, &size));
        const uint64_t want = 16 + 3 * 12 + 8 + 2 * (12 + 48) + (layout ? 2 * (12 + 48) : 2 * (12 + 48));
        CHECK(size == want);
        std::vector<uint32_t> storage(size / 4 + 1);
        auto *buf = reinterpret_cast<uint8_t *>(storage.data());
        CHECK_ERR(nexus_splice_build_blob(la, 20, 1, buf, size - 1), NEXUS_ERR_INVALID, "the blob needs");
        CHECK_ERR(nexus_splice_build_blob(la, 20, 1, buf + 1, size), NEXUS_ERR_INVALID, "4-byte aligned");
        CHECK_ERR(nexus_splice_build_blob(la, -1, 1, buf, size), NEXUS_ERR_INVALID, "n_past");
        CHECK_ERR(nexus_splice_build_blob(la, 20, -2, buf, size), NEXUS_ERR_INVALID, "seq_id");
        CHECK_OK(nexus_splice_build_blob(la, 20, 1, buf, size));
        const uint8_t *p = buf;
        auto u32 = [&] { uint32_t x; std::memcpy(&x, p, 4); p += 4; return x; };
        auto u64 = [&] { uint64_t x; std::memcpy(&x, p, 8); p += 8; return x; };
        CHECK(u32() == 0xaf143cd8u);
        CHECK(u32() == 1);  // seq_id
        CHECK(u32() == 1);  // n_stream
        CHECK(u32() == 3);  // cell_count
        for (uint32_t i = 0; i < 3; ++i) {
            CHECK(u32() == 20 + i);
            CHECK(u32() == 1);
            CHECK(u32() == 1);
        }
        CHECK(u32() == layout);
        CHECK(u32() == 2);
        for (int l = 0; l < 2; ++l) {
            CHECK(u32() == 1);
            CHECK(u64() == 16);
            std::vector<uint16_t> rot(24);
            CHECK_OK(nexus_rope_rotate_f16(bl.k.data() + l * 24, rot.data(), 3, 2, 4, 4, NEXUS_ROPE_NEOX, 1000000.0f,
                                           1.0f, 10));
            CHECK(std::memcmp(p, rot.data(), 48) == 0);
            CHECK(std::memcmp(p, bl.k.data() + l * 24, 48) != 0);
            p += 48;
        }
        for (int l = 0; l < 2; ++l) {
            CHECK(u32() == 1);
            if (layout == NEXUS_V_LAYOUT_ROWS) {
                CHECK(u64() == 16);
            } else {
                CHECK(u32() == 2);
                CHECK(u32() == 8);
            }
            CHECK(std::memcmp(p, bl.v.data() + l * 24, 48) == 0);
            p += 48;
        }
        CHECK(static_cast<uint64_t>(p - buf) == size);
        // at the anchor the K rows are copied exactly
        CHECK_OK(nexus_splice_build_blob(la, 10, 0, buf, size));
        CHECK(std::memcmp(buf + 16 + 36 + 8 + 12, bl.k.data(), 48) == 0);
        nexus_atb_close(la);
    }
    nexus_atb_close(a);

    // ---- every refusal, in the documented order
    const int L = __LINE__;
    expect_refusal(good, [](auto &x) { x.clear(); }, false, NEXUS_ERR_FORMAT,
                   "truncated: file is 0 bytes, header needs 128", L);
    expect_refusal(good, [](auto &x) { x.resize(100); }, false, NEXUS_ERR_FORMAT,
                   "truncated: file is 100 bytes, header needs 128", L);
    expect_refusal(good, [](auto &x) { x[0] = 'M'; }, false, NEXUS_ERR_FORMAT, "not an .atb file (bad magic)", L);
    expect_refusal(good, [](auto &x) { put_at<uint16_t>(x, 8, 2); }, false, NEXUS_ERR_FORMAT,
                   "unsupported .atb version 2 (this build reads 1)", L);
    expect_refusal(good, [](auto &x) { put_at<uint16_t>(x, 10, 64); }, false, NEXUS_ERR_FORMAT,
                   "bad header size 64 (expected 128)", L);
    expect_refusal(good, [](auto &x) { x[20] ^= 1; }, false, NEXUS_ERR_FORMAT, "header checksum mismatch", L);
    expect_refusal(good, [](auto &x) { x[12] ^= 0x80; }, false, NEXUS_ERR_FORMAT, "header checksum mismatch", L);
    expect_refusal(good, [](auto &x) { x[48] = 1; }, true, NEXUS_ERR_FORMAT, "bad header field rope_type: 1", L);
    expect_refusal(good, [](auto &x) { x[49] = 0; }, true, NEXUS_ERR_FORMAT, "bad header field k_type: 0", L);
    expect_refusal(good, [](auto &x) { x[50] = 8; }, true, NEXUS_ERR_FORMAT, "bad header field v_type: 8", L);
    expect_refusal(good, [](auto &x) { x[51] = 2; }, true, NEXUS_ERR_FORMAT, "bad header field v_layout: 2", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 52, 3); }, true, NEXUS_ERR_FORMAT,
                   "bad header field n_rot: 3", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 52, 6); }, true, NEXUS_ERR_FORMAT,
                   "bad header field n_rot: 6", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 56, 0); }, true, NEXUS_ERR_FORMAT,
                   "bad header field n_layer: 0 (must be 1..1024)", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 60, 2000); }, true, NEXUS_ERR_FORMAT,
                   "bad header field n_head_kv: 2000", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 64, 3); }, true, NEXUS_ERR_FORMAT,
                   "bad header field head_dim: 3", L);
    expect_refusal(good, [](auto &x) { put_at<float>(x, 68, -1.0f); }, true, NEXUS_ERR_FORMAT,
                   "bad header field freq_base: -1", L);
    expect_refusal(good, [](auto &x) { put_at<float>(x, 72, 0.0f); }, true, NEXUS_ERR_FORMAT,
                   "bad header field freq_scale: 0", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 96, 0x80000000u); }, true, NEXUS_ERR_FORMAT,
                   "bad header field anchor_pos: 2147483648", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 100, 0); }, true, NEXUS_ERR_FORMAT,
                   "bad header field n_tokens: 0", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 104, 100); }, true, NEXUS_ERR_FORMAT,
                   "bad header field payload_align: 100", L);
    expect_refusal(good, [](auto &x) { std::memset(x.data() + 32, 'a', 12); }, true, NEXUS_ERR_FORMAT,
                   "bad header field arch: unterminated", L);
    expect_refusal(good, [](auto &x) { x[33] = 7; }, true, NEXUS_ERR_FORMAT, "bad header field arch: byte 1 = 7", L);
    expect_refusal(good, [](auto &x) { put_at<uint32_t>(x, 44, 64); }, true, NEXUS_ERR_FORMAT,
                   "bad tokens_offset 64", L);
    expect_refusal(good, [](auto &x) { put_at<uint64_t>(x, 112, 193); }, true, NEXUS_ERR_FORMAT,
                   "k_offset 193 is not aligned to 64", L);
    expect_refusal(good, [](auto &x) { put_at<uint64_t>(x, 120, 330); }, true, NEXUS_ERR_FORMAT,
                   "v_offset 330 is not aligned to 64", L);
    expect_refusal(good, [](auto &x) { put_at<uint64_t>(x, 112, 128); }, true, NEXUS_ERR_FORMAT,
                   "tokens section ends at 140, after K section start 128", L);
    expect_refusal(good, [](auto &x) { put_at<uint64_t>(x, 120, 256); }, true, NEXUS_ERR_FORMAT,
                   "K section ends at 288, after V section start 256", L);
    expect_refusal(good, [](auto &x) { put_at<uint64_t>(x, 120, 0xFFFFFFFFFFFFFFC0ull); }, true, NEXUS_ERR_FORMAT,
                   "section offsets overflow", L);
    expect_refusal(good, [](auto &x) { x.resize(415); }, false, NEXUS_ERR_FORMAT,
                   "truncated: V section ends at 416 but file is 415 bytes", L);
    expect_refusal(good, [](auto &x) { x[130] ^= 1; }, false, NEXUS_ERR_FORMAT, "payload checksum mismatch", L);
    expect_refusal(good, [](auto &x) { x[200] ^= 4; }, false, NEXUS_ERR_FORMAT, "payload checksum mismatch", L);
    expect_refusal(good, [](auto &x) { x[415] ^= 0x10; }, false, NEXUS_ERR_FORMAT, "payload checksum mismatch", L);
    {  // a payload flip passes when verification is skipped
        std::vector<uint8_t> x = good;
        x[415] ^= 0x10;
        spit(g_dir + "/bad.atb", x);
        CHECK_OK(nexus_atb_open((g_dir + "/bad.atb").c_str(), 0, &a));
        nexus_atb_close(a);
    }
    CHECK_ERR(nexus_atb_open((g_dir + "/missing.atb").c_str(), 1, &a), NEXUS_ERR_IO,
              "No such file or directory");
    CHECK_ERR(nexus_atb_open(g_dir.c_str(), 1, &a), NEXUS_ERR_IO, "not a regular file");

    // ---- writer failures
    const size_t before = count_entries(g_dir);
    Block bad = make_block(NEXUS_V_LAYOUT_ROWS, 64);
    bad.h.n_rot = 5;
    CHECK_ERR(nexus_atb_write(path.c_str(), &bad.h, bad.tokens.data(), bad.k.data(), bad.v.data(), nullptr),
              NEXUS_ERR_INVALID, "bad header field n_rot: 5");
    CHECK_ERR(nexus_atb_write((g_dir + "/nodir/x.atb").c_str(), &b.h, b.tokens.data(), b.k.data(), b.v.data(), nullptr),
              NEXUS_ERR_IO, "No such file or directory");
    const std::string sub = g_dir + "/sub";
    mkdir(sub.c_str(), 0755);
    mkdir((sub + "/x.atb").c_str(), 0755);  // the rename onto a directory fails after the temp file was written
    CHECK_ERR(nexus_atb_write((sub + "/x.atb").c_str(), &b.h, b.tokens.data(), b.k.data(), b.v.data(), nullptr),
              NEXUS_ERR_IO, ("cannot write " + sub + "/x.atb: ").c_str());
    CHECK(count_entries(sub) == 1);  // only the directory itself: the temp file was removed
    CHECK(count_entries(g_dir) == before + 1);
    CHECK_ERR(nexus_atb_write((g_dir + "/").c_str(), &b.h, b.tokens.data(), b.k.data(), b.v.data(), nullptr),
              NEXUS_ERR_INVALID, "names a directory");

    // ---- default alignment: 2 MiB sections, stored sparsely
    {
        Block big = make_block(NEXUS_V_LAYOUT_TRANSPOSED, 0);
        const std::string bp = g_dir + "/sparse.atb";
        CHECK_OK(nexus_atb_write(bp.c_str(), &big.h, big.tokens.data(), big.k.data(), big.v.data(), &w));
        CHECK(w.payload_align == NEXUS_ATB_DEFAULT_ALIGN && w.k_offset == 2097152 && w.v_offset == 4194304);
        struct stat st {};
        stat(bp.c_str(), &st);
        CHECK(static_cast<uint64_t>(st.st_size) == 4194304 + 96);
        CHECK(static_cast<uint64_t>(st.st_blocks) * 512 < 1024 * 1024);  // holes, not 4 MiB of zeros
        CHECK_OK(nexus_atb_open(bp.c_str(), 1, &a));
        nexus_atb_close(a);
        unlink(bp.c_str());
    }

    // clean up
    unlink(path.c_str());
    unlink((g_dir + "/bad.atb").c_str());
    unlink((g_dir + "/layout.atb").c_str());
    rmdir((sub + "/x.atb").c_str());
    rmdir(sub.c_str());
    rmdir(g_dir.c_str());
    return finish("test_atb");
}
