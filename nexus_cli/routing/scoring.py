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

SCAN_K = 256  # a tool with no vector among the SCAN_K best is scored as the SCAN_K-th best vector (see below)


def tool_scorer(slb: SLB) -> kernels.SlbToolScorer:
    """The SLB's native per-tool scorer, made once per SLB: it reads the vectors where they lie (no copy per
    request)."""
    if slb.scorer is None:
        # floor_k = SCAN_K keeps the scores of the top-SCAN_K scan this replaced, bit for bit: a tool none of whose
        # vectors is among the SCAN_K best is raised to the SCAN_K-th best score (an upper bound on its own)
        slb.scorer = kernels.SlbToolScorer(slb.vectors, slb.scales, slb.owners, slb.n_tools, floor_k=SCAN_K,
                                           base=-1.0)
    return slb.scorer


def dense_tool_scores(slb: SLB, qvec: np.ndarray) -> tuple[np.ndarray, float]:
    """Per-tool dense score = max over the tool's vectors of the INT8 score (kernels.SlbToolScorer: quantization,
    scan and per-tool reduction in one native call). Returns (scores[n_tools] float32, a copy; native call
    seconds)."""
    scorer = tool_scorer(slb)
    t0 = time.perf_counter()
    out = scorer.scores(qvec)
    dt = time.perf_counter() - t0
    return out.copy(), dt


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
                   vecs: Sequence[np.ndarray], dense_fn=None, tokens: Sequence[Sequence[str]] | None = None,
                   ) -> tuple[np.ndarray, float]:
    """Per-tool fused score of one request = the mean over its texts (request_texts) of dense max-sim + weighted
    BM25, in one native call (kernels.SlbToolScorer.request). Returns (scores, a copy; native call seconds).
    vecs: the texts' vectors, [texts, dim] (or a sequence of rows). tokens: each text's textgen.lex_tokens, when the
    caller has them. dense_fn: a dense step to fuse in Python instead (a benchmark passes the one the native call
    replaced: the same scores, bit for bit)."""
    use_lex = bm25 is not None and lex_weight > 0
    if tokens is None and use_lex:
        tokens = [bm25.tokens(t) for t in texts]
    if dense_fn is not None:
        total, native = None, 0.0
        for i, v in enumerate(vecs):
            dense, dt = dense_fn(slb, v)
            s = fuse(dense, bm25.scores(tokens[i]) if use_lex else None, lex_weight)
            total = s if total is None else total + s
            native += dt
        return total / len(vecs), native
    scorer = tool_scorer(slb)
    lexical = bm25.request_postings(tokens) if use_lex else None
    t0 = time.perf_counter()
    out = scorer.request(vecs, lexical, lex_weight if use_lex else 0.0)
    return out.copy(), time.perf_counter() - t0


def gate_margin(scores: np.ndarray, top: int, twins: Sequence[int] = ()) -> float:
    """The gate's margin: the top tool's score minus the best score of a tool that is neither it nor interchangeable
    with it (the same tool on another server: their score difference says nothing about ambiguity). inf when there
    is no such tool."""
    rest = np.array(scores, dtype=np.float64, copy=True)
    rest[[int(top), *[int(t) for t in twins]]] = -np.inf
    best_other = float(rest.max()) if len(rest) else -np.inf
    return float(scores[top]) - best_other if np.isfinite(best_other) else float("inf")


def rank(index, scores: np.ndarray, k: int) -> tuple[np.ndarray, float]:
    """The k best tools of an index (score descending, ties to the lower index: a stable sort) and the gate's margin
    of the first (gate_margin, its interchangeable copies excluded), in one native call (kernels.ToolRanker)."""
    return index.ranker(k).rank(scores)
