"""Live serving: one shared engine (router + one llama.cpp context + the L0 arena + one re-entrant lock) and the
sessions that run multi-turn conversations on it (paper §V-B, §VI-C, §VI-D).

    engine = Engine(index_dir, EngineConfig(model="smollm2-135m"))
    s = Session(engine)                       # or Session.load(dir, engine)
    r = s.turn("open an issue in acme/api titled crash")   # -> TurnResult (route + arguments)
    s.save(dir)                               # conversation JSON + the KV state of its sequence, atomically

A turn, under `engine.lock` (a threading.RLock held for the whole turn: routing *and* argument generation, so turns
from many threads run one after another on the one context and give the same outputs as a serial run):
  1. route the request with the conversation as history (embedder + SLB scan + gate + reranker: stages/route.py);
  2. build the argument prompt over the chosen tool's compressed signature (stages/arguments.py: system, few-shot,
     the pruned conversation window, the signature, the request) and find, in the L0 arena, the slot sharing the
     longest exact token prefix with it: its cells are shared into the working sequence and only the rest is decoded;
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

import hashlib
import json
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ..errors import FormatError, ModelError, NexusError, UsageError

SESSION_FORMAT = "nexus-session"
SESSION_VERSION = 1
SESSION_FILE = "session.json"
MAX_SESSION_JSON = 16 * 1024 * 1024
MAX_HISTORY_MESSAGES = 200  # a session keeps at most this many messages (the prompt sees a pruned window anyway)


@dataclass
class EngineConfig:
    model: str = "qwen2.5-0.5b"
    with_args: bool = True
    n_ctx: int = 8192
    slots: int = 32
    max_tokens: int = 256
    top_k: int = 5
    reranker: str = "auto"
    threads: int | None = None
    deep_splice: str | None = None  # folder of .atb blocks (nexus compile --flash-attn) or None
    splice_mode: str = "sidecar"  # sidecar (anchored at position 0) or cursor (live cursor, depth-adaptive repair)
    deterministic: bool = False  # True: StateArena (outputs independent of other turns, bit for bit); see l0_arena


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


def _tool_for(router, entry):
    """The registry Tool of an index entry when --registry was given (original schema), else the entry itself."""
    schemas = getattr(router, "_schemas", None)
    if schemas:
        return schemas.get(entry.key, entry)
    return entry


class Engine:
    """Router + one llama.cpp context + L0 arena + the coarse re-entrant lock. Loaded once, shared by sessions."""

    WORK_SEQ = 0

    def __init__(self, index, config: EngineConfig | None = None, registry: Sequence[str] | None = None,
                 embedder=None, router=None):
        from .route import Router, RouterConfig

        self.config = config or EngineConfig()
        if self.config.splice_mode not in ("sidecar", "cursor"):
            raise UsageError(f"unknown splice mode '{self.config.splice_mode}' (sidecar, cursor)")
        self.lock = threading.RLock()
        self.router = router or Router(index, RouterConfig(top_k=self.config.top_k, reranker=self.config.reranker,
                                                           model=self.config.model, threads=self.config.threads),
                                       embedder=embedder, registry=registry)
        self._model = None
        self._ctx = None
        self._arena = None
        self._specs: dict[str, Any] = {}
        self._blocks: dict[str, Any] = {}
        self._splice_engine = None
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
            from ..adapters.llama import load_model

            self._model = load_model(self.config.model)
        return self._model

    def context(self):
        """The shared LlamaContext (flash attention on) and its arena, created on first use."""
        with self.lock:
            if self._ctx is None:
                from ..adapters.llama import LlamaContext
                from .l0_arena import L0Arena, StateArena

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

    def spec(self, entry):
        from ..schema import compile_tool

        s = self._specs.get(entry.key)
        if s is None:
            s = compile_tool(_tool_for(self.router, entry))
            self._specs[entry.key] = s
        return s

    def close(self) -> None:
        with self.lock:
            if self._ctx is not None:
                self._ctx.close()
                self._ctx = None
                self._arena = None

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
        from . import arguments as A

        spec = self.spec(entry)
        res = out.route
        if not spec.ok or not spec.grammar:
            res.args_error = f"tool '{spec.key}' cannot be called: {'; '.join(spec.problems) or 'no grammar'}"
            out.args_valid = False
            return
        ctx = self.context()
        arena = self._arena
        messages, window = A.build_messages(spec, query, history)
        tokens = ctx.model.chat_tokens(messages)
        if len(tokens) + self.config.max_tokens > ctx.n_ctx:
            raise NexusError(f"argument prompt needs {len(tokens) + self.config.max_tokens} cells, the context has "
                             f"{ctx.n_ctx}", hint="shorten the history or raise n_ctx")
        gen, acq, slot, full = self.generate(tokens, grammar=spec.grammar, max_tokens=self.config.max_tokens,
                                             owner=owner)
        out.tokens = full
        out.kv = {"reused": acq.n_reused, "decoded": len(tokens) - acq.n_reused, "prompt": len(tokens),
                  "generated": len(gen.tokens), "hit": acq.hit, "slot": slot, "copy_us": round(acq.copy_ns / 1e3, 3)}
        out.raw = gen.text
        errors: list[str] = []
        try:
            args = json.loads(gen.text)
        except ValueError as e:
            args = None
            errors = ["output hit max_tokens before the JSON closed" if gen.stop == "max_tokens"
                      else f"output is not JSON: {e}"]
        if args is not None and not isinstance(args, dict):
            args, errors = None, ["output is not a JSON object"]
        if args is not None:
            context = " ".join([str(query)] + [m["content"] for m in window])
            args, _dropped = A.drop_unsupported(args, spec, context)
            errors = A.validate_arguments(spec.input_schema, args)
        res.arguments = args
        out.args_valid = not errors
        out.args_errors = errors
        if errors:
            res.args_error = "; ".join(errors)

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
        from .compile import block_filename
        from .splice import open_checked_block

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
        from .compile import prefix_tokens
        from .splice import SpliceEngine, check_block

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


# ================================================================================================ sessions


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Session:
    """One conversation on an Engine: its messages and the tokens of its KV sequence (kept in an arena slot)."""

    def __init__(self, engine: Engine, messages: list[dict] | None = None, session_id: str | None = None):
        self.engine = engine
        self.messages: list[dict] = list(messages or [])
        self.id = session_id or hashlib.sha1(f"{time.time_ns()}-{id(self)}".encode()).hexdigest()[:12]
        self.tokens: list[int] = []  # what its KV sequence holds (positions 0..len-1)
        self._kept_kv: tuple[dict, Path] | None = None  # the saved state this session was loaded with / last saved
        self._model_doc: dict | None = None  # {name, fingerprint} of the model the kept state belongs to
        self.n_turns = sum(1 for m in self.messages if m.get("role") == "user")

    @property
    def history(self) -> list[dict]:
        return list(self.messages)

    def turn(self, query: str) -> TurnResult:
        with self.engine.lock:
            res = self.engine.turn(query, history=self.messages or None, owner=self.id)
            r = res.route
            self.messages.append({"role": "user", "content": query})
            call = {"tool": f"{r.server}/{r.tool}"}
            if r.arguments is not None:
                call["arguments"] = r.arguments
            self.messages.append({"role": "assistant", "content": json.dumps(call, ensure_ascii=False)})
            del self.messages[:-MAX_HISTORY_MESSAGES]
            if res.tokens:
                self.tokens = list(res.tokens)
            self.n_turns += 1
            return res

    # ------------------------------------------------------------------------------------------- persistence
    def save(self, directory: str | os.PathLike) -> Path:
        """Write DIR/kv-<turn>.bin (the llama.cpp state of the session's sequence) and then DIR/session.json (the
        conversation, the sequence's tokens, the model fingerprint and the state file's sha256), each atomically
        (temporary file + fsync + rename). session.json is the commit point: a crash leaves the previous pair."""
        d = Path(directory).expanduser()
        d.mkdir(parents=True, exist_ok=True)
        eng = self.engine
        kv = None
        with eng.lock:
            if self.tokens:
                ctx = eng.context()
                blob = eng.arena.export_state(self.tokens, owner=self.id)
                if blob is not None:
                    name = f"kv-{self.n_turns}.bin"
                    _atomic_write(d / name, blob)
                    kv = {"file": name, "bytes": len(blob), "sha256": _sha256(blob), "tokens": self.tokens,
                          "n_ctx": ctx.n_ctx, "flash_attn": ctx.flash_attn}
            if kv is None and self._kept_kv is not None:
                # no new state this turn (--no-args): keep the one the session already had
                prev, prev_dir = self._kept_kv
                if prev_dir.resolve() != d.resolve():
                    _atomic_write(d / prev["file"], (prev_dir / prev["file"]).read_bytes())
                kv = prev
            if eng.config.with_args or kv is None and self._model_doc is None:
                ident = eng.model().identity
                model_doc = {"name": ident.name, "fingerprint": ident.fingerprint}
            else:
                model_doc = self._model_doc  # routing only: the kept state's model, without loading one
        self._model_doc = model_doc
        doc = {"format": SESSION_FORMAT, "version": SESSION_VERSION, "id": self.id, "turns": self.n_turns,
               "model": model_doc,
               "index": str(eng.router.index.path), "messages": self.messages, "kv": kv,
               "saved_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        _atomic_write(d / SESSION_FILE, json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8"))
        if kv is not None:
            self._kept_kv = (kv, d)
        for old in d.glob("kv-*.bin"):
            if kv is None or old.name != kv["file"]:
                try:
                    old.unlink()
                except OSError:
                    pass
        return d / SESSION_FILE

    @classmethod
    def load(cls, directory: str | os.PathLike, engine: Engine, restore_kv: bool = True) -> "Session":
        """Read a saved session; refuse (FormatError, one line) a file that is not one, or a KV state that does not
        match its checksum or the engine's model. restore_kv=False keeps only the conversation."""
        d = Path(directory).expanduser()
        path = d / SESSION_FILE
        where = f"session {d}"
        try:
            size = path.stat().st_size
        except OSError as e:
            raise FormatError(f"{where}: cannot read {SESSION_FILE}: {e.strerror}") from None
        if size > MAX_SESSION_JSON:
            raise FormatError(f"{where}: {SESSION_FILE} is {size} bytes, over the {MAX_SESSION_JSON} byte limit")
        try:
            doc = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError:
            raise FormatError(f"{where}: {SESSION_FILE} is not UTF-8 (corrupt session)") from None
        except ValueError as e:
            raise FormatError(f"{where}: {SESSION_FILE} is not valid JSON ({e.msg} at line {e.lineno}): corrupt session",
                              hint="delete the folder to start a new session") from None
        if not isinstance(doc, dict) or doc.get("format") != SESSION_FORMAT:
            raise FormatError(f"{where}: {SESSION_FILE} is not a Nexus session file")
        if doc.get("version") != SESSION_VERSION:
            raise FormatError(f"{where}: session format version {doc.get('version')} is not supported "
                              f"(this Nexus reads {SESSION_VERSION})")
        msgs = doc.get("messages")
        if not isinstance(msgs, list) or not all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                 and isinstance(m.get("content"), str) for m in msgs):
            raise FormatError(f"{where}: \"messages\" must be a list of {{role, content}} strings")
        s = cls(engine, messages=msgs, session_id=str(doc.get("id") or "") or None)
        turns = doc.get("turns")
        if isinstance(turns, int) and turns >= 0:
            s.n_turns = turns
        kv = doc.get("kv")
        if kv is None or not restore_kv:
            return s
        if not isinstance(kv, dict) or not isinstance(kv.get("file"), str) or not isinstance(kv.get("tokens"), list):
            raise FormatError(f"{where}: \"kv\" entry is malformed")
        model = doc.get("model") or {}
        if not isinstance(model, dict) or not isinstance(model.get("fingerprint"), str):
            raise FormatError(f"{where}: \"model\" entry is malformed")
        s._model_doc = {"name": str(model.get("name")), "fingerprint": model["fingerprint"]}
        ident = engine.model().identity if engine.config.with_args else None
        if ident is not None and model.get("fingerprint") != ident.fingerprint:
            raise ModelError(f"{where} was saved with model {model.get('name')} ({model.get('fingerprint')}), "
                             f"not {ident.name} ({ident.fingerprint})", hint="pass the session's --model")
        name = Path(kv["file"]).name
        kv = {**kv, "file": name}
        try:
            blob = (d / name).read_bytes()
        except OSError as e:
            raise FormatError(f"{where}: cannot read its KV state {name}: {e.strerror}") from None
        if len(blob) != kv.get("bytes") or _sha256(blob) != kv.get("sha256"):
            raise FormatError(f"{where}: KV state {name} does not match its checksum (corrupt session)",
                              hint="delete the folder to start a new session")
        tokens = kv["tokens"]
        n_vocab = ident.n_vocab if ident is not None else 1 << 31
        if not all(isinstance(t, int) and 0 <= t < n_vocab for t in tokens):
            raise FormatError(f"{where}: \"kv.tokens\" holds values that are not token ids of {model.get('name')}")
        s._kept_kv = (kv, d)
        if not engine.config.with_args:
            return s  # routing only: the state is checked but not loaded (no LLM); save() keeps it as it is
        with engine.lock:
            ctx = engine.context()
            if len(tokens) >= ctx.n_ctx:
                raise FormatError(f"{where}: its KV state ({len(tokens)} cells) does not fit n_ctx {ctx.n_ctx}")
            try:
                engine.arena.import_state(tokens, blob, owner=s.id)
            except ModelError as e:
                raise FormatError(f"{where}: llama.cpp refused its KV state: {e.message}") from None
        s.tokens = list(tokens)
        return s


def route_with_session(session_dir: str, query: str, index: str, registry: Sequence[str] | None, model: str,
                       no_args: bool, top_k: int, reranker: str, deep_splice: str | None = None) -> TurnResult:
    """`nexus route QUERY --session DIR`: load (or start) the session in DIR, run one turn, save it atomically."""
    d = Path(session_dir).expanduser()
    if d.exists() and not d.is_dir():
        raise UsageError(f"--session {d} is not a directory")
    cfg = EngineConfig(model=model, with_args=not no_args, top_k=top_k, reranker=reranker, deep_splice=deep_splice)
    engine = Engine(index, cfg, registry=registry)
    try:
        s = Session.load(d, engine) if (d / SESSION_FILE).exists() else Session(engine)
        res = s.turn(query)
        s.save(d)
        res.kv = {**res.kv, "session": str(d), "turn": s.n_turns}
        return res
    finally:
        engine.close()
