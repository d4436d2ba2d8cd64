"""`nexus route`: query → embedding → native INT8 SLB scan (+ BM25 fusion) → margin gate → reranker on escalation →
the chosen tool → its arguments.

`Router` loads everything once (index, embedder, reranker, LLM on first use) and is reused by `--batch` and by the
routing benchmark. No CLI or rendering code here.
"""

from __future__ import annotations

import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np

from ..adapters.embedder import query_embedder
from ..config import ARGUMENTS_LLM, DEFAULT_ARGS_TIME_LIMIT_S, LIKELIHOOD_RERANKER_LLM, LLM_RERANKER_MODEL
from ..errors import ModelError, NexusError, UsageError
from ..models import model_key
from ..prefix_store import PrefixStore
from ..registry import load_registries
from .index import Index, load_index
from .rerank import RERANK_K, CascadeReranker, LikelihoodReranker, LLMReranker
from .scoring import rank, request_scores, request_texts

if TYPE_CHECKING:
    from ..arguments import ArgumentPrefixes

# The LLM adapter, the schema compiler and the arguments stage are imported where they are first used: a route
# without arguments that the gate does not escalate never loads them.

RERANKERS = ("auto", "none", "llm", "likelihood", "cascade")
HISTORY_WEIGHT = 0.2  # chosen on requests that do not depend on their history too (docs/routing.md, "History")
HISTORY_TURNS = 2  # the most recent messages that inform routing
HISTORY_CHARS = 300


def routing_context(history: Sequence[dict] | None) -> str:
    """The recent turns that inform routing: the last HISTORY_TURNS messages' text, bulky tool payloads replaced by
    surrogates (as in the arguments' history window), cut to HISTORY_CHARS from the end."""
    if not history:
        return ""
    from ..arguments import prune_history

    msgs = prune_history(history, max_turns=HISTORY_TURNS, digest=False)
    text = " ".join(m["content"] for m in msgs if m.get("content"))
    return text[-HISTORY_CHARS:].strip()


@dataclass
class Candidate:
    server: str
    tool: str
    score: float  # the retriever's fused score (one scale for every candidate; the gate's margin is over it)
    rerank_score: float | None = None  # the reranker's score, for the candidates it judged (they come first)


@dataclass
class RouteResult:
    tool: str
    server: str
    arguments: dict | None
    candidates: list[Candidate]
    gate: dict
    signature: str
    timings_ms: dict
    reranker: str | None = None
    args_error: str | None = None
    # required argument values the request gives no trace of (arguments/guessed.py); None when no arguments were made
    guessed: list[str] | None = None
    id: Any = None
    # the same tool on other servers (equal name, description and parameters): the request cannot prefer one of them
    interchangeable: list[dict] = field(default_factory=list)
    # a decision the cascade reranked: whether its name choice decided (True: the slow kind) or its likelihood (False)
    name_choice: bool | None = None

    def as_json(self) -> dict:
        d = {
            "tool": self.tool,
            "server": self.server,
            "arguments": self.arguments,
            "candidates": [asdict(c) for c in self.candidates],
            "gate": self.gate,
            "signature": self.signature,
            "timings_ms": self.timings_ms,
            "interchangeable": self.interchangeable,
        }
        if self.reranker is not None:
            d["reranker"] = self.reranker
        if self.name_choice is not None:
            d["name_choice"] = self.name_choice
        if self.args_error is not None:
            d["args_error"] = self.args_error
        if self.guessed is not None:
            d["guessed"] = self.guessed
        if self.id is not None:
            d = {"id": self.id, **d}
        return d


@dataclass
class RouterConfig:
    top_k: int = 5  # candidates reported
    rerank_k: int | None = None  # candidates the reranker sees; None: the reranker's own (rerank.RERANK_K)
    reranker: str = "auto"  # auto: none for an embedder fine-tuned on example requests; cascade over an index without
    # example requests with the default model; else likelihood (Router._pick_reranker)
    lex_weight: float | None = None  # None: the index's
    use_gate: bool = True  # False: always rerank (ablation)
    model: str = ARGUMENTS_LLM  # LLM for arguments
    # LLM of the reranker; None: config.LLM_RERANKER_MODEL for llm; for likelihood config.LIKELIHOOD_RERANKER_LLM when
    # `model` is ARGUMENTS_LLM (the default), else `model`
    rerank_model: str | None = None
    args_time_limit_s: float | None = DEFAULT_ARGS_TIME_LIMIT_S  # the bound on one argument generation, retries included
    threads: int | None = None
    history_weight: float = HISTORY_WEIGHT  # share of the history-prefixed query in the scores (0: ignore history)
    value_masking: bool | None = None  # None: the index's (also score the request with its values masked)
    rerank_masking: bool = True  # the likelihood reranker scores the request with its values masked
    query_encoder: str | None = None  # what embeds requests: auto / numpy / torch; None: $NEXUS_QUERY_ENCODER or auto
    prefix_store: bool = True  # decoded prefixes kept on disk (prefix_store.PrefixStore): the likelihood
    # reranker's candidates, and each tool's argument prompt prefix (arguments.ArgumentPrefixes)
    # load and run everything once at construction, so no timed route pays for lazy set-up (batches, servers,
    # benchmarks); a one-shot route turns it off and loads only what its request needs (no LLM unless the gate
    # escalates or arguments are asked for)
    warm: bool = True
    extra: dict = field(default_factory=dict)

    def __post_init__(self):
        if not 0.0 <= self.history_weight <= 1.0:
            raise UsageError(f"the history weight must be within [0, 1], not {self.history_weight}")


class Router:
    """Route queries over one index. Thread-compatible, not thread-safe (one Router per thread)."""

    def __init__(self, index: str | Path | Index, config: RouterConfig | None = None, embedder=None,
                 registry: Sequence[str] | None = None, llm=None):
        """llm: an existing LlamaContext of config.model to share (benchmarks that build many routers); else one is
        created on first use."""
        self.config = config or RouterConfig()
        if self.config.reranker not in RERANKERS:
            raise NexusError(f"unknown reranker '{self.config.reranker}' ({', '.join(RERANKERS)})")
        self.index = index if isinstance(index, Index) else load_index(index)
        self.tau = self.index.tau
        self.lex_weight = self.index.lex_weight() if self.config.lex_weight is None else float(self.config.lex_weight)
        self.value_masking = (self.index.value_masking if self.config.value_masking is None
                              else bool(self.config.value_masking))
        if embedder is None:
            # requests are embedded in NumPy where the model allows it: no torch / sentence-transformers import
            # (~7 s of a one-shot `nexus route`); adapters.embedder.query_embedder says when it falls back
            embedder = query_embedder(self.index.embedder, threads=self.config.threads,
                                      encoder=self.config.query_encoder, one_shot=not self.config.warm)
        self.embedder = embedder
        self._reranker = None
        self._reranker_name = self._pick_reranker()
        self.rerank_k = int(self.config.rerank_k or RERANK_K.get(self._reranker_name, 10))
        if self.rerank_k < 2:
            raise NexusError(f"rerank_k must be at least 2, got {self.rerank_k}")
        self._llm = llm
        self._rerank_llm = None  # the rerankers' own context when config.rerank_model differs from config.model
        self._cascade_small = None  # the cascade's likelihood model, when it is not config.model
        self._llm_loading: threading.Thread | None = None  # prefetch_llm's load, joined by llm()
        self._llm_error: BaseException | None = None
        self._arg_prefixes = None  # arguments.ArgumentPrefixes, made on the first argument call
        self._schemas = self._load_registry_schemas(registry) if registry else None
        self._specs: dict[str, object] = {}  # tool key -> ToolSpec, made once per tool
        if self.config.warm:
            self._warm()

    # ------------------------------------------------------------------------------------------- setup

    def _pick_reranker(self) -> str:
        r = self.config.reranker
        if r == "auto":  # the measured best (docs/routing.md, "Rerankers")
            # an embedder fine-tuned on example requests, over an index whose tools have examples, leaves the
            # likelihood reranker nothing to add (-0.5 to +0.3 points of top-1 in four measurements) for ~0.3 s a
            # decision: route on the retriever alone. Over tools without any example request (a user's own registry,
            # tools the shipped router embedder never saw) the cascade gains most (+4.7 points on the blind
            # leave-servers-out test part over the likelihood reranker alone); its name choice runs on the arguments'
            # model, so it is the default only with the default --model (no third model to load)
            m = self.index.manifest
            examples = (m.get("recipe") or {}).get("examples")
            if examples:
                return "none" if m.get("embedder", {}).get("examples_finetuned") else "likelihood"
            cascade = model_key(self.config.model) == model_key(LLM_RERANKER_MODEL) and self.config.rerank_model is None
            return "cascade" if cascade else "likelihood"
        return r

    def _load_registry_schemas(self, registry: Sequence[str]) -> dict[str, Any]:
        tools = load_registries(registry)
        by_key = {t.key: t for t in tools}
        missing = [t.key for t in self.index.tools if t.key not in by_key]
        if missing:
            raise NexusError(f"--registry does not match the index: {len(missing)} indexed tools are missing "
                             f"(e.g. {missing[0]})", hint="rebuild the index from this registry")
        return by_key

    def _warm(self) -> None:
        """One throw-away query so the first timed route does not pay for lazy initialisation."""
        self.embedder.encode_one("warm up")
        self.index.interchangeable(0)  # the copies map (~17 ms over 955 tools), built here rather than in a route
        if self.value_masking:
            self.embedder.encode_few(["warm up acme/api", "warm up repository"])
        if self._reranker_name != "none":
            reranker = self.reranker()
            if isinstance(reranker, CascadeReranker):
                reranker.chooser  # its model too: a warm router (serve, batches) loads everything up front

    def reranker(self):
        if self._reranker is None and self._reranker_name != "none":
            # the name choice's prompt head has a folder of its own (each folder has its own cap)
            head_store = PrefixStore.default(LLMReranker.STORE_SUBDIR) if self.config.prefix_store else None
            if self._reranker_name == "llm":
                self._reranker = LLMReranker(self.rerank_llm(), store=head_store)
            else:
                store = PrefixStore.default() if self.config.prefix_store else None
                likelihood_llm = self.rerank_llm() if self._reranker_name == "likelihood" else self._cascade_llm()
                likelihood = LikelihoodReranker(likelihood_llm, mask_values=self.config.rerank_masking, store=store)
                self._reranker = likelihood if self._reranker_name == "likelihood" else \
                    CascadeReranker(likelihood, lambda: LLMReranker(self.rerank_llm(), store=head_store))
        return self._reranker

    def _cascade_llm(self):
        """The cascade's likelihood model: LIKELIHOOD_RERANKER_LLM, the arguments' context when it is that model."""
        if model_key(LIKELIHOOD_RERANKER_LLM) == model_key(self.config.model):
            return self.llm()
        if self._cascade_small is None:
            self._cascade_small = self._context(LIKELIHOOD_RERANKER_LLM)
        return self._cascade_small

    def _context(self, name: str):
        # sequence 0: arguments; 1: the llm reranker's prompt, 2..: its copies, or the likelihood reranker's
        # candidates, scored together. Flash attention: the reranker's batched decode over restored prefixes took
        # 7-13 % less time with it, with the same decisions (docs/routing.md, "Latency")
        from ..adapters.llama import LlamaContext, LlamaModel

        return LlamaContext(LlamaModel(name), n_ctx=4096, n_seq_max=LikelihoodReranker.SEQ + self.rerank_k,
                            flash_attn=True)

    def llm(self):
        """The LLM context of argument generation (config.model), made on first use."""
        if self._llm_loading is not None:
            self._llm_loading.join()
            self._llm_loading = None
            if self._llm_error is not None:
                error, self._llm_error = self._llm_error, None
                raise error
        if self._llm is None:
            self._llm = self._context(self.config.model)
        return self._llm

    def prefetch_llm(self) -> None:
        """Start loading the arguments' LLM in a thread, so that its load overlaps the routing and the reranker
        (a one-shot `nexus route` needs both models); llm() waits for it."""
        if self._llm is not None or self._llm_loading is not None:
            return

        def load():
            try:
                self._llm = self._context(self.config.model)
            except BaseException as e:  # noqa: BLE001 - handed to llm(), which raises it in the caller's thread
                self._llm_error = e

        self._llm_loading = threading.Thread(target=load, name="nexus-llm-load", daemon=True)
        self._llm_loading.start()

    @property
    def rerank_model(self) -> str | None:
        """The reranker's LLM (None: no reranker)."""
        if self._reranker_name == "none":
            return None
        if self.config.rerank_model is not None:
            return self.config.rerank_model
        if self._reranker_name in ("llm", "cascade"):  # the cascade's name choice (its likelihood: _cascade_llm)
            return LLM_RERANKER_MODEL
        # each stage on the model measured best for it by default; any other --model runs both
        return LIKELIHOOD_RERANKER_LLM if model_key(self.config.model) == ARGUMENTS_LLM else self.config.model

    def rerank_llm(self):
        """The reranker's LLM context: its own, or the arguments' one when it is the same model."""
        name = self.rerank_model
        if model_key(name) == model_key(self.config.model):
            return self.llm()
        if self._rerank_llm is None:
            self._rerank_llm = self._context(name)
        return self._rerank_llm

    def _rerank(self, query: str, entries: list, base_scores: list[float], history) -> list[float]:
        """The reranker's scores. While the arguments' model is still loading in its thread (prefetch_llm, a
        one-shot route), the reranker's own model decodes on one thread fewer: the loader works on one core, and
        on 2 cores the reranker's two threads took turns with it (`make demo`'s request: the likelihood took 0.8 s
        instead of 0.35, and the load ended 0.2 s later than beside one thread). The scores are the same
        (LlamaContext.set_threads)."""
        reranker = self.reranker()
        loading = self._llm_loading is not None and self._llm_loading.is_alive()
        own = [c for c in (self._cascade_small, self._rerank_llm) if c is not None and c is not self._llm] \
            if loading else []
        for c in own:
            c.set_threads(max(1, c.n_threads - 1))
        try:
            return reranker.score(query, entries, base_scores, context=routing_context(history))
        finally:
            for c in own:
                c.set_threads()

    @property
    def reranker_name(self) -> str:
        return self._reranker_name

    # ------------------------------------------------------------------------------------------- retrieval

    def _scores(self, text: str) -> tuple[np.ndarray, float, float, float]:
        """Fused per-tool scores of one text (averaged with its value-masked form when the index says so, see
        index.request_texts): (scores, embed s, scan+fusion s, native scan s)."""
        texts = request_texts(text, self.value_masking)
        t0 = time.perf_counter()
        qvecs = self.embedder.encode_few(texts)  # [texts, dim], one forward pass; the scorer copies it in one go
        t1 = time.perf_counter()
        scores, native = request_scores(self.index.slb, self.index.bm25, self.lex_weight, texts, qvecs)
        return scores, t1 - t0, time.perf_counter() - t1, native

    def retrieve(self, query: str, history: Sequence[dict] | None = None) -> tuple[np.ndarray, dict]:
        """Fused per-tool scores and timings (ms) of embed and scan (scan includes the BM25 pass and fusion).

        With a history, follow-ups ("close it", "post that there") name neither the object nor the service, so the
        query is also scored with the recent turns prepended, and the two score vectors are averaged with weight
        HISTORY_WEIGHT on the prefixed one. In a session most requests have a history they do not depend on, so the
        query alone keeps most of the weight: a new topic must not be pulled back to the old one."""
        scores, embed_s, scan_s, native_s = self._scores(query)
        context = routing_context(history)
        if context and self.config.history_weight > 0:
            with_ctx, e2, s2, n2 = self._scores(f"{context} {query}")
            w = self.config.history_weight
            scores = (1.0 - w) * scores + w * with_ctx
            embed_s, scan_s, native_s = embed_s + e2, scan_s + s2, native_s + n2
        return scores, {"embed": embed_s * 1e3, "scan": scan_s * 1e3, "scan_native": native_s * 1e3}

    def route(self, query: str, history: Sequence[dict] | None = None, with_args: bool = True,
              rerank: bool | None = None) -> RouteResult:
        """Route one query. rerank=None follows the gate; True/False forces the reranker on/off (ablations)."""
        if not isinstance(query, str) or not query.strip():
            raise NexusError("the query is empty")
        t_start = time.perf_counter()
        scores, tm = self.retrieve(query, history)
        if with_args:
            self.prefetch_llm()  # after the request's encoding, which would share the cores with it
        # room for the reranker's distinct candidates when copies of one tool sit among the first
        k = max(self.config.top_k, 2 * self.rerank_k)
        order, margin = rank(self.index, scores, k)
        escalate = margin < self.tau if self.config.use_gate else True
        do_rerank = (escalate if rerank is None else rerank) and self._reranker_name != "none" and len(order) > 1
        t_r = time.perf_counter()
        rerank_scores: dict[int, float] = {}
        ranked = [int(i) for i in order]
        name_choice = None
        if do_rerank:
            # the reranker judges distinct tools: a copy of a tool on another server (interchangeable) would take a
            # slot and score the same; copies follow their tool, with its score
            cand: list[int] = []
            for i in ranked:
                if len(cand) == self.rerank_k:
                    break
                if not any(i in self.index.interchangeable(c) for c in cand):
                    cand.append(i)
            reranker = self.reranker()
            asked = reranker.asked if isinstance(reranker, CascadeReranker) else None  # it counts its name choices
            rs = self._rerank(query, [self.index.tools[i] for i in cand], [scores[i] for i in cand], history)
            if asked is not None:
                name_choice = reranker.asked > asked
            rorder = np.argsort(-np.asarray(rs), kind="stable")
            head: list[int] = []
            for j in rorder:
                copies = [i for i in ranked if i in self.index.interchangeable(cand[j])]
                head += [cand[j], *copies]
                rerank_scores.update({i: float(rs[j]) for i in [cand[j], *copies]})
            in_head = set(head)
            ranked = head + [i for i in ranked if i not in in_head]
        tm["rerank"] = (time.perf_counter() - t_r) * 1e3
        best = ranked[0]
        heads = self.index.heads  # names and signatures: a route without arguments reads no schema
        entry = heads[best]
        twins = [heads[i] for i in self.index.interchangeable(best)]
        cands = [Candidate(server=heads[i].server, tool=heads[i].name,
                           score=round(float(scores[i]), 6),
                           rerank_score=round(rerank_scores[i], 6) if i in rerank_scores else None)
                 for i in ranked[: self.config.top_k]]
        args, args_err, guessed = None, None, None
        t_a = time.perf_counter()
        if with_args:
            args, args_err, guessed = self._arguments(query, self.index.tools[best], history)
        tm["args"] = (time.perf_counter() - t_a) * 1e3
        tm["total"] = (time.perf_counter() - t_start) * 1e3
        timings = {k2: round(tm[k2], 3) for k2 in ("embed", "scan", "rerank", "args", "total")}
        return RouteResult(
            tool=entry.name, server=entry.server, arguments=args, candidates=cands,
            # margin null: no other tool to compare with (strict JSON has no Infinity)
            gate={"margin": round(margin, 6) if np.isfinite(margin) else None, "tau": round(self.tau, 6),
                  "escalated": bool(escalate)},
            signature=entry.signature, timings_ms=timings,
            reranker=self._reranker_name if do_rerank else None, args_error=args_err, guessed=guessed,
            interchangeable=[{"server": t.server, "tool": t.name} for t in twins], name_choice=name_choice,
        )

    # ------------------------------------------------------------------------------------------- arguments

    def spec(self, entry):
        """The arguments stage's ToolSpec of an indexed tool, made once per tool: what the index stored (its schema
        normalized at build time), or the tool as --registry gives it."""
        spec = self._specs.get(entry.key)
        if spec is None:
            if self._schemas is not None and entry.key in self._schemas:
                from ..schema import compile_tool

                spec = compile_tool(self._schemas[entry.key])
            else:
                spec = entry.spec()
            self._specs[entry.key] = spec
        return spec

    def argument_prefixes(self) -> ArgumentPrefixes:
        """Each tool's argument prompt prefix, kept in memory and on disk (arguments.ArgumentPrefixes)."""
        from ..arguments import ArgumentPrefixes

        if self._arg_prefixes is None:
            store = PrefixStore.default(ArgumentPrefixes.SUBDIR) if self.config.prefix_store else None
            self._arg_prefixes = ArgumentPrefixes(store=store)
        return self._arg_prefixes

    def _arguments(self, query: str, entry, history) -> tuple[dict | None, str | None, list[str] | None]:
        """Arguments through the one argument pipeline (arguments.generate_arguments). Returns (arguments,
        error-or-None, the required values guessed or None); a tool whose schema could not be compiled, or output
        that fails validation, is reported, not raised, and then the arguments are None."""
        from ..arguments import generate_arguments

        try:
            res = generate_arguments(self.llm(), self.spec(entry), query, history=history,
                                     prefixes=self.argument_prefixes(), time_limit_s=self.config.args_time_limit_s)
        except NexusError as e:
            if isinstance(e, ModelError):
                raise
            return None, e.message, None
        if not res.valid:  # a final failure is never passed off as arguments: null, with the reason beside it
            return None, "; ".join(res.errors) or "the arguments did not validate", None
        return res.arguments, None, res.guessed
