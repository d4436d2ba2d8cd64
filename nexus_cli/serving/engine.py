"""The serving engine: one shared engine (router + one llama.cpp context + the L0 arena + one re-entrant lock) and the
sessions that run multi-turn conversations on it (paper §V-B, §VI-C, §VI-D).

    engine = Engine(index_dir, EngineConfig(model="smollm2-135m"))
    s = Session(engine)                       # or Session.load(dir, engine)
    r = s.turn("open an issue in acme/api titled crash")   # -> TurnResult (route + arguments)
    s.save(dir)                               # conversation JSON + the KV state of its sequence, atomically

A turn, under `engine.lock` (a threading.RLock held for the whole turn: routing *and* argument generation, so turns
from many threads run one after another on the one context and give the same outputs as a serial run):
  1. route the request with the conversation as history (embedder + SLB scan + gate + reranker: routing/router.py);
  2. build the argument prompt over the chosen tool's compressed signature (arguments/pipeline.py: system, the pruned
     conversation window, the signature, the request) and find, in the L0 arena, the slot sharing the longest exact
     token prefix with it: its cells are shared into the working sequence and only the rest is decoded; with
     `card_splice` (the default) the tool's block is not decoded but spliced from its compiled card, after the
     conversation, with the model's calibrated repair (arguments/cards.py; the card is compiled on first use and
     kept in the card cache);
  3. generate the arguments greedily under the tool's GBNF grammar, post-process and validate them (the arguments
     stage's own helpers); commit the sequence (prompt + generated tokens) to an arena slot, where the session's next
     turn finds it;
  4. with `deep_splice` (a folder of .atb blocks from `nexus compile`, for this model, flash attention on): splice the
     chosen tool's block into a temporary *sidecar* sequence that starts with the compile prefix at position 0, so the
     block lands on its compile anchor (delta 0: output-exact, nothing recomputed), then decode the request after it;
     or, with splice_mode "cursor", splice at the end of the session's live sequence (a temporary copy of it) with the
     depth-adaptive repair of eq. (2). The sidecar is dropped after the turn; the report carries the splice's costs.

The KV cache keeps every session's last sequence in an arena slot (32 by default, LRU); a session whose slot was
evicted simply prefills again. `Session.save` writes the sequence's llama.cpp state next to the conversation, and
`Session.load` restores it into a free slot, so a session continues warm in a new process (`nexus route --session`).

The context runs with flash attention: llama.cpp's output then does not depend on how a prompt is split into batches,
so a reused prefix gives the same logits as a cold prefill when the cells lie in position order (tests/test_l0_arena).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..adapters.llama import LlamaContext, load_model
from ..arguments import generate_arguments
from ..arguments.cards import CardSplicer, CardStore
from ..config import ARGUMENTS_LLM, DEFAULT_ARGS_TIME_LIMIT_S
from ..errors import FormatError, ModelError, NexusError, UsageError
from ..routing.router import Router, RouterConfig
from ..splice.compile import block_filename
from ..splice.engine import SpliceEngine, check_block, open_checked_block
from ..splice.render import prefix_tokens
from .arena import L0Arena, StateArena


@dataclass
class EngineConfig:
    model: str = ARGUMENTS_LLM
    with_args: bool = True
    n_ctx: int = 8192
    slots: int = 32
    max_tokens: int = 256
    args_time_limit_s: float | None = DEFAULT_ARGS_TIME_LIMIT_S  # the bound on one argument generation, retries included
    top_k: int = 5
    reranker: str = "auto"
    rerank_model: str | None = None  # the reranker's LLM (RouterConfig.rerank_model)
    threads: int | None = None
    deep_splice: str | None = None  # folder of .atb blocks (nexus compile --flash-attn) or None
    splice_mode: str = "sidecar"  # sidecar (anchored at position 0) or cursor (live cursor, depth-adaptive repair)
    deterministic: bool = False  # True: StateArena (outputs independent of other turns, bit for bit); see l0_arena
    card_splice: bool = True  # the tool's card compiled once and spliced after the conversation (arguments/cards.py)
    card_cache: str | None = None  # folder of compiled cards (None: $NEXUS_CARD_CACHE or ~/.cache/nexus/cards)


@dataclass
class TurnResult:
    route: Any  # stages.route.RouteResult (arguments filled in)
    args_valid: bool | None = None
    args_errors: list[str] = field(default_factory=list)
    raw: str = ""
    kv: dict = field(default_factory=dict)  # reused/decoded tokens, slot, hit
    splice: dict | None = None
    tokens: list[int] = field(default_factory=list)  # what the working sequence holds after the turn

    def as_json(self) -> dict:
        d = self.route.as_json()
        if self.args_valid is not None:
            d["arguments_valid"] = self.args_valid
            if self.args_errors:
                d["arguments_errors"] = self.args_errors
        if self.kv:
            d["kv"] = self.kv
        if self.splice is not None:
            d["splice"] = self.splice
        return d


class Engine:
    """Router + one llama.cpp context + L0 arena + the coarse re-entrant lock. Loaded once, shared by sessions."""

    WORK_SEQ = 0

    def __init__(self, index, config: EngineConfig | None = None, registry: Sequence[str] | None = None,
                 embedder=None, router=None):
        self.config = config or EngineConfig()
        if self.config.splice_mode not in ("sidecar", "cursor"):
            raise UsageError(f"unknown splice mode '{self.config.splice_mode}' (sidecar, cursor)")
        self.lock = threading.RLock()
        self.router = router or Router(index, RouterConfig(top_k=self.config.top_k, reranker=self.config.reranker,
                                                           model=self.config.model, threads=self.config.threads,
                                                           rerank_model=self.config.rerank_model),
                                       embedder=embedder, registry=registry)
        self._model = None
        self._ctx = None
        self._arena = None
        self._specs: dict[str, Any] = {}
        self._blocks: dict[str, Any] = {}
        self._splice_engine = None
        self._cards: CardSplicer | None = None
        self.turns = 0

    # ------------------------------------------------------------------------------------------- lazy model
    @property
    def sidecar_seq(self) -> int:
        return self.config.slots + 1

    @property
    def scratch_seq(self) -> int:
        return self.config.slots + 2

    def model(self):
        if self._model is None:
            self._model = load_model(self.config.model)
        return self._model

    def context(self):
        """The shared LlamaContext (flash attention on) and its arena, created on first use."""
        with self.lock:
            if self._ctx is None:
                self._ctx = LlamaContext(self.model(), n_ctx=self.config.n_ctx, n_batch=512,
                                         n_seq_max=self.config.slots + 3, flash_attn=True,
                                         n_threads=self.config.threads)
                if self.config.deterministic:
                    self._arena = StateArena(self._ctx, n_slots=self.config.slots, work_seq=self.WORK_SEQ)
                else:
                    self._arena = L0Arena(self._ctx, n_slots=self.config.slots, work_seq=self.WORK_SEQ,
                                          first_slot_seq=1)
            return self._ctx

    @property
    def arena(self):
        self.context()
        return self._arena

    def card_splicer(self) -> CardSplicer | None:
        """The splicer of compiled cards on the shared context, or None when card splicing is off."""
        if not self.config.card_splice:
            return None
        with self.lock:
            if self._cards is None:
                store = CardStore(self.config.card_cache) if self.config.card_cache else CardStore.default()
                if store is None:
                    return None
                self._cards = CardSplicer(self.context(), store, self.WORK_SEQ, self.scratch_seq)
            return self._cards

    def close(self) -> None:
        with self.lock:
            if self._ctx is not None:
                self._ctx.close()
                self._ctx = None
                self._arena = None
                self._cards = None
                self._splice_engine = None

    # ------------------------------------------------------------------------------------------- a turn
    def turn(self, query: str, history: Sequence[dict] | None = None, with_args: bool | None = None,
             live_tokens: Sequence[int] | None = None, owner: str | None = None) -> TurnResult:
        """Route `query` (+ history) and generate its arguments; one whole turn under the lock."""
        if not isinstance(query, str) or not query.strip():
            raise UsageError("the request is empty")
        with_args = self.config.with_args if with_args is None else with_args
        with self.lock:
            t0 = time.perf_counter()
            res = self.router.route(query, history=history, with_args=False)
            out = TurnResult(route=res)
            entry = next((t for t in self.router.index.tools if t.server == res.server and t.name == res.tool), None)
            if with_args and entry is not None:
                t_a = time.perf_counter()
                self._arguments(out, entry, query, history, owner)
                res.timings_ms["args"] = round((time.perf_counter() - t_a) * 1e3, 3)
            if self.config.deep_splice and entry is not None:
                out.splice = self._deep_splice(entry, query, live_tokens or out.tokens or None)
            res.timings_ms["total"] = round((time.perf_counter() - t0) * 1e3, 3)
            self.turns += 1
            return out

    def _arguments(self, out: TurnResult, entry, query: str, history, owner: str | None = None) -> None:
        """The one argument pipeline (arguments.generate_arguments), its prompt cells taken from the arena."""
        spec = self.router.spec(entry)
        res = out.route
        ctx = self.context()
        cache = ArenaCache(self._arena, owner, self.card_splicer())
        try:
            try:
                a = generate_arguments(ctx, spec, query, history=history, max_tokens=self.config.max_tokens,
                                       seq_id=self._arena.work_seq, cache=cache,
                                       time_limit_s=self.config.args_time_limit_s)
            except ModelError as e:
                if "no KV slot" not in e.message and "context full" not in e.message:
                    raise
                self._arena.clear()  # the cache is full of other conversations' slots: drop them and prefill cold
                cache = ArenaCache(self._arena, owner, self.card_splicer())
                a = generate_arguments(ctx, spec, query, history=history, max_tokens=self.config.max_tokens,
                                       seq_id=self._arena.work_seq, cache=cache,
                                       time_limit_s=self.config.args_time_limit_s)
        except NexusError as e:
            if isinstance(e, ModelError):
                raise
            res.args_error = e.message  # a tool that cannot be called, a prompt over the context
            out.args_valid = False
            return
        out.tokens = cache.held
        out.kv = cache.report()
        out.raw = a.raw
        res.arguments = a.arguments if a.valid else None  # never an invalid object passed off as arguments
        res.guessed = list(a.guessed) if a.valid else None
        out.args_valid = a.valid
        out.args_errors = list(a.errors)
        if a.errors:
            res.args_error = "; ".join(a.errors)
        elif not a.valid:
            res.args_error = "the arguments did not validate"

    def generate(self, tokens: Sequence[int], grammar: str | None, max_tokens: int, owner: str | None = None):
        """Greedy generation after `tokens` on the shared context through the arena: the longest warm prefix is reused,
        the rest decoded, the result committed to a slot. Returns (GenerationResult, Acquired, slot, held tokens).
        `owner` names the conversation (a session id): the deterministic arena reuses only that owner's state.
        Callers hold the lock (turn() does)."""
        with self.lock:
            ctx = self.context()
            arena = self._arena
            acq = arena.acquire(tokens, owner=owner)
            try:
                gen = ctx.generate(tokens[acq.n_reused:], max_tokens=max_tokens, grammar=grammar, temperature=0.0,
                                   seq_id=arena.work_seq, start_pos=acq.n_reused)
            except ModelError as e:
                if "no KV slot" not in e.message and "context full" not in e.message:
                    raise
                arena.clear()  # the cache is full of other conversations' slots: drop them and prefill cold
                acq = arena.acquire(tokens, owner=owner)
                gen = ctx.generate(tokens, max_tokens=max_tokens, grammar=grammar, temperature=0.0,
                                   seq_id=arena.work_seq, start_pos=0)
            held = ctx.seq_pos_max(arena.work_seq) + 1
            full = (list(tokens) + list(gen.tokens))[:held]
            slot = arena.commit(full, owner=owner)
            return gen, acq, slot, full

    # ------------------------------------------------------------------------------------------- deep splice
    def _block(self, entry):
        b = self._blocks.get(entry.key)
        if b is None:
            path = Path(self.config.deep_splice).expanduser() / block_filename(entry.server, entry.name)
            if not path.is_file():
                return None
            b = open_checked_block(path)
            self._blocks[entry.key] = b
        return b

    def _deep_splice(self, entry, query: str, live_tokens) -> dict:
        """Splice the chosen tool's block into a temporary sidecar sequence; see the module doc."""
        block = self._block(entry)
        if block is None:
            return {"status": "no block", "tool": entry.key}
        ctx = self.context()
        check_block(block.header, ctx.identity, ctx.v_layout, str(entry.key))
        if self._splice_engine is None:
            self._splice_engine = SpliceEngine(ctx, live_seq=self.sidecar_seq, scratch_seq=self.scratch_seq)
        eng = self._splice_engine
        q = ctx.model.tokenize(f"<|im_start|>user\n{query}<|im_end|>\n<|im_start|>assistant\n", add_special=False)
        side = self.sidecar_seq
        ctx.seq_rm(side, -1, -1)
        try:
            if self.config.splice_mode == "sidecar" or not live_tokens:
                prefix = prefix_tokens(ctx.model)
                if len(prefix) != int(block.header.anchor_pos):
                    raise FormatError(f"block of {entry.key} is anchored at {block.header.anchor_pos}, the compile "
                                      f"prefix has {len(prefix)} tokens", hint="recompile the blocks")
                ctx.decode(prefix, 0, side, logits_last=False)
                r = eng.splice(block, len(prefix), recompute=0.0, then_tokens=q)
                mode = "sidecar"
            else:
                n_past = len(live_tokens)
                ctx.seq_cp(self.WORK_SEQ, side, 0, n_past)
                r = eng.splice(block, n_past, recompute="auto", then_tokens=q)
                mode = "cursor"
            top1 = int(r.logits.argmax()) if r.logits is not None else None
            return {"status": "spliced", "mode": mode, "tool": entry.key, "n_past": r.n_past, "block_tokens": r.n_tokens,
                    "recompute_pct": round(r.R_pct, 3), "recomputed_tokens": r.recomputed_tokens,
                    "overhead_ms": round(r.overhead_ms, 3), "decode_ms": round(r.t_decode_ms, 3), "top1": top1}
        finally:
            ctx.seq_rm(side, -1, -1)
            ctx.seq_rm(self.scratch_seq, -1, -1)


class ArenaCache:
    """The arguments' prompt cells from the L0 arena (arguments.PromptCache's interface): the slot that shares the
    longest exact token prefix with the prompt is shared into the working sequence, and the prompt with the first
    answer is committed to a slot, where the conversation's next turn finds it."""

    def __init__(self, arena, owner: str | None, cards: CardSplicer | None = None):
        self.arena = arena
        self.owner = owner
        self.cards = cards
        self.card: dict | None = None  # what happened to the tool's card (CardSplicer.prepare's report)
        self.prefixes = None
        self.acquired = None
        self.prompt = 0
        self.decoded = 0
        self.generated = 0
        self.slot = None
        self.held: list[int] = []

    def start(self, ctx, tokens: Sequence[int], n_tool_prefix: int, seq_id: int, card=None) -> int:
        self.acquired = self.arena.acquire(tokens, owner=self.owner)
        self.prompt = len(tokens)
        n = self.acquired.n_reused
        self.decoded = len(tokens) - n
        if card is None or self.cards is None:
            return n
        start, self.card = self.cards.prepare(tokens, card, n)
        if self.card["status"] == "spliced":  # everything after the reused cells but the spliced ones
            self.decoded = len(tokens) - min(n, card.head) - self.card["spliced"]
        return start

    def kept(self, ctx, tokens: Sequence[int], generated: Sequence[int] | None, seq_id: int) -> None:
        if generated is None:  # a second pass: the slot keeps the first answer
            return
        held = ctx.seq_pos_max(self.arena.work_seq) + 1
        self.held = (list(tokens) + list(generated))[:held]
        self.generated = len(generated)
        self.slot = self.arena.commit(self.held, owner=self.owner)

    def report(self) -> dict:
        acq = self.acquired
        out = {"reused": acq.n_reused, "decoded": self.decoded, "prompt": self.prompt,
               "generated": self.generated, "hit": acq.hit, "slot": self.slot, "copy_us": round(acq.copy_ns / 1e3, 3)}
        if self.card is not None:
            out["card"] = self.card
        return out
