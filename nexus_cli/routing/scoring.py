"""Query-time scoring: a request's per-tool scores from the SLB scan and BM25, and the gate's margin.

The index builder calibrates the gate with these same functions, so the router and the calibration score alike.
"""

from __future__ import annotations

import time
from typing import Sequence

import numpy as np

from .. import kernels, textgen
from .lexical import BM25
from .slb import SLB

SCAN_K = 256  # vectors kept by the native top-k scan (partial selection, not a full sort of every score)


def dense_tool_scores(slb: SLB, qvec: np.ndarray, k_vec: int | None = SCAN_K) -> tuple[np.ndarray, float]:
    """Per-tool dense score = max over the tool's vectors of the INT8 dot (native scan: kernels.slb_topk).

    Tools with no vector among the k_vec best get the k_vec-th score (an upper bound). Returns (scores[n_tools],
    scan seconds)."""
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


def gate_margin(scores: np.ndarray, top: int, twins: Sequence[int] = ()) -> float:
    """The gate's margin: the top tool's score minus the best score of a tool that is neither it nor interchangeable
    with it (the same tool on another server: their score difference says nothing about ambiguity). inf when there
    is no such tool."""
    rest = np.array(scores, dtype=np.float64, copy=True)
    rest[[int(top), *[int(t) for t in twins]]] = -np.inf
    best_other = float(rest.max()) if len(rest) else -np.inf
    return float(scores[top]) - best_other if np.isfinite(best_other) else float("inf")
