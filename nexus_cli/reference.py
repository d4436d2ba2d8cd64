"""NumPy reference implementations of every libnexus kernel. Slow and obvious on purpose: the tests compare the
native library against these."""

from __future__ import annotations

import numpy as np


def eff_pct(n_past: int, m: int = 256, r_base: float = 5.0, k: float = 4.0) -> float:
    """Eq. (2): the recompute percentage at depth n_past."""
    if n_past <= m:
        return float(r_base)
    pct = r_base + (n_past - m) / (m * (k - 1)) * (100.0 - r_base)
    return float(min(100.0, max(r_base, pct)))


def rope_rotate(k: np.ndarray, n_heads: int, head_dim: int, n_rot: int, rope_type: int, freq_base: float,
                freq_scale: float, delta: int) -> np.ndarray:
    """Rotate F16 rows [n_rows, n_heads*head_dim] in float64; returns float64 (no rounding back to F16)."""
    x = np.asarray(k).view(np.float16).astype(np.float64).reshape(-1, n_heads, head_dim)
    y = x.copy()
    half = n_rot // 2
    i = np.arange(half, dtype=np.float64)
    theta = float(delta) * float(np.float32(freq_scale)) * np.power(float(np.float32(freq_base)), -2.0 * i / n_rot)
    c, s = np.cos(theta), np.sin(theta)
    if rope_type == 0:  # NORM: adjacent pairs
        a, b = 2 * np.arange(half), 2 * np.arange(half) + 1
    elif rope_type == 2:  # NEOX: halves
        a, b = np.arange(half), np.arange(half) + half
    else:
        raise ValueError(f"rope_type must be 0 or 2, got {rope_type}")
    x0, x1 = x[..., a], x[..., b]
    y[..., a] = x0 * c - x1 * s
    y[..., b] = x0 * s + x1 * c
    return y.reshape(np.asarray(k).shape)


def rope_rotate_f16(k, n_heads, head_dim, n_rot, rope_type, freq_base, freq_scale, delta) -> np.ndarray:
    """The float64 rotation rounded once to F16 (returned as uint16 bits)."""
    if delta == 0 or n_rot == 0:
        return np.asarray(k).view(np.uint16).copy()
    return rope_rotate(k, n_heads, head_dim, n_rot, rope_type, freq_base, freq_scale, delta).astype(
        np.float16).view(np.uint16)


def f16_ulp_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in F16 units in the last place between two arrays of F16 bits (sign-magnitude ordered)."""
    def ordered(h):
        h = np.asarray(h).view(np.uint16).astype(np.int32)
        return np.where(h & 0x8000, -(h & 0x7FFF), h)
    return np.abs(ordered(a) - ordered(b))


def quantize_i8(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=np.float32)
    amax = np.max(np.abs(x), axis=1)
    scales = np.where(amax > 0, amax / np.float32(127), np.float32(1)).astype(np.float32)
    v = (x / scales[:, None]).astype(np.float64)  # the float32 quotient, exactly
    r = np.sign(v) * np.floor(np.abs(v) + 0.5)  # halves away from zero (exact in float64)
    return np.clip(r, -127, 127).astype(np.int8), scales


def slb_dots(db: np.ndarray, query: np.ndarray) -> np.ndarray:
    return (db.astype(np.int64) @ query.astype(np.int64)).astype(np.int32)


def slb_scores(db, db_scales, query_q, query_scale) -> np.ndarray:
    dots = slb_dots(db, query_q).astype(np.float32)
    sc = np.ones(db.shape[0], np.float32) if db_scales is None else np.asarray(db_scales, np.float32)
    return (dots * sc) * np.float32(query_scale)


def slb_topk(db, db_scales, query_q, query_scale, k) -> tuple[np.ndarray, np.ndarray]:
    scores = slb_scores(db, db_scales, query_q, query_scale)
    order = np.lexsort((np.arange(scores.size), -scores.astype(np.float64)))[:k]
    return order.astype(np.int64), scores[order]


def slb_topk_exact(db_f32, query_f32, k) -> tuple[np.ndarray, np.ndarray]:
    """The float32 rows ranked by their dot product with the float32 query, computed in float64, ties to the lower
    index: the answer nexus_slb_topk_exact must give whatever its INT8 shortlist was."""
    scores = np.asarray(db_f32, np.float64) @ np.asarray(query_f32, np.float64)
    order = np.lexsort((np.arange(scores.size), -scores))[:k]
    return order.astype(np.int64), scores[order].astype(np.float32)


def slb_tool_scores(db, db_scales, owners, n_tools, query_f32, floor_k=0, base=-1.0) -> np.ndarray:
    """Per-tool scores: the float32 query quantized, every row scored, each tool's best row, raised to the
    floor_k-th best row score (0 < floor_k < n) or else to base."""
    q, qs = quantize_i8(np.asarray(query_f32, dtype=np.float32).reshape(1, -1))
    scores = slb_scores(db, db_scales, q[0], float(qs[0]))
    keyed = np.where(np.isnan(scores), np.float32(-np.inf), scores)
    out = np.full(n_tools, -np.inf, dtype=np.float32)
    np.maximum.at(out, np.asarray(owners, dtype=np.int64), keyed)
    n = scores.size
    lowest = np.sort(keyed)[::-1][floor_k - 1] if 0 < floor_k < n else np.float32(base)
    return np.maximum(out, lowest).astype(np.float32)


def gelu(x) -> np.ndarray:
    """BERT's GELU, x * Phi(x) with the exact erf, in float64."""
    import math

    x = np.asarray(x, np.float64)
    return 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def linear_f16(x, w, bias=None, act=None) -> np.ndarray:
    """act(x @ w + bias) with float16 w [k, n], in float64, rounded once to float32."""
    y = np.asarray(x, np.float64) @ np.asarray(w).view(np.float16).astype(np.float64)
    if bias is not None:
        y = y + np.asarray(bias, np.float64)
    if act == "gelu":
        y = gelu(y)
    return y.astype(np.float32)


def layer_norm(x, gamma, beta, eps, residual=None) -> np.ndarray:
    """LayerNorm(x + residual) over the last axis, in float64, rounded once to float32."""
    v = np.asarray(x, np.float64) + (0.0 if residual is None else np.asarray(residual, np.float32).astype(np.float64))
    mu = v.mean(axis=-1, keepdims=True)
    var = ((v - mu) ** 2).mean(axis=-1, keepdims=True)
    return ((v - mu) / np.sqrt(var + eps) * np.asarray(gamma, np.float64) + np.asarray(beta, np.float64)).astype(
        np.float32)


class PyTrie:
    """A dict-of-dicts trie with the same contract as the native one."""

    def __init__(self):
        self.root: dict = {}
        self.n_sequences = 0
        self.n_nodes = 1

    def insert(self, tokens, value: int) -> None:
        if len(tokens) == 0:
            raise ValueError("empty sequence")
        node = self.root
        for t in tokens:
            if int(t) not in node:
                node[int(t)] = {}
                self.n_nodes += 1
            node = node[int(t)]
        if None not in node:
            self.n_sequences += 1
        node[None] = int(value)  # the None key holds the terminal value

    def next(self, prefix) -> tuple[list[int], int | None]:
        node = self.root
        for t in prefix:
            node = node.get(int(t))
            if node is None:
                return [], None
        return sorted(k for k in node if k is not None), node.get(None)
