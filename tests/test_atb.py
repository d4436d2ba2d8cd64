"""The .atb format: native writer/reader vs the pure-Python reader/writer, golden files, every refusal with its
message, atomic writes, and the llama.cpp sequence-state blob built from a block."""

from __future__ import annotations

import json
import os
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest

from nexus_cli import atb, kernels, reference
from nexus_cli.errors import FormatError, NativeError

GOLDEN = Path(__file__).resolve().parent / "golden"
sys_path_golden = str(GOLDEN)


def _golden_inputs(layout):
    import importlib.util

    spec = importlib.util.spec_from_file_location("make_golden", GOLDEN / "make_golden.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.golden_inputs(layout)


def random_block(rng, layout, n_layer=3, n_tokens=5, n_head_kv=2, head_dim=8, n_rot=8, rope_type=atb.ROPE_NEOX):
    row = n_head_kv * head_dim
    h = atb.BlockHeader(fingerprint=rng.bytes(16), arch="llama", rope_type=rope_type, v_layout=layout, n_rot=n_rot,
                        n_layer=n_layer, n_head_kv=n_head_kv, head_dim=head_dim, freq_base=10000.0,
                        freq_scale=1.0, n_ctx_orig=4096, anchor_pos=40, n_tokens=n_tokens, payload_align=64)
    tokens = rng.integers(0, 150000, n_tokens, dtype=np.int32)
    k = rng.standard_normal((n_layer, n_tokens, row)).astype(np.float16)
    v = rng.standard_normal((n_layer, n_tokens, row) if layout == 0 else (n_layer, row, n_tokens)).astype(np.float16)
    return h, tokens, k, v


# ---------------------------------------------------------------- golden files

@pytest.mark.parametrize("name,layout", [("v1-rows", 0), ("v1-transposed", 1)])
def test_golden_files(name, layout, tmp_path):
    path = GOLDEN / f"{name}.atb"
    want = json.loads((GOLDEN / f"{name}.json").read_text())
    assert path.stat().st_size == want["file_size"]
    with atb.open_block(path) as b:
        assert b.header.to_dict() == want["header"]
        assert b.tokens.tolist() == want["tokens"]
        assert b.k.view(np.uint16).reshape(-1).tolist() == want["k_bits"]
        assert b.v.view(np.uint16).reshape(-1).tolist() == want["v_bits"]
        assert b.v.shape == ((2, 3, 8) if layout == 0 else (2, 8, 3))
    h, tokens, k, v = atb.read_block_py(path)
    assert h.to_dict() == want["header"]
    assert tokens.tolist() == want["tokens"] and k.view(np.uint16).reshape(-1).tolist() == want["k_bits"]
    # the writers still produce these exact bytes (format stability), native and pure Python alike
    header, tokens, k, v = _golden_inputs(layout)
    atb.write_block(tmp_path / "n.atb", header, tokens, k, v)
    atb.write_block_py(tmp_path / "p.atb", header, tokens, k, v)
    assert (tmp_path / "n.atb").read_bytes() == path.read_bytes()
    assert (tmp_path / "p.atb").read_bytes() == path.read_bytes()


def test_header_layout_matches_spec():
    raw = (GOLDEN / "v1-rows.atb").read_bytes()
    assert raw[:8] == b"NXATB\r\n\x1a"
    assert struct.unpack_from("<HH", raw, 8) == (1, 128)
    assert struct.unpack_from("<I", raw, 44)[0] == 128  # tokens_offset
    assert struct.unpack_from("<QQ", raw, 112) == (192, 320)
    crc = struct.unpack_from("<I", raw, 12)[0]
    assert crc == zlib.crc32(raw[:12] + b"\0" * 4 + raw[16:128])


# ---------------------------------------------------------------- round trip, native vs Python

@pytest.mark.parametrize("layout", [0, 1])
def test_round_trip_native_and_python_readers(layout, tmp_path):
    rng = np.random.default_rng(layout)
    h, tokens, k, v = random_block(rng, layout)
    p = tmp_path / "b.atb"
    w = atb.write_block(p, h, tokens, k, v)
    assert w.tokens_offset == 128 and w.k_offset % 64 == 0 and w.v_offset % 64 == 0
    with atb.open_block(p) as b:
        assert b.header == w
        assert np.array_equal(b.tokens, tokens)
        assert np.array_equal(b.k.view(np.uint16), k.view(np.uint16))
        assert np.array_equal(b.v.view(np.uint16), v.view(np.uint16))
        assert not b.k.flags.writeable
        ph, pt, pk, pv = atb.read_block_py(p)
        assert ph == b.header
        assert np.array_equal(pt, b.tokens) and np.array_equal(pk.view(np.uint16), b.k.view(np.uint16))
        assert np.array_equal(pv.view(np.uint16), b.v.view(np.uint16))
    assert sorted(os.listdir(tmp_path)) == ["b.atb"]  # no temp file left


def test_default_alignment_is_sparse(tmp_path):
    rng = np.random.default_rng(9)
    h, tokens, k, v = random_block(rng, 0)
    h.payload_align = 0
    w = atb.write_block(tmp_path / "big.atb", h, tokens, k, v)
    assert w.payload_align == 2 * 1024 * 1024 and w.k_offset == w.payload_align and w.v_offset == 2 * w.payload_align
    st = os.stat(tmp_path / "big.atb")
    assert st.st_size == w.v_offset + k.nbytes
    assert st.st_blocks * 512 < 1024 * 1024  # the padding is holes
    atb.read_block_py(tmp_path / "big.atb")


# ---------------------------------------------------------------- refusals: native and Python agree, message by message

def _u(fmt, off, val):
    def edit(b: bytearray):
        struct.pack_into(fmt, b, off, val)
    return edit


CORRUPTIONS = [
    # (edit, reseal header crc, expected reason)
    (lambda b: b.clear(), False, "truncated: file is 0 bytes, header needs 128"),
    (lambda b: b.__delitem__(slice(100, None)), False, "truncated: file is 100 bytes, header needs 128"),
    (_u("<B", 0, ord("M")), False, "not an .atb file (bad magic)"),
    (_u("<H", 8, 2), False, "unsupported .atb version 2 (this build reads 1)"),
    (_u("<H", 10, 64), False, "bad header size 64 (expected 128)"),
    (_u("<B", 20, 0x55), False, "header checksum mismatch"),
    (_u("<I", 100, 4), False, "header checksum mismatch"),  # a field flip without resealing
    (_u("<B", 48, 1), True, "bad header field rope_type: 1 (must be 0 (NORM) or 2 (NEOX))"),
    (_u("<B", 49, 0), True, "bad header field k_type: 0 (must be 1 (F16))"),
    (_u("<B", 50, 8), True, "bad header field v_type: 8 (must be 1 (F16))"),
    (_u("<B", 51, 2), True, "bad header field v_layout: 2 (must be 0 (rows) or 1 (transposed))"),
    (_u("<I", 56, 0), True, "bad header field n_layer: 0 (must be 1..1024)"),
    (_u("<I", 60, 1025), True, "bad header field n_head_kv: 1025 (must be 1..1024)"),
    (_u("<I", 64, 3), True, "bad header field head_dim: 3 (must be even and 1..1024)"),
    (_u("<I", 52, 6), True, "bad header field n_rot: 6 (must be even and <= head_dim)"),
    (_u("<I", 100, 0), True, "bad header field n_tokens: 0 (must be 1..1000000)"),
    (_u("<I", 104, 96), True, "bad header field payload_align: 96 (must be a power of two in 64..2^30)"),
    (_u("<f", 68, -1.0), True, "bad header field freq_base: -1 (must be finite and > 0)"),
    (_u("<f", 72, float("inf")), True, "bad header field freq_scale: inf (must be finite and > 0)"),
    (_u("<I", 96, 2**31), True, "bad header field anchor_pos: 2147483648 (must be < 2^31)"),
    (lambda b: b.__setitem__(slice(32, 44), b"a" * 12), True, "bad header field arch: unterminated"),
    (_u("<B", 32, 0), True, 'bad header field arch: "" (must be 1..11 printable ASCII bytes, NUL-padded)'),
    (_u("<B", 33, 7), True, "bad header field arch: byte 1 = 7"),
    (_u("<B", 40, 65), True, "bad header field arch: byte 8 = 65"),  # garbage after the NUL
    (_u("<I", 44, 64), True, "bad tokens_offset 64 (must be >= 128 and a multiple of 4)"),
    (_u("<I", 44, 130), True, "bad tokens_offset 130"),
    (_u("<Q", 112, 193), True, "k_offset 193 is not aligned to 64"),
    (_u("<Q", 120, 330), True, "v_offset 330 is not aligned to 64"),
    (_u("<Q", 112, 128), True, "tokens section ends at 140, after K section start 128"),
    (_u("<Q", 120, 256), True, "K section ends at 288, after V section start 256"),
    (_u("<Q", 120, 2**64 - 64), True, "section offsets overflow"),
    (_u("<Q", 120, 384), True, "truncated: V section ends at 480 but file is 416 bytes"),
    (lambda b: b.__delitem__(slice(415, None)), False, "truncated: V section ends at 416 but file is 415 bytes"),
    (lambda b: b.__delitem__(slice(200, None)), False, "truncated: V section ends at 416 but file is 200 bytes"),
    (_u("<B", 129, 0x77), False, "payload checksum mismatch"),  # a token
    (_u("<B", 200, 0x77), False, "payload checksum mismatch"),  # K
    (_u("<B", 415, 0x77), False, "payload checksum mismatch"),  # last V byte
    (_u("<I", 108, 0), True, "payload checksum mismatch"),  # the stored payload crc itself
]


def _reseal(b: bytearray):
    b[12:16] = b"\0" * 4
    b[12:16] = struct.pack("<I", zlib.crc32(bytes(b[:128])))


@pytest.mark.parametrize("edit,reseal,reason", CORRUPTIONS, ids=[c[2][:40] for c in CORRUPTIONS])
def test_every_corruption_is_refused_identically(edit, reseal, reason, tmp_path):
    raw = bytearray((GOLDEN / "v1-rows.atb").read_bytes())
    edit(raw)
    if reseal:
        _reseal(raw)
    p = tmp_path / "bad.atb"
    p.write_bytes(bytes(raw))
    with pytest.raises(FormatError) as native:
        atb.open_block(p)
    with pytest.raises(FormatError) as python:
        atb.read_block_py(p)
    assert str(native.value).startswith(f"{p}: ")
    assert reason in str(native.value)
    assert str(native.value) == str(python.value)


def test_unverified_open_skips_only_the_payload_check(tmp_path):
    raw = bytearray((GOLDEN / "v1-rows.atb").read_bytes())
    pad = bytearray(raw)
    pad[300] ^= 1  # padding between K (ends at 288) and V (320) is outside the checksum, by definition
    (tmp_path / "pad.atb").write_bytes(bytes(pad))
    atb.open_block(tmp_path / "pad.atb").close()
    raw[330] ^= 1
    p = tmp_path / "flip.atb"
    p.write_bytes(bytes(raw))
    with pytest.raises(FormatError, match="payload checksum mismatch"):
        atb.open_block(p)
    atb.open_block(p, verify=False).close()
    atb.read_block_py(p, verify=False)


def test_io_errors(tmp_path):
    with pytest.raises(NativeError, match="cannot open .*No such file or directory"):
        atb.open_block(tmp_path / "missing.atb")
    h, tokens, k, v = _golden_inputs(0)
    with pytest.raises(NativeError, match=f"cannot write {tmp_path}/nodir/x.atb: No such file or directory"):
        atb.write_block(tmp_path / "nodir" / "x.atb", h, tokens, k, v)
    (tmp_path / "d" / "x.atb").mkdir(parents=True)  # the final rename fails: the temp file must be gone
    with pytest.raises(NativeError, match="cannot write .*x.atb: Is a directory"):
        atb.write_block(tmp_path / "d" / "x.atb", h, tokens, k, v)
    assert os.listdir(tmp_path / "d") == ["x.atb"]
    h.n_rot = 5
    with pytest.raises(NativeError, match="bad header field n_rot: 5"):
        atb.write_block(tmp_path / "y.atb", h, tokens, k, v)
    assert not (tmp_path / "y.atb").exists()


# ---------------------------------------------------------------- splice blob

def parse_blob(blob: bytes) -> dict:
    off = 0

    def take(fmt):
        nonlocal off
        vals = struct.unpack_from("<" + fmt, blob, off)
        off += struct.calcsize("<" + fmt)
        return vals if len(vals) > 1 else vals[0]

    out = {"magic": take("I"), "seq_id": take("i"), "n_stream": take("I"), "cell_count": take("I"), "cells": []}
    for _ in range(out["cell_count"]):
        out["cells"].append(take("iIi"))
    out["v_trans"], out["n_layer"] = take("I"), take("I")
    n = out["cell_count"]
    out["k"] = []
    for _ in range(out["n_layer"]):
        typ, row_bytes = take("iQ")
        out["k"].append((typ, row_bytes, np.frombuffer(blob, np.uint16, n * row_bytes // 2, off)))
        off += n * row_bytes
    out["v"] = []
    for _ in range(out["n_layer"]):
        if out["v_trans"] == 0:
            typ, row_bytes = take("iQ")
            size = n * row_bytes
            meta = (typ, row_bytes)
        else:
            typ, el, n_embd = take("iII")
            size = el * n_embd * n
            meta = (typ, el, n_embd)
        out["v"].append((meta, np.frombuffer(blob, np.uint16, size // 2, off)))
        off += size
    out["end"] = off
    return out


@pytest.mark.parametrize("layout", [0, 1])
@pytest.mark.parametrize("rope_type", [atb.ROPE_NORM, atb.ROPE_NEOX])
def test_splice_blob(layout, rope_type, tmp_path):
    rng = np.random.default_rng(layout * 10 + rope_type)
    h, tokens, k, v = random_block(rng, layout, n_rot=4, rope_type=rope_type)  # partial rotation
    atb.write_block(tmp_path / "b.atb", h, tokens, k, v)
    with atb.open_block(tmp_path / "b.atb") as b:
        blob = b.splice_blob(n_past=100, seq_id=1)
        assert blob.size == b.blob_size
        p = parse_blob(blob.tobytes())
        assert p["end"] == blob.size
        assert (p["magic"], p["seq_id"], p["n_stream"], p["cell_count"]) == (0xAF143CD8, 1, 1, h.n_tokens)
        assert p["cells"] == [(100 + i, 1, 1) for i in range(h.n_tokens)]
        assert (p["v_trans"], p["n_layer"]) == (layout, h.n_layer)
        row = h.row
        for layer, (typ, row_bytes, rows) in enumerate(p["k"]):
            assert typ == 1 and row_bytes == row * 2
            want = kernels.rope_rotate_f16(k[layer], h.n_head_kv, h.head_dim, 4, rope_type, h.freq_base,
                                           h.freq_scale, 100 - h.anchor_pos)
            assert np.array_equal(rows, want.view(np.uint16).reshape(-1))
            ref = reference.rope_rotate_f16(k[layer], h.n_head_kv, h.head_dim, 4, rope_type, h.freq_base,
                                            h.freq_scale, 100 - h.anchor_pos)
            assert reference.f16_ulp_distance(rows, ref.reshape(-1)).max() <= 1
        for layer, (meta, vals) in enumerate(p["v"]):
            assert meta == ((1, row * 2) if layout == 0 else (1, 2, row))
            assert np.array_equal(vals, v[layer].view(np.uint16).reshape(-1))
        # at the anchor, K is copied exactly; a reusable buffer gives the same bytes
        buf = np.zeros(b.blob_size + 64, np.uint8)
        res = b.splice_blob_into(buf, n_past=h.anchor_pos, seq_id=0)
        assert res.size == b.blob_size and res.ptr is not None
        assert np.array_equal(parse_blob(res.view.tobytes())["k"][0][2], k[0].view(np.uint16).reshape(-1))
        res = b.splice_blob_into(buf, n_past=100, seq_id=1)
        assert np.array_equal(res.view, blob)
        with pytest.raises(Exception, match="the blob needs"):
            b.splice_blob_into(np.zeros(10, np.uint8), 100, 1)
        with pytest.raises(NativeError, match="seq_id must be >= 0"):
            b.splice_blob(100, -1)
        with pytest.raises(NativeError, match="n_past"):
            b.splice_blob(2**31, 0)


def test_views_outlive_the_block_object(tmp_path):
    import gc

    with atb.open_block(GOLDEN / "v1-rows.atb") as b:
        pass
    with pytest.raises(Exception, match="closed"):
        b.splice_blob(10, 0)
    k = atb.open_block(GOLDEN / "v1-rows.atb").k  # the Block is dropped at once; its mapping lives on in k
    gc.collect()
    want = json.loads((GOLDEN / "v1-rows.json").read_text())["k_bits"]
    assert k.view(np.uint16).reshape(-1).tolist() == want
