"""`nexus compile`: render each tool's schema the way the model sees it, prefill it once after a fixed prefix, and
store its K/V cells as one `.atb` block per tool, plus a manifest (see docs/compile.md).

Layout of the compile prompt (ChatML, both Nexus models use it):

    COMPILE_PREFIX                      positions 0 .. m0-1   (m0 = the anchor, stored in every block header)
    render_schema(tool)                 positions m0 .. m0+S-1 (the block: S tokens, their K and V rows)

The prefix is decoded once per run; each schema is decoded after it in one llama_decode call (split only when it is
longer than n_batch), then the cells [m0, m0+S) are read back out of llama.cpp's sequence state.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

import numpy as np

from ..adapters.llama import LlamaContext, load_model
from ..atb import BlockHeader, write_block
from ..errors import FormatError, ModelError, NexusError
from ..files import atomic_write_json, pid_alive, sha256_file
from ..registry import Tool, load_registries
from .render import COMPILE_PREFIX, RENDER_VERSION, prefix_tokens, render_schema
from .state import parse_state_blob

PAYLOAD_ALIGN = 4096  # page alignment of the K and V sections (the header allows any power of two >= 64)
MANIFEST_NAME = "manifest.json"
MANIFEST_VERSION = 1


_SAFE = re.compile(r"[^A-Za-z0-9._-]+")


def block_filename(server: str, name: str) -> str:
    """`<server>__<name>.atb` with every run of characters outside [A-Za-z0-9._-] replaced by one '_'."""
    s = _SAFE.sub("_", server).strip("._") or "server"
    n = _SAFE.sub("_", name).strip("._") or "tool"
    return f"{s}__{n}.atb"


def compile_settings(flash_attn: bool) -> dict:
    """Everything besides the schema text and the weights that changes a block's bytes."""
    return {
        "render": RENDER_VERSION,
        "prefix": COMPILE_PREFIX,
        "v_layout": 0 if flash_attn else 1,
        "k_type": "f16",
        "v_type": "f16",
        "payload_align": PAYLOAD_ALIGN,
    }


def tool_key(schema_text: str, fingerprint: str, settings: dict) -> str:
    """The incremental key of one block: sha256 over the schema text, the model fingerprint and the settings."""
    h = hashlib.sha256()
    h.update(json.dumps({"schema": schema_text, "fingerprint": fingerprint, "settings": settings}, sort_keys=True,
                        ensure_ascii=False).encode("utf-8"))
    return h.hexdigest()


def block_header_for(identity, anchor: int, n_tokens: int, v_layout: int):
    """A BlockHeader carrying the live model's identity, for a block of n_tokens anchored at `anchor`."""

    return BlockHeader(
        fingerprint=identity.fingerprint_bytes,
        arch=identity.arch,
        rope_type=identity.rope_type,
        k_type=1,
        v_type=1,
        v_layout=v_layout,
        n_rot=identity.n_rot,
        n_layer=identity.n_layer,
        n_head_kv=identity.n_head_kv,
        head_dim=identity.head_dim,
        freq_base=identity.freq_base,
        freq_scale=identity.freq_scale,
        yarn_ext_factor=identity.yarn_ext_factor,
        yarn_attn_factor=identity.yarn_attn_factor,
        yarn_beta_fast=identity.yarn_beta_fast,
        yarn_beta_slow=identity.yarn_beta_slow,
        n_ctx_orig=identity.n_ctx_orig,
        anchor_pos=anchor,
        n_tokens=n_tokens,
        payload_align=PAYLOAD_ALIGN,
    )


def extract_cells(ctx, seq_id: int, p0: int, p1: int):
    """K and V of the cells of `seq_id` with p0 <= pos < p1, read from llama.cpp's sequence state.

    Returns (k [n_layer, n, row] uint16, v [n_layer, n, row] or [n_layer, row, n] when the cache is transposed)."""
    st = parse_state_blob(ctx.state_seq_get(seq_id))
    sel = np.nonzero((st.pos >= p0) & (st.pos < p1))[0]
    order = sel[np.argsort(st.pos[sel], kind="stable")]
    if len(order) != p1 - p0 or not np.array_equal(st.pos[order], np.arange(p0, p1)):
        raise ModelError(f"sequence {seq_id} does not hold exactly the positions {p0}..{p1 - 1}")
    k = np.ascontiguousarray(st.k[:, order, :])
    if st.v_trans:
        v = np.ascontiguousarray(st.v[:, :, order])
    else:
        v = np.ascontiguousarray(st.v[:, order, :])
    return k, v


@dataclass
class CompileResult:
    n_tools: int
    n_compiled: int
    n_skipped: int
    n_tokens_total: int
    bytes_total: int
    seconds: float
    tokens_per_s: float
    manifest: str
    compiled_tokens: int = 0
    entries: list[dict] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "n_tools": self.n_tools,
            "n_compiled": self.n_compiled,
            "n_skipped": self.n_skipped,
            "n_tokens_total": self.n_tokens_total,
            "bytes_total": self.bytes_total,
            "seconds": round(self.seconds, 3),
            "tokens_per_s": round(self.tokens_per_s, 1),
            "manifest": self.manifest,
        }


def read_manifest(out_dir: Path) -> dict | None:
    path = Path(out_dir) / MANIFEST_NAME
    if not path.exists():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(f"manifest {path} is not valid JSON ({e})", hint="delete it to recompile everything") from None
    if not isinstance(data, dict) or not isinstance(data.get("tools"), list):
        raise FormatError(f"manifest {path} has no \"tools\" list")
    return data


def write_manifest(out_dir: Path, manifest: dict) -> Path:
    """Write DIR/manifest.json atomically (files.atomic_write_json)."""
    return atomic_write_json(Path(out_dir) / MANIFEST_NAME, manifest)


_TMP_PID = re.compile(r"\.(?:tmp\.)?(\d+)\.tmp$|\.tmp\.(\d+)\.")


def _clean_temp_files(out_dir: Path) -> None:
    """Remove leftovers of a killed run: hidden temp files (the block writer's `.<name>.tmp.<pid>.<nonce>`, the
    manifest's `.manifest.json.<pid>.tmp`) whose writing process is gone. They are never valid blocks or manifests."""
    for p in out_dir.iterdir():
        if not (p.is_file() and p.name.startswith(".") and ".tmp" in p.name):
            continue
        m = _TMP_PID.search(p.name)
        pid = int(m.group(1) or m.group(2)) if m else None
        if pid is not None and pid_alive(pid):
            continue
        try:
            p.unlink()
        except OSError:
            pass


def compile_registries(
    registries: Iterable[str | os.PathLike],
    model_name: str,
    out_dir: str | os.PathLike,
    flash_attn: bool = False,
    n_batch: int = 512,
    on_start: Callable[[int], None] | None = None,
    on_tool: Callable[[Tool, bool], None] | None = None,
    force: bool = False,
) -> CompileResult:
    """Compile every tool of `registries` into DIR/<server>__<name>.atb and DIR/manifest.json.

    A tool whose key (tool_key: schema text, model fingerprint, settings) equals the one in the existing manifest and
    whose block file is still there with the recorded size and sha256 is skipped. on_start(n_tools) and
    on_tool(tool, compiled) report progress."""

    t_start = time.perf_counter()
    tools = load_registries(registries)
    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise NexusError(f"--out {out} exists and is not a directory")
    try:
        out.mkdir(parents=True, exist_ok=True)
        _clean_temp_files(out)
        probe = out / f".write-probe-{os.getpid()}"  # fail before the model loads, not after the first block
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise NexusError(f"cannot write to the output folder {out}: {e.strerror or e}") from None

    model = load_model(model_name)
    ident = model.identity
    settings = compile_settings(flash_attn)
    v_layout = settings["v_layout"]
    prefix = prefix_tokens(model)
    m0 = len(prefix)

    old = read_manifest(out) if not force else None
    old_by_key: dict[str, dict] = {}
    if old:
        for e in old.get("tools", []):
            if isinstance(e, dict) and isinstance(e.get("key"), str):
                old_by_key[f"{e.get('server')}/{e.get('name')}"] = e

    # Plan: render and tokenize everything first (cheap), so the context is sized once.
    plan = []
    used_names: dict[str, str] = {}
    for tool in tools:
        text = render_schema(tool)
        toks = model.tokenize(text, add_special=False, parse_special=False)
        fname = block_filename(tool.server, tool.name)
        if fname in used_names and used_names[fname] != tool.key:
            fname = fname[:-4] + "__" + hashlib.sha256(tool.key.encode()).hexdigest()[:8] + ".atb"
        used_names[fname] = tool.key
        plan.append((tool, text, toks, fname, tool_key(text, ident.fingerprint, settings)))

    max_s = max(len(p[2]) for p in plan)
    if m0 + max_s > ident.n_ctx_train:
        worst = max(plan, key=lambda p: len(p[2]))
        raise NexusError(f"tool {worst[0].key} renders to {len(worst[2])} tokens: with the {m0}-token prefix that is "
                         f"over the model's training context ({ident.n_ctx_train})")

    base = {
        "version": MANIFEST_VERSION,
        "model": ident.to_dict(),
        "anchor": m0,
        "prefix_tokens": prefix,
        "settings": settings,
        "tools": [],
    }
    entries: list[dict] = []
    ctx = None
    n_compiled = n_skipped = 0
    compiled_tokens = 0
    t_compile = 0.0
    last_write = time.perf_counter()
    if on_start:
        on_start(len(plan))
    try:
        for tool, text, toks, fname, key in plan:
            path = out / fname
            prev = old_by_key.get(tool.key)
            if (
                prev is not None
                and prev.get("key") == key
                and prev.get("file") == fname
                and path.is_file()
                and path.stat().st_size == prev.get("bytes")
                and sha256_file(path) == prev.get("sha256")
            ):
                entries.append(prev)
                n_skipped += 1
                if on_tool:
                    on_tool(tool, False)
                continue
            if ctx is None:
                n_ctx = ((m0 + max_s + 255) // 256) * 256
                ctx = LlamaContext(model, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=1, flash_attn=flash_attn)
                ctx.decode(prefix, 0, 0, logits_last=False)
            tc = time.perf_counter()
            ctx.seq_rm(0, m0, -1)
            ctx.decode(toks, m0, 0, logits_last=False)
            k, v = extract_cells(ctx, 0, m0, m0 + len(toks))
            header = block_header_for(ident, m0, len(toks), v_layout)
            write_block(path, header, np.asarray(toks, dtype=np.int32), k, v)
            t_compile += time.perf_counter() - tc
            entries.append({
                "server": tool.server,
                "name": tool.name,
                "file": fname,
                "n_tokens": len(toks),
                "sha256": sha256_file(path),
                "bytes": path.stat().st_size,
                "key": key,
            })
            n_compiled += 1
            compiled_tokens += len(toks)
            if on_tool:
                on_tool(tool, True)
            if time.perf_counter() - last_write > 2.0:  # keep finished work across an interruption
                write_manifest(out, {**base, "complete": False, "tools": entries})
                last_write = time.perf_counter()
    except KeyboardInterrupt:
        if entries:  # Ctrl-C: record what is finished (atomically) so the next run resumes, then stop
            write_manifest(out, {**base, "complete": False, "tools": entries})
        raise
    finally:
        if ctx is not None:
            ctx.close()

    manifest_path = write_manifest(out, {**base, "complete": True, "tools": entries})
    # Blocks of tools that left the registry (listed in the old manifest only) are removed.
    if old:
        keep = {e["file"] for e in entries}
        for e in old.get("tools", []):
            f = e.get("file") if isinstance(e, dict) else None
            if isinstance(f, str) and f not in keep and "/" not in f and (out / f).is_file():
                (out / f).unlink()
    seconds = time.perf_counter() - t_start
    return CompileResult(
        n_tools=len(plan),
        n_compiled=n_compiled,
        n_skipped=n_skipped,
        n_tokens_total=sum(e["n_tokens"] for e in entries),
        bytes_total=sum(e["bytes"] for e in entries),
        seconds=seconds,
        tokens_per_s=(compiled_tokens / t_compile) if t_compile > 0 else 0.0,
        manifest=str(manifest_path),
        compiled_tokens=compiled_tokens,
        entries=entries,
    )
