"""The llama.cpp adapter: the only module of Nexus that imports `llama_cpp`.

It drives llama.cpp through the low-level ctypes module `llama_cpp.llama_cpp` (llama-cpp-python 0.3.36), not through
the high-level `Llama` class, because a splice needs what that class hides: decoding at explicit positions and
sequences, one sequence's serialized state, and cell-range edits of the KV cache.

Two classes:

* `LlamaModel`: the weights (mmap'ed once) and their identity (`ModelIdentity`: architecture, geometry, RoPE
  parameters as the context will use them, training context, and a fingerprint of the GGUF file).
* `LlamaContext`: one llama.cpp context over a model, with a *unified* KV cache (`kv_unified = true`, one stream
  shared by every sequence, so cells can be shared across sequences with `seq_cp`) and F16 K/V. Flash attention on
  gives a row-major V cache (`v_layout = 0`), off gives the transposed one (`v_layout = 1`).

Every llama.cpp call that can fail is checked, and failure raises a `ModelError` (a NexusError) with what failed.
llama.cpp's own log lines are silenced with a no-op `llama_log_set` callback; set NEXUS_LLAMA_LOG=1 to see them.
"""

from __future__ import annotations

import ctypes
import json
import math
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Mapping, Sequence

import numpy as np

from ..config import models_dir
from ..errors import ModelError, SchemaError
from ..files import atomic_write_json, sha256_file
from ..models import canonical_name, resolve_model

ROPE_NORM = 0  # llama.cpp LLAMA_ROPE_TYPE_NORM: adjacent pairs (x[2i], x[2i+1])
ROPE_NEOX = 2  # llama.cpp LLAMA_ROPE_TYPE_NEOX: half-split pairs (x[i], x[i + n_rot/2])
GGML_TYPE_F16 = 1
V_LAYOUT_ROWS = 0  # flash attention on: V stored [cell][n_embd_v_gqa]
V_LAYOUT_TRANSPOSED = 1  # flash attention off: V stored [n_embd_v_gqa][cell]
DEFAULT_MAX_DRAFT = 3  # draft tokens per decode: a batch of 4 costs ~1.5x one, a batch of 6 ~2.3x (1.5B, 2 cores)

_L = None  # the llama_cpp.llama_cpp module, once loaded
_LOG_CB = None  # keeps the no-op log callback alive for the life of the process
_INIT_LOCK = threading.Lock()


def _lib():
    """Import llama_cpp lazily (so `nexus --help` stays fast), silence its logs, init the backend once."""
    global _L, _LOG_CB
    if _L is not None:
        return _L
    with _INIT_LOCK:
        if _L is not None:
            return _L
        try:
            import llama_cpp.llama_cpp as L  # noqa: N812 - the one import of llama_cpp in the project
        except ImportError as e:  # pragma: no cover - environment problem
            raise ModelError(f"llama-cpp-python is not importable: {e}", hint="run `make setup`") from None
        if os.environ.get("NEXUS_LLAMA_LOG") != "1":

            def _noop(level, text, user_data):  # noqa: ARG001
                return None

            _LOG_CB = L.llama_log_callback(_noop)
            L.llama_log_set(_LOG_CB, ctypes.c_void_p(0))
        L.llama_backend_init()
        _L = L
        return L


class _quiet_stderr:
    """Silence file descriptor 2 for a native call that writes to stderr directly (not through llama_log_set)."""

    def __enter__(self):
        self._saved = None
        if os.environ.get("NEXUS_LLAMA_LOG") == "1":
            return self
        try:
            import sys

            sys.stderr.flush()
            self._saved = os.dup(2)
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, 2)
            os.close(devnull)
        except OSError:
            self._saved = None
        return self

    def __exit__(self, *exc):
        if self._saved is not None:
            os.dup2(self._saved, 2)
            os.close(self._saved)
        return False


# ----------------------------------------------------------------------------------------------------------- identity


@dataclass(frozen=True)
class ModelIdentity:
    """What a compiled KV block depends on. `fingerprint` changes whenever the GGUF file's bytes change.

    RoPE values are the ones the context applies (llama.cpp's cparams rules: freq_base from the GGUF, freq_scale =
    1/factor for linear scaling, 1.0 when scaling is none, YaRN ext factor 1.0 only for YaRN scaling)."""

    name: str  # the Nexus model name (smollm2-135m, qwen2.5-0.5b) or the file stem
    path: str
    arch: str
    n_layer: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_embd: int
    n_vocab: int
    rope_type: int  # ROPE_NORM / ROPE_NEOX
    n_rot: int
    freq_base: float
    freq_scale: float
    rope_scaling: str  # none / linear / yarn / ...
    yarn_ext_factor: float
    yarn_attn_factor: float
    yarn_beta_fast: float
    yarn_beta_slow: float
    n_ctx_train: int
    n_ctx_orig: int  # the YaRN original context (n_ctx_train when the GGUF does not say)
    add_bos: bool
    chat_template: str  # "chatml" or "other"
    file_size: int
    sha256: str
    fingerprint: str  # hex of the first 16 bytes of sha256

    @property
    def fingerprint_bytes(self) -> bytes:
        return bytes.fromhex(self.fingerprint)

    @property
    def n_embd_k_gqa(self) -> int:
        return self.n_head_kv * self.head_dim

    def to_dict(self) -> dict:
        return asdict(self)


def _fingerprint_cache_path() -> Path:
    return models_dir() / ".fingerprints.json"


def file_sha256(path: Path) -> str:
    """sha256 of a model file, computed once per (path, size, mtime_ns) and remembered in the models cache dir."""
    path = Path(path).resolve()
    st = path.stat()
    key = f"{path}|{st.st_size}|{st.st_mtime_ns}"
    cache = _fingerprint_cache_path()
    saved: dict = {}
    try:
        saved = json.loads(cache.read_text())
        if isinstance(saved, dict) and isinstance(saved.get(key), str) and len(saved[key]) == 64:
            return saved[key]
    except (OSError, ValueError):
        saved = {}
    digest = sha256_file(path)
    if not isinstance(saved, dict):
        saved = {}
    saved[key] = digest
    try:
        atomic_write_json(cache, dict(sorted(saved.items())))
    except OSError:
        pass  # a read-only cache only costs a re-hash next time
    return digest


# ------------------------------------------------------------------------------------------------------------- model


@dataclass
class GenerationResult:
    """What `LlamaContext.generate` returns.

    text: the generated text (special tokens rendered as text; the end-of-generation token is not included).
    tokens: the generated token ids (without the end-of-generation token).
    n_prompt: prompt tokens decoded for this call (0 when the prompt was already in the cache).
    t_first_token_ms: from the call's start (prompt decode included) to the first sampled token.
    t_total_ms: the whole call.
    stop: "eog" (end-of-generation token), "max_tokens", or "deadline" (the caller's deadline passed).
    grammar_rejections: steps at which the grammar rejected the unconstrained greedy choice, so the whole
    vocabulary was masked (lazy grammar; 0 without a grammar or with it in the sampler chain).
    drafted / accepted: draft tokens verified and kept (greedy decoding with a `draft`; 0 without).
    closed: the steps at which `close_string` had a JSON string closed early.
    """

    text: str
    tokens: list[int]
    n_prompt: int
    t_first_token_ms: float
    t_total_ms: float
    stop: str
    per_token_ms: list[float] = field(default_factory=list)
    grammar_rejections: int = 0
    drafted: int = 0  # draft tokens decoded for verification (generate's `draft`)
    accepted: int = 0  # of those, the ones greedy decoding picked (each one a decode step saved)
    closed: int = 0  # strings closed early at close_string's request


class LlamaModel:
    """One GGUF model, loaded on the CPU with mmap. `LlamaModel("smollm2-135m")` or a path to a .gguf file."""

    def __init__(self, name_or_path: str | os.PathLike):
        L = _lib()
        path = resolve_model(str(name_or_path))
        self.path = Path(path)
        self.name = canonical_name(str(name_or_path)) or self.path.stem
        params = L.llama_model_default_params()
        params.n_gpu_layers = 0
        params.use_mmap = True
        model = L.llama_model_load_from_file(str(self.path).encode("utf-8"), params)
        if not model:
            raise ModelError(f"llama.cpp could not load {self.path}", hint="NEXUS_LLAMA_LOG=1 shows llama.cpp's reason")
        self._model = model
        self._vocab = L.llama_model_get_vocab(model)
        self.n_vocab = int(L.llama_vocab_n_tokens(self._vocab))
        self.identity = self._read_identity()

    # -- metadata
    def meta(self, key: str) -> str | None:
        """A GGUF metadata value as a string (llama_model_meta_val_str), or None when the key is absent."""
        L = _lib()
        size = 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_model_meta_val_str(self._model, key.encode("utf-8"), buf, size)
            if n < 0:
                return None
            if n < size:
                return buf.value.decode("utf-8", errors="replace")
            size = n + 1

    def _meta_float(self, key: str, default: float) -> float:
        v = self.meta(key)
        try:
            return float(v) if v is not None else default
        except ValueError:
            return default

    def _meta_int(self, key: str, default: int) -> int:
        v = self.meta(key)
        try:
            return int(v) if v is not None else default
        except ValueError:
            return default

    def _read_identity(self) -> ModelIdentity:
        L = _lib()
        m = self._model
        arch = self.meta("general.architecture") or "unknown"
        n_layer = int(L.llama_model_n_layer(m))
        n_head = int(L.llama_model_n_head(m))
        n_head_kv = int(L.llama_model_n_head_kv(m))
        n_embd = int(L.llama_model_n_embd(m))
        head_dim = self._meta_int(f"{arch}.attention.key_length", n_embd // max(n_head, 1))
        n_rot = self._meta_int(f"{arch}.rope.dimension_count", head_dim)
        rope_type = int(L.llama_model_rope_type(m))
        n_ctx_train = int(L.llama_model_n_ctx_train(m))
        freq_base = self._meta_float(f"{arch}.rope.freq_base", 10000.0)
        scaling = (self.meta(f"{arch}.rope.scaling.type") or "none").lower()
        freq_scale = float(L.llama_model_rope_freq_scale_train(m))
        if scaling == "none":
            freq_scale = 1.0  # llama.cpp: "never scale if scaling type is none"
        ext = 1.0 if scaling == "yarn" else 0.0
        n_ctx_orig = self._meta_int(f"{arch}.rope.scaling.original_context_length", n_ctx_train)
        tmpl = L.llama_model_chat_template(m, None)
        tmpl_s = tmpl.decode("utf-8", errors="replace") if tmpl else ""
        sha = file_sha256(self.path)
        return ModelIdentity(
            name=self.name,
            path=str(self.path),
            arch=arch,
            n_layer=n_layer,
            n_head=n_head,
            n_head_kv=n_head_kv,
            head_dim=head_dim,
            n_embd=n_embd,
            n_vocab=self.n_vocab,
            rope_type=rope_type,
            n_rot=n_rot,
            freq_base=freq_base,
            freq_scale=freq_scale,
            rope_scaling=scaling,
            yarn_ext_factor=ext,
            yarn_attn_factor=self._meta_float(f"{arch}.rope.scaling.attn_factor", 1.0),
            yarn_beta_fast=self._meta_float(f"{arch}.rope.scaling.yarn_beta_fast", 32.0),
            yarn_beta_slow=self._meta_float(f"{arch}.rope.scaling.yarn_beta_slow", 1.0),
            n_ctx_train=n_ctx_train,
            n_ctx_orig=n_ctx_orig,
            add_bos=bool(L.llama_vocab_get_add_bos(self._vocab)),
            chat_template="chatml" if "<|im_start|>" in tmpl_s else ("other" if tmpl_s else "none"),
            file_size=self.path.stat().st_size,
            sha256=sha,
            fingerprint=sha[:32],
        )

    # -- tokens
    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        """Token ids of `text`. add_special adds BOS when the model wants it; parse_special turns `<|im_start|>` and
        the like into their single control tokens (on by default: prompts here are written in the template's syntax)."""
        L = _lib()
        data = text.encode("utf-8")
        cap = len(data) + 16
        while True:
            arr = (L.llama_token * cap)()
            n = L.llama_tokenize(self._vocab, data, len(data), arr, cap, add_special, parse_special)
            if n >= 0:
                return list(arr[:n])
            cap = -n + 8

    def token_to_piece(self, token: int, special: bool = True) -> bytes:
        L = _lib()
        size = 64
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_token_to_piece(self._vocab, int(token), buf, size, 0, special)
            if n >= 0:
                return buf.raw[:n]
            size = -n + 8

    def detokenize(self, tokens: Iterable[int], special: bool = True) -> str:
        return b"".join(self.token_to_piece(t, special) for t in tokens).decode("utf-8", errors="replace")

    def is_eog(self, token: int) -> bool:
        return bool(_lib().llama_vocab_is_eog(self._vocab, int(token)))

    @property
    def bos(self) -> int:
        return int(_lib().llama_vocab_bos(self._vocab))

    # -- chat template
    def apply_chat_template(self, messages: Sequence[dict], add_assistant: bool = True) -> str:
        """Render [{"role", "content"}, ...] with the model's own chat template (llama_chat_apply_template, which
        recognises the GGUF template, e.g. ChatML for both Nexus models). Returns the prompt text."""
        L = _lib()
        tmpl = L.llama_model_chat_template(self._model, None)
        if not tmpl:
            raise ModelError(f"model {self.name} has no chat template in its GGUF")
        keep = [(m["role"].encode("utf-8"), m["content"].encode("utf-8")) for m in messages]
        arr = (L.llama_chat_message * len(keep))()
        for i, (role, content) in enumerate(keep):
            arr[i].role = role
            arr[i].content = content
        size = 2 * sum(len(r) + len(c) for r, c in keep) + 256
        while True:
            buf = ctypes.create_string_buffer(size)
            n = L.llama_chat_apply_template(tmpl, arr, len(keep), add_assistant, buf, size)
            if n < 0:
                raise ModelError(f"llama.cpp does not support the chat template of {self.name}")
            if n <= size:
                return buf.raw[:n].decode("utf-8", errors="replace")
            size = n + 1

    def chat_tokens(self, messages: Sequence[dict], add_assistant: bool = True) -> list[int]:
        """Tokens of a chat rendered with the model's template (BOS added when the model wants it)."""
        return self.tokenize(self.apply_chat_template(messages, add_assistant), add_special=True, parse_special=True)

    def close(self) -> None:
        if getattr(self, "_model", None):
            _lib().llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass


# ----------------------------------------------------------------------------------------------------------- context


class _GrammarCheck:
    """Greedy grammar-constrained sampling without masking the whole vocabulary at every step.

    Applying a grammar to all ~150k candidates costs ~15-20 ms a token on 2 cores (Qwen2.5), a quarter of a decode
    step. The unconstrained greedy choice (logit bias applied) is tested against the grammar alone; only when the
    grammar rejects it is the grammar applied to every candidate (bias included, in token order) and the best one
    allowed taken. The result is the token the full chain (bias, grammar, greedy) picks: an allowed first maximum is
    also the first maximum among the allowed tokens. llama.cpp's common sampler does the same."""

    def __init__(self, L, grammar, ctx, model, logit_bias: Mapping[int, float] | None):
        self._L, self._g, self._ctx = L, grammar, ctx
        self._n_vocab = int(L.llama_vocab_n_tokens(model._vocab))
        self._bias = None
        if logit_bias:
            ids = np.fromiter((int(t) for t in logit_bias), dtype=np.int64, count=len(logit_bias))
            vals = np.fromiter((float(b) for b in logit_bias.values()), dtype=np.float32, count=len(logit_bias))
            keep = (ids >= 0) & (ids < self._n_vocab)  # as llama.cpp's logit-bias sampler, which skips the others
            self._bias = (ids[keep], vals[keep])
        self._one = L.llama_token_data(0, 0.0, 0.0)
        self._one_arr = L.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)
        self._all = None  # the full candidate array, made on the first rejection
        self.rejections = 0

    def constrain(self, tok: int, idx: int = -1) -> int:
        """The token the full chain picks at output `idx` of the last decode, given the chain's choice `tok`."""
        L = self._L
        self._one.id, self._one.logit, self._one.p = tok, 0.0, 0.0
        self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
        L.llama_sampler_apply(self._g, ctypes.byref(self._one_arr))
        if math.isfinite(self._one.logit):
            return tok
        self.rejections += 1
        if self._all is None:
            self._all = np.zeros(self._n_vocab, dtype=[("id", np.int32), ("logit", np.float32), ("p", np.float32)])
            self._all["id"] = np.arange(self._n_vocab, dtype=np.int32)
        logits = np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, idx), shape=(self._n_vocab,))
        self._all["logit"] = logits
        if self._bias is not None:
            ids, vals = self._bias
            np.add.at(self._all["logit"], ids, vals)
        arr = L.llama_token_data_array(self._all.ctypes.data_as(ctypes.POINTER(L.llama_token_data)),
                                       self._n_vocab, -1, False)
        L.llama_sampler_apply(self._g, ctypes.byref(arr))
        best = int(np.argmax(self._all["logit"]))
        if not math.isfinite(float(self._all["logit"][best])):
            raise ModelError("the grammar allows no token at this point of the output")
        return int(self._all["id"][best])

    def closing(self, model: "LlamaModel", idx: int = -1) -> int | None:
        """The best token at output `idx` (logit bias applied) that begins with a double quote and that the grammar
        allows, or None when it allows none: inside a JSON string, the token that closes it (`",`, `"}`, ...).
        Candidates are tried from the highest logit down; a closing token is usually among the first hundred."""
        L = self._L
        logits = np.array(np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, idx), shape=(self._n_vocab,)))
        if self._bias is not None:
            ids, vals = self._bias
            np.add.at(logits, ids, vals)
        for tok in np.argsort(-logits, kind="stable"):
            tok = int(tok)
            if not math.isfinite(float(logits[tok])):
                break
            if not model.token_to_piece(tok, special=False).startswith(b'"'):
                continue
            self._one.id, self._one.logit, self._one.p = tok, 0.0, 0.0
            self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
            L.llama_sampler_apply(self._g, ctypes.byref(self._one_arr))
            if math.isfinite(self._one.logit):
                return tok
        return None


class LlamaContext:
    """One llama.cpp context over a `LlamaModel`.

    n_ctx: KV cells (shared by all sequences: the cache is unified). n_batch: the most tokens one llama_decode call
    takes (longer inputs are split). n_seq_max: how many sequence ids may be used (0 .. n_seq_max-1).
    flash_attn: True gives the row-major V cache (v_layout 0), False the transposed one (v_layout 1).
    """

    def __init__(
        self,
        model: LlamaModel,
        n_ctx: int = 4096,
        n_batch: int = 512,
        n_ubatch: int | None = None,
        n_seq_max: int = 4,
        flash_attn: bool = False,
        n_threads: int | None = None,
    ):
        L = _lib()
        self.model = model
        n_threads = n_threads or int(os.environ.get("NEXUS_THREADS", "0") or 0) or min(os.cpu_count() or 2, 8)
        p = L.llama_context_default_params()
        p.n_ctx = n_ctx
        p.n_batch = n_batch
        p.n_ubatch = n_ubatch or n_batch
        p.n_seq_max = n_seq_max
        p.n_threads = n_threads
        p.n_threads_batch = n_threads
        p.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        p.type_k = GGML_TYPE_F16
        p.type_v = GGML_TYPE_F16
        p.kv_unified = True
        p.offload_kqv = False
        p.no_perf = True
        ctx = L.llama_init_from_model(model._model, p)
        if not ctx:
            raise ModelError(f"llama.cpp could not create a context (n_ctx={n_ctx}, flash_attn={flash_attn})")
        self._ctx = ctx
        self._mem = L.llama_get_memory(ctx)
        self.n_ctx = int(L.llama_n_ctx(ctx))
        self.n_batch = n_batch
        self.n_seq_max = n_seq_max
        self.flash_attn = flash_attn
        self.v_layout = V_LAYOUT_ROWS if flash_attn else V_LAYOUT_TRANSPOSED
        self.n_threads = n_threads
        self._batch = L.llama_batch_init(n_batch, 0, 1)
        self._n_vocab = model.n_vocab

    @property
    def identity(self) -> ModelIdentity:
        return self.model.identity

    def set_threads(self, n: int | None = None) -> None:
        """Decode on n threads from now on (None: the n_threads the context was made with). Each row of a matrix
        product is one thread's work, so the count changes the time, not the numbers."""
        n = int(n or self.n_threads)
        _lib().llama_set_n_threads(self._ctx, n, n)

    # -- tokens (delegates, for callers that hold only a context)
    def tokenize(self, text: str, add_special: bool = False, parse_special: bool = True) -> list[int]:
        return self.model.tokenize(text, add_special, parse_special)

    def detokenize(self, tokens: Iterable[int], special: bool = True) -> str:
        return self.model.detokenize(tokens, special)

    # -- decoding
    def _check_span(self, seq_id: int, start_pos: int, n: int) -> None:
        """Refuse a sequence id or a position range this context cannot hold, before llama.cpp sees it."""
        if not (0 <= seq_id < self.n_seq_max):
            raise ModelError(f"sequence id {seq_id} out of range (n_seq_max = {self.n_seq_max})")
        if start_pos + n > self.n_ctx:
            raise ModelError(f"context full: {start_pos + n} positions > n_ctx {self.n_ctx}")

    def decode(
        self,
        tokens: Sequence[int],
        start_pos: int,
        seq_id: int = 0,
        logits_last: bool = True,
        logits_all: bool = False,
    ) -> None:
        """Decode `tokens` at positions start_pos .. start_pos+len-1 of sequence `seq_id`, in chunks of n_batch.

        The first position must continue the sequence (llama.cpp requires pos == seq_pos_max + 1 for a fresh
        batch). Logits are kept for the last token (logits_last) or every token of the last chunk (logits_all);
        read them with `logits()`."""
        L = _lib()
        toks = np.ascontiguousarray(np.asarray(tokens, dtype=np.int32))
        n = int(toks.shape[0])
        if n == 0:
            return
        self._check_span(seq_id, start_pos, n)
        b = self._batch
        for c0 in range(0, n, self.n_batch):
            c1 = min(n, c0 + self.n_batch)
            m = c1 - c0
            last_chunk = c1 == n
            ctypes.memmove(b.token, toks[c0:c1].ctypes.data, m * 4)
            pos = np.arange(start_pos + c0, start_pos + c1, dtype=np.int32)
            ctypes.memmove(b.pos, pos.ctypes.data, m * 4)
            for i in range(m):
                b.n_seq_id[i] = 1
                b.seq_id[i][0] = seq_id
                b.logits[i] = 1 if (last_chunk and (logits_all or (logits_last and i == m - 1))) else 0
            b.n_tokens = m
            rc = L.llama_decode(self._ctx, b)
            if rc != 0:
                raise ModelError(
                    f"llama_decode failed ({rc}) at positions {start_pos + c0}..{start_pos + c1 - 1} of sequence {seq_id}"
                    + (": no KV slot (context full)" if rc == 1 else "")
                )

    def _decode_packed(self, items: Sequence[tuple[Sequence[int], int, int]], wants_logits, what: str):
        """Decode items (tokens, start_pos, seq_id) packed into as few llama_decode calls as n_batch allows (an item
        is never split). `wants_logits(k, n)` says whether token k of an n-token item keeps its logits. Yields each
        decoded group as [(item index, offset of its first token in the batch)], to read logits from before the next."""
        L = _lib()
        b = self._batch
        i = 0
        while i < len(items):
            group, m = [], 0
            while i < len(items) and (not group or m + len(items[i][0]) <= self.n_batch):
                toks, start, seq = items[i]
                if len(toks) > self.n_batch:
                    raise ModelError(f"{what}: an item of {len(toks)} tokens exceeds n_batch {self.n_batch}")
                self._check_span(seq, start, len(toks))
                group.append((i, m))
                m += len(toks)
                i += 1
            for j, off in group:
                toks, start, seq = items[j]
                for k, tok in enumerate(toks):
                    b.token[off + k] = int(tok)
                    b.pos[off + k] = start + k
                    b.n_seq_id[off + k] = 1
                    b.seq_id[off + k][0] = seq
                    b.logits[off + k] = 1 if wants_logits(k, len(toks)) else 0
            if m == 0:
                continue
            b.n_tokens = m
            rc = L.llama_decode(self._ctx, b)
            if rc != 0:
                raise ModelError(f"llama_decode failed ({rc}) in {what} of {len(group)} sequences"
                                 + (": no KV slot (context full)" if rc == 1 else ""))
            yield group

    def decode_many(self, items: Sequence[tuple[Sequence[int], int, int]]) -> list[np.ndarray]:
        """Decode several sequences' tokens together and return each item's last-token logits (float32 copies).

        Each item is (tokens, start_pos, seq_id), as in `decode`. Items are packed into as few llama_decode calls as
        n_batch allows (an item is never split): on two CPU cores one call over four ~40-token prompts took 0.83x four
        calls (the weights are read once per call)."""
        if any(len(toks) == 0 for toks, _, _ in items):
            raise ModelError("decode_many: an item has no tokens")
        L = _lib()
        out: list[np.ndarray] = []
        for group in self._decode_packed(items, lambda k, n: k == n - 1, "decode_many"):
            for j, off in group:
                ptr = L.llama_get_logits_ith(self._ctx, off + len(items[j][0]) - 1)
                if not ptr:
                    raise ModelError("llama.cpp returned no logits for a decoded sequence")
                out.append(np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy())
        return out

    def generate_many(self, prompts: Sequence[Sequence[int]], max_tokens: int,
                      stop: Callable[[list[int]], bool] | None = None, temperature: float = 0.0,
                      top_k: int = 40, seed: int = 0) -> list[list[int]]:
        """Generate for several prompts at once, prompt k in sequence k: every step decodes one token of each
        unfinished sequence in a single llama_decode call, so the weights are read once per step for all of them.
        The prompts' common start is decoded once and shared. temperature 0 is greedy; above 0, each token is sampled
        from the top_k logits at that temperature (sequence k draws from its own generator, seeded with seed + k).
        A sequence ends at an end-of-generation token (not returned), after max_tokens, or when `stop(tokens so far)`
        is true; the sequences are emptied afterwards. A batch sums in another order than one sequence alone, so a
        near-tie may go the other way than in `generate` (tests/test_adapter_llama.py checks each token against the
        logits)."""
        if len(prompts) > self.n_seq_max:
            raise ModelError(f"generate_many: {len(prompts)} prompts > n_seq_max {self.n_seq_max}")
        if any(len(p) == 0 for p in prompts):
            raise ModelError("generate_many: a prompt has no tokens")
        rngs = [np.random.default_rng(seed + k) for k in range(len(prompts))]

        def pick(logits: np.ndarray, seq: int) -> int:
            if temperature <= 0:
                return int(np.argmax(logits))
            top = np.argpartition(logits, -top_k)[-top_k:]
            z = (logits[top] - logits[top].max()) / temperature
            p = np.exp(z.astype(np.float64))
            return int(top[rngs[seq].choice(len(top), p=p / p.sum())])

        for seq in range(len(prompts)):
            self.seq_rm(seq)
        # the prompts' common start (an instruction, a worked example) is decoded once and shared by every sequence
        n_common = 0
        while (n_common < min(len(p) for p in prompts) - 1
               and all(p[n_common] == prompts[0][n_common] for p in prompts)):
            n_common += 1
        out: list[list[int]] = [[] for _ in prompts]
        try:
            if n_common and len(prompts) > 1:
                self.decode(prompts[0][:n_common], 0, seq_id=0, logits_last=False)
                for seq in range(1, len(prompts)):
                    self.seq_cp(0, seq)
            else:
                n_common = 0
            logits = self.decode_many([(p[n_common:], n_common, seq) for seq, p in enumerate(prompts)])
            pos = [len(p) for p in prompts]
            active = list(range(len(prompts)))
            while active:
                step = []
                for k, seq in enumerate(active):  # logits[k] belongs to the k-th sequence decoded last
                    tok = pick(logits[k], seq)
                    if self.model.is_eog(tok):
                        continue
                    out[seq].append(tok)
                    if len(out[seq]) >= max_tokens or (stop is not None and stop(out[seq])):
                        continue
                    step.append(seq)
                active = step
                if active:
                    logits = self.decode_many([([out[seq][-1]], pos[seq], seq) for seq in active])
                    for seq in active:
                        pos[seq] += 1
        finally:
            for seq in range(len(prompts)):
                self.seq_rm(seq)
        return out

    def continuation_logprobs(self, items: Sequence[tuple[Sequence[int], int, int]]) -> list[list[float]]:
        """Score continuations of several sequences at once. Each item is (tokens, start_pos, seq_id): the tokens are
        decoded at start_pos.. of that sequence (which must already hold positions < start_pos), and the result for
        the item is log p(tokens[i + 1] | everything before) for each i < len(tokens) - 1, in nats.

        Items are packed into as few llama_decode calls as n_batch allows (an item is never split): one call over
        many short continuations runs the weights once instead of once per item."""
        L = _lib()
        out: list[list[float]] = [[] for _ in items]
        for group in self._decode_packed(items, lambda k, n: k < n - 1, "continuation scoring"):
            for j, off in group:
                toks = items[j][0]
                n = len(toks) - 1
                if n <= 0:
                    continue
                first = L.llama_get_logits_ith(self._ctx, off)
                last = L.llama_get_logits_ith(self._ctx, off + n - 1)
                if not first or not last:
                    raise ModelError("llama.cpp returned no logits for a scored continuation")
                row_bytes = self._n_vocab * ctypes.sizeof(ctypes.c_float)
                if ctypes.addressof(last.contents) - ctypes.addressof(first.contents) == (n - 1) * row_bytes:
                    rows = np.ctypeslib.as_array(first, shape=(n, self._n_vocab))  # one item's outputs, in order
                else:  # not laid out contiguously: gather the rows one by one
                    rows = np.stack([np.ctypeslib.as_array(L.llama_get_logits_ith(self._ctx, off + k),
                                                           shape=(self._n_vocab,)) for k in range(n)])
                # float32 log-sum-exp per row: the vocabulary is large (150k for Qwen), float64 would triple the cost;
                # in place in one scratch buffer (half the time of the allocating expression)
                mx = rows.max(axis=1)
                scratch = np.subtract(rows, mx[:, None])
                np.exp(scratch, out=scratch)
                lse = mx + np.log(scratch.sum(axis=1))
                tgt = rows[np.arange(n), np.asarray(toks[1:], dtype=np.int64)]
                out[j] = [float(x) for x in (tgt - lse)]
        return out

    def logits(self, idx: int = -1) -> np.ndarray:
        """A float32 copy of the logits of output `idx` of the last decode (-1: the last output)."""
        L = _lib()
        ptr = L.llama_get_logits_ith(self._ctx, idx)
        if not ptr:
            raise ModelError(f"no logits for output {idx} (was the token decoded with logits on?)")
        return np.ctypeslib.as_array(ptr, shape=(self._n_vocab,)).copy()

    # -- KV cache edits
    def seq_rm(self, seq_id: int, p0: int = -1, p1: int = -1) -> None:
        """Remove the cells of `seq_id` with p0 <= pos < p1 (-1: open end). seq_id -1: every sequence."""
        if not _lib().llama_memory_seq_rm(self._mem, seq_id, p0, p1):
            raise ModelError(f"llama_memory_seq_rm({seq_id}, {p0}, {p1}) failed")

    def seq_cp(self, src: int, dst: int, p0: int = -1, p1: int = -1) -> None:
        """Make the cells of `src` with p0 <= pos < p1 belong to `dst` too (no copy in a unified cache)."""
        _lib().llama_memory_seq_cp(self._mem, src, dst, p0, p1)

    def seq_add(self, seq_id: int, p0: int, p1: int, delta: int) -> None:
        """Shift the positions of `seq_id`'s cells in [p0, p1) by delta. llama.cpp applies the matching K rotation
        lazily, over the whole cache, at the next decode (its K-shift)."""
        _lib().llama_memory_seq_add(self._mem, seq_id, p0, p1, delta)

    def seq_pos_max(self, seq_id: int) -> int:
        """Largest position held by seq_id, -1 when it is empty."""
        return int(_lib().llama_memory_seq_pos_max(self._mem, seq_id))

    def seq_pos_min(self, seq_id: int) -> int:
        return int(_lib().llama_memory_seq_pos_min(self._mem, seq_id))

    def clear(self) -> None:
        """Empty the whole KV cache (every sequence)."""
        _lib().llama_memory_clear(self._mem, True)

    # -- sequence state
    def state_seq_size(self, seq_id: int) -> int:
        return int(_lib().llama_state_seq_get_size(self._ctx, seq_id))

    def state_seq_get(self, seq_id: int) -> bytes:
        """The serialized state of one sequence (see docs/splice.md for its layout)."""
        L = _lib()
        size = self.state_seq_size(seq_id)
        if size <= 0:
            raise ModelError(f"llama_state_seq_get_size({seq_id}) returned {size}")
        buf = (ctypes.c_uint8 * size)()
        n = L.llama_state_seq_get_data(self._ctx, buf, size, seq_id)
        if n != size:
            raise ModelError(f"llama_state_seq_get_data({seq_id}) wrote {n} of {size} bytes")
        return bytes(buf)

    def state_seq_set(self, blob, seq_id: int) -> int:
        """Restore a sequence-state blob (bytes or a uint8 numpy array) into seq_id, replacing what seq_id held.
        Cells land at the positions written in the blob, with no rotation. Returns the bytes read."""
        L = _lib()
        if isinstance(blob, np.ndarray):
            if blob.dtype != np.uint8 or not blob.flags["C_CONTIGUOUS"]:
                raise ModelError("state blob must be a contiguous uint8 array")
            ptr = blob.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8))
            size = int(blob.nbytes)
        else:
            size = len(blob)
            ptr = ctypes.cast(ctypes.c_char_p(bytes(blob)), ctypes.POINTER(ctypes.c_uint8))
        n = L.llama_state_seq_set_data(self._ctx, ptr, size, seq_id)
        if n == 0:
            raise ModelError(
                f"llama.cpp refused the state blob for sequence {seq_id} (layer count, types, row sizes, V layout "
                "or free cells do not match)",
                hint="NEXUS_LLAMA_LOG=1 shows llama.cpp's reason",
            )
        return int(n)

    def try_state_seq_set(self, blob, seq_id: int) -> bool:
        """state_seq_set for a blob that may be stale or damaged (one read back from disk): True when restored, False
        (seq_id left empty) when llama.cpp refuses it."""
        self.seq_rm(seq_id)
        try:
            self.state_seq_set(blob, seq_id)
            return True
        except ModelError:
            self.seq_rm(seq_id)
            return False

    # -- generation
    def generate(
        self,
        prompt_tokens: Sequence[int],
        max_tokens: int = 128,
        grammar: str | None = None,
        temperature: float = 0.0,
        seq_id: int = 0,
        start_pos: int = 0,
        seed: int = 0,
        stop_at_eog: bool = True,
        logit_bias: Mapping[int, float] | None = None,
        lazy_grammar: bool = True,
        deadline: float | None = None,
        draft: Callable[[Sequence[int]], Sequence[int]] | None = None,
        max_draft: int = DEFAULT_MAX_DRAFT,
        close_string: Callable[[Sequence[int]], bool] | None = None,
    ) -> GenerationResult:
        """Generate up to `max_tokens` tokens after `prompt_tokens`, optionally constrained by a GBNF grammar.

        Cache handling: the cells of `seq_id` at positions >= start_pos are removed, then `prompt_tokens` are
        decoded at start_pos.. (so start_pos = 0, the default, starts the sequence afresh; a caller that keeps a
        warm prefix of exactly start_pos tokens in seq_id passes start_pos to reuse it). Generated tokens stay in
        the cache after the call.

        grammar: GBNF text with a `root` rule (llama.cpp grammar syntax, as in llama.cpp's grammars/README.md);
        an invalid grammar raises SchemaError. temperature 0 is greedy (deterministic); > 0 samples with the
        given seed. Generation stops at an end-of-generation token (not included in the result) or after
        max_tokens. A grammar that is complete admits only end-of-generation tokens, so a grammar-constrained
        generation ends by itself once its root rule is matched.

        logit_bias: {token id: value} added to those tokens' logits at every step (before the grammar and the
        sampler).

        lazy_grammar: with greedy decoding, test the unconstrained choice against the grammar and mask the whole
        vocabulary only when it is rejected (_GrammarCheck: the same tokens, faster); False puts the grammar in the
        sampler chain (every candidate masked at every step), the reference the tests compare against.

        deadline: a time.perf_counter() value; generation stops (stop="deadline") once it has passed, checked after
        each sampled token (the prompt's decode is not interrupted).

        draft (greedy only): called with the tokens generated so far, returns the tokens it expects next. Up to
        `max_draft` of them are decoded in the same batch as the token just sampled, and each is kept while the
        greedy choice (grammar included) at the position before it is that token; the cells of the first wrong one
        and after are removed. The choices are the greedy ones; only the order of the float sums differs, since a
        batch of several tokens runs other matrix kernels than one token (`nexus bench drafts` counts the answers
        that differ). A batch of 4 tokens costs ~1.5x one (Qwen2.5-1.5B, 2 cores), so a draft pays when it is
        mostly right.

        close_string (greedy, with a grammar): called with the tokens generated so far after each one; True makes
        the next token the best one the grammar allows among those that begin with a double quote, so that a JSON
        string being written closes there (the caller's judgement that the rest of the value is not needed). When
        the grammar allows no such token the choice is the usual one. No draft is decoded at that step.

        Returns GenerationResult(text, tokens, n_prompt, t_first_token_ms, t_total_ms, stop)."""
        L = _lib()
        t0 = time.perf_counter()
        if not prompt_tokens:
            raise ModelError("generate() needs at least one prompt token")
        greedy = not (temperature and temperature > 0)
        lazy = greedy and lazy_grammar
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if not chain:
            raise ModelError("llama_sampler_chain_init failed")
        g = None  # the grammar sampler, outside the chain when decoding is greedy (see _GrammarCheck)
        try:
            if logit_bias:
                items = (L.llama_logit_bias * len(logit_bias))(
                    *[L.llama_logit_bias(int(t), float(b)) for t, b in logit_bias.items()])
                n_vocab = L.llama_vocab_n_tokens(self.model._vocab)
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_logit_bias(n_vocab, len(logit_bias), items))
            if grammar is not None:
                with _quiet_stderr():  # llama.cpp's grammar parser prints its errors straight to stderr
                    g = L.llama_sampler_init_grammar(self.model._vocab, grammar.encode("utf-8"), b"root")
                if not g:
                    raise SchemaError("the GBNF grammar does not parse (llama_sampler_init_grammar returned NULL)")
                if not lazy:
                    L.llama_sampler_chain_add(chain, g)  # the chain owns it from here
                    g = None
            if greedy:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
            else:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_temp(float(temperature)))
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_dist(int(seed) & 0xFFFFFFFF))
            check = _GrammarCheck(L, g, self._ctx, self.model, logit_bias) if g is not None else None

            self.seq_rm(seq_id, start_pos, -1)
            self.decode(prompt_tokens, start_pos, seq_id)
            pos = start_pos + len(prompt_tokens)  # the next free position of the sequence
            out: list[int] = []
            per_token: list[float] = []
            t_first = None
            stop = "max_tokens"
            vocab = self.model._vocab
            drafting = draft is not None and greedy and max_draft > 0
            idx = -1  # the output of the last decode whose logits give the next token
            pending: list[int] = []  # draft tokens decoded after output idx, not verified yet
            drafted = accepted = closed = 0
            closing = close_string is not None and check is not None
            close_next = False  # close_string asked for a closing quote at this step
            while len(out) < max_tokens:  # (the end is also checked after each token, to stop before a decode)
                ts = time.perf_counter()
                forced = check.closing(self.model, idx) if close_next else None
                if forced is not None:
                    tok = forced
                    closed += 1
                else:
                    tok = int(L.llama_sampler_sample(chain, self._ctx, idx))
                    if check is not None:
                        tok = check.constrain(tok, idx)
                if t_first is None:
                    t_first = time.perf_counter()
                in_cache = bool(pending) and tok == pending[0]  # a verified draft token: its cell is kept
                if in_cache:
                    pending.pop(0)
                    accepted += 1
                elif pending:  # the draft went wrong here: its cells from this position on go
                    pos -= len(pending)
                    self.seq_rm(seq_id, pos, -1)
                    pending = []
                if L.llama_vocab_is_eog(vocab, tok):
                    stop = "eog"
                    if stop_at_eog:
                        break
                if check is not None:
                    L.llama_sampler_accept(g, tok)
                out.append(tok)
                ended = len(out) >= max_tokens
                if not ended and deadline is not None and time.perf_counter() >= deadline:
                    stop, ended = "deadline", True
                if ended:
                    # as without a draft: the sequence holds the prompt and the output but its last token
                    if in_cache or pending:
                        self.seq_rm(seq_id, start_pos + len(prompt_tokens) + len(out) - 1, -1)
                    per_token.append((time.perf_counter() - ts) * 1e3)
                    break
                close_next = closing and close_string(out)
                if in_cache:
                    idx += 1  # the next token's logits are the next output of the same batch
                    per_token.append((time.perf_counter() - ts) * 1e3)
                    continue
                guess: list[int] = []
                if drafting and not close_next:
                    for t in draft(out):
                        if len(guess) >= max_draft or L.llama_vocab_is_eog(vocab, int(t)):
                            break
                        guess.append(int(t))
                if guess:
                    self.decode([tok] + guess, pos, seq_id, logits_all=True)
                    drafted += len(guess)
                    pending, idx = guess, 0
                else:
                    self.decode([tok], pos, seq_id)
                    idx = -1
                pos += 1 + len(guess)
                per_token.append((time.perf_counter() - ts) * 1e3)
            t_end = time.perf_counter()
        finally:
            L.llama_sampler_free(chain)
            if g is not None:
                L.llama_sampler_free(g)
        text = self.model.detokenize(out, special=True)
        return GenerationResult(
            text=text,
            tokens=out,
            n_prompt=len(prompt_tokens),
            t_first_token_ms=((t_first or t_end) - t0) * 1e3,
            t_total_ms=(t_end - t0) * 1e3,
            stop=stop,
            per_token_ms=per_token,
            grammar_rejections=check.rejections if check is not None else 0,
            drafted=drafted,
            accepted=accepted,
            closed=closed,
        )

    # -- lifetime
    def close(self) -> None:
        L = _L
        if L is None:
            return
        if getattr(self, "_batch", None) is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):  # pragma: no cover
        try:
            self.close()
        except Exception:
            pass


# ------------------------------------------------------------------------------------------------ helper functions


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x = x - x.max()
    return x - math.log(np.exp(x).sum())


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """D_KL(p || q) in nats of the softmax distributions of two logit vectors (float64)."""
    if not (np.all(np.isfinite(p_logits)) and np.all(np.isfinite(q_logits))):
        raise ModelError("non-finite logits: the KL divergence is undefined (a corrupted KV cache?)")
    lp = log_softmax(p_logits)
    lq = log_softmax(q_logits)
    p = np.exp(lp)
    kl = float(np.sum(p * (lp - lq)))
    return kl if kl > 0.0 else 0.0  # a float64 sum of a non-negative quantity can round a hair below zero


_MODEL_CACHE: dict[str, LlamaModel] = {}


def load_model(name_or_path: str) -> LlamaModel:
    """A process-wide cached LlamaModel (weights are mmap'ed once however many contexts use them)."""
    key = canonical_name(str(name_or_path)) or str(Path(name_or_path).expanduser().resolve())
    m = _MODEL_CACHE.get(key)
    if m is None:
        m = LlamaModel(name_or_path)
        _MODEL_CACHE[key] = m
    return m
