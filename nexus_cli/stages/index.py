"""`nexus index`: embed a tool registry into an INT8 semantic lookaside buffer (SLB), calibrate the margin gate, and
store every tool's compressed signature and argument grammar. Spec of the files: docs/routing.md.

An index directory holds
  manifest.json   format version, embedder, text recipe, fusion weights, gate (tau, fire rates), file digests
  slb.bin         the SLB: 128-byte header, servers, names, vector→tool owners, scales, INT8 vectors (little-endian)
  tools.json      per tool: server, name, description, signature, described signature, GBNF grammar, problems
  lexical.json    per tool BM25 token lists (the lexical half of the hybrid retriever)
  reranker/       optional: the locally trained cross-encoder (see stages/rerank.py)

It is written atomically: everything goes into a temporary sibling directory, which is renamed into place at the end
(an existing index is swapped out only after the new one is complete).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import random
import shutil
import struct
import tempfile
import time
import zlib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..errors import FormatError, NexusError
from ..registry import Tool, interchangeable_groups, interchangeable_map
from . import textgen

INDEX_FORMAT_VERSION = 1
SLB_MAGIC = b"NXSLB\r\n\x1a"
SLB_VERSION = 1
SLB_HEADER_SIZE = 128
SLB_ALIGN = 64
_HEADER = struct.Struct("<8sHHIIIIIIQQQQQII")  # see docs/routing.md, "SLB file"

DEFAULT_RECIPE = "multi"  # "doc": one vector per tool; "multi": doc + extra_texts (max-sim)
DEFAULT_LEX_WEIGHT = 0.20  # chosen by the ablation in docs/routing.md
DEFAULT_ADAPTER = False  # fused score = dense + w * bm25 / max(bm25)
GATE_PERCENTILE = 20.0
CALIBRATION_SEED = 1234
# Pairs at least this close are the same tool text (one tool in two server generations): nothing can separate them,
# so they say nothing about where a reranker helps, and their ~0 margins would drag τ down (all 955: 0.005 → 0.083).
DUPLICATE_COSINE = 0.99
# A request is scored as itself and as itself with its literal values masked (textgen.mask_values), the two fused
# score vectors averaged (docs/routing.md, "Request values"). Recorded in the manifest; older indexes score the
# request alone.
DEFAULT_VALUE_MASKING = True
# Bumped whenever the same tools would give a different index (caches of built indexes key on it). 2: τ leaves out
# exact duplicates. 3: requests (and the gate's probes) are also scored with their values masked. 4: example requests
# join their tool's BM25 document. 5: twelve examples per tool. 6: the gate's margin leaves out interchangeable tools
# (the same tool on another server, registry.interchangeable_groups).
BUILD_REVISION = 6
# Example requests (`nexus index --examples FILE.jsonl`) become extra vectors and BM25 words of their tool, at most
# this many per tool: what was written per tool (docs/routing.md, "Example requests").
EXAMPLES_PER_TOOL = 12


# ================================================================================================ SLB file


def _align(n: int, a: int = SLB_ALIGN) -> int:
    return (n + a - 1) // a * a


def write_slb(path: Path, servers: Sequence[str], tool_server: Sequence[int], names: Sequence[str],
              owners: np.ndarray, scales: np.ndarray, vectors: np.ndarray) -> None:
    """Write the SLB file (not atomic by itself: callers write into a temporary index directory)."""
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
    with open(path, "wb") as f:
        f.write(buf)
        f.flush()
        os.fsync(f.fileno())


@dataclass
class SLB:
    dim: int
    servers: list[str]
    tool_server: np.ndarray  # [n_tools] uint16 index into servers
    names: list[str]
    owners: np.ndarray  # [n_vec] uint32 tool index of each vector
    scales: np.ndarray  # [n_vec] float32
    vectors: np.ndarray  # [n_vec, dim] int8

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


# ================================================================================================ lexical (BM25)


class BM25:
    """Okapi BM25 over per-tool token lists (k1=1.2, b=0.75). Scores all tools for a query in O(query postings)."""

    def __init__(self, docs: Sequence[Sequence[str]], k1: float = 1.2, b: float = 0.75):
        self.n = len(docs)
        self.k1, self.b = k1, b
        lens = np.asarray([len(d) for d in docs], dtype=np.float64)
        self.avgdl = float(lens.mean()) if self.n else 1.0
        self.postings: dict[str, list[tuple[int, float]]] = {}
        norm = k1 * (1 - b + b * lens / max(self.avgdl, 1e-9))
        for i, d in enumerate(docs):
            for tok, tf in Counter(d).items():
                w = tf * (k1 + 1) / (tf + norm[i])
                self.postings.setdefault(tok, []).append((i, w))
        self.idf = {t: math.log(1 + (self.n - len(p) + 0.5) / (len(p) + 0.5)) for t, p in self.postings.items()}
        self._arrays = {t: (np.asarray([i for i, _ in p], dtype=np.int64), np.asarray([w for _, w in p]))
                        for t, p in self.postings.items()}

    def scores(self, tokens: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.float64)
        for tok in set(tokens):
            arr = self._arrays.get(tok)
            if arr is not None:
                out[arr[0]] += self.idf[tok] * arr[1]
        return out


# ================================================================================================ the loaded index


@dataclass
class ToolEntry:
    server: str
    name: str
    description: str
    signature: str
    described_signature: str
    grammar: str | None
    input_schema: dict
    problems: list[str] = field(default_factory=list)
    ok: bool = True
    examples: list[str] = field(default_factory=list)  # example requests (nexus index --examples); the reranker reads them

    @property
    def key(self) -> str:
        return f"{self.server}/{self.name}"


@dataclass
class Index:
    path: Path
    manifest: dict
    slb: SLB
    tools: list[ToolEntry]
    bm25: BM25 | None
    adapter: np.ndarray | None = None  # query-side linear map W [dim, dim] (adapter.npy), or None
    _twins: dict[int, tuple[int, ...]] | None = field(default=None, repr=False)

    def interchangeable(self, i: int) -> tuple[int, ...]:
        """The other tools that are the same tool on another server (registry.interchangeable_groups), or ()."""
        if self._twins is None:
            self._twins = interchangeable_map(self.tools)
        return self._twins.get(int(i), ())

    def query_vector(self, v: np.ndarray) -> np.ndarray:
        return apply_adapter(self.adapter, v)

    @property
    def tau(self) -> float:
        return float(self.manifest["gate"]["tau"])

    @property
    def embedder(self) -> str:
        """What to load as the query embedder: the index's own fine-tuned model if it has one, else the named one."""
        local = self.manifest["embedder"].get("path")
        return str(self.path / local) if local else self.manifest["embedder"]["name"]

    def lex_weight(self) -> float:
        return float(self.manifest["retrieval"].get("lex_weight", 0.0)) if self.bm25 is not None else 0.0

    @property
    def value_masking(self) -> bool:
        """Score requests also with their values masked (indexes built before this existed: False)."""
        return bool(self.manifest["retrieval"].get("value_masking", False))


def load_index(path: str | Path) -> Index:
    p = Path(path).expanduser()
    if not p.exists():
        recover_index_dir(p.absolute())
    if not p.exists():
        raise FormatError(f"index {p} does not exist", hint="build one with `nexus index REGISTRY --out DIR`")
    if not p.is_dir():
        raise FormatError(f"index {p} is not a directory")
    mpath = p / "manifest.json"
    if not mpath.is_file():
        raise FormatError(f"{p} is not a Nexus index (no manifest.json)", hint="build one with `nexus index`")
    try:
        manifest = json.loads(mpath.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(f"{mpath} is unreadable: {e}") from None
    if manifest.get("format") != "nexus-index" or manifest.get("version") != INDEX_FORMAT_VERSION:
        raise FormatError(f"{p}: index format {manifest.get('format')} v{manifest.get('version')} is not supported",
                          hint="rebuild it with `nexus index`")
    for fname, digest in manifest.get("files", {}).items():
        fp = p / fname
        if not fp.is_file():
            raise FormatError(f"index {p} is incomplete: {fname} is missing")
    slb = read_slb(p / "slb.bin")
    try:
        raw_tools = json.loads((p / "tools.json").read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(f"{p / 'tools.json'} is unreadable: {e}") from None
    tools = [ToolEntry(**t) for t in raw_tools]
    if len(tools) != slb.n_tools or any(t.name != n for t, n in zip(tools, slb.names)):
        raise FormatError(f"index {p}: tools.json does not match slb.bin")
    bm25 = None
    lp = p / "lexical.json"
    if lp.is_file():
        docs = json.loads(lp.read_text("utf-8"))["docs"]
        bm25 = BM25(docs)
    adapter = None
    ap = p / "adapter.npy"
    if ap.is_file():
        try:
            adapter = np.load(ap, allow_pickle=False)
        except (OSError, ValueError) as e:
            raise FormatError(f"{ap} is unreadable: {e}") from None
        if adapter.shape != (slb.dim, slb.dim) or adapter.dtype != np.float32:
            raise FormatError(f"{ap}: adapter is {adapter.dtype}{list(adapter.shape)}, expected float32[{slb.dim}, {slb.dim}]")
    return Index(path=p, manifest=manifest, slb=slb, tools=tools, bm25=bm25, adapter=adapter)


def apply_adapter(W: np.ndarray | None, v: np.ndarray) -> np.ndarray:
    """normalize(W v) for one vector [d] or rows [n, d]; identity when W is None."""
    if W is None:
        return v
    out = v @ W.T
    norm = np.linalg.norm(out, axis=-1, keepdims=True)
    return np.ascontiguousarray(out / np.maximum(norm, 1e-12), dtype=np.float32)


# ================================================================================================ scoring


SCAN_K = 256  # vectors kept by the native top-k scan (partial selection, not a full sort of every score)


def dense_tool_scores(slb: SLB, qvec: np.ndarray, k_vec: int | None = SCAN_K) -> tuple[np.ndarray, float]:
    """Per-tool dense score = max over the tool's vectors of the INT8 dot (native scan: kernels.slb_topk).

    Tools with no vector among the k_vec best get the k_vec-th score (an upper bound). Returns (scores[n_tools],
    scan seconds)."""
    from .. import kernels

    q, qs = kernels.quantize_i8(np.ascontiguousarray(qvec.reshape(1, -1), dtype=np.float32))
    k = slb.n_vectors if k_vec is None else min(int(k_vec), slb.n_vectors)
    t0 = time.perf_counter()
    idx, sc = kernels.slb_topk(slb.vectors, slb.scales, q[0], float(qs[0]), k)
    dt = time.perf_counter() - t0
    idx = np.asarray(idx, dtype=np.int64)
    sc = np.asarray(sc, dtype=np.float32)
    floor = float(sc[-1]) if len(sc) and k < slb.n_vectors else -1.0
    out = np.full(slb.n_tools, floor, dtype=np.float32)
    np.maximum.at(out, slb.owners[idx], sc)
    return out, dt


def fuse(dense: np.ndarray, lex: np.ndarray | None, lex_weight: float) -> np.ndarray:
    if lex is None or lex_weight <= 0:
        return dense.astype(np.float64)
    m = float(lex.max())
    return dense.astype(np.float64) + (lex_weight * lex / m if m > 0 else 0.0)


def request_texts(text: str, value_masking: bool) -> list[str]:
    """The texts one request is scored as: itself, and (value_masking) itself with its values masked, when that
    differs."""
    if not value_masking:
        return [text]
    masked = textgen.mask_values(text)
    return [text] if masked == text or not masked.strip() else [text, masked]


def request_scores(slb: SLB, bm25: BM25 | None, lex_weight: float, texts: Sequence[str],
                   vecs: Sequence[np.ndarray]) -> tuple[np.ndarray, float]:
    """Per-tool fused score of one request = the mean over its texts (request_texts) of dense max-sim + weighted
    BM25. Returns (scores, native scan seconds)."""
    total, native = None, 0.0
    for text, v in zip(texts, vecs):
        dense, dt = dense_tool_scores(slb, v)
        lex = bm25.scores(textgen.lex_tokens(text)) if bm25 is not None and lex_weight > 0 else None
        s = fuse(dense, lex, lex_weight)
        total = s if total is None else total + s
        native += dt
    return total / len(texts), native


# ================================================================================================ building


@dataclass
class BuildReport:
    out: Path
    n_tools: int
    n_vectors: int
    n_servers: int
    dim: int
    tau: float
    fire_rate: float
    seconds: dict
    problems: dict  # tool key -> reasons
    reranker: dict | None = None
    finetuned: dict | None = None
    examples: dict | None = None
    interchangeable: list[list[str]] = field(default_factory=list)  # groups of the same tool on several servers

    def as_json(self) -> dict:
        return {
            "out": str(self.out), "n_tools": self.n_tools, "n_vectors": self.n_vectors, "n_servers": self.n_servers,
            "dim": self.dim, "gate": {"tau": self.tau, "fire_rate": self.fire_rate},
            "seconds": self.seconds, "schema_problems": self.problems, "reranker": self.reranker,
            "finetuned": self.finetuned, "examples": self.examples, "interchangeable": self.interchangeable,
        }


def compile_specs(tools: Sequence[Tool]) -> list[ToolEntry]:
    """Signature and grammar of every tool via nexus_cli.schema; a schema that fails records its reason."""
    try:
        from .. import schema as schema_mod
    except Exception as e:  # noqa: BLE001 - the module is owned elsewhere; routing must still work without it
        schema_mod = None
        import_err = f"schema compiler unavailable: {type(e).__name__}: {e}"
    out = []
    for t in tools:
        problems = list(t.problems)
        sig, described, gram, ok = f"{t.name}()", f"{t.name}()", None, True
        if schema_mod is None:
            problems.append(import_err)
            ok = False
        else:
            try:
                spec = schema_mod.compile_tool(t)
                sig, described, gram, ok = spec.signature, spec.described_signature or spec.signature, spec.grammar, spec.ok
                problems += [p for p in spec.problems if p not in problems]
            except Exception as e:  # noqa: BLE001 - one schema must never stop the registry
                problems.append(f"schema: {type(e).__name__}: {e}")
                ok = False
        out.append(ToolEntry(server=t.server, name=t.name, description=t.description, signature=sig,
                             described_signature=described, grammar=gram, input_schema=t.input_schema,
                             problems=problems, ok=ok))
    return out


def doc_text_for(tool) -> str:
    return textgen.doc_text(tool)


def tool_texts(tool, recipe: str) -> list[str]:
    """The texts embedded for a tool from its own name and description, main text first."""
    if recipe == "doc":
        return [textgen.doc_text(tool)]
    if recipe == "multi":
        return [textgen.doc_text(tool)] + textgen.extra_texts(tool)
    raise NexusError(f"unknown text recipe '{recipe}' (doc, multi)")


def match_examples(tools: Sequence[Tool], examples: dict[str, list[str]] | None) -> tuple[list[list[str]], dict | None]:
    """Each tool's example requests (at most EXAMPLES_PER_TOOL) and the record for the manifest: how many were used,
    and the example keys that name no tool of this registry (an examples file may cover more servers)."""
    if not examples:
        return [[] for _ in tools], None
    keys = {t.key for t in tools}
    per_tool = [list(examples.get(t.key, []))[:EXAMPLES_PER_TOOL] for t in tools]
    unmatched = sorted(k for k in examples if k not in keys)
    return per_tool, {"per_tool_max": EXAMPLES_PER_TOOL, "n_requests": sum(len(x) for x in per_tool),
                      "n_tools_with": sum(1 for x in per_tool if x), "n_unmatched_tools": len(unmatched),
                      "unmatched_sample": unmatched[:5]}


def gate_margin(scores: np.ndarray, top: int, twins: Sequence[int] = ()) -> float:
    """The gate's margin: the top tool's score minus the best score of a tool that is neither it nor interchangeable
    with it (the same tool on another server: their score difference says nothing about ambiguity). inf when there
    is no such tool."""
    rest = np.array(scores, dtype=np.float64, copy=True)
    rest[[int(top), *[int(t) for t in twins]]] = -np.inf
    best_other = float(rest.max()) if len(rest) else -np.inf
    return float(scores[top]) - best_other if np.isfinite(best_other) else float("inf")


def adversarial_pairs(doc_vecs: np.ndarray, closer_fraction: float = 0.5,
                      duplicate_cosine: float = DUPLICATE_COSINE) -> list[tuple[int, int]]:
    """Near-neighbour tool pairs: each tool with its nearest neighbour (cosine of the main vectors), kept when that
    cosine is in the closer `closer_fraction` of all nearest-neighbour cosines (every tool has *a* nearest neighbour;
    the adversarial ones are the near-duplicates: list/search/get, per-field updates beside a general write) and
    below `duplicate_cosine` (exact duplicates, the same tool in two server generations, are left out).
    Deduplicated as unordered pairs."""
    n = doc_vecs.shape[0]
    if n < 2:
        return []
    sims = doc_vecs @ doc_vecs.T
    np.fill_diagonal(sims, -np.inf)
    nn = np.argmax(sims, axis=1)
    nn_cos = sims[np.arange(n), nn]
    cut = np.quantile(nn_cos, 1.0 - closer_fraction) if closer_fraction < 1.0 else -np.inf
    pairs = sorted({(min(i, int(j)), max(i, int(j))) for i, j in enumerate(nn)
                    if cut <= nn_cos[i] < duplicate_cosine})
    return pairs


def calibrate_gate(tools: Sequence[Tool], doc_vecs: np.ndarray, slb: SLB, bm25: BM25 | None, lex_weight: float,
                   encode: Callable[[list[str]], np.ndarray], percentile: float = GATE_PERCENTILE,
                   seed: int = CALIBRATION_SEED, probes_per_tool: int = 2,
                   value_masking: bool = DEFAULT_VALUE_MASKING) -> dict:
    """τ = P20 of top-1/top-2 margins of probe queries of the tools in adversarial (nearest-neighbour) pairs.

    Probe queries come from each paired tool's own name/description (textgen.probe_queries, seeded), never from
    evaluation data. Fire rate = share of those probes whose margin is below τ (≈ the percentile by construction),
    plus the fire rate over probes of every tool (what a registry-wide mix of requests would see)."""
    rng = random.Random(seed)
    pairs = adversarial_pairs(doc_vecs)
    twins = interchangeable_map(tools)
    in_pair = sorted({i for p in pairs for i in p})
    probe_tool, probes = [], []
    for i in range(len(tools)):
        for q in textgen.probe_queries(tools[i], rng, probes_per_tool):
            probe_tool.append(i)
            probes.append(q)
    if not probes:
        return {"tau": 0.0, "fire_rate": 0.0, "n_pairs": 0, "n_probes": 0}
    texts = [request_texts(q, value_masking) for q in probes]
    flat = list(dict.fromkeys(t for ts in texts for t in ts))
    row = {t: i for i, t in enumerate(flat)}
    qv = encode(flat)
    margins = np.zeros(len(probes))
    hits = np.zeros(len(probes), dtype=bool)
    for j in range(len(probes)):
        s, _ = request_scores(slb, bm25, lex_weight, texts[j], [qv[row[t]] for t in texts[j]])
        top = int(np.argmax(s))
        margins[j] = gate_margin(s, top, twins.get(top, ()))  # as the router measures it
        hits[j] = top == probe_tool[j] or top in twins.get(probe_tool[j], ())
    pt = np.asarray(probe_tool)
    adv = np.isin(pt, in_pair)
    adv_m = margins[adv] if adv.any() else margins
    finite_m = adv_m[np.isfinite(adv_m)]  # inf: a probe whose tool has no rival but its own twins
    tau = float(np.percentile(finite_m, percentile)) if len(finite_m) else 0.0
    return {
        "tau": tau,
        "percentile": percentile,
        "fire_rate": float(np.mean(adv_m < tau)) if len(adv_m) else 0.0,
        "fire_rate_all_probes": float(np.mean(margins < tau)),
        "n_pairs": len(pairs),
        "n_probes": int(adv.sum()),
        "n_probes_all": len(probes),
        "probe_top1_all": float(hits.mean()),
        "probe_top1_below_tau": float(hits[margins < tau].mean()) if np.any(margins < tau) else None,
        "probe_top1_above_tau": float(hits[margins >= tau].mean()) if np.any(margins >= tau) else None,
        "seed": seed,
        "probes_per_tool": probes_per_tool,
        "duplicate_cosine": DUPLICATE_COSINE,
        "value_masking": value_masking,
    }


def train_query_adapter(tools: Sequence[Tool], slb: SLB, embedder, n_queries: int = 4, steps: int = 200,
                        l2: float = 0.1, seed: int = 7, progress=None) -> tuple[np.ndarray, dict]:
    """Learn the query-side linear adapter from registry-derived requests (textgen.training_queries, seed 7: not the
    gate's probes) against the index's own dequantized vectors. Returns (W, manifest record)."""
    from ..adapters.embedder import train_linear_adapter

    rng = random.Random(seed)
    qs, targets = [], []
    for i, t in enumerate(tools):
        for q in textgen.training_queries(t, rng, n_queries):
            qs.append(q)
            targets.append(i)
    if progress:
        progress("adapter: embedding requests", 0, len(qs))
    done = [0]

    def _cb(n):
        done[0] += n
        if progress:
            progress("adapter: embedding requests", done[0], len(qs))

    qv = embedder.encode(qs, batch_size=64, callback=_cb, role="query")
    deq = slb.vectors.astype(np.float32) * slb.scales[:, None]
    W, log = train_linear_adapter(qv, deq, slb.owners, targets, slb.n_tools, steps=steps, l2=l2, seed=seed)
    log.update({"data": "textgen.training_queries (registry only)", "seed": seed, "queries_per_tool": n_queries,
                "kind": "query-side linear map, init identity, softmax over max-sim tool scores"})
    return W, log


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_json(path: Path, obj: Any) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, indent=None, separators=(",", ":"))
        f.flush()
        os.fsync(f.fileno())


def build_index(tools: Sequence[Tool], out: str | Path, embedder=None, embedder_name: str = "minilm",
                recipe: str = DEFAULT_RECIPE, lexical: bool = True, lex_weight: float = DEFAULT_LEX_WEIGHT,
                train_reranker: bool = False, reranker_options: dict | None = None,
                finetune: bool = False, finetune_options: dict | None = None,
                adapter: bool = DEFAULT_ADAPTER, adapter_options: dict | None = None,
                value_masking: bool = DEFAULT_VALUE_MASKING, examples: dict[str, list[str]] | None = None,
                progress: Callable[[str, int, int], None] | None = None, sources: Sequence[str] = ()) -> BuildReport:
    """Build an index for `tools` into directory `out` atomically. `progress(stage, done, total)` is optional.
    `examples` ({"server/tool": [request, ...]}, registry.load_example_requests) adds requests as extra vectors."""
    from .. import __version__

    if not tools:
        raise FormatError("the registry holds no tools")
    out = Path(out).expanduser().resolve()
    recover_index_dir(out)
    if out.exists() and not out.is_dir():
        raise NexusError(f"--out {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise NexusError(f"--out {out} is a non-empty directory that is not a Nexus index; refusing to replace it")
    report_progress = progress or (lambda *_: None)
    secs: dict[str, float] = {}
    t_all = time.perf_counter()

    if embedder is None:
        from ..adapters.embedder import Embedder

        t0 = time.perf_counter()
        embedder = Embedder(embedder_name)
        secs["load_embedder"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    entries = compile_specs(tools)
    secs["schemas"] = time.perf_counter() - t0

    tool_examples, examples_info = match_examples(tools, examples)
    for entry, own in zip(entries, tool_examples):
        entry.examples = list(own)
    ft_info = None
    ft_dir = None
    if finetune:
        # Fine-tune the bi-encoder on the example requests when there are any, else on registry-derived requests
        # (hard negatives from the base model's confusions); save it into the index and embed everything with it.
        from . import rerank

        t0 = time.perf_counter()
        ft_dir = Path(tempfile.mkdtemp(prefix=".finetune-", dir=Path(out).parent if Path(out).parent.exists() else None))
        try:
            ft_info = rerank.finetune_embedder(tools, embedder, ft_dir, progress=report_progress,
                                               examples=tool_examples if examples_info else None,
                                               **(finetune_options or {}))
        except BaseException:
            shutil.rmtree(ft_dir, ignore_errors=True)
            raise
        from ..adapters.embedder import Embedder

        embedder = Embedder(str(ft_dir))
        secs["finetune"] = time.perf_counter() - t0

    # texts and owners (vectors grouped by tool, main vector first)
    texts, owners, is_request = [], [], []
    for i, t in enumerate(tools):
        for flag, group in ((False, tool_texts(t, recipe)), (True, tool_examples[i])):
            texts.extend(group)
            owners.extend([i] * len(group))
            is_request.extend([flag] * len(group))
    t0 = time.perf_counter()
    done = [0]

    def _cb(n):
        done[0] += n
        report_progress("embedding", done[0], len(texts))

    report_progress("embedding", 0, len(texts))
    # Tool texts are documents; example requests are embedded as queries, like the requests they stand for (the same
    # thing for MiniLM; models with query/document prompts differ). Each group is sorted by length so batches pad
    # little (long descriptions together), then the order is restored.
    vecs = None
    for role, flag in (("document", False), ("query", True)):
        rows = np.asarray([j for j, r in enumerate(is_request) if r == flag], dtype=np.int64)
        if not len(rows):
            continue
        order = rows[np.argsort([len(texts[j]) for j in rows], kind="stable")]
        part = embedder.encode([texts[j] for j in order], batch_size=32, callback=_cb, role=role)
        if vecs is None:
            vecs = np.empty((len(texts), part.shape[1]), dtype=part.dtype)
        vecs[order] = part
    secs["embed"] = time.perf_counter() - t0

    from .. import kernels

    t0 = time.perf_counter()
    q, scales = kernels.quantize_i8(np.ascontiguousarray(vecs, dtype=np.float32))
    secs["quantize"] = time.perf_counter() - t0

    servers = textgen.unique(t.server for t in tools)
    sidx = {s: i for i, s in enumerate(servers)}
    if len(servers) > 65535:
        raise NexusError("more than 65535 servers in one index")
    slb = SLB(dim=int(vecs.shape[1]), servers=servers, tool_server=np.asarray([sidx[t.server] for t in tools]),
              names=[t.name for t in tools], owners=np.asarray(owners, dtype=np.int64), scales=np.asarray(scales),
              vectors=np.asarray(q))
    lex_docs = [textgen.lexical_doc(t, examples=own) for t, own in zip(tools, tool_examples)] if lexical else None
    bm25 = BM25(lex_docs) if lex_docs is not None else None

    W, adapter_info = None, None
    if adapter:
        t0 = time.perf_counter()
        W, adapter_info = train_query_adapter(tools, slb, embedder, progress=report_progress, **(adapter_options or {}))
        secs["adapter"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    main_rows = np.asarray([owners.index(i) for i in range(len(tools))])
    report_progress("calibrating", 0, 1)
    gate = calibrate_gate(tools, vecs[main_rows], slb, bm25, lex_weight if lexical else 0.0,
                          lambda qs: apply_adapter(W, embedder.encode(qs, batch_size=64, role="query")),
                          value_masking=value_masking)
    report_progress("calibrating", 1, 1)
    secs["calibrate"] = time.perf_counter() - t0
    # fine-tuned on example requests, in this build or before (an --embedder folder a fine-tuning wrote): the
    # router's `auto` reranker then stays off (docs/routing.md, "Example requests")
    from .rerank import finetune_record

    examples_finetuned = bool((finetune_record(getattr(embedder, "path", None)) or {}).get("on_examples"))

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        (tmp / ".owner").write_text(str(os.getpid()))
    except OSError as e:
        raise NexusError(f"cannot write the index next to {out}: {e.strerror or e}") from None
    try:
        write_slb(tmp / "slb.bin", servers, [sidx[t.server] for t in tools], [t.name for t in tools],
                  slb.owners, slb.scales, slb.vectors)
        _write_json(tmp / "tools.json", [e.__dict__ for e in entries])
        if lex_docs is not None:
            _write_json(tmp / "lexical.json", {"tokenizer": "textgen.lex_tokens/v1", "docs": lex_docs})
        if W is not None:
            with open(tmp / "adapter.npy", "wb") as f:
                np.save(f, W.astype(np.float32), allow_pickle=False)
                f.flush()
                os.fsync(f.fileno())
        if ft_dir is not None:
            shutil.move(str(ft_dir), str(tmp / "embedder"))
            ft_dir = None
        rr_info = None
        if train_reranker:
            from . import rerank

            t0 = time.perf_counter()
            rr_info = rerank.train_cross_encoder(tools, slb, bm25, lex_weight if lexical else 0.0, embedder,
                                                 tmp / "reranker", progress=report_progress,
                                                 **(reranker_options or {}))
            secs["train_reranker"] = time.perf_counter() - t0
        files = {p.name: _sha256(p) for p in sorted(tmp.iterdir()) if p.is_file() and p.name != ".owner"}
        manifest = {
            "format": "nexus-index",
            "version": INDEX_FORMAT_VERSION,
            "nexus_version": __version__,
            "created_unix": int(time.time()),
            "sources": list(sources),
            "n_tools": len(tools),
            "n_vectors": int(len(texts)),
            "n_servers": len(servers),
            "embedder": {"name": embedder_name, "dim": int(vecs.shape[1]), "normalized": True,
                         "finetuned": ft_info, "path": "embedder" if ft_info else None,
                         "examples_finetuned": examples_finetuned,
                         "prompts": dict(getattr(embedder, "prompts", None) or {})},
            "recipe": {
                "name": recipe,
                "doc": "readable name (abbreviations expanded) + raw name + first 48 words of the description",
                "extra": "multi: + readable name, first/second description sentence (boilerplate stripped), "
                         "name + required parameters; tool score = max over its vectors" if recipe == "multi" else None,
                "examples": examples_info,
            },
            "quantization": {"kind": "int8-symmetric-per-vector", "kernel": "nexus_quantize_i8"},
            "retrieval": {"lexical": bool(lexical), "lex_weight": float(lex_weight if lexical else 0.0),
                          "fusion": "dense_max + lex_weight * bm25 / max(bm25)",
                          "value_masking": bool(value_masking),
                          "request": "mean of the fused scores of the request and of the request with its values "
                                     "masked (textgen.mask_values)" if value_masking else "the request as written"},
            "gate": gate,
            "adapter": adapter_info,
            "reranker": rr_info,
            "schema_failures": sum(1 for e in entries if not e.ok),
            "files": files,
        }
        _write_json(tmp / "manifest.json", manifest)
        _swap_into_place(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if ft_dir is not None:
            shutil.rmtree(ft_dir, ignore_errors=True)
        if isinstance(e, OSError):  # full disk, read-only folder, ...: one line, nothing left behind
            raise NexusError(f"cannot write the index to {out}: {e.strerror or e}") from None
        raise
    secs["total"] = time.perf_counter() - t_all
    return BuildReport(out=out, n_tools=len(tools), n_vectors=len(texts), n_servers=len(servers),
                       dim=int(vecs.shape[1]), tau=gate["tau"], fire_rate=gate["fire_rate"],
                       seconds={k: round(v, 3) for k, v in secs.items()},
                       problems={e.key: e.problems for e in entries if e.problems}, reranker=rr_info,
                       finetuned=ft_info, examples=examples_info,
                       interchangeable=[[tools[i].key for i in g] for g in interchangeable_groups(tools)])


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_index_dir(out: Path) -> None:
    """Repair what a killed `nexus index` can leave next to `out`: if it died between the two renames of the swap,
    `out` is missing and the previous index sits in `.NAME.old-PID`: move it back. Leftover temporary and old
    directories of dead processes are removed."""
    parent = out.parent
    if not parent.is_dir():
        return
    olds = sorted(parent.glob(f".{out.name}.old-*"), key=lambda q: q.stat().st_mtime, reverse=True)
    if not out.exists():
        for old in olds:
            if (old / "manifest.json").is_file():
                os.replace(old, out)
                break
    for stale in list(parent.glob(f".{out.name}.old-*")) + list(parent.glob(f".{out.name}.tmp-*")):
        pid_part = stale.name.rsplit("-", 1)[-1]
        if stale.name.startswith(f".{out.name}.old-") and pid_part.isdigit() and _pid_alive(int(pid_part)):
            continue
        if stale.name.startswith(f".{out.name}.tmp-") and (stale / ".owner").is_file():
            owner = (stale / ".owner").read_text().strip()
            if owner.isdigit() and _pid_alive(int(owner)):
                continue
        shutil.rmtree(stale, ignore_errors=True)


def _swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished temporary directory onto `out`; an existing index is moved aside first and removed after.
    A kill between the two renames is repaired by recover_index_dir() on the next load or build."""
    os.chmod(tmp, 0o755)
    (tmp / ".owner").unlink(missing_ok=True)
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
