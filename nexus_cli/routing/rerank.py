"""Rerankers for escalated routing decisions: the local LLM reads the top candidates.

* `LikelihoodReranker` (the default on escalation): the LLM scores the request's tokens as a continuation of each
  candidate's description (query likelihood, nothing trained), fused with the retriever's order by reciprocal ranks.
* `LLMReranker` (`--reranker llm`): the LLM reads the request and the candidates as short cards, and each candidate
  is scored by the probability that the LLM answers with its name.
* `CascadeReranker` (`--reranker cascade`): the likelihood reranker over the first two candidates, and the name
  choice over the first three only where the likelihood does not clearly prefer the retriever's first candidate.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from .. import textgen
from ..config import LLM_RERANKER_WEIGHT, LLM_RERANKER_WEIGHTS
from ..prefix_store import PrefixStore

# Candidates each reranker sees by default. The likelihood reranker's cost grows with its candidates (the request is
# decoded once per candidate): over the top 5 it reached the same top-1 as over the top 10 at half the cost, and
# scoring the value-masked request over the top 4 the same again at 0.55x the cost of the top 5; the gold tool is
# among the retriever's first 5 for 88 % of the leave-servers-out dev requests, the llm reranker's reach (docs/routing.md).
RERANK_K = {"likelihood": 4, "llm": 5, "cascade": 5}


def llm_reranker_weight(model_name: str) -> float:
    """The name choice's weight against the retriever's score for a model (a canonical name such as qwen2.5-0.5b)."""
    return LLM_RERANKER_WEIGHTS.get(model_name, LLM_RERANKER_WEIGHT)


class LLMReranker:
    """The LLM reads the candidates as short cards and the request, and each candidate is scored by the probability
    that the LLM answers with its name: log p(name, end of turn | cards, request), summed over the name's tokens. The
    whole answer is scored (the name and the end of the turn), so a name that begins another ("git_diff",
    "git_diff_staged") is not favoured, and every candidate gets a score the fusion can use; the answer can only be
    one of the candidates, as if decoding were held to the candidates' names.

    A card: the name (with its server when two candidates share a name), the server, the first DESC_WORDS words of the
    description and the first MAX_PARAMS parameter names. The prompt is decoded once, on sequence SEQ; each
    candidate's answer is scored on a copy of it (sequences SEQ + 1 ...), all in one batch.

    The prompt's head (the system turn and the user turn up to the first card), the same for every request, is
    decoded on its own once per context and kept on sequence SEQ between decisions (keep_head); a decision decodes
    the rest. The head is decoded apart the first time too: llama.cpp's logits depend on how a prompt is split into
    decode calls, so a decision must not depend on whether the head was already held. With a prefix store the head's
    state is read back from disk where an earlier process decoded it (a one-shot route), as it was decoded."""

    name = "llm"
    SEQ = 1  # the prompt's sequence, its copies after it; sequence 0 keeps argument generation's warm prefix
    STORE_SUBDIR = "name-choice"  # the prefix store's folder for the prompt's head
    DESC_WORDS = 40
    MAX_PARAMS = 6
    SYSTEM = ("You route a user's request to the one tool that fulfils it. Answer with the tool's name only, exactly "
              "as written in the list.")

    def __init__(self, ctx, index=None, weight: float | None = None, keep_head: bool = True,
                 store: PrefixStore | None = None):
        """weight: of the log-probabilities against the retriever's score (score()); None: the one chosen for this
        model (config.LLM_RERANKER_WEIGHTS). keep_head: keep the prompt's head decoded between decisions (False:
        decode each prompt whole; a benchmark compares the two). store: where the head's decoded state is kept
        across processes (PrefixStore), or None."""
        self.ctx = ctx
        self.weight = llm_reranker_weight(ctx.model.name) if weight is None else float(weight)
        self.keep_head = keep_head
        self.store = store
        self._end = None
        self._head: list[int] | None = None  # the tokens every prompt starts with (_head_tokens)
        self._head_held = False  # is the head decoded on sequence SEQ (checked against the cache before use)

    @staticmethod
    def label(entry, entries: Sequence) -> str:
        """What the LLM answers for this candidate: its name, with its server when another candidate has that name."""
        twins = sum(1 for e in entries if e.name == entry.name)
        return entry.name if twins == 1 else f"{entry.name} ({entry.server})"

    def card(self, entry, entries: Sequence) -> str:
        desc = textgen.truncate_words(textgen.clean_description(entry.description or ""), self.DESC_WORDS)
        props = list(((entry.input_schema or {}).get("properties") or {}).keys())[: self.MAX_PARAMS]
        params = f"\n  parameters: {', '.join(props)}" if props else ""
        return f"- {self.label(entry, entries)} (server: {entry.server})\n  {desc}{params}"

    def prompt(self, query: str, entries: Sequence, context: str = "") -> list[int]:
        """context: the conversation's recent turns (router.routing_context), so a follow-up ("close it") can be
        read against what it follows."""
        earlier = f"Earlier in the conversation: {context}\n" if context else ""
        return self._chat("Tools:\n" + "\n".join(self.card(e, entries) for e in entries)
                          + f"\n\n{earlier}Request: {query}\nWhich tool fulfils the request?")

    def _chat(self, user: str) -> list[int]:
        return self.ctx.model.chat_tokens([{"role": "system", "content": self.SYSTEM},
                                           {"role": "user", "content": user}])

    def _head_tokens(self) -> list[int]:
        """The prompt's head: the tokens two prompts share when their first cards differ from the first character,
        less the last one (a token at the boundary could merge with what follows it). Every prompt is checked to
        start with it before it is used."""
        if self._head is None:
            a, b = self._chat("Tools:\n- alpha (server: a)"), self._chat("Tools:\n- (zz) [server: b]")
            n = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
            self._head = a[:max(0, n - 1)]
        return self._head

    def _decode_prompt(self, prompt: list[int]) -> int:
        """Decode the prompt on sequence SEQ, its head apart (held from an earlier decision where the cache still
        has it). Returns how many of its first tokens stay on SEQ after the decision (the head's, or 0)."""
        ctx = self.ctx
        head = self._head_tokens() if self.keep_head else []
        if not head or len(prompt) <= len(head) or prompt[:len(head)] != head:
            ctx.seq_rm(self.SEQ)
            self._head_held = False
            ctx.decode(prompt, 0, seq_id=self.SEQ)
            return 0
        n = len(head)
        if not (self._head_held and ctx.seq_pos_max(self.SEQ) == n - 1):  # emptied or overwritten elsewhere
            self._head_held = False
            self._load_head(head)
            self._head_held = True
        ctx.decode(prompt[n:], n, seq_id=self.SEQ)
        return n

    def _load_head(self, head: list[int]) -> None:
        """Put the head on sequence SEQ: read back from the store, else decoded (and stored)."""
        from ..adapters.llama import log_softmax  # here: routing that never reranks never loads the LLM adapter

        ctx, n = self.ctx, len(head)
        key = PrefixStore.key(ctx, "name choice head: " + " ".join(map(str, head))) if self.store else None
        if key is not None:
            hit = self.store.get(key)
            if hit is not None:
                if hit[2] == n and ctx.try_state_seq_set(hit[0], self.SEQ) and ctx.seq_pos_max(self.SEQ) == n - 1:
                    return
                self.store.discard(key)  # refused, or not this head: decoded again below
        ctx.seq_rm(self.SEQ)
        ctx.decode(head, 0, seq_id=self.SEQ, logits_last=key is not None)
        if key is not None:  # the store's entries carry the next-token distribution; the head's is kept with it
            self.store.put(key, (ctx.state_seq_get(self.SEQ), log_softmax(ctx.logits()).astype(np.float16), n))

    def _end_tokens(self) -> list[int]:
        """The tokens that end the assistant's turn (Qwen's <|im_end|>; a newline where the template has none)."""
        if self._end is None:
            end = self.ctx.tokenize("<|im_end|>", add_special=False, parse_special=True)
            self._end = end if len(end) == 1 and self.ctx.model.is_eog(end[0]) else \
                self.ctx.tokenize("\n", add_special=False, parse_special=False)[-1:]
        return self._end

    def name_logprobs(self, query: str, entries: Sequence, context: str = "") -> list[float]:
        """log p(answer = each candidate's label) in nats, in the candidates' order."""
        from ..adapters.llama import log_softmax  # here: routing that never reranks never loads the LLM adapter

        ctx = self.ctx
        prompt = self.prompt(query, entries, context)
        answers = [ctx.tokenize(self.label(e, entries), add_special=False, parse_special=False) + self._end_tokens()
                   for e in entries]
        width = max(1, ctx.n_seq_max - self.SEQ - 1)
        out: list[float] = []
        kept = 0
        try:
            kept = self._decode_prompt(prompt)
            first = log_softmax(ctx.logits())
            for g0 in range(0, len(answers), width):
                group = answers[g0:g0 + width]
                items = []
                for n, toks in enumerate(group):
                    seq = self.SEQ + 1 + n
                    ctx.seq_rm(seq)
                    ctx.seq_cp(self.SEQ, seq)
                    items.append((toks, len(prompt), seq))
                try:
                    rest = ctx.continuation_logprobs(items)
                finally:
                    for n in range(len(group)):
                        ctx.seq_rm(self.SEQ + 1 + n)
                out += [float(first[toks[0]]) + float(sum(lp)) for toks, lp in zip(group, rest)]
        finally:
            ctx.seq_rm(self.SEQ, kept)  # the head stays for the next decision
            self._head_held = self._head_held and kept > 0
        return out

    def choose(self, query: str, entries: Sequence, context: str = "") -> int:
        """The candidate the LLM most probably names."""
        return int(np.argmax(self.name_logprobs(query, entries, context)))

    def score(self, query: str, entries: Sequence, base_scores: Sequence[float], context: str = "") -> list[float]:
        """The retriever's score plus weight x (log p(name) - the best log p(name)): at 0.1 (Qwen2.5-1.5B) a candidate
        the LLM finds 10 nats less likely than its favourite loses one unit of retriever score (cosine-scale), so a
        retriever lead survives an LLM that is unsure and gives way to one that is sure."""
        lp = np.asarray(self.name_logprobs(query, entries, context), dtype=np.float64)
        return [float(b) + self.weight * float(x) for b, x in zip(base_scores, lp - lp.max())]


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
        from ..adapters.llama import log_softmax  # here: routing that never reranks never loads the LLM adapter

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

    def score(self, query: str, entries: Sequence, base_scores: Sequence[float], context: str = "") -> list[float]:
        """context is not read: the request alone is scored (the retriever already weighs the history in)."""
        return rrf_fuse(base_scores, self.log_likelihoods(self.scored_text(query), entries), self.RRF_K)


class CascadeReranker:
    """The likelihood reranker first; the name choice (a larger model, slower) only where the two signals disagree
    or nearly do.

    The likelihood reranker scores the first LIKELIHOOD_K candidates. Where the request is more likely after the
    retriever's first candidate than after any other by at least ASK_MARGIN (mean log-probability per token), the
    likelihood reranker's order stands (its reciprocal-rank fusion with the retriever; the candidates after them
    follow, in the retriever's order). Elsewhere the name choice decides over the first CHOICE_K candidates (the
    retriever's score plus its weight x the log-probability of each name), as `--reranker llm` would over its own;
    the candidates after them follow, in the retriever's order. Measured in docs/routing.md, "Rerankers"."""

    name = "cascade"
    # the name choice reads three cards, not five: on the leave-servers-out dev part's written requests the same
    # top-1 (188 of 219) and two more follow-ups, at 1.34x the speed of a name choice (docs/routing.md, "Rerankers")
    CHOICE_K = 3
    # the likelihood reads two, chosen with ASK_MARGIN weighing the escalated decision's time: on the dev servers'
    # written requests 189 of 219 right against 190 over three, the name choice asked on 60 against 72 of 154
    # escalated, the median escalated decision 440 against 926 ms (docs/routing.md, "Rerankers")
    LIKELIHOOD_K = 2
    # ask also where the likelihood prefers the retriever's first by less than 0.1 nats a token (docs/routing.md,
    # "Rerankers")
    ASK_MARGIN = 0.1

    def __init__(self, likelihood: "LikelihoodReranker", chooser: "LLMReranker | Callable[[], LLMReranker]"):
        """chooser: the name choice, or a function that makes it on first use (so a decision that never asks it
        does not wait for its model, which a one-shot route may still be loading)."""
        self.likelihood = likelihood
        self._chooser = chooser
        self.asked = 0  # decisions the name choice made

    @property
    def chooser(self) -> LLMReranker:
        if not isinstance(self._chooser, LLMReranker) and callable(self._chooser):
            self._chooser = self._chooser()
        return self._chooser

    def score(self, query: str, entries: Sequence, base_scores: Sequence[float], context: str = "") -> list[float]:
        k = min(len(entries), self.LIKELIHOOD_K)
        ll = self.likelihood.log_likelihoods(self.likelihood.scored_text(query), entries[:k])
        if k > 1 and ll[0] - max(ll[1:]) < self.ASK_MARGIN:
            self.asked += 1
            k = min(len(entries), self.CHOICE_K)
            reranked = self.chooser.score(query, entries[:k], base_scores[:k], context)
        else:
            reranked = rrf_fuse(base_scores[:k], ll, self.likelihood.RRF_K)
        low = min(reranked)
        # the candidates the judge did not read rank after those it did, in the retriever's order
        return reranked + [low - 1.0 - j for j in range(len(entries) - k)]


def rrf_fuse(first: Sequence[float], second: Sequence[float], k: int) -> list[float]:
    """Reciprocal-rank fusion of two score lists over the same candidates: Σ 1 / (k + rank), ranks from 1; ties keep
    the candidates' order."""
    out = [0.0] * len(first)
    for scores in (first, second):
        order = np.argsort(-np.asarray(scores, dtype=np.float64), kind="stable")
        for rank, j in enumerate(order, start=1):
            out[int(j)] += 1.0 / (k + rank)
    return out
