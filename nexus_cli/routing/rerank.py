"""Rerankers for escalated routing decisions: the local LLM reads the top candidates.

* `LikelihoodReranker` (the default on escalation): the LLM scores the request's tokens as a continuation of each
  candidate's description (query likelihood, nothing trained), fused with the retriever's order by reciprocal ranks.
* `LLMReranker` (`--reranker llm`): the LLM reads the request and the candidates (name + first description
  sentence) and answers with one name; decoding is constrained token by token to the native tool-name trie
  (kernels.Trie), so it can only emit a candidate.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from .. import kernels, textgen
from ..adapters.llama import log_softmax
from ..prefix_store import PrefixStore

# Candidates each reranker sees by default. The likelihood reranker's cost grows with its candidates (the request is
# decoded once per candidate): over the top 5 it reached the same top-1 as over the top 10 at half the cost, and
# scoring the value-masked request over the top 4 the same again at 0.55x the cost of the top 5 (docs/routing.md).
RERANK_K = {"likelihood": 4, "llm": 10}


class LLMReranker:
    """Let the LLM pick one of the candidates; the output is constrained to the candidates' names by the native trie.

    Scores: the chosen candidate gets 1.0 + its base score, the others their base score minus 1 (so the order of
    the rest is the retriever's)."""

    name = "llm"
    SEQ = 1  # its own KV sequence: sequence 0 belongs to argument generation (which keeps a warm prefix there)

    def __init__(self, ctx, index=None, max_desc_words: int = 18):
        self.ctx = ctx
        self.max_desc_words = max_desc_words
        self._eog = None

    def _prompt(self, query: str, entries: Sequence) -> list[int]:
        lines = []
        for e in entries:
            desc = textgen.truncate_words(textgen.first_sentence(e.description) or e.description, self.max_desc_words)
            lines.append(f"- {e.name}: {desc}")
        system = ("You choose the one tool that fulfils the user's request. Answer with the tool name only, exactly "
                  "as written in the list.")
        user = "Tools:\n" + "\n".join(lines) + f"\n\nRequest: {query}\nTool:"
        return self.ctx.model.chat_tokens([{"role": "system", "content": system}, {"role": "user", "content": user}])

    def choose(self, query: str, entries: Sequence) -> int:
        trie = kernels.Trie()
        seqs = {}
        for j, e in enumerate(entries):
            toks = self.ctx.tokenize(e.name, add_special=False, parse_special=False)
            if tuple(toks) not in seqs and toks:
                seqs[tuple(toks)] = j
                trie.insert(toks, j)
        prompt = self._prompt(query, entries)
        seq = self.SEQ
        self.ctx.seq_rm(seq)
        self.ctx.decode(prompt, 0, seq_id=seq)
        pos = len(prompt)
        prefix: list[int] = []
        for _ in range(64):
            allowed, terminal = trie.next(prefix)
            allowed = list(allowed)
            if terminal is not None and terminal >= 0 and not allowed:
                return int(terminal)
            logits = self.ctx.logits()
            best_tok, best_val = None, -np.inf
            for t in allowed:
                if logits[t] > best_val:
                    best_tok, best_val = int(t), float(logits[t])
            if terminal is not None and terminal >= 0:
                # the name may end here: stop if the model prefers ending (any end-of-generation token) to going on
                eog = max(float(logits[t]) for t in self._eog_tokens())
                if eog >= best_val:
                    return int(terminal)
            if best_tok is None:
                break
            prefix.append(best_tok)
            self.ctx.decode([best_tok], pos, seq_id=seq)
            pos += 1
        return 0

    def _eog_tokens(self) -> list[int]:
        if self._eog is None:
            cands = self.ctx.tokenize("<|im_end|>", add_special=False, parse_special=True)
            nl = self.ctx.tokenize("\n", add_special=False, parse_special=False)
            self._eog = [t for t in cands + nl[-1:] if self.ctx.model.is_eog(t) or t in nl]
            if not self._eog:
                self._eog = nl[-1:]
        return self._eog

    def score(self, query: str, entries: Sequence, base_scores: Sequence[float]) -> list[float]:
        j = self.choose(query, entries)
        return [float(b) + (1.0 if i == j else -1.0) for i, b in enumerate(base_scores)]


class LikelihoodReranker:
    """Query likelihood: how probable the LLM finds the request as a continuation of each candidate's description.

    Each candidate is read as `Tool: <readable name> (<name>), server <server>` + `Description: <first 40 words>` +
    `A user request this tool handles:`, and the request's tokens are scored under it (mean log-probability per
    token). The LLM judges every candidate on its own, so "close it as not planned" can match "update issue state
    (open/closed, state_reason …)" with no shared word: the knowledge the embedder lacks. The final order fuses the
    retriever's rank and the likelihood rank by reciprocal-rank fusion (k = RRF_K, the literature's default, fixed a
    priori: neither signal alone is trusted over the other).

    Cost: a candidate's description prefix is decoded once and its KV state and next-token distribution kept (an LRU
    of `cache_size` tools), so a reranked decision decodes only the request's tokens once per candidate, all
    candidates in one batch. It uses sequences SEQ and up (sequence 0 keeps argument generation's warm prefix)."""

    name = "likelihood"
    SEQ = 2  # sequence 0: argument generation's warm prefix; 1: the llm reranker
    RRF_K = 60
    DESC_WORDS = 40
    MAX_QUERY_TOKENS = 128  # a longer request is scored on its start (the cost grows with its length × candidates)
    CUE = "A user request this tool handles:"
    PREFIX_EXAMPLES = 4  # a tool's first examples in its prefix; more lengthen every uncached prefix's decode

    def __init__(self, ctx, cache_size: int = 256, mask_values: bool = True, store: PrefixStore | None = None):
        self.ctx = ctx
        self.cache_size = cache_size
        self.mask_values = mask_values
        self.store = store  # prefixes decoded by earlier processes (PrefixStore), or None
        self._prefix: dict[tuple[str, str], tuple[bytes, np.ndarray, int]] = {}  # see _cached_prefixes

    def prefix_text(self, entry) -> str:
        """The candidate as the LLM reads it; the tool's example requests (if the index has them) come as earlier
        requests of the same form, value-masked like the request that is scored after them."""
        desc = textgen.truncate_words(textgen.clean_description(entry.description or ""), self.DESC_WORDS)
        shots = "".join(f"{self.CUE} {self.scored_text(q)}\n" for q in entry.examples[:self.PREFIX_EXAMPLES])
        return (f"Tool: {textgen.readable_name(entry.name)} ({entry.name}), server {entry.server}\n"
                f"Description: {desc}\n{shots}{self.CUE}")

    def _cached_prefixes(self, entries: Sequence) -> list[tuple[bytes, np.ndarray, int]]:
        """Per entry: (KV state of its whole prefix, log-probabilities of the next token after it as float16, its
        length). Keeping the next-token distribution (300 KB for Qwen's 152k vocabulary, beside a ~0.7 MB KV state)
        means a decision decodes only the request's tokens, not the prefix's last token again for every candidate.
        The prefixes not cached yet are decoded together, one sequence each (0.83x decoding them one by one)."""
        keys = [(e.server, e.name) for e in entries]
        missing = [k for k, key in enumerate(keys) if key not in self._prefix and key not in keys[:k]]
        fresh: dict[tuple[str, str], tuple[bytes, np.ndarray, int]] = {}
        texts = {k: self.prefix_text(entries[k]) for k in missing}
        stored: dict[int, str] = {}
        if self.store is not None and missing:
            left = []
            for k in missing:
                skey = stored[k] = PrefixStore.key(self.ctx, texts[k])
                hit = self.store.get(skey)
                if hit is not None and self._restores(hit[0]):
                    fresh[keys[k]] = hit
                else:
                    if hit is not None:
                        self.store.discard(skey)
                    left.append(k)
            missing = left
        for g0 in range(0, len(missing), self.width):
            group = missing[g0:g0 + self.width]
            toks = [self.ctx.tokenize(texts[k], add_special=False, parse_special=False) for k in group]
            seqs = [self.SEQ + n for n in range(len(group))]
            for seq in seqs:
                self.ctx.seq_rm(seq)
            try:
                last_logits = self.ctx.decode_many([(tk, 0, seq) for tk, seq in zip(toks, seqs)])
                for k, tk, seq, logits in zip(group, toks, seqs, last_logits):
                    fresh[keys[k]] = (self.ctx.state_seq_get(seq), log_softmax(logits).astype(np.float16), len(tk))
                    if self.store is not None:
                        self.store.put(stored[k], fresh[keys[k]])
            finally:
                for seq in seqs:
                    self.ctx.seq_rm(seq)
        out = [fresh[key] if key in fresh else self._prefix[key] for key in keys]  # before anything is evicted
        for key, hit in zip(keys, out):
            self._prefix.pop(key, None)
            while len(self._prefix) >= self.cache_size:  # least recently used first
                self._prefix.pop(next(iter(self._prefix)))
            self._prefix[key] = hit  # most recently used last
        return out

    def _restores(self, blob: bytes) -> bool:
        """Does llama.cpp accept this stored state (tried on sequence SEQ, emptied again)?"""
        ok = self.ctx.try_state_seq_set(blob, self.SEQ)
        self.ctx.seq_rm(self.SEQ)
        return ok

    @property
    def width(self) -> int:
        """How many candidates fit at once: one sequence each, from SEQ up."""
        return max(1, self.ctx.n_seq_max - self.SEQ)

    def log_likelihood(self, query: str, entry) -> float:
        """Mean log-probability (nats per token) of the request's tokens after one candidate's prefix."""
        return self.log_likelihoods(query, [entry])[0]

    def log_likelihoods(self, query: str, entries: Sequence) -> list[float]:
        """Mean log-probability of the request after each candidate's prefix. The candidates' prefix states are
        restored into sequences SEQ, SEQ+1, … (as many as the context allows) and their continuations scored in one
        batch, so the weights run once per group rather than once per candidate. The request's first token is scored
        from the prefix's cached next-token distribution."""
        q = self.ctx.tokenize(" " + " ".join(query.split()), add_special=False, parse_special=False)
        q = q[: self.MAX_QUERY_TOKENS] or self.ctx.tokenize(" .", add_special=False, parse_special=False)
        out: list[float] = []
        for g0 in range(0, len(entries), self.width):
            group = entries[g0:g0 + self.width]
            prefixes = self._cached_prefixes(group)
            items = []
            if len(q) > 1:  # a one-token request is scored by the cached distribution alone
                for k, (blob, _, n_prefix) in enumerate(prefixes):
                    seq = self.SEQ + k
                    self.ctx.seq_rm(seq)
                    self.ctx.state_seq_set(blob, seq)
                    items.append((q, n_prefix, seq))
            try:
                rest = self.ctx.continuation_logprobs(items) if items else [[] for _ in group]
            finally:
                for k in range(len(group)):
                    self.ctx.seq_rm(self.SEQ + k)
            out += [(float(first[q[0]]) + sum(lp)) / len(q) for (_, first, _), lp in zip(prefixes, rest)]
        return out

    def scored_text(self, query: str) -> str:
        """The text whose likelihood is scored: the request with its literal values masked (textgen.mask_values).
        A value ("acme/api#1534", a quoted title) is many tokens no tool description predicts, noise in the mean
        log-probability; masked, the mean is over the words that say what to do, and there are ~30 % fewer tokens
        to decode."""
        if not self.mask_values:
            return query
        masked = textgen.mask_values(query)
        return masked if masked.strip() else query

    def score(self, query: str, entries: Sequence, base_scores: Sequence[float]) -> list[float]:
        return rrf_fuse(base_scores, self.log_likelihoods(self.scored_text(query), entries), self.RRF_K)


def rrf_fuse(first: Sequence[float], second: Sequence[float], k: int) -> list[float]:
    """Reciprocal-rank fusion of two score lists over the same candidates: Σ 1 / (k + rank), ranks from 1; ties keep
    the candidates' order."""
    out = [0.0] * len(first)
    for scores in (first, second):
        order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
        for rank, j in enumerate(order, start=1):
            out[int(j)] += 1.0 / (k + rank)
    return out
