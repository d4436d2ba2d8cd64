"""llama.cpp sequence-state blobs (llama_state_seq_get_data's layout, ../docs/splice.md): parsed into a block's K/V
rows at compile time, built from them at splice time. Layout facts: ../shared/design/llama-state.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ..errors import FormatError

STATE_MAGIC = 0xAF143CD8  # llama_context io_magic at the head of every llama_state_seq_get_data blob
GGML_TYPE_F16 = 1


@dataclass
class SeqState:
    """One parsed `llama_state_seq_get_data` blob (single stream, one sequence per cell, F16 K and V)."""

    seq_id: int
    pos: np.ndarray  # int32 [n_cells], in cell order
    v_trans: bool
    k: np.ndarray  # uint16 [n_layer, n_cells, row]
    v: np.ndarray  # uint16 [n_layer, n_cells, row] (v_trans False) or [n_layer, row, n_cells] (v_trans True)

    @property
    def n_cells(self) -> int:
        return int(self.pos.shape[0])

    @property
    def n_layer(self) -> int:
        return int(self.k.shape[0])


def parse_state_blob(blob: bytes | np.ndarray) -> SeqState:
    """Parse the blob of llama_state_seq_get_data (the layout of llama.cpp's llama_kv_cache::state_write at the
    vendored commit; written out in docs/splice.md). A NumPy reader, independent of libnexus, used by compile to
    extract a schema's cells and by the tests to check the native blob builder against llama.cpp's own blobs."""
    buf = memoryview(bytes(blob) if not isinstance(blob, (bytes, bytearray)) else blob)
    off = 0

    def take(fmt: str):
        nonlocal off
        size = struct.calcsize(fmt)
        if off + size > len(buf):
            raise FormatError(f"state blob truncated at byte {off} (needs {size} more)")
        vals = struct.unpack_from(fmt, buf, off)
        off += size
        return vals

    magic, seq_id, n_stream = take("<IiI")
    if magic != STATE_MAGIC:
        raise FormatError(f"state blob magic {magic:#x} != {STATE_MAGIC:#x}")
    if n_stream != 1:
        raise FormatError(f"state blob has {n_stream} streams; Nexus contexts use one (kv_unified)")
    (cell_count,) = take("<I")
    if cell_count == 0:
        empty = np.zeros((0, 0, 0), np.uint16)
        return SeqState(seq_id, np.zeros(0, np.int32), False, empty, empty)
    pos = np.empty(cell_count, np.int32)
    for i in range(cell_count):
        p, n_seq = take("<iI")
        take(f"<{n_seq}i")
        pos[i] = p
    v_trans, n_layer = take("<II")
    ks = []
    for il in range(n_layer):
        k_type, row_bytes = take("<iQ")
        if k_type != GGML_TYPE_F16:
            raise FormatError(f"layer {il}: K type {k_type} is not F16")
        n = cell_count * row_bytes
        if off + n > len(buf):
            raise FormatError("state blob truncated in the K rows")
        ks.append(np.frombuffer(buf, np.uint16, n // 2, off).reshape(cell_count, row_bytes // 2))
        off += n
    vs = []
    for il in range(n_layer):
        if not v_trans:
            v_type, row_bytes = take("<iQ")
            if v_type != GGML_TYPE_F16:
                raise FormatError(f"layer {il}: V type {v_type} is not F16")
            n = cell_count * row_bytes
            if off + n > len(buf):
                raise FormatError("state blob truncated in the V rows")
            vs.append(np.frombuffer(buf, np.uint16, n // 2, off).reshape(cell_count, row_bytes // 2))
        else:
            v_type, el, n_embd_v = take("<iII")
            if v_type != GGML_TYPE_F16 or el != 2:
                raise FormatError(f"layer {il}: V type {v_type} (element {el} bytes) is not F16")
            n = n_embd_v * cell_count * el
            if off + n > len(buf):
                raise FormatError("state blob truncated in the V columns")
            vs.append(np.frombuffer(buf, np.uint16, n // 2, off).reshape(n_embd_v, cell_count))
        off += n
    if off != len(buf):
        raise FormatError(f"state blob has {len(buf) - off} trailing bytes (a cell extension this reader lacks?)")
    return SeqState(seq_id, pos, bool(v_trans), np.stack(ks), np.stack(vs))


def build_state_blob(seq_id: int, positions: Sequence[int], k: np.ndarray, v: np.ndarray, v_trans: bool) -> bytes:
    """The inverse of parse_state_blob, in NumPy: a blob llama_state_seq_set_data accepts, each cell in one sequence.
    The reference the native `nexus_splice_build_blob` is checked against (tests/test_splice.py)."""
    k = np.asarray(k, np.uint16)
    v = np.asarray(v, np.uint16)
    n_layer, n_cells, row = k.shape
    parts = [struct.pack("<IiII", STATE_MAGIC, seq_id, 1, n_cells)]
    parts.append(b"".join(struct.pack("<iIi", int(p), 1, seq_id) for p in positions))
    parts.append(struct.pack("<II", 1 if v_trans else 0, n_layer))
    for il in range(n_layer):
        parts.append(struct.pack("<iQ", GGML_TYPE_F16, row * 2))
        parts.append(np.ascontiguousarray(k[il]).tobytes())
    for il in range(n_layer):
        if v_trans:
            parts.append(struct.pack("<iII", GGML_TYPE_F16, 2, v.shape[1]))
        else:
            parts.append(struct.pack("<iQ", GGML_TYPE_F16, v.shape[2] * 2))
        parts.append(np.ascontiguousarray(v[il]).tobytes())
    return b"".join(parts)
