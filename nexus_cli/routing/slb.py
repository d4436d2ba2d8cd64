"""The semantic lookaside buffer (SLB) file: every tool's INT8 vectors with their owners, scales and names.

Spec: docs/slb-format.md. `write_slb` and `read_slb` are the only code that knows the byte layout; the reader is pure
NumPy and validates the magic, version, both checksums and every section offset before it returns.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from ..errors import FormatError
from ..files import atomic_write_bytes

SLB_MAGIC = b"NXSLB\r\n\x1a"
SLB_VERSION = 1
SLB_HEADER_SIZE = 128
SLB_ALIGN = 64
_HEADER = struct.Struct("<8sHHIIIIIIQQQQQII")  # see docs/slb-format.md


def _align(n: int, a: int = SLB_ALIGN) -> int:
    return (n + a - 1) // a * a


def write_slb(path: Path, servers: Sequence[str], tool_server: Sequence[int], names: Sequence[str],
              owners: np.ndarray, scales: np.ndarray, vectors: np.ndarray) -> None:
    """Write the SLB file (atomically, inside the temporary index directory the build swaps into place)."""
    vectors = np.ascontiguousarray(vectors, dtype=np.int8)
    n_vec, dim = vectors.shape
    n_tools = len(names)
    owners = np.ascontiguousarray(owners, dtype="<u4")
    scales = np.ascontiguousarray(scales, dtype="<f4")
    if owners.shape != (n_vec,) or scales.shape != (n_vec,):
        raise ValueError("owners/scales do not match the vectors")
    strings = bytearray()
    for s in servers:
        b = s.encode("utf-8")
        strings += struct.pack("<H", len(b)) + b
    for si, nm in zip(tool_server, names):
        b = nm.encode("utf-8")
        strings += struct.pack("<HH", si, len(b)) + b
    strings_off = SLB_HEADER_SIZE
    owners_off = _align(strings_off + len(strings))
    scales_off = _align(owners_off + owners.nbytes)
    vectors_off = _align(scales_off + scales.nbytes)
    total = vectors_off + vectors.nbytes
    buf = bytearray(total)
    buf[strings_off : strings_off + len(strings)] = strings
    buf[owners_off : owners_off + owners.nbytes] = owners.tobytes()
    buf[scales_off : scales_off + scales.nbytes] = scales.tobytes()
    buf[vectors_off:total] = vectors.tobytes()
    payload_crc = zlib.crc32(bytes(buf[SLB_HEADER_SIZE:])) & 0xFFFFFFFF
    fields = [SLB_MAGIC, SLB_VERSION, SLB_HEADER_SIZE, dim, n_tools, n_vec, len(servers), 1, 0,
              strings_off, owners_off, scales_off, vectors_off, total, payload_crc, 0]
    head = bytearray(_HEADER.pack(*fields).ljust(SLB_HEADER_SIZE, b"\0"))
    fields[-1] = zlib.crc32(bytes(head)) & 0xFFFFFFFF
    head = _HEADER.pack(*fields).ljust(SLB_HEADER_SIZE, b"\0")
    buf[:SLB_HEADER_SIZE] = head
    atomic_write_bytes(path, bytes(buf))


@dataclass
class SLB:
    dim: int
    servers: list[str]
    tool_server: np.ndarray  # [n_tools] uint16 index into servers
    names: list[str]
    owners: np.ndarray  # [n_vec] uint32 tool index of each vector
    scales: np.ndarray  # [n_vec] float32
    vectors: np.ndarray  # [n_vec, dim] int8
    # the native per-tool scorer over these vectors (scoring.tool_scorer), made on first use
    scorer: object = field(default=None, init=False, repr=False, compare=False)

    @property
    def n_tools(self) -> int:
        return len(self.names)

    @property
    def n_vectors(self) -> int:
        return int(self.vectors.shape[0])


def read_slb(path: Path) -> SLB:
    """Read and validate an SLB file (pure NumPy)."""
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise FormatError(f"cannot read {path}: {e.strerror}") from None
    if len(data) < SLB_HEADER_SIZE or data[:8] != SLB_MAGIC:
        raise FormatError(f"{path} is not an SLB file (bad magic)")
    f = list(_HEADER.unpack_from(data, 0))
    (_m, version, hsize, dim, n_tools, n_vec, n_servers, flags, _res, s_off, o_off, sc_off, v_off, total, pcrc,
     hcrc) = f
    if version != SLB_VERSION:
        raise FormatError(f"{path}: SLB version {version} is not supported (this build reads {SLB_VERSION})")
    f[-1] = 0
    if zlib.crc32(_HEADER.pack(*f).ljust(SLB_HEADER_SIZE, b"\0")) & 0xFFFFFFFF != hcrc:
        raise FormatError(f"{path}: SLB header checksum mismatch")
    if total != len(data):
        raise FormatError(f"{path}: SLB file is {len(data)} bytes, header says {total} (truncated?)")
    if zlib.crc32(data[SLB_HEADER_SIZE:]) & 0xFFFFFFFF != pcrc:
        raise FormatError(f"{path}: SLB payload checksum mismatch")
    if not (hsize <= s_off <= o_off <= sc_off <= v_off <= total) or v_off + n_vec * dim != total:
        raise FormatError(f"{path}: SLB section offsets are inconsistent")
    pos = s_off
    servers = []
    for _ in range(n_servers):
        (ln,) = struct.unpack_from("<H", data, pos)
        servers.append(data[pos + 2 : pos + 2 + ln].decode("utf-8"))
        pos += 2 + ln
    names, tsrv = [], []
    for _ in range(n_tools):
        si, ln = struct.unpack_from("<HH", data, pos)
        if si >= n_servers:
            raise FormatError(f"{path}: tool server index out of range")
        tsrv.append(si)
        names.append(data[pos + 4 : pos + 4 + ln].decode("utf-8"))
        pos += 4 + ln
    if pos > o_off:
        raise FormatError(f"{path}: SLB string table overruns its section")
    owners = np.frombuffer(data, dtype="<u4", count=n_vec, offset=o_off).astype(np.int64)
    if n_vec and (owners.max() >= n_tools or np.any(np.diff(owners) < 0)):
        raise FormatError(f"{path}: SLB vector owners are out of range or not grouped by tool")
    scales = np.frombuffer(data, dtype="<f4", count=n_vec, offset=sc_off).astype(np.float32)
    vectors = np.frombuffer(data, dtype=np.int8, count=n_vec * dim, offset=v_off).reshape(n_vec, dim).copy()
    return SLB(dim=dim, servers=servers, tool_server=np.asarray(tsrv, dtype=np.int64), names=names, owners=owners,
               scales=scales, vectors=vectors)
