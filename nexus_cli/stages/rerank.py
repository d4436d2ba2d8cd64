"""Rerankers for escalated routing decisions, and the registry-only training data they learn from.

* `CrossReranker`: a MiniLM cross-encoder trained locally at index time (`nexus index --train-reranker`) on
  (registry-derived request, tool text) groups: one positive tool and hard negatives taken from the SLB's own
  confusions for that request (the tools the retriever ranks highest that are not the right one).
* `LLMReranker`: the local LLM (Qwen2.5 0.5B) reads the request and the top-k candidates (name + signature + first
  description sentence) and answers with one candidate name; decoding is constrained token by token to the native
  tool-name trie (kernels.Trie), so it can only emit a candidate.
* `LikelihoodReranker`: the local LLM scores the request's tokens as a continuation of each candidate's description
  (query likelihood, nothing trained), fused with the retriever's order by reciprocal ranks.

Training data never comes from evaluation files: queries are textgen.training_queries(tool) (name, description,
parameters, synthetic argument values), seeded.
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ..config import (FINETUNE_BUDGET_S, FINETUNE_EPOCHS, FINETUNE_EXAMPLE_POSITIVES, FINETUNE_ROUNDS,
                      FINETUNE_SECOND_ROUND_EPOCHS)
from ..errors import NexusError
from ..prefix_store import PrefixStore  # noqa: F401 - rerank.PrefixStore, where it was first
from ..results import atomic_write_json
from . import textgen

# Candidates each reranker sees by default. The likelihood reranker's cost grows with its candidates (the request is
# decoded once per candidate): over the top 5 it reached the same top-1 as over the top 10 at half the cost, and
# scoring the value-masked request over the top 4 the same again at 0.55x the cost of the top 5 (docs/routing.md).
RERANK_K = {"likelihood": 4, "cross": 10, "llm": 10}

# Written into a fine-tuned embedder's folder: how it was trained (finetune_embedder's record).
FINETUNE_RECORD = "nexus-finetune.json"

TRAIN_SEED = 7  # differs from the gate calibration seed, so the gate's probes are not the training queries


def rerank_doc(entry) -> str:
    """The text the cross-encoder reads for a tool: readable name, name, signature, description start."""
    desc = textgen.truncate_words(textgen.clean_description(entry.description), 40)
    sig = getattr(entry, "signature", "") or ""
    return f"{textgen.readable_name(entry.name)} ({entry.name}): {desc} | {sig[:160]}"


def mine_groups(tools, slb, bm25, lex_weight: float, encode: Callable[[list[str]], np.ndarray], n_queries: int = 3,
                n_neg: int = 7, seed: int = TRAIN_SEED, depth: int = 20):
    """(query, positive tool index, [hard negative tool indices]) for registry-derived queries.

    Hard negatives are the highest-ranked wrong tools of the SLB (+BM25) for that very query, topped up with random
    tools when the query is easy."""
    from .index import dense_tool_scores, fuse

    rng = random.Random(seed)
    qs, owners = [], []
    for i, t in enumerate(tools):
        for q in textgen.training_queries(t, rng, n_queries):
            qs.append(q)
            owners.append(i)
    qv = encode(qs)
    out = []
    n = len(tools)
    for j, q in enumerate(qs):
        dense, _ = dense_tool_scores(slb, qv[j])
        lex = bm25.scores(textgen.lex_tokens(q)) if bm25 is not None else None
        s = fuse(dense, lex, lex_weight)
        top = [int(x) for x in np.argsort(-s)[: depth + 1] if int(x) != owners[j]]
        negs = top[:n_neg]
        while len(negs) < min(n_neg, n - 1):
            r = rng.randrange(n)
            if r != owners[j] and r not in negs:
                negs.append(r)
        out.append((q, owners[j], negs))
    return out


def train_cross_encoder(tools, slb, bm25, lex_weight: float, embedder, out_dir: Path, base: str | Path | None = None,
                        n_queries: int = 3, n_neg: int = 7, epochs: int = 1, time_budget_s: float = 300.0,
                        progress=None, entries=None) -> dict:
    """Train the cross-encoder from the bundled MiniLM weights and save it to out_dir. Returns its manifest entry."""
    from ..adapters.embedder import PairScorer

    t0 = time.perf_counter()
    base = base or embedder.path
    groups_idx = mine_groups(tools, slb, bm25, lex_weight, lambda q: embedder.encode(q, batch_size=64, role="query"),
                             n_queries=n_queries, n_neg=n_neg)
    docs = [rerank_doc(e) for e in (entries or tools)]
    groups = [(q, [docs[p]] + [docs[k] for k in negs]) for q, p, negs in groups_idx]
    mined_s = time.perf_counter() - t0
    scorer = PairScorer(base)
    cb = (lambda s, n: progress("training reranker", s, n)) if progress else None
    log = scorer.train_listwise(groups, epochs=epochs, time_budget_s=time_budget_s, callback=cb)
    out_dir.mkdir(parents=True, exist_ok=True)
    scorer.save(out_dir)
    return {"kind": "cross-encoder", "base": str(Path(base).name), "n_groups": len(groups), "group_size": 1 + n_neg,
            "loss": "listwise softmax cross-entropy", "mining_seconds": round(mined_s, 1), "train": log,
            "data": "textgen.training_queries (registry only), hard negatives = SLB+BM25 confusions",
            "seed": TRAIN_SEED}


class CrossReranker:
    name = "cross"

    def __init__(self, path: Path, threads: int | None = None):
        from ..adapters.embedder import PairScorer

        self.scorer = PairScorer(path, threads=threads)

    def score(self, query: str, entries: Sequence, base_scores: Sequence[float]) -> list[float]:
        docs = [rerank_doc(e) for e in entries]
        return [float(x) for x in self.scorer.score([query] * len(docs), docs)]


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
        from .. import kernels

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
        from ..adapters.llama import log_softmax

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


def finetune_record(model_dir) -> dict | None:
    """The record finetune_embedder left in a model folder, or None (a stock model, an unreadable record)."""
    if not model_dir:
        return None
    try:
        rec = json.loads((Path(model_dir) / FINETUNE_RECORD).read_text("utf-8"))
    except (OSError, ValueError):
        return None
    return rec if isinstance(rec, dict) else None


def finetune_embedder(tools, embedder, out_dir: Path, n_queries: int = 4, epochs: int = FINETUNE_EPOCHS,
                      batch_size: int = 32, lr: float = 3e-5, time_budget_s: float = FINETUNE_BUDGET_S,
                      progress=None, seed: int = TRAIN_SEED, examples: Sequence[Sequence[str]] | None = None,
                      precision: str = "auto", n_hard: int = 1,
                      example_positives: bool = FINETUNE_EXAMPLE_POSITIVES, rounds: int = FINETUNE_ROUNDS,
                      second_round_epochs: int = FINETUNE_SECOND_ROUND_EPOCHS) -> dict:
    """Fine-tune the bi-encoder (`_finetune_round`), then, on example requests and with `rounds` = 2, once more
    from the model the first round made, its hard negatives mined by that model: the tools it still confuses, where
    the first round's came from the base model's confusions, most of which it has learned to separate. Saves the
    final model to out_dir with a record of both rounds (FINETUNE_RECORD)."""
    if rounds not in (1, 2):
        raise NexusError(f"fine-tuning rounds must be 1 or 2, got {rounds}")
    t0 = time.perf_counter()
    common = dict(n_queries=n_queries, batch_size=batch_size, lr=lr, seed=seed, examples=examples,
                  precision=precision, n_hard=n_hard, example_positives=example_positives)
    info = _finetune_round(tools, embedder, out_dir, epochs=epochs, time_budget_s=time_budget_s,
                           progress=progress, label="fine-tuning embedder", **common)
    info["rounds"] = 1
    left = time_budget_s - (time.perf_counter() - t0)
    if rounds == 2 and examples is not None:  # measured on example requests only (docs/routing.md)
        if left <= 0:
            info["second_round"] = {"skipped": f"the time budget of {time_budget_s:.0f} s was spent by the first round"}
        else:
            import shutil

            from ..adapters.embedder import Embedder

            out_dir = Path(out_dir)
            second_dir = out_dir.with_name(out_dir.name + ".round2")
            shutil.rmtree(second_dir, ignore_errors=True)
            try:
                second = _finetune_round(tools, Embedder(str(out_dir)), second_dir, epochs=second_round_epochs,
                                         time_budget_s=left, progress=progress,
                                         label="fine-tuning embedder (round 2)", **common)
                shutil.rmtree(out_dir)
                second_dir.rename(out_dir)
            except BaseException:
                shutil.rmtree(second_dir, ignore_errors=True)
                raise
            second["base"] = "the first round's model"
            info.update(rounds=2, second_round=second)
    # the record travels with the model folder, so an index built later with `--embedder THAT_FOLDER` knows it too
    atomic_write_json(Path(out_dir) / FINETUNE_RECORD, info)
    return info


def _finetune_round(tools, embedder, out_dir: Path, n_queries: int, epochs: int, batch_size: int, lr: float,
                    time_budget_s: float, progress, seed: int, examples: Sequence[Sequence[str]] | None,
                    precision: str, n_hard: int, example_positives: bool, label: str) -> dict:
    """One fine-tuning of the bi-encoder, starting from `embedder`'s weights, on (request, tool doc text, hard
    negative docs) items.

    The requests are the tools' example requests when `examples` (one list per tool) is given, else
    registry-derived ones (textgen.training_queries). Hard negatives of a request = the `n_hard` tools `embedder`
    (the model this round starts from) ranks highest among the wrong ones whose text differs from the right one's
    (an exact duplicate in another server generation is not wrong; two copies of one wrong text count once); the
    loss is in-batch-negatives softmax
    (MNRL) with those extra negatives. With `examples`, `example_positives` adds, for each request of a tool with
    several, a second item whose positive is another example request of that tool: the index scores a tool by the
    max over its vectors, most of them example requests, so requests of one tool are taught to meet each other as
    well as the tool's text. Texts of one tool are one class in the loss, so they never act as each other's
    negatives. Saves the model to out_dir and returns its log (the caller writes the record)."""
    from ..adapters.embedder import finetune_biencoder
    from .index import doc_text_for

    if n_hard < 1:
        raise NexusError(f"n_hard must be at least 1, got {n_hard}")
    t0 = time.perf_counter()
    rng = random.Random(seed)
    docs = [doc_text_for(t) for t in tools]
    dv = embedder.encode(docs, batch_size=32)
    qs, owners = [], []
    for i, t in enumerate(tools):
        for q in (examples[i] if examples is not None else textgen.training_queries(t, rng, n_queries)):
            qs.append(q)
            owners.append(i)
    if not qs:
        raise NexusError("no requests to fine-tune the embedder on")
    qv = embedder.encode(qs, batch_size=64, role="query")
    sims = qv @ dv.T
    text_id = {d: k for k, d in enumerate(dict.fromkeys(docs))}
    doc_text = np.asarray([text_id[d] for d in docs])
    sims[doc_text[None, :] == doc_text[np.asarray(owners)][:, None]] = -np.inf  # the tool itself and its exact twins
    hard = [_distinct_top(row, doc_text, n_hard) for row in sims]
    items = [(q, docs[o], [docs[h] for h in hs]) for q, o, hs in zip(qs, owners, hard)]
    labels = [(int(doc_text[o]), [int(doc_text[h]) for h in hs]) for o, hs in zip(owners, hard)]
    example_positives = example_positives and examples is not None  # measured on example requests only
    if example_positives:
        by_tool: dict[int, list[str]] = {}
        for q, o in zip(qs, owners):
            by_tool.setdefault(o, []).append(q)
        for (q, _doc, negs), lab, o in list(zip(items, labels, owners)):  # the same negatives, another positive
            others = [x for x in by_tool[o] if x != q]
            if others:
                items.append((q, rng.choice(others), negs))
                labels.append(lab)
    mined_s = time.perf_counter() - t0
    cb = (lambda s, n: progress(label, s, n)) if progress else None
    log = finetune_biencoder(embedder.path, items, out_dir, epochs=epochs, batch_size=batch_size, lr=lr,
                             time_budget_s=time_budget_s, seed=seed, callback=cb, precision=precision, labels=labels)
    info = {"base": Path(embedder.path).name, "n_triples": len(qs), "n_items": len(items),
            "loss": f"MNRL + {n_hard} mined hard negative{'s' if n_hard > 1 else ''}"
                    + (" + other example requests as positives" if example_positives else ""),
            "epochs": epochs, "lr": lr, "n_hard": n_hard, "example_positives": example_positives,
            "mining_seconds": round(mined_s, 1), "train": log, "seed": seed, "on_examples": examples is not None,
            "data": "example requests (nexus index --examples)" if examples is not None
                    else "textgen.training_queries (registry only)"}
    return info


def _distinct_top(scores: np.ndarray, text_of: np.ndarray, n: int) -> list[int]:
    """The n highest-scoring indices with pairwise different texts (two copies of one wrong tool are one negative)."""
    picked: list[int] = []
    for h in np.argsort(-scores, kind="stable"):
        if len(picked) == n or not np.isfinite(scores[h]):
            break
        if all(text_of[h] != text_of[x] for x in picked):
            picked.append(int(h))
    return picked
