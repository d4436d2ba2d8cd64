"""The sentence embedder (all-MiniLM-L6-v2 by default). The only module that imports sentence_transformers or torch.

Everything heavy is imported lazily, inside `Embedder.__init__`, so `nexus --help` never pays for torch. The model is
loaded strictly offline (HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE are set before the import) from the verified local
folder resolved by `nexus_cli.models.resolve_model`. Vectors come back as L2-normalised float32 [n, dim].

Requests are embedded without torch where the model allows it (`query_embedder`): importing sentence-transformers
costs ~7 s on 2 cores, against ~15 ms for the request itself, so a one-shot `nexus route` spent almost all its time
importing. `NumpyBertEncoder` runs the same BERT forward pass in NumPy from the folder's safetensors and tokenizer.json
(tests/test_embedder_numpy.py holds it to sentence-transformers' float32 output).
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Sequence

import numpy as np  # light (~0.1 s); the NumPy request encoder uses it on every request. torch stays lazy

from .. import kernels
from ..config import DEFAULT_EMBEDDER
from ..errors import ModelError
from ..models import resolve_model

DEFAULT_THREADS = int(os.environ.get("NEXUS_THREADS", "2") or 2)
# Precision of query embeddings (requests, probes): "auto" runs them in bfloat16 where the CPU has native bf16 matmul
# (AVX512_BF16 / AMX), which measured 1.6-1.7x faster than float32 for a request on 2 cores at a cosine of 0.9999 to
# the float32 vector; documents (tool texts, the SLB) stay float32. "float32" turns it off.
QUERY_PRECISION = os.environ.get("NEXUS_QUERY_PRECISION", "auto").strip().lower() or "auto"
# Which code embeds requests at route time: "auto" (NumPy where the model is a BERT mean-pooling encoder, else
# sentence-transformers), "numpy" (required: an unsupported model is an error) or "torch" (sentence-transformers).
QUERY_ENCODER = os.environ.get("NEXUS_QUERY_ENCODER", "auto").strip().lower() or "auto"


def _offline_env() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")


def _quiet_transformers() -> None:
    """No 'Loading weights' progress bars or advisory warnings on stderr (progress there is ours)."""
    try:
        import logging

        from transformers.utils import logging as tlog

        tlog.disable_progress_bar()
        tlog.set_verbosity_error()
        logging.getLogger("sentence_transformers").setLevel(logging.ERROR)
    except Exception:  # noqa: BLE001 - cosmetic only
        pass


def set_threads(n: int | None = None) -> None:
    import torch

    n = int(n or DEFAULT_THREADS)
    if torch.get_num_threads() != n:
        torch.set_num_threads(n)


class Embedder:
    """A bi-encoder: `encode(texts) -> float32[n, dim]`, unit-norm rows."""

    def __init__(self, name_or_path: str = DEFAULT_EMBEDDER, threads: int | None = None, device: str = "cpu",
                 query_precision: str | None = None):
        path = resolve_model(name_or_path, kind="embedder") if not isinstance(name_or_path, Path) else name_or_path
        self.path = Path(path)
        if not self.path.is_dir():
            raise ModelError(f"embedder {self.path} is not a sentence-transformers folder")
        self.name = name_or_path if isinstance(name_or_path, str) else self.path.name
        _offline_env()
        try:
            set_threads(threads)
            _quiet_transformers()
            import torch
            from sentence_transformers import SentenceTransformer

            self.model = SentenceTransformer(str(self.path), device=device)
            # The shipped router embedder stores float16 weights (half the bytes); documents and the SLB are float32
            if any(p.dtype != torch.float32 for p in self.model.parameters()):
                self.model.float()
        except ModelError:
            raise
        except Exception as e:  # noqa: BLE001 - a broken model folder must become one clear line
            raise ModelError(f"cannot load the embedder from {self.path}: {type(e).__name__}: {e}") from None
        getdim = getattr(self.model, "get_embedding_dimension", None) or self.model.get_sentence_embedding_dimension
        self.dim = int(getdim())
        # Models trained with task prefixes (e5, bge, EmbeddingGemma) name them in their own config as the "query" and
        # "document" prompts; requests and probes are embedded as queries, tool texts as documents. MiniLM has none.
        prompts = dict(getattr(self.model, "prompts", None) or {})
        self.prompts = {role: prompts[role] for role in ("query", "document") if prompts.get(role)}
        self.query_precision = _resolve_precision(query_precision or QUERY_PRECISION, device)
        self._query_model = None
        self._query_lock = threading.Lock()

    def _model_for(self, role: str):
        """The float32 model for documents; for queries a bfloat16 copy when query_precision says so (made once)."""
        if role != "query" or self.query_precision == "float32":
            return self.model
        if self._query_model is None:
            with self._query_lock:
                if self._query_model is None:
                    import copy

                    import torch

                    self._query_model = copy.deepcopy(self.model).to(torch.bfloat16)
        return self._query_model

    def _prompt_name(self, role: str) -> str | None:
        if role not in ("query", "document"):
            raise ValueError(f"role must be 'query' or 'document', not {role!r}")
        return role if role in self.prompts else None

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False, callback=None,
               role: str = "document"):
        """Embed texts in batches; returns a C-contiguous, L2-normalised float32 array [n, dim]. `callback(n_done)` is
        called after each batch (for progress bars). role: "document" (tool texts) or "query" (requests, probes);
        it selects the model's own prompt for that role, if it has one."""
        import torch

        texts = list(texts)
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        out = []
        with torch.inference_mode():
            for i in range(0, len(texts), batch_size):
                chunk = texts[i : i + batch_size]
                v = self._model_for(role).encode(chunk, batch_size=batch_size, convert_to_numpy=True,
                                                 normalize_embeddings=True, show_progress_bar=False,
                                                 prompt_name=self._prompt_name(role))
                out.append(_unit_rows(v))
                if callback is not None:
                    callback(len(chunk))
        return np.ascontiguousarray(np.concatenate(out, axis=0), dtype=np.float32)

    def encode_few(self, texts: Sequence[str]):
        """A handful of query texts in one forward pass, [n, dim] float32, unit norm (a request and its value-masked
        form: one batch of two costs ~1.3x one text, two calls 2x)."""
        import torch

        with torch.inference_mode():
            v = self._model_for("query").encode(list(texts), batch_size=max(1, len(texts)), convert_to_numpy=True,
                                                normalize_embeddings=True, show_progress_bar=False,
                                                prompt_name=self._prompt_name("query"))
        return _unit_rows(v)

    def encode_one(self, text: str):
        """One query, [dim] float32, unit norm (fast path: no batching overhead)."""
        import torch

        with torch.inference_mode():
            v = self._model_for("query").encode([text], batch_size=1, convert_to_numpy=True,
                                                normalize_embeddings=True, show_progress_bar=False,
                                                prompt_name=self._prompt_name("query"))
        return _unit_rows(v)[0]


# safetensors dtype names -> NumPy (bfloat16 has no NumPy type: such a file is refused with its name)
_SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                       "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """A safetensors file's tensors as read-only arrays over one memory map: nothing is copied, so a one-shot
    process reads only the pages it touches (safetensors.numpy.load_file copies all 45 MB of the router embedder).

    The format: an unsigned little-endian 64-bit header length N, N bytes of JSON mapping each tensor name to
    {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows the header; an optional
    "__metadata__" entry holds strings), then the tensors' bytes, row-major and little-endian."""
    path = Path(path)
    try:
        raw = np.memmap(path, dtype=np.uint8, mode="r")
        n = int(raw[:8].view("<u8")[0])
        if not 0 < n <= raw.size - 8:
            raise ValueError(f"header length {n} does not fit a file of {raw.size} bytes")
        header = json.loads(bytes(raw[8:8 + n]).decode("utf-8"))
        data = raw[8 + n:]
        out = {}
        for name, info in header.items():
            if name == "__metadata__":
                continue
            dtype = _SAFETENSORS_DTYPES.get(info["dtype"])
            if dtype is None:
                raise ValueError(f"tensor {name} has dtype {info['dtype']}, which this reader does not take")
            begin, end = (int(x) for x in info["data_offsets"])
            shape = tuple(int(x) for x in info["shape"])
            dt = np.dtype(dtype).newbyteorder("<")
            if not 0 <= begin <= end <= data.size or end - begin != dt.itemsize * int(np.prod(shape, dtype=np.int64)):
                raise ValueError(f"tensor {name}: offsets {begin}..{end} do not hold {info['dtype']} {list(shape)}")
            out[name] = data[begin:end].view(dt).reshape(shape)
        return out
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ModelError(f"cannot read {path}: {e}") from None


class NumpyBertEncoder:
    """Request embeddings of a sentence-transformers BERT model (Transformer → mean Pooling → Normalize, no prompts,
    e.g. all-MiniLM-L6-v2 and the router embedders `nexus index --finetune` writes) computed in NumPy, float32.

    It reads what sentence-transformers reads: config.json, model.safetensors (mapped, read_safetensors), the fast
    tokenizer's tokenizer.json (through `tokenizers`), the maximum sequence length, and runs BertModel's forward pass
    (embeddings + LayerNorm, then per layer: self-attention within each text, output projection + residual +
    LayerNorm, exact-erf GELU feed-forward + residual + LayerNorm), then the mean over each text's tokens and L2
    normalisation. Same interface as `Embedder` for queries: encode_one, encode_few, encode."""

    def __init__(self, path: str | Path, native: bool | None = None):
        """native: a float16 model's dense layers in libnexus (True) or in NumPy float32 (False: the baseline `nexus
        bench latency` measures the native layers against); None: the faster on this CPU (kernels.native_dense_pays)."""
        self.path = Path(path)
        self.name = self.path.name
        why = numpy_unsupported_reason(self.path)
        if why:
            raise ModelError(f"embedder {self.path} cannot run in NumPy: {why}")
        cfg = json.loads((self.path / "config.json").read_text("utf-8"))
        self.dim = int(cfg["hidden_size"])
        self.heads = int(cfg["num_attention_heads"])
        self.eps = float(cfg.get("layer_norm_eps", 1e-12))
        self.prompts: dict[str, str] = {}
        self.max_length = _max_seq_length(self.path, cfg)
        try:
            from tokenizers import Tokenizer

            weights = read_safetensors(self.path / "model.safetensors")
            self.tokenizer = Tokenizer.from_file(str(self.path / "tokenizer.json"))
        except Exception as e:  # noqa: BLE001 - a broken model folder must become one clear line
            raise ModelError(f"cannot load the embedder from {self.path}: {type(e).__name__}: {e}") from None
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)
        prefix = "bert." if "bert.embeddings.word_embeddings.weight" in weights else ""

        def raw(name: str):
            key = prefix + name
            if key not in weights:
                raise ModelError(f"embedder {self.path}: model.safetensors has no {key}")
            return weights[key]

        def w(name: str):
            return np.ascontiguousarray(raw(name), dtype=np.float32)

        # a float16 model (the shipped router embedder) keeps its token table in float16, read row by row. Its dense
        # layers run in libnexus (kernels.LinearF16, exact float16 x float32 products summed in float32: loading
        # converts nothing and a request reads half the bytes) where that is the faster way: one core's AVX-512
        # beats NumPy's float32 BLAS on both cores there, AVX2 does not (kernels.native_dense_pays)
        f16_model = raw("encoder.layer.0.attention.self.query.weight").dtype == np.float16
        if native is None:  # (a float32 model has no native layers to choose: libnexus is not asked)
            native = f16_model and kernels.native_dense_pays()
        half = native and f16_model

        def dense(a: str, names: Sequence[str], act: str | None = None):
            """The Linear layers `names` of prefix a as one layer (their outputs side by side): x -> act(x @ W + b)."""
            bias = np.concatenate([w(a + f"{x}.bias") for x in names])
            if half:
                weights_out_in = [raw(a + f"{x}.weight") for x in names]
                return kernels.LinearF16(kernels.pack_f16_panels_rows(weights_out_in), len(bias), bias, act)
            wt = np.concatenate([raw(a + f"{x}.weight") for x in names]).T  # [in, out]
            wt = np.ascontiguousarray(wt, dtype=np.float32)
            return (lambda x: _gelu(x @ wt + bias)) if act == "gelu" else (lambda x: x @ wt + bias)

        def norm(name: str):
            return (w(name + ".weight"), w(name + ".bias"))

        self.word = raw("embeddings.word_embeddings.weight") if f16_model else w("embeddings.word_embeddings.weight")
        self.position = w("embeddings.position_embeddings.weight")
        self.token_type = w("embeddings.token_type_embeddings.weight")
        self.emb_norm = norm("embeddings.LayerNorm")
        self.layers = []
        for i in range(int(cfg["num_hidden_layers"])):
            a = f"encoder.layer.{i}."
            self.layers.append({
                # Q, K and V as one [dim, 3*dim] product: one matrix multiply per layer instead of three
                "qkv": dense(a + "attention.self.", ("query", "key", "value")),
                "out": dense(a + "attention.output.", ("dense",)),
                "norm1": norm(a + "attention.output.LayerNorm"),
                "up": dense(a + "intermediate.", ("dense",), act="gelu"),
                "down": dense(a + "output.", ("dense",)),
                "norm2": norm(a + "output.LayerNorm"),
            })
        self.half = half

    def _layer_norm(self, x, gamma, beta, residual=None):
        """LayerNorm(x + residual): native for a float16 model (with its dense layers), else NumPy."""
        if self.half:
            return kernels.layer_norm(x, gamma, beta, self.eps, residual)
        if residual is not None:
            x = x + residual
        mu = x.mean(axis=-1, keepdims=True)
        var = ((x - mu) ** 2).mean(axis=-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * gamma + beta

    def _forward(self, ids, types, lengths):
        """The texts of a batch packed one after another, with no padding (ids, types: int [T], text i's tokens the
        next lengths[i] of them) → token states float32 [T, dim]. The dense layers and norms run on all T rows at
        once; attention runs within each text, texts of one length together: no row is computed for padding."""
        starts = np.concatenate(([0], np.cumsum(lengths)))
        positions = np.concatenate([np.arange(n) for n in lengths])
        x = self.word[ids].astype(np.float32) + self.position[positions] + self.token_type[types]
        x = self._layer_norm(x, *self.emb_norm)
        hd = self.dim // self.heads
        scale = np.float32(1.0 / np.sqrt(hd))
        groups: dict[int, list[int]] = {}
        for i, n in enumerate(lengths):
            groups.setdefault(int(n), []).append(i)
        # each length's texts: (the first row of each [b], their rows [b, n] for gathering and scattering)
        rows = {n: starts[np.asarray(g)][:, None] + np.arange(n)[None] for n, g in groups.items()}
        for layer in self.layers:
            qkv = layer["qkv"](x)  # [T, 3*dim]
            ctx = np.empty_like(x)
            for n, r in rows.items():
                b = len(r)
                part = qkv[r[0, 0]:r[0, 0] + n][None] if b == 1 else qkv[r]  # [b, n, 3*dim]
                part = part.reshape(b, n, 3, self.heads, hd).transpose(2, 0, 3, 1, 4)  # [3, b, heads, n, hd]
                q, k, v = part[0], part[1], part[2]
                scores = (q @ k.transpose(0, 1, 3, 2)) * scale
                scores = np.exp(scores - scores.max(axis=-1, keepdims=True))
                probs = scores / scores.sum(axis=-1, keepdims=True)
                out = (probs @ v).transpose(0, 2, 1, 3).reshape(b, n, self.dim)
                if b == 1:
                    ctx[r[0, 0]:r[0, 0] + n] = out[0]
                else:
                    ctx[r] = out
            x = self._layer_norm(layer["out"](ctx), *layer["norm1"], residual=x)
            x = self._layer_norm(layer["down"](layer["up"](x)), *layer["norm2"], residual=x)
        return x

    def encode(self, texts: Sequence[str], batch_size: int = 64, show_progress: bool = False, callback=None,
               role: str = "query"):
        texts = list(texts)
        out = []
        for i in range(0, len(texts), batch_size):
            chunk = texts[i : i + batch_size]
            encs = self.tokenizer.encode_batch(chunk)
            lengths = [len(e.ids) for e in encs]
            total = sum(lengths)
            ids = np.fromiter((t for e in encs for t in e.ids), dtype=np.int64, count=total)
            types = np.fromiter((t for e in encs for t in e.type_ids), dtype=np.int64, count=total)
            states = self._forward(ids, types, lengths)
            # each text's mean over its own tokens (np.add.reduceat sums each text's run of rows)
            pooled = np.add.reduceat(states, np.cumsum([0] + lengths[:-1]), axis=0)
            pooled /= np.asarray(lengths, dtype=np.float32)[:, None]
            out.append(_unit_rows(pooled))
            if callback is not None:
                callback(len(chunk))
        if not out:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.ascontiguousarray(np.concatenate(out, axis=0), dtype=np.float32)

    def encode_few(self, texts: Sequence[str]):
        """A handful of query texts in one forward pass, [n, dim] float32, unit norm."""
        return self.encode(texts, batch_size=max(1, len(texts)))

    def encode_one(self, text: str):
        """One query, [dim] float32, unit norm."""
        return self.encode([text], batch_size=1)[0]


def _gelu(x):
    """BERT's exact GELU, x * Phi(x), with erf by Abramowitz & Stegun 7.1.26 (erf's absolute error under 1.5e-7,
    float32's own resolution): NumPy has no erf, and SciPy's import alone would cost ~0.25 s of a ~15 ms request."""
    z = np.abs(x) * np.float32(0.7071067811865476)
    t = 1.0 / (1.0 + np.float32(0.3275911) * z)
    poly = t * (np.float32(0.254829592) + t * (np.float32(-0.284496736) + t * (np.float32(1.421413741)
           + t * (np.float32(-1.453152027) + t * np.float32(1.061405429)))))
    erf_abs = 1.0 - poly * np.exp(-z * z)
    return 0.5 * x * (1.0 + np.copysign(erf_abs, x))


def _max_seq_length(path: Path, cfg: dict) -> int:
    """The token limit sentence-transformers applies: sentence_bert_config.json's max_seq_length, else the tokenizer's
    model_max_length, never past the model's position table."""
    limit = int(cfg.get("max_position_embeddings", 512))
    for fname, key in (("sentence_bert_config.json", "max_seq_length"), ("tokenizer_config.json", "model_max_length")):
        try:
            value = json.loads((path / fname).read_text("utf-8")).get(key)
        except (OSError, ValueError, AttributeError):
            continue
        if isinstance(value, int) and 0 < value:
            return min(value, limit)
    return limit


def numpy_unsupported_reason(path: Path) -> str | None:
    """Why `NumpyBertEncoder` cannot stand in for sentence-transformers on this model folder (None: it can)."""
    def load(name: str):
        try:
            return json.loads((path / name).read_text("utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as e:
            raise ModelError(f"embedder {path}: {name} is unreadable: {e}") from None

    cfg = load("config.json")
    if not isinstance(cfg, dict) or cfg.get("model_type") != "bert":
        return "not a BERT model"
    if cfg.get("hidden_act") != "gelu" or cfg.get("position_embedding_type", "absolute") != "absolute":
        return "a BERT variant (activation or position embeddings) the NumPy encoder does not implement"
    for name in ("model.safetensors", "tokenizer.json"):
        if not (path / name).is_file():
            return f"no {name}"
    modules = load("modules.json")
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules] if isinstance(modules, list) else []
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return f"modules {kinds or '?'} are not Transformer, Pooling[, Normalize]"
    pooling = load(f"{modules[1].get('path') or '1_Pooling'}/config.json") or {}
    mean = pooling.get("pooling_mode") == "mean" or (
        pooling.get("pooling_mode_mean_tokens") is True
        and not any(pooling.get(k) for k in ("pooling_mode_cls_token", "pooling_mode_max_tokens",
                                              "pooling_mode_mean_sqrt_len_tokens", "pooling_mode_weightedmean_tokens",
                                              "pooling_mode_lasttoken")))
    if not mean:
        return "its pooling is not a plain mean over tokens"
    st = load("config_sentence_transformers.json") or {}
    if any((st.get("prompts") or {}).values()) or st.get("default_prompt_name"):
        return "it uses prompts"
    return None


def query_embedder(name_or_path: str | Path = DEFAULT_EMBEDDER, threads: int | None = None, encoder: str | None = None,
                   one_shot: bool = False):
    """What embeds requests at route time: a NumpyBertEncoder where the model allows it (no torch import), else the
    sentence-transformers Embedder. encoder (or $NEXUS_QUERY_ENCODER): auto, numpy or torch. one_shot: a process
    that embeds one request keeps a float16 model's layers native on every CPU (their float32 copy costs more to
    make, ~27 ms on an AVX2-only CPU, than it saves in one request)."""
    choice = (encoder or QUERY_ENCODER).strip().lower()
    if choice not in ("auto", "numpy", "torch"):
        raise ModelError(f"query encoder must be auto, numpy or torch, not {choice!r} (NEXUS_QUERY_ENCODER)")
    if choice != "torch":
        path = resolve_model(name_or_path, kind="embedder") if not isinstance(name_or_path, Path) else name_or_path
        try:
            # refuses, with the reason, a model it does not implement
            return NumpyBertEncoder(path, native=True if one_shot else None)
        except ModelError:
            if choice == "numpy":
                raise
            # auto: sentence-transformers takes what NumPy does not (or says why it cannot load it either)
    return Embedder(name_or_path, threads=threads)


def index_embedder(name_or_path: str | Path = DEFAULT_EMBEDDER, encoder: str | None = None):
    """What embeds a registry's tool texts, example requests and the gate's probes at index time when nothing is
    fine-tuned: the encoder `nexus route` embeds requests with (query_embedder, as a warm process picks it), so an
    index and its requests are embedded alike and `nexus index` imports no torch (~4.5 s of a small registry's
    build on 2 cores). Fine-tuning needs the sentence-transformers Embedder, and builds one itself."""
    return query_embedder(name_or_path, encoder=encoder)


def _unit_rows(v):
    """float32, C-contiguous, rows re-normalised in float32 (a bfloat16 model normalises to only ~3 digits)."""
    v = np.asarray(v, dtype=np.float32)
    norms = np.linalg.norm(v, axis=1, keepdims=True)
    return np.ascontiguousarray(v / np.maximum(norms, 1e-12), dtype=np.float32)


def _resolve_precision(precision: str, device: str) -> str:
    if precision not in ("auto", "float32", "bfloat16"):
        raise ModelError(f"precision must be auto, float32 or bfloat16, not {precision!r} "
                         "(NEXUS_QUERY_PRECISION for queries)")
    if precision != "auto":
        return precision
    if device != "cpu":
        return "float32"
    import torch

    try:
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except Exception:  # noqa: BLE001 - an older torch without the probe: stay exact
        native = False
    return "bfloat16" if native else "float32"


# ================================================================================================ training (index time)


def finetune_biencoder(base: str | Path, pairs: Sequence[tuple], out: str | Path,
                       epochs: int = 1, batch_size: int = 32, lr: float = 3e-5, scale: float = 20.0, seed: int = 0,
                       max_length: int = 96, time_budget_s: float | None = None, threads: int | None = None,
                       callback=None, precision: str = "auto",
                       labels: Sequence[tuple[int, Sequence[int]]] | None = None, device: str = "cpu") -> dict:
    """Fine-tune a sentence-transformers bi-encoder with in-batch-negatives ranking loss (MNRL) on (query, positive
    text, hard negatives) items, the negatives being None, one text or a list of texts; saves the model to `out`.
    Returns a training log.

    `labels` (one per item: the positive's class and each negative's class) says which texts of a batch stand for the
    same answer: a candidate of the query's own class other than its own positive is masked out of its softmax, so two
    requests of one tool in a batch do not push each other's positives away. Without labels each distinct text is its
    own class, so only copies of the positive are masked.

    `precision` "bfloat16" runs the forward and backward passes under bfloat16 autocast (weights and optimizer state
    stay float32); "auto" picks it where the CPU runs bfloat16 natively, as for query embedding. On the core
    registry's examples it gave the same development decisions as float32 in 0.78x the time (docs/routing.md).

    `device` "cuda" trains on a GPU (the shipped router embedder's recipe was run there; `cpu` is what `nexus index
    --finetune` uses); a model stored in float16 is trained in float32 either way."""
    import random
    import time

    import torch

    _offline_env()
    set_threads(threads)
    _quiet_transformers()
    from sentence_transformers import SentenceTransformer

    precision = _resolve_precision(precision, device)
    negatives = [_as_text_list(p[2] if len(p) > 2 else None) for p in pairs]
    if labels is None:
        text_class: dict[str, int] = {}
        labels = [(text_class.setdefault(p[1], len(text_class)), [text_class.setdefault(n, len(text_class)) for n in ns])
                  for p, ns in zip(pairs, negatives)]
    elif len(labels) != len(pairs) or any(len(lab[1]) != len(ns) for lab, ns in zip(labels, negatives)):
        raise ModelError("fine-tuning labels must give one class per positive and per negative of each item")
    torch.manual_seed(seed)
    rng = random.Random(seed)
    model = SentenceTransformer(str(base), device=device)
    model.float()  # a float16 checkpoint (the shipped router embedder) must not be trained in float16
    model.max_seq_length = max_length
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    order = list(range(len(pairs)))
    steps_total = epochs * ((len(order) + batch_size - 1) // batch_size)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / max(1, steps_total // 10)) * max(0.0, 1 - s / max(1, steps_total)))

    def embed(texts):
        feats = {k: v.to(device) if hasattr(v, "to") else v for k, v in model.tokenize(texts).items()}
        out = model(feats)["sentence_embedding"]
        return torch.nn.functional.normalize(out, dim=-1)

    model.train()
    t0 = time.perf_counter()
    step, losses, stopped = 0, [], False
    for _ in range(epochs):
        rng.shuffle(order)
        for b0 in range(0, len(order), batch_size):
            batch = order[b0 : b0 + batch_size]
            qs = [pairs[i][0] for i in batch]
            cands = [pairs[i][1] for i in batch] + [n for i in batch for n in negatives[i]]
            same = torch.from_numpy(same_answer_mask([labels[i][0] for i in batch],
                                                     [c for i in batch for c in labels[i][1]])).to(device)
            with torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=precision == "bfloat16"):
                sim = (embed(qs) @ embed(cands).T).float() * scale
            sim = sim.masked_fill(same, -1e4)
            loss = torch.nn.functional.cross_entropy(sim, torch.arange(len(qs), device=device))
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            sched.step()
            opt.zero_grad()
            losses.append(loss.item())
            step += 1
            if callback is not None:
                callback(step, steps_total)
            if time_budget_s is not None and time.perf_counter() - t0 > time_budget_s:
                stopped = True
                break
        if stopped:
            break
    model.eval()
    model.save(str(out))
    return {"steps": step, "steps_planned": steps_total, "seconds": round(time.perf_counter() - t0, 1),
            "loss_first": round(sum(losses[:10]) / max(1, len(losses[:10])), 4),
            "loss_last": round(sum(losses[-10:]) / max(1, len(losses[-10:])), 4), "stopped_on_budget": stopped,
            "precision": precision, "device": torch.device(device).type}


def same_answer_mask(positive_classes: Sequence[int], negative_classes: Sequence[int]):
    """[queries, candidates] bool mask of a batch's softmax: the candidates are the queries' own positives (in order)
    then every negative. True where a candidate other than the query's own positive has the query's class (two
    requests of one tool in a batch): it is not a wrong answer, so it is left out of that query's softmax."""
    own = np.asarray(positive_classes)
    cand = np.concatenate([own, np.asarray(negative_classes, dtype=own.dtype)])
    mask = own[:, None] == cand[None, :]
    mask[np.arange(len(own)), np.arange(len(own))] = False
    return mask


def _as_text_list(negatives) -> list[str]:
    if negatives is None:
        return []
    if isinstance(negatives, str):
        return [negatives] if negatives else []
    return [n for n in negatives if n]
