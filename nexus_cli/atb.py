"""Python API for .atb tool blocks (spec: docs/atb-format.md).

write_block / open_block go through libnexus (atomic writer, validating mmap reader, zero-copy views).
read_block_py is an independent pure-Python reader (struct + numpy + zlib) of the same spec, with the same checks
in the same order and the same messages; the tests cross-check the two.
"""

from __future__ import annotations

import dataclasses
import math
import os
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np

from . import _native
from .errors import FormatError, NativeError, NexusError, UsageError

MAGIC = _native.ATB_MAGIC
VERSION = _native.ATB_VERSION
HEADER_SIZE = _native.ATB_HEADER_SIZE
DEFAULT_ALIGN = _native.ATB_DEFAULT_ALIGN
ROPE_NORM = _native.ROPE_NORM
ROPE_NEOX = _native.ROPE_NEOX
V_LAYOUT_ROWS = _native.V_LAYOUT_ROWS
V_LAYOUT_TRANSPOSED = _native.V_LAYOUT_TRANSPOSED
GGML_TYPE_F16 = _native.GGML_TYPE_F16

# The header as one struct format: field order, sizes and offsets of docs/atb-format.md (128 bytes, little-endian).
_HEADER_FIELDS = (
    ("magic", "8s"), ("version", "H"), ("header_size", "H"), ("header_crc32", "I"), ("fingerprint", "16s"),
    ("arch", "12s"), ("tokens_offset", "I"), ("rope_type", "B"), ("k_type", "B"), ("v_type", "B"),
    ("v_layout", "B"), ("n_rot", "I"), ("n_layer", "I"), ("n_head_kv", "I"), ("head_dim", "I"),
    ("freq_base", "f"), ("freq_scale", "f"), ("yarn_ext_factor", "f"), ("yarn_attn_factor", "f"),
    ("yarn_beta_fast", "f"), ("yarn_beta_slow", "f"), ("n_ctx_orig", "I"), ("anchor_pos", "I"), ("n_tokens", "I"),
    ("payload_align", "I"), ("payload_crc32", "I"), ("k_offset", "Q"), ("v_offset", "Q"),
)
_HEADER = struct.Struct("<" + "".join(f for _, f in _HEADER_FIELDS))
assert _HEADER.size == HEADER_SIZE


@dataclass(kw_only=True)
class BlockHeader:
    """Every field of the 128-byte header. The writer fills magic, version, header_size, offsets and checksums."""

    fingerprint: bytes = b"\0" * 16
    arch: str = ""
    rope_type: int = ROPE_NEOX
    k_type: int = GGML_TYPE_F16
    v_type: int = GGML_TYPE_F16
    v_layout: int = V_LAYOUT_ROWS
    n_rot: int = 0
    n_layer: int = 0
    n_head_kv: int = 0
    head_dim: int = 0
    freq_base: float = 10000.0
    freq_scale: float = 1.0
    yarn_ext_factor: float = 0.0
    yarn_attn_factor: float = 1.0
    yarn_beta_fast: float = 32.0
    yarn_beta_slow: float = 1.0
    n_ctx_orig: int = 0
    anchor_pos: int = 0
    n_tokens: int = 0
    payload_align: int = 0  # 0: the default (2 MiB)
    magic: bytes = MAGIC
    version: int = VERSION
    header_size: int = HEADER_SIZE
    header_crc32: int = 0
    tokens_offset: int = 0
    payload_crc32: int = 0
    k_offset: int = 0
    v_offset: int = 0

    @property
    def row(self) -> int:
        """F16 values per token per layer: n_head_kv * head_dim."""
        return self.n_head_kv * self.head_dim

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["fingerprint"] = self.fingerprint.hex()
        d["magic"] = self.magic.hex()
        return d

    # ---- byte and ctypes forms
    def pack(self) -> bytes:
        vals = []
        for name, _ in _HEADER_FIELDS:
            v = getattr(self, name)
            if name == "arch":
                v = v.encode("ascii")
            vals.append(v)
        return _HEADER.pack(*vals)

    @classmethod
    def unpack(cls, raw: bytes) -> BlockHeader:
        vals = dict(zip((n for n, _ in _HEADER_FIELDS), _HEADER.unpack(raw[:HEADER_SIZE])))
        vals["arch"] = vals["arch"].split(b"\0", 1)[0].decode("ascii", "replace")
        return cls(**vals)

    def _to_c(self) -> _native.AtbHeader:
        return _native.header_from_bytes(self.pack())

    @classmethod
    def _from_c(cls, c: _native.AtbHeader) -> BlockHeader:
        return cls.unpack(bytes(c))


# ---------------------------------------------------------------- native writer / reader

def _f16(a, name: str, shape: tuple) -> np.ndarray:
    if not isinstance(a, np.ndarray) or a.dtype not in (np.float16, np.uint16):
        raise UsageError(f"{name} must be a float16 or uint16 numpy array")
    if a.shape != shape:
        raise UsageError(f"{name} must have shape {shape}, got {a.shape}")
    return np.ascontiguousarray(a).view(np.uint16)


def write_block(path: str | os.PathLike, header: BlockHeader, tokens: np.ndarray, k: np.ndarray,
                v: np.ndarray) -> BlockHeader:
    """Write a block atomically; returns the header as written (offsets, checksums filled)."""
    tokens = np.ascontiguousarray(np.asarray(tokens, dtype=np.int32).reshape(-1))
    h = dataclasses.replace(header)
    if h.n_tokens == 0:
        h.n_tokens = int(tokens.size)
    if tokens.size != h.n_tokens:
        raise UsageError(f"header says n_tokens = {h.n_tokens}, tokens has {tokens.size}")
    if len(h.fingerprint) != 16:
        raise UsageError(f"fingerprint must be 16 bytes, got {len(h.fingerprint)}")
    if not h.arch.isascii() or len(h.arch.encode()) > 11:
        raise UsageError(f"arch must be at most 11 ASCII characters, got {h.arch!r}")
    kshape = (h.n_layer, h.n_tokens, h.row)
    vshape = kshape if h.v_layout == V_LAYOUT_ROWS else (h.n_layer, h.row, h.n_tokens)
    k16 = _f16(k, "k", kshape)
    v16 = _f16(v, "v", vshape)
    lib = _native.lib()
    written = _native.AtbHeader()
    _native.check(lib.nexus_atb_write(os.fsencode(os.fspath(path)), _native.ref(h._to_c()), tokens.ctypes.data,
                                      k16.ctypes.data, v16.ctypes.data, _native.ref(written)))
    return BlockHeader._from_c(written)


class SpliceBlob(NamedTuple):
    """A built sequence-state blob: `ptr`/`size` go straight to llama_state_seq_set_data; `view` is the bytes."""

    ptr: object  # a ctypes POINTER(c_uint8), from _native.u8_pointer
    size: int
    view: np.ndarray


def _view(addr: int, count: int, dtype, shape: tuple, owner) -> np.ndarray:
    nbytes = count * np.dtype(dtype).itemsize
    buf = _native.bytes_at(addr, nbytes)
    buf._owner = owner  # the view keeps the mapping alive
    arr = np.frombuffer(buf, dtype=dtype).reshape(shape)
    arr.flags.writeable = False  # the mapping is PROT_READ: writing would fault
    return arr


class _Mapping:
    """Owns the native handle (and so the mapping). The views reference this object, not the Block, so there is
    no reference cycle: the mapping goes away as soon as the Block and every view are gone."""

    def __init__(self, lib, handle):
        self._lib = lib
        self.handle = handle

    def close(self) -> None:
        h, self.handle = self.handle, None
        if h:
            self._lib.nexus_atb_close(h)

    def __del__(self):
        self.close()


class Block:
    """An opened (memory-mapped, validated) block. tokens/k/v are zero-copy read-only views into the mapping.

    The views keep the mapping alive on their own; close() unmaps at once, after which old views must not be touched.
    """

    def __init__(self, path: str | os.PathLike, verify: bool = True):
        self.path = Path(path)
        self._lib = _native.lib()
        h = _native.out("ptr")
        st = self._lib.nexus_atb_open(os.fsencode(os.fspath(path)), 1 if verify else 0, _native.ref(h))
        if st == _native.ERR_FORMAT:
            raise FormatError(f"{self.path}: {_native.last_error()}")
        _native.check(st)
        self._map = _Mapping(self._lib, h)
        c = _native.AtbHeader()
        _native.check(self._lib.nexus_atb_get_header(h, _native.ref(c)))
        self.header = BlockHeader._from_c(c)
        hd = self.header
        p = _native.out("ptr")
        _native.check(self._lib.nexus_atb_tokens(h, _native.ref(p)))
        self.tokens = _view(p.value, hd.n_tokens, np.int32, (hd.n_tokens,), self._map)
        _native.check(self._lib.nexus_atb_k(h, _native.ref(p)))
        n = hd.n_layer * hd.n_tokens * hd.row
        self.k = _view(p.value, n, np.float16, (hd.n_layer, hd.n_tokens, hd.row), self._map)
        _native.check(self._lib.nexus_atb_v(h, _native.ref(p)))
        vshape = (hd.n_layer, hd.n_tokens, hd.row) if hd.v_layout == V_LAYOUT_ROWS else (hd.n_layer, hd.row,
                                                                                        hd.n_tokens)
        self.v = _view(p.value, n, np.float16, vshape, self._map)
        size = _native.out("u64")
        _native.check(self._lib.nexus_splice_blob_size(h, _native.ref(size)))
        self.blob_size = int(size.value)

    @property
    def native_handle(self):
        """The nexus_atb * (a ctypes void pointer) for native calls; valid until close()."""
        m = getattr(self, "_map", None)
        if m is None or not m.handle:
            raise NexusError(f"{self.path}: block is closed")
        return m.handle

    def splice_blob(self, n_past: int, seq_id: int) -> np.ndarray:
        """The llama.cpp sequence-state blob placing this block at positions n_past.. for seq_id (new array)."""
        buf = np.empty(self.blob_size, dtype=np.uint8)
        self.splice_blob_into(buf, n_past, seq_id)
        return buf

    def splice_blob_into(self, buf: np.ndarray, n_past: int, seq_id: int) -> SpliceBlob:
        """Build the blob into a caller-owned reusable uint8 buffer (at least blob_size bytes, 4-byte aligned)."""
        if not isinstance(buf, np.ndarray) or buf.dtype != np.uint8 or not buf.flags.c_contiguous \
                or not buf.flags.writeable:
            raise UsageError("buf must be a writable, C-contiguous uint8 numpy array")
        if buf.nbytes < self.blob_size:
            raise UsageError(f"buf holds {buf.nbytes} bytes, the blob needs {self.blob_size}")
        addr = buf.ctypes.data
        _native.check(self._lib.nexus_splice_build_blob(self.native_handle, int(n_past), int(seq_id), addr,
                                                        buf.nbytes))
        return SpliceBlob(_native.u8_pointer(addr), self.blob_size, buf[: self.blob_size])

    def close(self) -> None:
        m = getattr(self, "_map", None)
        if m is not None:
            m.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def open_block(path: str | os.PathLike, verify: bool = True) -> Block:
    """Map and validate a block (payload CRC checked unless verify=False). Malformed files raise FormatError."""
    return Block(path, verify)


# ---------------------------------------------------------------- the independent pure-Python reader

def _bad_field(name: str, value: str, rule: str):
    raise _Reason(f"bad header field {name}: {value} ({rule})")


class _Reason(Exception):
    pass


def _g(x: float) -> str:
    return "%g" % x


def validate_fields(h: BlockHeader, raw_arch: bytes) -> None:
    """The field range checks of docs/atb-format.md, in order; raises _Reason."""
    if h.rope_type not in (ROPE_NORM, ROPE_NEOX):
        _bad_field("rope_type", str(h.rope_type), "must be 0 (NORM) or 2 (NEOX)")
    if h.k_type != GGML_TYPE_F16:
        _bad_field("k_type", str(h.k_type), "must be 1 (F16)")
    if h.v_type != GGML_TYPE_F16:
        _bad_field("v_type", str(h.v_type), "must be 1 (F16)")
    if h.v_layout > V_LAYOUT_TRANSPOSED:
        _bad_field("v_layout", str(h.v_layout), "must be 0 (rows) or 1 (transposed)")
    if not 1 <= h.n_layer <= 1024:
        _bad_field("n_layer", str(h.n_layer), "must be 1..1024")
    if not 1 <= h.n_head_kv <= 1024:
        _bad_field("n_head_kv", str(h.n_head_kv), "must be 1..1024")
    if not 1 <= h.head_dim <= 1024 or h.head_dim % 2:
        _bad_field("head_dim", str(h.head_dim), "must be even and 1..1024")
    if h.n_rot % 2 or h.n_rot > h.head_dim:
        _bad_field("n_rot", str(h.n_rot), "must be even and <= head_dim")
    if not 1 <= h.n_tokens <= 1_000_000:
        _bad_field("n_tokens", str(h.n_tokens), "must be 1..1000000")
    a = h.payload_align
    if a < 64 or a > 1 << 30 or a & (a - 1):
        _bad_field("payload_align", str(a), "must be a power of two in 64..2^30")
    if not math.isfinite(h.freq_base) or not h.freq_base > 0:
        _bad_field("freq_base", _g(h.freq_base), "must be finite and > 0")
    if not math.isfinite(h.freq_scale) or not h.freq_scale > 0:
        _bad_field("freq_scale", _g(h.freq_scale), "must be finite and > 0")
    if not all(math.isfinite(x) for x in (h.yarn_ext_factor, h.yarn_attn_factor, h.yarn_beta_fast,
                                          h.yarn_beta_slow)):
        _bad_field("yarn_*", "non-finite", "must be finite")
    if h.anchor_pos > 0x7FFFFFFF:
        _bad_field("anchor_pos", str(h.anchor_pos), "must be < 2^31")
    rule = "must be 1..11 printable ASCII bytes, NUL-padded"
    n = raw_arch.find(b"\0")
    n = len(raw_arch) if n < 0 else n
    if n == 0 or n == len(raw_arch):
        _bad_field("arch", '""' if n == 0 else "unterminated", rule)
    for i, c in enumerate(raw_arch):
        if (not 0x20 <= c <= 0x7E) if i < n else c != 0:
            _bad_field("arch", f"byte {i} = {c}", rule)


def _check(raw: bytes, verify: bool) -> tuple[BlockHeader, int]:
    size = len(raw)
    if size < HEADER_SIZE:
        raise _Reason(f"truncated: file is {size} bytes, header needs 128")
    h = BlockHeader.unpack(raw)
    if h.magic != MAGIC:
        raise _Reason("not an .atb file (bad magic)")
    if h.version != VERSION:
        raise _Reason(f"unsupported .atb version {h.version} (this build reads 1)")
    if h.header_size != HEADER_SIZE:
        raise _Reason(f"bad header size {h.header_size} (expected 128)")
    if zlib.crc32(raw[:12] + b"\0\0\0\0" + raw[16:HEADER_SIZE]) != h.header_crc32:
        raise _Reason("header checksum mismatch")
    validate_fields(h, raw[32:44])
    row = h.n_head_kv * h.head_dim
    sec = h.n_layer * h.n_tokens * row * 2
    tok_bytes = h.n_tokens * 4
    align = h.payload_align
    if h.tokens_offset < HEADER_SIZE or h.tokens_offset % 4:
        raise _Reason(f"bad tokens_offset {h.tokens_offset} (must be >= 128 and a multiple of 4)")
    if h.k_offset % align:
        raise _Reason(f"k_offset {h.k_offset} is not aligned to {align}")
    if h.v_offset % align:
        raise _Reason(f"v_offset {h.v_offset} is not aligned to {align}")
    tokens_end = h.tokens_offset + tok_bytes
    if tokens_end > h.k_offset:
        raise _Reason(f"tokens section ends at {tokens_end}, after K section start {h.k_offset}")
    if h.k_offset + sec >= 1 << 64 or h.v_offset + sec >= 1 << 64:  # the C reader works in uint64
        raise _Reason("section offsets overflow")
    k_end = h.k_offset + sec
    if k_end > h.v_offset:
        raise _Reason(f"K section ends at {k_end}, after V section start {h.v_offset}")
    v_end = h.v_offset + sec
    if v_end > size:
        raise _Reason(f"truncated: V section ends at {v_end} but file is {size} bytes")
    if verify:
        c = zlib.crc32(raw[h.tokens_offset:tokens_end])
        c = zlib.crc32(raw[h.k_offset:k_end], c)
        c = zlib.crc32(raw[h.v_offset:v_end], c)
        if c != h.payload_crc32:
            raise _Reason("payload checksum mismatch")
    return h, sec


def read_block_py(path: str | os.PathLike, verify: bool = True):
    """Pure-Python reader: (BlockHeader, tokens int32 [n], k float16 [L, n, row], v float16 in its layout)."""
    try:
        raw = Path(path).read_bytes()
    except OSError as e:
        raise NexusError(f"cannot open {path}: {e.strerror}") from None
    try:
        h, sec = _check(raw, verify)
    except _Reason as r:
        raise FormatError(f"{path}: {r}") from None
    tokens = np.frombuffer(raw, dtype="<i4", count=h.n_tokens, offset=h.tokens_offset).copy()
    k = np.frombuffer(raw, dtype="<f2", count=sec // 2, offset=h.k_offset).reshape(h.n_layer, h.n_tokens, h.row)
    v = np.frombuffer(raw, dtype="<f2", count=sec // 2, offset=h.v_offset)
    v = v.reshape((h.n_layer, h.n_tokens, h.row) if h.v_layout == V_LAYOUT_ROWS else (h.n_layer, h.row, h.n_tokens))
    return h, tokens, k.copy(), v.copy()


__all__ = ["BlockHeader", "Block", "SpliceBlob", "write_block", "open_block", "read_block_py", "validate_fields",
           "NativeError", "FormatError"]


def write_block_py(path: str | os.PathLike, header: BlockHeader, tokens: np.ndarray, k: np.ndarray,
                   v: np.ndarray) -> BlockHeader:
    """Pure-Python writer of the same spec (not atomic, no sparse holes): the tests check that it produces the
    native writer's bytes exactly."""
    h = dataclasses.replace(header, magic=MAGIC, version=VERSION, header_size=HEADER_SIZE, tokens_offset=HEADER_SIZE)
    tokens = np.ascontiguousarray(np.asarray(tokens, dtype="<i4").reshape(-1))
    if h.n_tokens == 0:
        h.n_tokens = int(tokens.size)
    if h.payload_align == 0:
        h.payload_align = DEFAULT_ALIGN
    try:
        validate_fields(h, h.arch.encode("ascii").ljust(12, b"\0")[:12])
    except _Reason as r:
        raise UsageError(str(r)) from None
    tb = tokens.tobytes()
    kb = np.ascontiguousarray(k).view("<u2").tobytes()
    vb = np.ascontiguousarray(v).view("<u2").tobytes()
    align = h.payload_align
    h.k_offset = -(-(HEADER_SIZE + len(tb)) // align) * align
    h.v_offset = -(-(h.k_offset + len(kb)) // align) * align
    h.payload_crc32 = zlib.crc32(vb, zlib.crc32(kb, zlib.crc32(tb)))
    h.header_crc32 = 0
    h.header_crc32 = zlib.crc32(h.pack())
    with open(path, "wb") as f:
        f.write(h.pack())
        f.write(tb)
        f.seek(h.k_offset)
        f.write(kb)
        f.seek(h.v_offset)
        f.write(vb)
    return h
