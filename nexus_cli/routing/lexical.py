"""The lexical half of the hybrid retriever: Okapi BM25 over each tool's token list (text.lex_tokens)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np


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
        # a token's postings as arrays, made when a query first uses it: a one-shot route reads a handful of tokens,
        # and converting every token's list up front was a quarter of loading a 955-tool index
        self._arrays: dict[str, tuple[np.ndarray, np.ndarray]] = {}

    def _postings(self, tok: str):
        arr = self._arrays.get(tok)
        if arr is None:
            p = self.postings.get(tok)
            if p is None:
                return None
            arr = self._arrays[tok] = (np.asarray([i for i, _ in p], dtype=np.int64), np.asarray([w for _, w in p]))
        return arr

    def scores(self, tokens: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.float64)
        for tok in set(tokens):
            arr = self._postings(tok)
            if arr is not None:
                out[arr[0]] += self.idf[tok] * arr[1]
        return out
