"""Conversations on the serving engine: a Session keeps its messages and the KV sequence of its last turn, and saves
both to a folder (`nexus route --session DIR`), so a conversation continues warm in a new process.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Sequence

from ..config import DEFAULT_ARGS_TIME_LIMIT_S
from ..errors import FormatError, ModelError, UsageError
from ..files import atomic_write_bytes, sha256_bytes
from .engine import Engine, EngineConfig, TurnResult

SESSION_FORMAT = "nexus-session"
SESSION_VERSION = 1
SESSION_FILE = "session.json"
MAX_SESSION_JSON = 16 * 1024 * 1024
MAX_HISTORY_MESSAGES = 200  # a session keeps at most this many messages (the prompt sees a pruned window anyway)


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
                    atomic_write_bytes(d / name, blob)
                    kv = {"file": name, "bytes": len(blob), "sha256": sha256_bytes(blob), "tokens": self.tokens,
                          "n_ctx": ctx.n_ctx, "flash_attn": ctx.flash_attn}
            if kv is None and self._kept_kv is not None:
                # no new state this turn (--no-args): keep the one the session already had
                prev, prev_dir = self._kept_kv
                if prev_dir.resolve() != d.resolve():
                    atomic_write_bytes(d / prev["file"], (prev_dir / prev["file"]).read_bytes())
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
        atomic_write_bytes(d / SESSION_FILE, json.dumps(doc, ensure_ascii=False, indent=1).encode("utf-8"))
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
        if len(blob) != kv.get("bytes") or sha256_bytes(blob) != kv.get("sha256"):
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
                       no_args: bool, top_k: int, reranker: str, deep_splice: str | None = None,
                       args_time_limit_s: float | None = DEFAULT_ARGS_TIME_LIMIT_S,
                       rerank_model: str | None = None, card_splice: bool = True) -> TurnResult:
    """`nexus route QUERY --session DIR`: load (or start) the session in DIR, run one turn, save it atomically."""
    d = Path(session_dir).expanduser()
    if d.exists() and not d.is_dir():
        raise UsageError(f"--session {d} is not a directory")
    cfg = EngineConfig(model=model, with_args=not no_args, top_k=top_k, reranker=reranker, deep_splice=deep_splice,
                       args_time_limit_s=args_time_limit_s, rerank_model=rerank_model, card_splice=card_splice)
    engine = Engine(index, cfg, registry=registry)
    try:
        s = Session.load(d, engine) if (d / SESSION_FILE).exists() else Session(engine)
        res = s.turn(query)
        s.save(d)
        res.kv = {**res.kv, "session": str(d), "turn": s.n_turns}
        return res
    finally:
        engine.close()
