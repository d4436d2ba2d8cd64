"""The lexical half of the hybrid retriever: Okapi BM25 over each tool's token list (text.lex_tokens)."""

from __future__ import annotations

import math
from collections import Counter
from typing import Sequence

import numpy as np

from .. import kernels, textgen


def postings_of(docs: Sequence[Sequence[str]]) -> dict[str, list[int]]:
    """Each token's postings as lexical.json (format 4) stores them: [tool, term frequency, tool, tf, …], tools
    ascending."""
    out: dict[str, list[int]] = {}
    for i, d in enumerate(docs):
        for tok, tf in Counter(d).items():
            out.setdefault(tok, []).extend((i, tf))
    return out


def docs_of(doc_lengths: Sequence[int], postings: dict[str, list[int]]) -> list[list[str]]:
    """Token lists with the same term frequencies and lengths (the order within a list is not kept: BM25 does not
    read it), for a reader of the older format."""
    docs: list[list[str]] = [[] for _ in doc_lengths]
    for tok, flat in postings.items():
        for i, tf in zip(flat[0::2], flat[1::2]):
            docs[i].extend([tok] * tf)
    return docs


class BM25:
    """Okapi BM25 over per-tool token lists (k1=1.2, b=0.75).

    A token's postings (the tools that hold it, with their term weights) and its idf are made when a query first
    uses it, and kept: a one-shot route reads a handful of tokens. From an index's stored postings
    (`from_postings`, lexical.json format 4) that reads one list per token; from token lists (`BM25(docs)`: the
    index builder, and indexes of formats 2 and 3) it counts the token in every tool's list, ~1 ms a token at 955
    tools, which is why the index stores postings. Building every token's weights up front was 60 % of loading a
    955-tool index (80 of 133 ms)."""

    def __init__(self, docs: Sequence[Sequence[str]] | None = None, k1: float = 1.2, b: float = 0.75, *,
                 doc_lengths: Sequence[int] | None = None, postings: dict[str, list[int]] | None = None,
                 tokenizer: int | None = None):
        self.k1, self.b = k1, b
        # the textgen.lex_tokens version the documents were made with; a request is tokenized with the same
        self.tokenizer = textgen.LEX_TOKENIZER if tokenizer is None else tokenizer
        self._docs = list(docs) if docs is not None else None  # each document only needs .count(token)
        self._stored = postings
        if docs is not None:
            doc_lengths = [len(d) for d in self._docs]
        lens = np.asarray(doc_lengths if doc_lengths is not None else [], dtype=np.float64)
        self.n = int(lens.size)
        self.avgdl = float(lens.mean()) if self.n else 1.0
        self._norm = k1 * (1 - b + b * lens / max(self.avgdl, 1e-9))
        self._cache: dict[str, tuple | None] = {}
        self._records: dict[str, int] = {}  # each cached token's postings record address (0: no tool holds it)

    @classmethod
    def from_postings(cls, doc_lengths: Sequence[int], postings: dict[str, list[int]],
                      tokenizer: int | None = None) -> "BM25":
        return cls(doc_lengths=doc_lengths, postings=postings, tokenizer=tokenizer)

    def tokens(self, text: str) -> list[str]:
        """A request's tokens, made as this BM25's documents were."""
        return textgen.lex_tokens(text, self.tokenizer)

    def _counts(self, tok: str) -> tuple[np.ndarray, np.ndarray] | None:
        """(tool indices ascending, term frequencies) of a token, or None when no tool holds it."""
        if self._stored is not None:
            flat = self._stored.get(tok)
            if not flat:
                return None
            a = np.asarray(flat, dtype=np.int64).reshape(-1, 2)
            return np.ascontiguousarray(a[:, 0]), a[:, 1].astype(np.float64)  # contiguous: read by address
        idx, tfs = [], []
        for i, d in enumerate(self._docs):
            tf = d.count(tok)
            if tf:
                idx.append(i)
                tfs.append(tf)
        if not idx:
            return None
        return np.asarray(idx, dtype=np.int64), np.asarray(tfs, dtype=np.float64)

    def _postings(self, tok: str):
        """(tool indices, each tool's term score idf * weight, their postings record for the native scan, the
        record's address) of a token, or None when no tool holds it. Kept for the life of this BM25: the native scan
        reads the record and its arrays by address."""
        if tok in self._cache:
            return self._cache[tok]
        entry = None
        counts = self._counts(tok)
        if counts is not None:
            idx, tf = counts
            w = tf * (self.k1 + 1) / (tf + self._norm[idx])
            idf = math.log(1 + (self.n - len(idx) + 0.5) / (len(idx) + 0.5))
            term = idf * w  # a new float64 array; idx is contiguous int64 (_counts): both readable by address
            record = kernels.postings_record(idx, term)
            entry = (idx, term, record, record.ctypes.data)
        self._cache[tok] = entry
        self._records[tok] = entry[3] if entry is not None else 0
        return entry

    def request_postings(self, texts_tokens: Sequence[Sequence[str]]) -> tuple[list[int], list[int]]:
        """What the native request scan reads of several texts' BM25 (kernels.SlbToolScorer.request): the address
        of each token's postings record (kernels.postings_record, kept alive by this BM25; 0 for a token no tool
        holds), and where each text's tokens end."""
        records, ends = [], []
        lookup = self._records.__getitem__
        for tokens in texts_tokens:
            toks = sorted(set(tokens))  # scores()' order
            start = len(records)
            try:  # this runs on every request: one lookup per token in C, no test per token
                records.extend(map(lookup, toks))
            except KeyError:  # a token met for the first time: its postings made once, then read as the others
                del records[start:]
                for t in toks:
                    self._postings(t)
                records.extend(map(lookup, toks))
            ends.append(len(records))
        return records, ends

    def scores(self, tokens: Sequence[str]) -> np.ndarray:
        out = np.zeros(self.n, dtype=np.float64)
        for tok in sorted(set(tokens)):  # sorted: the same order of additions, so the same bits, in every process
            entry = self._postings(tok)
            if entry is not None:
                out[entry[0]] += entry[1]
        return out
