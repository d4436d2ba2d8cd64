"""Second-stage signals for routing over servers the router never saw, dumped per request so fusions can be compared
offline on the leave-servers-out dev part and then checked once on the test part.

    python benchmarks/rerank_features.py dump --part dev [--queries FILE] [--k 5] [--max-queries N] [--choosers ...]
    python benchmarks/rerank_features.py fuse results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --prev-request
    python benchmarks/rerank_features.py history results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --orders
    python benchmarks/rerank_features.py orders results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --chooser-k 3
    python benchmarks/rerank_features.py chooser-k results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --head-cache
    python benchmarks/rerank_features.py head-cache results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --likelihood-k 3
    python benchmarks/rerank_features.py likelihood-k results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --ask-margin
    python benchmarks/rerank_features.py ask-margin results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --ask-time
    python benchmarks/rerank_features.py ask-time results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --queries FILE --history-candidates
    python benchmarks/rerank_features.py history-candidates results/rerank-features/FILE.json
    python benchmarks/rerank_features.py dump --part dev --queries FILE --queries FILE --server-cards
    python benchmarks/rerank_features.py server-cards results/rerank-features/FILE.json

`dump` builds the part's index as `nexus bench routing-lso` does (no example requests, the default embedder) and, for
every request, keeps the retriever's first ten distinct tools (a copy of a tool on another server counts once) with
their fused scores, then scores the first K of them with:

* `ll05`: the query likelihood of Qwen2.5-Coder-0.5B (the shipped `likelihood` reranker's signal, masked request);
* `choice05`, `choice15`: `rerank.LLMReranker.name_logprobs`, the log-probability that Qwen2.5-Coder-0.5B / -1.5B, shown the K candidates as short cards
  (name, server, description, parameters) and the request, answers with each candidate's name (the whole name and
  the end of the turn, so a name that is the prefix of another is not favoured).

`fuse` prints top-1 for each signal alone and for fusions of the retriever with each, so one rule can be chosen on dev.

With `--orders`, only the requests where the cascade asks the name choice get it (the 0.5B likelihood's choice is
not the retriever's first), each twice, reading the conversation as the product's cascade does: `choice15` with the
cards in the retriever's order, `choice15_rev` with them in reverse (mapped back to the retriever's order). `orders`
then prints the cascade, gated, with the first against the mean of the two (a list's order biases which name a
model answers; the mean reads every candidate once near the top and once near the request).

With `--chooser-k N`, only the requests where `nexus route` asks the name choice (escalated by the margin gate,
and the likelihood's choice not the retriever's first) get it, twice, reading the
conversation as the product's cascade does and timed: `choice15` over the K cards (as shipped) and `choice15_first`
over the first N of them only (a shorter prompt to decode). `chooser-k` then prints the cascade, gated, with each,
and the median time of a name choice both ways.

With `--head-cache`, only the requests where `nexus route` asks the name choice get it, over the first
CascadeReranker.CHOICE_K cards as the cascade asks it, twice, timed, from two contexts of one model: `choice15` with
each prompt decoded whole, `choice15_head` with the prompt's shared head kept decoded between decisions
(LLMReranker.keep_head). `head-cache` then prints the cascade, gated, with each, and the median time both ways.

With `--likelihood-k N`, every request `nexus route` escalates gets the likelihood over the first 4 candidates
(`ll05_4`) and over the first N (`ll05_n`), each from its own call and timed with the candidates' prefixes already
decoded (as in a warm router; the two calls alternate which goes first), and the name choice over the first
CascadeReranker.CHOICE_K cards (`choice15`, as shipped) where either would make the cascade ask it.
`likelihood-k` then prints the cascade, gated, with each: top-1 and top-3 per query set, paired, and the likelihood
stage's median time both ways.

With `--ask-margin`, every request `nexus route` escalates gets the likelihood over the first 3 candidates (as the
cascade called it when its rule was written; `ll05_3`) and the name choice over the first
CHOICE_K cards (`choice15`), whatever the likelihood says. `ask-margin` then prints the cascade, gated, asking the
name choice where the likelihood's score of the retriever's first candidate minus the best other's is below d, for
each d of ASK_MARGINS (the shipped rule is d = 0), and the decision of results/rerank-features/ask-margin/RULE.txt.

With `--ask-time`, every request `nexus route` escalates gets the likelihood over the first 3 candidates (`ll05_3`)
and over the first 2 (`ll05_2`), each from its own call, warm (the candidates' prefixes decoded before), the two
calls alternating which goes first, and the name choice over the first CascadeReranker.CHOICE_K cards (`choice15`),
whatever the likelihood says, each timed. `ask-time` then prints, gated, for each width K (2, 3) and each d of
ASK_MARGINS: top-1 (all, follow-ups), the asks, the escalated decision's modelled median (the likelihood's time at K,
plus the name choice's where it is asked), and the decision of results/rerank-features/ask-time/RULE.txt.

With `--card-words`, every request where the shipped cascade asks the name choice (escalated; the likelihood over
the first 2 prefers another candidate or the first by under CascadeReranker.ASK_MARGIN) gets the name choice over
the first CHOICE_K cards with each card size of CARD_VARIANTS (`choice_<variant>`, each timed, the order rotating
per request); `card-words` then prints, gated, the cascade's top-1 and follow-ups with each, the median asked name
choice, and the decision of results/rerank-features/card-words/RULE.txt.

With `--prev-request`, a request with a history also gets `ll05_prev`: the same likelihood, of the conversation's
last user turn (the previous request) under each candidate, a judge reading the history where the likelihood reranker
reads the request alone; the name choice is then asked only where some weight in PREV_WEIGHTS makes the cascade ask
it. `history` prints the cascade with `ll05 + w x ll05_prev` against the cascade as shipped, gated by the index's
margin gate as `nexus route` is, per query set (follow-ups; requests after another conversation).

With `--history-candidates`, every request `nexus route` escalates gets the likelihood over the first 2 candidates
(`ll05_2`) and, where the cascade asks it, the name choice over the first CHOICE_K cards (`choice15`). A request with
a history also gets `hist_key`: the best tool of its history-prefixed text alone (the text the router weighs by
HISTORY_WEIGHT) that is neither among the fused list's first two nor a copy of one; where that tool is not among the
first CHOICE_K, the name choice over the first two and it (`choice15_h`, whatever the likelihood says).
`history-candidates` then prints the cascade, gated, as shipped (base), with that tool as the name choice's third
card where the cascade asks (C1), and asking the name choice wherever it is one (C2), per kind of request, paired;
then the decision of results/rerank-features/history-candidates/RULE.txt.

With `--server-cards`, every request `nexus route` escalates gets the shipped cascade's signals (`ll05_2`, and
`choice15` where it asks), and a request with a history also the conversation's server (`conv_server`: that of the
routing context's own best tool) and, for N in SERVER_CARDS, the name choice over the fused list's first two tools
and then that server's other tools in fused order, up to N cards (`choice15_s<N>`, with `s<N>_keys` and `s<N>_base`,
the cards and their fused scores), wherever such a tool was added. `server-cards` then prints the cascade, gated, as
shipped and with each N (asked wherever the server's tools were added), strict top-1 per kind of request, paired,
and the decision of results/rerank-features/server-cards/RULE.txt.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.adapters.embedder import index_embedder  # noqa: E402
from nexus_cli.adapters.llama import LlamaContext, LlamaModel  # noqa: E402
from nexus_cli.config import DEFAULT_EMBEDDER  # noqa: E402
from nexus_cli.lab.bench_lso import EXAMPLES, TEST_QUERIES, dev_requests, part_servers  # noqa: E402
from nexus_cli.lab.bench_routing import _index_for, gold_keys, load_queries, with_interchangeable  # noqa: E402
from nexus_cli.lab.common import registry_dir_default  # noqa: E402
from nexus_cli.lab.results import Run, model_identity  # noqa: E402
from nexus_cli.lab.stats import sign_test  # noqa: E402
from nexus_cli.registry import load_registries  # noqa: E402
from nexus_cli.routing.rerank import CascadeReranker, LikelihoodReranker, LLMReranker, rrf_fuse  # noqa: E402
from nexus_cli.routing.router import Router, RouterConfig, routing_context  # noqa: E402

SUITE = "rerank-features"
POOL = 10
CHOOSERS = {"choice05": "qwen2.5-0.5b", "choice15": "qwen2.5-1.5b"}
PREV_WEIGHTS = (0.25, 0.5, 1.0)  # the weights `history` compares, fixed before any dump with --prev-request
ASK_MARGINS = (-0.3, -0.2, -0.1, 0.0, 0.1, 0.2, 0.3)  # the grid `ask-margin` and `ask-time` compare, fixed before dumps
# the name choice's card variants `card-words` compares: (description words, parameter names), fixed by
# results/rerank-features/card-words/RULE.txt before any dump; "today" is rerank.LLMReranker's own
SERVER_CARDS = (3, 5)  # the name choice's card counts `--server-cards` dumps (results/rerank-features/server-cards/)
CARD_VARIANTS = {"today": (LLMReranker.DESC_WORDS, LLMReranker.MAX_PARAMS), "S1": (20, 6), "S2": (20, 0), "S3": (12, 6)}


def last_user_turn(history) -> str:
    """The conversation's last user message (the previous request), "" without one."""
    return next((m.get("content") or "" for m in reversed(history or []) if m.get("role") == "user"), "")


def _likelihood(ll, prev, w: float) -> np.ndarray:
    """The likelihood's first 4 scores, plus w x the previous request's where there is one."""
    x = np.asarray(ll[:4], dtype=np.float64)
    return x + w * np.asarray(prev[:4], dtype=np.float64) if prev is not None and w else x


def cascade_asks(ll, prev, w: float) -> bool:
    """Does the cascade ask the name choice: is the request (plus w x the previous request) most likely after
    another candidate than the retriever's first, over the likelihood's first 4?"""
    return int(np.argmax(_likelihood(ll, prev, w))) != 0


def cascade_pick(r: dict, k: int, w: float = 0.0, choice=None) -> int:
    """The cascade's choice for a dumped request (CascadeReranker.score): the name choice (the retriever + 0.1 x its
    log-probability; `choice`, else the dumped choice15) where it is asked, else the likelihood's reciprocal-rank
    fusion with the retriever over 4."""
    prev = r.get("ll05_prev")
    if cascade_asks(r["ll05"], prev, w):
        c = np.asarray(r["choice15"] if choice is None else choice, dtype=np.float64)
        return int(np.argmax(np.asarray(r["retriever"][:k]) + 0.1 * (c - c.max())))
    return int(np.argmax(rrf_fuse(r["retriever"][:4], list(_likelihood(r["ll05"], prev, w)), 60)))


def escalated(r: dict, tau: float) -> bool:
    """Does the index's margin gate escalate this dumped request (its first two distinct tools' gap below tau)?"""
    return len(r["retriever"]) < 2 or r["retriever"][0] - r["retriever"][1] < tau


def request_kind(r: dict) -> str:
    s = r.get("set") or ""
    return "after another conversation" if "+" in s else ("follow-ups" if r["follow_up"] else "no history")


def choice_scorer(model: str | LlamaModel, k: int, keep_head: bool = True) -> LLMReranker:
    """The product's name-choice reranker on its own context (the prompt's sequence and one copy per candidate)."""
    model = model if isinstance(model, LlamaModel) else LlamaModel(model)
    return LLMReranker(LlamaContext(model, n_ctx=4096, n_seq_max=LLMReranker.SEQ + 1 + k), keep_head=keep_head)


def part_queries(part: str, keys: set[str], files: list[str] | None = None) -> list[dict]:
    if files:
        qs = [q for f in files for q in load_queries(Path(f))]
    elif part == "dev":
        qs = dev_requests(part_servers(part))
    else:
        qs = [q for f in TEST_QUERIES if f.is_file() for q in load_queries(f)]
    return [q for q in qs if gold_keys(q) & keys]


def dump(part: str, k: int, max_queries: int | None, stride: int, choosers: list[str], out_dir: str,
         queries: list[str] | None = None, prev_request: bool = False, orders: bool = False,
         chooser_k: int | None = None, head_cache: bool = False, likelihood_k: int | None = None,
         ask_margin: bool = False, ask_time: bool = False, card_words: bool = False,
         history_candidates: bool = False, server_cards: bool = False) -> Path:
    servers = part_servers(part)
    tools = [t for t in load_registries([registry_dir_default()]) if t.server in servers]
    qs = part_queries(part, {t.key for t in tools}, queries)[::stride][:max_queries]
    emb = index_embedder(DEFAULT_EMBEDDER)  # as `nexus bench routing-lso` embeds the index and the requests
    router = Router(_index_for(tools, emb), RouterConfig(reranker="none", prefix_store=False), embedder=emb)
    index = router.index
    small = LlamaContext(LlamaModel("qwen2.5-0.5b"), n_ctx=4096, n_seq_max=LikelihoodReranker.SEQ + k)
    likelihood = LikelihoodReranker(small, store=None)
    choosers = {} if head_cache else {name: choice_scorer(CHOOSERS[name], k) for name in choosers}
    if orders or chooser_k or likelihood_k or ask_margin or ask_time or history_candidates or server_cards:
        choosers = {"choice15": choosers.get("choice15") or choice_scorer(CHOOSERS["choice15"], k)}
    if card_words:  # one 1.5B model, a context per card variant, each with its own card size
        large = LlamaModel(CHOOSERS["choice15"])
        choosers = {}
        for name, (words, params) in CARD_VARIANTS.items():
            choosers[name] = choice_scorer(large, k)
            choosers[name].DESC_WORDS, choosers[name].MAX_PARAMS = words, params
    if head_cache:  # one model, two contexts: the prompt decoded whole, and its head kept between decisions
        large = LlamaModel(CHOOSERS["choice15"])
        choosers = {"choice15": choice_scorer(large, k, keep_head=False),
                    "choice15_head": choice_scorer(large, k, keep_head=True)}
    run = Run(SUITE, dict(part=part, queries=queries, k=k, pool=POOL, n_queries=len(qs), stride=stride, choosers=sorted(choosers),
                          orders=orders, chooser_k=chooser_k, head_cache=head_cache,
                          choice_k=CascadeReranker.CHOICE_K if head_cache or likelihood_k or ask_margin or ask_time
                          or card_words or history_candidates or server_cards else None,
                          history_candidates=history_candidates, history_weight=router.config.history_weight,
                          server_cards=list(SERVER_CARDS) if server_cards else None,
                          likelihood_k=likelihood_k, ask_margin=ask_margin, ask_time=ask_time,
                          card_variants=CARD_VARIANTS if card_words else None,
                          embedder=DEFAULT_EMBEDDER,
                          examples=None, tools=len(tools), prev_request=prev_request,
                          prev_weights=list(PREV_WEIGHTS) if prev_request else None, tau=float(router.tau)),
              models={"embedder": model_identity(DEFAULT_EMBEDDER, kind="embedder"),
                      "llm_small": model_identity("qwen2.5-0.5b"), "llm_large": model_identity("qwen2.5-1.5b")})
    rows, t0 = [], time.time()
    for n, q in enumerate(qs):
        scores, _ = router.retrieve(q["query"], q.get("history"))
        order = [int(i) for i in np.argsort(-scores, kind="stable")]
        cand: list[int] = []
        for i in order:
            if not any(i in index.interchangeable(c) for c in cand):
                cand.append(i)
            if len(cand) == POOL:
                break
        gold = with_interchangeable(gold_keys(q), index)
        head = [index.tools[i] for i in cand[:k]]
        row = {"id": q.get("id"), "gold": sorted(gold), "follow_up": bool(q.get("history")),
               "cands": [index.tools[i].key for i in cand], "retriever": [float(scores[i]) for i in cand],
               "gold_rank": next((r for r, i in enumerate(order) if index.tools[i].key in gold), None)}
        request = q["query"]
        row["set"] = q.get("set")
        row["ll05"] = likelihood.log_likelihoods(likelihood.scored_text(request), head)
        needed = True
        if prev_request:
            prev = last_user_turn(q.get("history"))
            row["ll05_prev"] = likelihood.log_likelihoods(likelihood.scored_text(prev), head) if prev else None
            needed = any(cascade_asks(row["ll05"], row["ll05_prev"], w) for w in (0.0, *PREV_WEIGHTS))
        if orders:
            asked = cascade_asks(row["ll05"], None, 0.0)
            context = routing_context(q.get("history"))
            chooser = choosers["choice15"]
            row["choice15"] = chooser.name_logprobs(request, head, context) if asked else None
            row["choice15_rev"] = chooser.name_logprobs(request, head[::-1], context)[::-1] if asked else None
        elif chooser_k:  # only where `nexus route` asks it: an escalated decision the likelihood disagrees on
            asked = escalated(row, float(router.tau)) and cascade_asks(row["ll05"], None, 0.0)
            context = routing_context(q.get("history"))
            chooser = choosers["choice15"]
            for key, cards in (("choice15", head), ("choice15_first", head[:chooser_k])):
                t1 = time.perf_counter()
                row[key] = chooser.name_logprobs(request, cards, context) if asked else None
                row[f"{key}_ms"] = (time.perf_counter() - t1) * 1000 if asked else None
        elif likelihood_k:  # every escalated request: the likelihood over 4 and over N, warm, timed
            if escalated(row, float(router.tau)):
                scored = likelihood.scored_text(request)
                for key, cards in (("ll05_4", head[:4]), ("ll05_n", head[:likelihood_k]))[::1 if n % 2 else -1]:
                    t1 = time.perf_counter()
                    row[key] = likelihood.log_likelihoods(scored, cards)  # prefixes decoded above (ll05)
                    row[f"{key}_ms"] = (time.perf_counter() - t1) * 1000
                asked = cascade_asks(row["ll05_4"], None, 0.0) or cascade_asks(row["ll05_n"], None, 0.0)
                row["choice15"] = choosers["choice15"].name_logprobs(
                    request, head[:CascadeReranker.CHOICE_K], routing_context(q.get("history"))) if asked else None
            else:
                row.update(ll05_4=None, ll05_n=None, ll05_4_ms=None, ll05_n_ms=None, choice15=None)
        elif ask_margin:  # every escalated request: the cascade's likelihood and the name choice, whatever it says
            if escalated(row, float(router.tau)):
                row["ll05_3"] = likelihood.log_likelihoods(likelihood.scored_text(request), head[:3])
                row["choice15"] = choosers["choice15"].name_logprobs(
                    request, head[:CascadeReranker.CHOICE_K], routing_context(q.get("history")))
            else:
                row.update(ll05_3=None, choice15=None)
        elif ask_time:  # every escalated request: the likelihood over 3 and over 2, and the name choice, all timed
            if escalated(row, float(router.tau)):
                scored = likelihood.scored_text(request)
                for key, width in (("ll05_3", 3), ("ll05_2", 2))[::1 if n % 2 else -1]:
                    t1 = time.perf_counter()
                    row[key] = likelihood.log_likelihoods(scored, head[:width])  # prefixes decoded above (ll05)
                    row[f"{key}_ms"] = (time.perf_counter() - t1) * 1000
                t1 = time.perf_counter()
                row["choice15"] = choosers["choice15"].name_logprobs(
                    request, head[:CascadeReranker.CHOICE_K], routing_context(q.get("history")))
                row["choice15_ms"] = (time.perf_counter() - t1) * 1000
            else:
                row.update(ll05_3=None, ll05_2=None, ll05_3_ms=None, ll05_2_ms=None, choice15=None, choice15_ms=None)
        elif card_words:  # where the shipped cascade asks: the name choice with each card variant, timed
            row["ll05_2"] = likelihood.log_likelihoods(likelihood.scored_text(request), head[:2]) \
                if escalated(row, float(router.tau)) else None
            asked = row["ll05_2"] is not None and likelihood_margin(row["ll05_2"]) < CascadeReranker.ASK_MARGIN
            names = list(CARD_VARIANTS)
            names = names[n % len(names):] + names[:n % len(names)]  # each variant first in turn
            context = routing_context(q.get("history"))
            for name in names:
                t1 = time.perf_counter()
                row[f"choice_{name}"] = choosers[name].name_logprobs(
                    request, head[:CascadeReranker.CHOICE_K], context) if asked else None
                row[f"choice_{name}_ms"] = (time.perf_counter() - t1) * 1000 if asked else None
        elif server_cards:  # escalated: the shipped cascade, and the conversation's server's tools as cards
            row.update(ll05_2=None, choice15=None, conv_server=None, gold_strict=sorted(gold_keys(q)))
            for n_cards in SERVER_CARDS:
                row.update({f"choice15_s{n_cards}": None, f"s{n_cards}_keys": None, f"s{n_cards}_base": None})
            if escalated(row, float(router.tau)):
                context = routing_context(q.get("history"))
                ck = CascadeReranker.CHOICE_K
                row["ll05_2"] = likelihood.log_likelihoods(likelihood.scored_text(request), head[:2])
                if likelihood_margin(row["ll05_2"]) < CascadeReranker.ASK_MARGIN:
                    row["choice15"] = choosers["choice15"].name_logprobs(request, head[:ck], context)
                if context:
                    conv = index.tools[int(np.argmax(router._scores(context)[0]))].server
                    row["conv_server"] = conv
                    for n_cards in SERVER_CARDS:
                        cards = list(cand[:2])
                        for i in order:
                            if len(cards) == n_cards:
                                break
                            if index.tools[i].server == conv and not any(
                                    i == c or i in index.interchangeable(c) for c in cards):
                                cards.append(i)
                        if len(cards) > 2:
                            row[f"s{n_cards}_keys"] = [index.tools[i].key for i in cards]
                            row[f"s{n_cards}_base"] = [float(scores[i]) for i in cards]
                            row[f"choice15_s{n_cards}"] = choosers["choice15"].name_logprobs(
                                request, [index.tools[i] for i in cards], context)
        elif history_candidates:  # escalated: the shipped cascade, and the conversation's own best tool as a card
            row.update(ll05_2=None, choice15=None, hist_key=None, hist_score=None, choice15_h=None)
            context = routing_context(q.get("history"))
            if context and router.config.history_weight > 0:
                prefixed = router._scores(f"{context} {request}")[0]  # the text Router.retrieve weighs in
                first_two = cand[:2]
                t_h = next(int(i) for i in np.argsort(-prefixed, kind="stable")
                           if not any(int(i) in index.interchangeable(c) or int(i) == c for c in first_two))
                row["hist_key"], row["hist_score"] = index.tools[t_h].key, float(scores[t_h])
                row["hist_in_first"] = any(t_h == c or t_h in index.interchangeable(c)
                                           for c in cand[:CascadeReranker.CHOICE_K])
            if escalated(row, float(router.tau)):
                row["ll05_2"] = likelihood.log_likelihoods(likelihood.scored_text(request), head[:2])
                ck = CascadeReranker.CHOICE_K
                if likelihood_margin(row["ll05_2"]) < CascadeReranker.ASK_MARGIN:
                    row["choice15"] = choosers["choice15"].name_logprobs(request, head[:ck], context)
                if row["hist_key"] is not None and not row["hist_in_first"]:
                    row["choice15_h"] = choosers["choice15"].name_logprobs(
                        request, head[:ck - 1] + [index.tools[t_h]], context)
        elif head_cache:  # only where `nexus route` asks it, over the cards the cascade shows
            asked = escalated(row, float(router.tau)) and cascade_asks(row["ll05"], None, 0.0)
            context = routing_context(q.get("history"))
            for key, chooser in choosers.items():
                t1 = time.perf_counter()
                row[key] = chooser.name_logprobs(request, head[:CascadeReranker.CHOICE_K], context) if asked else None
                row[f"{key}_ms"] = (time.perf_counter() - t1) * 1000 if asked else None
        else:
            for name, chooser in choosers.items():
                row[name] = chooser.name_logprobs(request, head) if needed else None
        rows.append(row)
        if n % 10 == 0:
            print(f"[{time.time() - t0:6.0f} s] {n + 1}/{len(qs)}", file=sys.stderr, flush=True)
    return Path(run.write({"n": len(rows)}, {"queries": rows}, out_dir=out_dir)["files"]["json"])


def fuse(path: Path) -> None:
    """Top-1 of each signal and fusion, every request reranked; paired against the shipped default's rule (the
    likelihood reranker's reciprocal-rank fusion with the retriever over the first 4, k = 60)."""
    doc = json.loads(Path(path).read_text())
    rows = doc["samples"]["queries"]
    k = doc["params"]["k"]
    n = len(rows)

    def hits(pick) -> np.ndarray:
        return np.array([r["cands"][pick(r)] in r["gold"] for r in rows])

    shipped = hits(lambda r: int(np.argmax(rrf_fuse(r["retriever"][:4], r["ll05"][:4], 60))))

    def show(label: str, h: np.ndarray) -> None:
        fixed, broken = int((h & ~shipped).sum()), int((~h & shipped).sum())
        print(f"  {label:<42} {h.mean() * 100:5.1f} %   {fixed:3d} fixed / {broken:3d} broken, sign test p = "
              f"{sign_test(fixed, broken):.3f}")

    print(f"{path}: {n} requests, K = {k}; gold among the first K: "
          f"{sum(r['gold_rank'] is not None and r['gold_rank'] < k for r in rows) / n * 100:.1f} %")
    show("retriever alone", hits(lambda r: 0))
    show("shipped: likelihood RRF, top 4", shipped)
    present = [s for s in ("ll05", "choice05", "choice15") if all(r.get(s) is not None for r in rows)]
    for sig in present:
        show(f"{sig} alone", hits(lambda r, s=sig: int(np.argmax(r[s]))))
        show(f"{sig} RRF (k = 60) with the retriever", hits(
            lambda r, s=sig: int(np.argmax(rrf_fuse(r["retriever"][:k], r[s], 60)))))
        for w in (0.02, 0.05, 0.1, 0.2):
            def linear(r, s=sig, w=w):
                x = np.asarray(r[s], dtype=np.float64)
                return int(np.argmax(np.asarray(r["retriever"][:k]) + w * (x - x.max())))
            show(f"retriever + {w} x {sig}", hits(linear))
    if "choice15" in present:  # a cascade: the 1.5B only where the 0.5B likelihood's own choice is not the retriever's
        asked = sum(cascade_asks(r["ll05"], None, 0.0) for r in rows)
        show(f"cascade: 1.5B (+ 0.1 x) on {asked} of {n}, else shipped", hits(lambda r: cascade_pick(r, k)))

        # both judges on every request, added to the retriever's score (what the cascade saves is the 1.5B's time
        # where the two agree); the 0.5B scores only the first 4, so the 5th gets its lowest score
        def both(a: float, b: float):
            def pick(r):
                ll = np.asarray(r["ll05"][:k], dtype=np.float64)
                ll = np.concatenate([ll, np.full(k - ll.size, ll.min())])
                c = np.asarray(r["choice15"], dtype=np.float64)
                return int(np.argmax(np.asarray(r["retriever"][:k]) + a * (ll - ll.max()) + b * (c - c.max())))
            return pick

        for a in (0.05, 0.1):
            for b in (0.02, 0.05, 0.1):
                show(f"retriever + {a} x ll05 + {b} x choice15", hits(both(a, b)))


def history(path: Path) -> None:
    """The cascade with the previous request's likelihood added (ll05 + w x ll05_prev, for requests with a history)
    against the cascade as shipped, each decision gated by the index's margin gate (the retriever's first two distinct
    tools' score gap below tau escalates), per query set."""
    doc = json.loads(Path(path).read_text())
    rows, k, tau = doc["samples"]["queries"], doc["params"]["k"], doc["params"]["tau"]

    def pick(r, w: float) -> int:
        return cascade_pick(r, k, w) if escalated(r, tau) else 0  # not escalated: the fast path, no reranker

    groups: dict[str, list] = {}
    for r in rows:
        groups.setdefault(request_kind(r), []).append(r)
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, escalated {sum(escalated(r, tau) for r in rows)}")
    for name, rs in sorted(groups.items()):
        base = np.array([r["cands"][pick(r, 0.0)] in r["gold"] for r in rs])
        print(f"  {name} ({len(rs)}): shipped cascade {base.sum()} ({base.mean() * 100:.1f} %)")
        for w in PREV_WEIGHTS:
            h = np.array([r["cands"][pick(r, w)] in r["gold"] for r in rs])
            fixed, broken = int((h & ~base).sum()), int((~h & base).sum())
            print(f"    + {w} x previous request: {h.sum()} ({h.mean() * 100:.1f} %), {fixed} fixed / {broken} broken, "
                  f"sign test p = {sign_test(fixed, broken):.3f}")


def paired_by_kind(rows: list[dict], pick, base_label: str, cand_label: str) -> None:
    """Top-1 of two picks over the dumped requests (pick(r, False): the shipped one; pick(r, True): the candidate),
    over all of them and per kind of request (request_kind), paired with a sign test."""
    groups: dict[str, list] = {"all": rows}
    for r in rows:
        groups.setdefault(request_kind(r), []).append(r)
    for name, rs in groups.items():
        base = np.array([r["cands"][pick(r, False)] in r["gold"] for r in rs])
        cand = np.array([r["cands"][pick(r, True)] in r["gold"] for r in rs])
        fixed, broken = int((cand & ~base).sum()), int((~cand & base).sum())
        print(f"  {name} ({len(rs)}): {base_label} {base.sum()} ({base.mean() * 100:.1f} %), {cand_label} "
              f"{cand.sum()} ({cand.mean() * 100:.1f} %), {fixed} fixed / {broken} broken, sign test p = "
              f"{sign_test(fixed, broken):.3f}")


def paired_times(rows: list[dict], base_key: str, cand_key: str, what: str, base_label: str, cand_label: str,
                 note: str = "") -> None:
    """The median time of two ways of one step over the same requests (timed one after the other in one process),
    and the median of the per-request ratio."""
    if not rows:
        return
    base = float(np.median([r[base_key] for r in rows]))
    cand = float(np.median([r[cand_key] for r in rows]))
    ratio = float(np.median([r[base_key] / r[cand_key] for r in rows]))
    print(f"  {what} over {len(rows)}{note}: {base_label} {base:.0f} ms, {cand_label} {cand:.0f} ms; "
          f"per request {ratio:.2f}x as fast")


def orders_report(path: Path) -> None:
    """The cascade, gated by the index's margin gate as `nexus route` is, with the name choice read in the retriever's
    order (as shipped) against the mean of that and the reverse order, per query set; paired."""
    doc = json.loads(Path(path).read_text())
    rows, k, tau = doc["samples"]["queries"], doc["params"]["k"], doc["params"]["tau"]

    def pick(r, both: bool) -> int:
        if not escalated(r, tau):
            return 0  # the fast path: no reranker
        mean = None
        if both and r["choice15"] is not None:
            mean = (np.asarray(r["choice15"], dtype=np.float64) + np.asarray(r["choice15_rev"], dtype=np.float64)) / 2
        return cascade_pick(r, k, choice=mean)

    up = [r for r in rows if escalated(r, tau)]
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, escalated {len(up)}, the name choice asked on "
          f"{sum(cascade_asks(r['ll05'], None, 0.0) for r in up)}")
    paired_by_kind(rows, pick, "one order", "both orders")


def chooser_k_report(path: Path) -> None:
    """The cascade, gated by the index's margin gate as `nexus route` is, with the name choice over all K cards (as
    shipped) against over the first N only (the candidates after them ranked after, in the retriever's order), per
    query set, paired; and the name choice's median time both ways (one process, one after the other per request)."""
    doc = json.loads(Path(path).read_text())
    rows, k, tau, n = doc["samples"]["queries"], doc["params"]["k"], doc["params"]["tau"], doc["params"]["chooser_k"]

    def pick(r, first: bool) -> int:
        if not escalated(r, tau):
            return 0  # the fast path: no reranker
        if first and r["choice15_first"] is not None:
            return cascade_pick(r, n, choice=r["choice15_first"])
        return cascade_pick(r, k)

    up = [r for r in rows if escalated(r, tau)]
    asked = [r for r in up if r["choice15"] is not None]
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, escalated {len(up)}, the name choice asked on {len(asked)}")
    paired_by_kind(rows, pick, f"{k} cards", f"the first {n}")
    timed = [r for r in rows if r["choice15_ms"] is not None]
    paired_times(timed, "choice15_ms", "choice15_first_ms", "a name choice, median", f"{k} cards", f"the first {n}")


def head_cache_report(path: Path) -> None:
    """The cascade, gated by the index's margin gate as `nexus route` is, with the name choice's prompt decoded whole
    against its head kept decoded, per query set, paired; and the name choice's median time both ways (one process,
    one after the other per request)."""
    doc = json.loads(Path(path).read_text())
    rows, tau, n = doc["samples"]["queries"], doc["params"]["tau"], doc["params"]["choice_k"]

    def pick(r, held: bool) -> int:
        if not escalated(r, tau):
            return 0  # the fast path: no reranker
        return cascade_pick(r, n, choice=r["choice15_head" if held else "choice15"])

    up = [r for r in rows if escalated(r, tau)]
    asked = [r for r in up if r["choice15"] is not None]
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, escalated {len(up)}, the name choice asked on {len(asked)}"
          f" (over {n} cards)")
    paired_by_kind(rows, pick, "whole prompt", "head kept")
    paired_times(asked, "choice15_ms", "choice15_head_ms", "a name choice, median", "whole prompt", "head kept")


def cascade_order(r: dict, ll, choice_k: int) -> list[int]:
    """The cascade's ranking of a dumped request's candidates (CascadeReranker.score, then the router's stable sort)
    with the likelihood scores `ll` over its first len(ll): the name choice's (r["choice15"], over the first
    choice_k) where the likelihood's first is not the retriever's, else the reciprocal-rank fusion; the candidates
    the judge did not read after, in the retriever's order."""
    n = len(r["cands"])
    if int(np.argmax(ll)) != 0:
        c = np.asarray(r["choice15"], dtype=np.float64)
        head = np.asarray(r["retriever"][:choice_k]) + 0.1 * (c - c.max())
    else:
        head = np.asarray(rrf_fuse(r["retriever"][:len(ll)], list(ll), 60))
    return [int(i) for i in np.argsort(-head, kind="stable")] + list(range(len(head), n))


def likelihood_k_report(path: Path) -> None:
    """The cascade, gated by the index's margin gate as `nexus route` is, with its likelihood over the first 4
    candidates (as shipped before) against over the first N: top-1 per query set and top-3, paired; how often the name
    choice is asked; the likelihood stage's median time both ways (one process, warm, alternating)."""
    doc = json.loads(Path(path).read_text())
    rows, tau, n, ck = (doc["samples"]["queries"], doc["params"]["tau"], doc["params"]["likelihood_k"],
                        doc["params"]["choice_k"])

    def order(r, short: bool) -> list[int]:
        if not escalated(r, tau):
            return list(range(len(r["cands"])))  # the fast path: no reranker
        return cascade_order(r, r["ll05_n" if short else "ll05_4"], ck)

    up = [r for r in rows if escalated(r, tau)]
    ask4 = sum(cascade_asks(r["ll05_4"], None, 0.0) for r in up)
    askn = sum(cascade_asks(r["ll05_n"], None, 0.0) for r in up)
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, escalated {len(up)}; the name choice asked on {ask4} "
          f"with the likelihood over 4, {askn} over {n}")
    paired_by_kind(rows, lambda r, short: order(r, short)[0], "over 4", f"over {n}")
    top3 = {short: np.array([any(r["cands"][i] in r["gold"] for i in order(r, short)[:3]) for r in rows])
            for short in (False, True)}
    fixed, broken = int((top3[True] & ~top3[False]).sum()), int((~top3[True] & top3[False]).sum())
    print(f"  top-3 ({len(rows)}): over 4 {top3[False].sum()}, over {n} {top3[True].sum()}, {fixed} fixed / "
          f"{broken} broken")
    paired_times(up, "ll05_4_ms", "ll05_n_ms", "the likelihood stage, median", "over 4", f"over {n}", " (warm)")


def likelihood_margin(ll) -> float:
    """The likelihood's score of the retriever's first candidate minus the best other's (inf with one candidate)."""
    return float(ll[0] - max(ll[1:])) if len(ll) > 1 else float("inf")


def margin_cascade_pick(r: dict, ll, d: float, tau: float, choice_k: int) -> int:
    """The cascade's first choice for a dumped request, gated as `nexus route` is, asking the name choice
    (r["choice15"], over the first choice_k) where likelihood_margin(ll) < d, else the likelihood's reciprocal-rank
    fusion with the retriever over the first len(ll) (CascadeReranker.score)."""
    if not escalated(r, tau):
        return 0  # the fast path: no reranker
    if likelihood_margin(ll) < d:
        c = np.asarray(r["choice15"], dtype=np.float64)
        return int(np.argmax(np.asarray(r["retriever"][:choice_k]) + 0.1 * (c - c.max())))
    return int(np.argmax(rrf_fuse(r["retriever"][:len(ll)], ll, 60)))


def ask_margin_report(path: Path) -> None:
    """The cascade, gated by the index's margin gate as `nexus route` is, asking the name choice where the likelihood's
    first-candidate margin is below d, for each d of ASK_MARGINS: top-1 (all, follow-ups), paired against d = 0, and
    the asks; then the rule's decision (results/rerank-features/ask-margin/RULE.txt)."""
    doc = json.loads(Path(path).read_text())
    rows, tau, ck = doc["samples"]["queries"], doc["params"]["tau"], doc["params"]["choice_k"]
    up = [r for r in rows if escalated(r, tau)]
    follow = np.array([r["follow_up"] for r in rows])
    hits = {d: np.array([r["cands"][margin_cascade_pick(r, r["ll05_3"], d, tau, ck)] in r["gold"] for r in rows])
            for d in ASK_MARGINS}
    asks = {d: sum(likelihood_margin(r["ll05_3"]) < d for r in up) for d in ASK_MARGINS}
    base = hits[0.0]
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, escalated {len(up)}")
    net = {}
    for d in ASK_MARGINS:
        h = hits[d]
        fixed, broken = int((h & ~base).sum()), int((~h & base).sum())
        net[d] = (fixed - broken, int(h[follow].sum()) - int(base[follow].sum()))
        print(f"  d = {d:+.1f}: top-1 {h.sum()} ({h.mean() * 100:.1f} %), {fixed} fixed / {broken} broken; follow-ups "
              f"{h[follow].sum()} of {follow.sum()}; the name choice asked on {asks[d]} of {len(up)}")
    best = max(ASK_MARGINS, key=lambda d: (int(hits[d].sum()), -asks[d]))
    if net[best][0] >= 2 and net[best][1] >= 0:
        print(f"  the rule: d = {best:+.1f} (step 1: {net[best][0]} more right, follow-ups {net[best][1]:+d})")
        return
    faster = [d for d in ASK_MARGINS if d < 0 and net[d][0] >= 0 and net[d][1] >= 0 and asks[d] <= 0.8 * asks[0.0]]
    if faster:
        d = min(faster)
        print(f"  the rule: d = {d:+.1f} (step 2: top-1 {net[d][0]:+d}, follow-ups {net[d][1]:+d}, "
              f"{asks[d]} asks against {asks[0.0]})")
    else:
        print("  the rule: nothing changes (step 3)")


def ask_time_report(path: Path) -> None:
    """The cascade, gated by the index's margin gate as `nexus route` is, for each likelihood width K (2, 3) and ask
    margin d of ASK_MARGINS: top-1 (all, follow-ups), paired against K = 3, d = +0.1 (as shipped when the dump's rule
    was written), how often the name choice is asked, and the escalated decision's modelled median (per escalated
    request, the likelihood's time at K plus the name choice's where it is asked); then the decision of
    results/rerank-features/ask-time/RULE.txt."""
    doc = json.loads(Path(path).read_text())
    rows, tau, ck = doc["samples"]["queries"], doc["params"]["tau"], doc["params"]["choice_k"]
    up = [r for r in rows if escalated(r, tau)]
    follow = np.array([r["follow_up"] for r in rows])

    def asked(r, k: int, d: float) -> bool:
        return likelihood_margin(r[f"ll05_{k}"]) < d

    grid = [(k, d) for k in (3, 2) for d in ASK_MARGINS]
    hits = {s: np.array([r["cands"][margin_cascade_pick(r, r[f"ll05_{s[0]}"], s[1], tau, ck)] in r["gold"]
                         for r in rows]) for s in grid}
    asks = {s: sum(asked(r, *s) for r in up) for s in grid}
    median = {s: float(np.median([r[f"ll05_{s[0]}_ms"] + (r["choice15_ms"] if asked(r, *s) else 0.0) for r in up]))
              for s in grid}
    base = hits[(3, 0.1)]
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, escalated {len(up)}; median times over them: likelihood "
          f"over 3 {np.median([r['ll05_3_ms'] for r in up]):.0f} ms, over 2 "
          f"{np.median([r['ll05_2_ms'] for r in up]):.0f} ms, name choice {np.median([r['choice15_ms'] for r in up]):.0f} ms")
    for s in grid:
        h = hits[s]
        fixed, broken = int((h & ~base).sum()), int((~h & base).sum())
        print(f"  K = {s[0]}, d = {s[1]:+.1f}: top-1 {h.sum()} ({h.mean() * 100:.1f} %), {fixed} fixed / {broken} broken "
              f"against K = 3, d = +0.1; follow-ups {h[follow].sum()} of {follow.sum()}; the name choice asked on "
              f"{asks[s]} of {len(up)} ({asks[s] / len(up) * 100:.0f} %); escalated median {median[s]:.0f} ms")
    admissible = [s for s in grid if asks[s] <= 0.4 * len(up)]
    if not admissible:
        print("  the rule: no setting asks on at most 40 % of the escalated requests; nothing changes")
        return
    best = max(admissible, key=lambda s: (int(hits[s].sum()), int(hits[s][follow].sum()), -median[s]))
    print(f"  the rule: K = {best[0]}, d = {best[1]:+.1f} (top-1 {hits[best].sum()}, follow-ups "
          f"{hits[best][follow].sum()}, asks {asks[best]} of {len(up)}, escalated median {median[best]:.0f} ms)")


def card_words_report(path: Path) -> None:
    """The shipped cascade (likelihood over 2, ask margin ASK_MARGIN, name choice over CHOICE_K cards), gated as
    `nexus route` is, with each card variant of the dump's name choice: top-1 (all, follow-ups; an interchangeable
    copy counts as right), paired against today's cards, and the median time of an asked name choice; then the
    decision of results/rerank-features/card-words/RULE.txt."""
    doc = json.loads(Path(path).read_text())
    rows, tau, ck = doc["samples"]["queries"], doc["params"]["tau"], doc["params"]["choice_k"]
    variants = list(doc["params"]["card_variants"])
    follow = np.array([r["follow_up"] for r in rows])
    asked = [r for r in rows if r.get("choice_today") is not None]

    def pick(r: dict, name: str) -> int:  # the fast path returns before the likelihood or the choice is read
        return margin_cascade_pick({**r, "choice15": r.get(f"choice_{name}")}, r["ll05_2"],
                                   CascadeReranker.ASK_MARGIN, tau, ck)

    hits = {v: np.array([r["cands"][pick(r, v)] in r["gold"] for r in rows]) for v in variants}
    ms = {v: float(np.median([r[f"choice_{v}_ms"] for r in asked])) for v in variants}
    base = hits["today"]
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}, the name choice asked on {len(asked)}")
    for v in variants:
        h = hits[v]
        words, params = doc["params"]["card_variants"][v]
        print(f"  {v} ({words} words, {params} parameters): top-1 {h.sum()} ({h.mean() * 100:.1f} %), "
              f"{int((h & ~base).sum())} fixed / {int((~h & base).sum())} broken against today's; follow-ups "
              f"{h[follow].sum()} of {follow.sum()}; asked name choice median {ms[v]:.0f} ms "
              f"({ms['today'] / ms[v]:.2f}x today's)")
    admissible = [v for v in variants if v != "today" and hits[v].sum() >= base.sum()
                  and hits[v][follow].sum() >= base[follow].sum()]
    if not admissible:
        print("  the rule: no variant keeps today's top-1 and follow-ups; the cards stay")
        return
    best = min(admissible, key=lambda v: (ms[v], -int(hits[v].sum())))
    goes = ms["today"] / ms[best] >= 1.2
    print(f"  the rule: {best} ({ms['today'] / ms[best]:.2f}x) " + ("goes on to the test part" if goes else
                                                                     "is under 1.2x; the cards stay"))


def name_choice_pick(keys: list[str], base, choice) -> str:
    """The name choice's pick among its cards: the retriever's score + 0.1 x the log-probability's distance to the best
    (LLMReranker.score with Qwen2.5-1.5B's weight)."""
    c = np.asarray(choice, dtype=np.float64)
    return keys[int(np.argmax(np.asarray(base) + 0.1 * (c - c.max())))]


def history_candidate_pick(r: dict, variant: str, tau: float, choice_k: int) -> str:
    """The key of the tool the cascade picks for a dumped --history-candidates request: "base" as shipped, "C1" with
    the conversation's own best tool as the name choice's last card where the cascade asks it, "C2" asking the name
    choice wherever that tool is such a card (results/rerank-features/history-candidates/RULE.txt)."""
    if not escalated(r, tau):
        return r["cands"][0]
    ll = r["ll05_2"]
    swap = variant != "base" and r.get("choice15_h") is not None
    asked = likelihood_margin(ll) < CascadeReranker.ASK_MARGIN or (variant == "C2" and swap)
    if not asked:
        return r["cands"][int(np.argmax(rrf_fuse(r["retriever"][:len(ll)], ll, 60)))]
    if swap:
        return name_choice_pick(r["cands"][:choice_k - 1] + [r["hist_key"]],
                                r["retriever"][:choice_k - 1] + [r["hist_score"]], r["choice15_h"])
    return name_choice_pick(r["cands"][:choice_k], r["retriever"][:choice_k], r["choice15"])


def server_cards_pick(r: dict, variant: str, tau: float, choice_k: int) -> str:
    """The key of the tool the cascade picks for a dumped --server-cards request: "base" as shipped, "s3" / "s5" with
    the conversation's server's tools among the name choice's cards where any was added (asked there whatever the
    likelihood says; results/rerank-features/server-cards/RULE.txt)."""
    if not escalated(r, tau):
        return r["cands"][0]
    if variant != "base" and r.get(f"choice15_{variant}") is not None:
        return name_choice_pick(r[f"{variant}_keys"], r[f"{variant}_base"], r[f"choice15_{variant}"])
    ll = r["ll05_2"]
    if likelihood_margin(ll) >= CascadeReranker.ASK_MARGIN:
        return r["cands"][int(np.argmax(rrf_fuse(r["retriever"][:len(ll)], ll, 60)))]
    return name_choice_pick(r["cands"][:choice_k], r["retriever"][:choice_k], r["choice15"])


def history_variants_report(rows: list[dict], variants: list[str], pick, gold: str, asked, kind_note,
                            slack: int, need: int) -> None:
    """The cascade's variants over dumped requests with a history, per kind of request (request_kind): top-1 against
    `gold` (a row key), paired against variants[0] (the shipped cascade), and the name choices each asks
    (asked(r, v)); kind_note(rows) adds a line per kind. Then a rule's step 1: a variant is admissible if its top-1
    after another conversation is at most `slack` below the base's; the admissible one with the most follow-ups (a
    tie goes to the first listed) goes on if it gains at least `need`."""
    kinds: dict[str, list[dict]] = {}
    for r in rows:
        kinds.setdefault(request_kind(r), []).append(r)
    hits = {v: {k: np.array([pick(r, v) in r[gold] for r in rs]) for k, rs in kinds.items()} for v in variants}
    for k, rs in kinds.items():
        print(f"  {k} ({len(rs)}): {kind_note(rs)}")
        base = hits[variants[0]][k]
        for v in variants:
            h = hits[v][k]
            fixed, broken = int((h & ~base).sum()), int((~h & base).sum())
            print(f"    {v}: top-1 {h.sum()} ({h.mean() * 100:.1f} %), {fixed} fixed / {broken} broken against base, "
                  f"sign test p = {sign_test(fixed, broken):.3f}; the name choice asked on "
                  f"{sum(asked(r, v) for r in rs)}")

    def total(v: str, kind: str) -> int:
        return int(hits[v].get(kind, np.array([])).sum())

    after, follow = "after another conversation", "follow-ups"
    admissible = [v for v in variants[1:] if total(v, after) >= total(variants[0], after) - slack]
    if not admissible:
        print("  the rule: no candidate is admissible (top-1 after another conversation); nothing changes")
        return
    best = max(admissible, key=lambda v: (total(v, follow), v == variants[1]))
    gain = total(best, follow) - total(variants[0], follow)
    print(f"  the rule: {best} " + (f"goes on to step 2 (follow-ups {gain:+d})" if gain >= need else
                                    f"gains {gain:+d} follow-ups, under {need}; nothing changes"))


def history_candidates_report(path: Path) -> None:
    """Base, C1 and C2 (history_candidate_pick) per kind of request, paired against base, the name choices each
    asks, and the decision of step 1 of results/rerank-features/history-candidates/RULE.txt."""
    doc = json.loads(Path(path).read_text())
    rows, tau, ck = doc["samples"]["queries"], doc["params"]["tau"], doc["params"]["choice_k"]
    swapped = sum(r.get("choice15_h") is not None for r in rows)
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}; the conversation's own tool outside the first {ck} on "
          f"{swapped} escalated requests")

    def asked(r: dict, v: str) -> bool:
        return escalated(r, tau) and (likelihood_margin(r["ll05_2"]) < CascadeReranker.ASK_MARGIN
                                      or (v == "C2" and r.get("choice15_h") is not None))

    def note(rs: list[dict]) -> str:
        return f"the conversation's own best tool is the gold one for {sum(r.get('hist_key') in r['gold'] for r in rs)}"

    history_variants_report(rows, ["base", "C1", "C2"], lambda r, v: history_candidate_pick(r, v, tau, ck), "gold",
                            asked, note, slack=1, need=2)


def server_cards_report(path: Path) -> None:
    """Base, S3 and S5 (server_cards_pick) per kind of request, strict top-1 (the gold tool or a listed acceptable
    one), paired against base, the name choices each asks, and step 1's decision of
    results/rerank-features/server-cards/RULE.txt."""
    doc = json.loads(Path(path).read_text())
    rows, tau, ck = doc["samples"]["queries"], doc["params"]["tau"], doc["params"]["choice_k"]
    print(f"{path}: {len(rows)} requests, tau = {tau:.4f}")

    def asked(r: dict, v: str) -> bool:
        return escalated(r, tau) and ((v != "base" and r.get(f"choice15_{v}") is not None)
                                      or likelihood_margin(r["ll05_2"]) < CascadeReranker.ASK_MARGIN)

    def note(rs: list[dict]) -> str:
        conv = sum(r.get("conv_server") is not None and
                   any(g.split("/")[0] == r["conv_server"] for g in r["gold_strict"]) for r in rs)
        return f"the conversation's server is the gold tool's for {conv}"

    variants = ["base"] + [f"s{n}" for n in doc["params"]["server_cards"]]
    history_variants_report(rows, variants, lambda r, v: server_cards_pick(r, v, tau, ck), "gold_strict", asked, note,
                            slack=2, need=3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--part", default="dev", choices=("dev", "test"))
    d.add_argument("--k", type=int, default=5)
    d.add_argument("--max-queries", type=int, default=None)
    d.add_argument("--stride", type=int, default=1, help="every N-th request (the requests are grouped by tool)")
    d.add_argument("--choosers", default="choice15", help=f"comma-separated, of {sorted(CHOOSERS)}")
    d.add_argument("--queries", action="append", default=None,
                   help="a request file (repeatable); by default the part's requests as `nexus bench routing-lso` reads them")
    d.add_argument("--out", default="results")
    d.add_argument("--orders", action="store_true",
                   help="the 1.5B name choice in both orders of the cards, where the cascade asks it (see `orders`)")
    d.add_argument("--chooser-k", type=int, default=None,
                   help="the 1.5B name choice over all K cards and over the first N, timed, where the cascade asks it")
    d.add_argument("--head-cache", action="store_true",
                   help="the 1.5B name choice with its prompt decoded whole and with its head kept, timed, where the "
                        "cascade asks it")
    d.add_argument("--likelihood-k", type=int, default=None,
                   help="the 0.5B likelihood over the first 4 and over the first N, timed, where the gate escalates")
    d.add_argument("--ask-margin", action="store_true",
                   help="the cascade's likelihood and the 1.5B name choice on every escalated request (see ask-margin)")
    d.add_argument("--ask-time", action="store_true",
                   help="the likelihood over 3 and over 2 and the 1.5B name choice, timed, on every escalated request "
                        "(see ask-time)")
    d.add_argument("--card-words", action="store_true",
                   help="the 1.5B name choice with each card variant of CARD_VARIANTS, timed, where the shipped cascade "
                        "asks it (see card-words)")
    d.add_argument("--prev-request", action="store_true",
                   help="also score the previous request's likelihood (ll05_prev) for requests with a history")
    d.add_argument("--server-cards", action="store_true",
                   help="the shipped cascade on every escalated request, and the 1.5B name choice over the first two "
                        "and the conversation's server's tools (see server-cards)")
    d.add_argument("--history-candidates", action="store_true",
                   help="the shipped cascade on every escalated request, and the 1.5B name choice with the "
                        "conversation's own best tool as a card (see history-candidates)")
    f = sub.add_parser("fuse")
    f.add_argument("file")
    h = sub.add_parser("history")
    h.add_argument("file")
    o = sub.add_parser("orders")
    o.add_argument("file")
    c = sub.add_parser("chooser-k")
    c.add_argument("file")
    hc = sub.add_parser("head-cache")
    hc.add_argument("file")
    lk = sub.add_parser("likelihood-k")
    lk.add_argument("file")
    am = sub.add_parser("ask-margin")
    am.add_argument("file")
    at = sub.add_parser("ask-time")
    at.add_argument("file")
    cw = sub.add_parser("card-words")
    cw.add_argument("file")
    hcand = sub.add_parser("history-candidates")
    hcand.add_argument("file")
    scards = sub.add_parser("server-cards")
    scards.add_argument("file")
    a = ap.parse_args()
    if a.cmd == "dump":
        print(dump(a.part, a.k, a.max_queries, a.stride, [c for c in a.choosers.split(",") if c], a.out,
                   a.queries, a.prev_request, a.orders, a.chooser_k, a.head_cache, a.likelihood_k,
                   a.ask_margin, a.ask_time, a.card_words, a.history_candidates, a.server_cards))
    elif a.cmd == "history":
        history(Path(a.file))
    elif a.cmd == "orders":
        orders_report(Path(a.file))
    elif a.cmd == "chooser-k":
        chooser_k_report(Path(a.file))
    elif a.cmd == "head-cache":
        head_cache_report(Path(a.file))
    elif a.cmd == "likelihood-k":
        likelihood_k_report(Path(a.file))
    elif a.cmd == "ask-margin":
        ask_margin_report(Path(a.file))
    elif a.cmd == "ask-time":
        ask_time_report(Path(a.file))
    elif a.cmd == "card-words":
        card_words_report(Path(a.file))
    elif a.cmd == "history-candidates":
        history_candidates_report(Path(a.file))
    elif a.cmd == "server-cards":
        server_cards_report(Path(a.file))
    else:
        fuse(Path(a.file))


if __name__ == "__main__":
    main()
