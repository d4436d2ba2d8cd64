"""The splice engine on the real models: exactness at the anchor, R = 100 % at the numerical floor in both V layouts,
a bare off-anchor splice's KL, the native rotation against llama.cpp's own K-shift, the native blob against
llama.cpp's own blob, and the refusals of the real CLI."""

from __future__ import annotations

import json
import math
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
SMALL = REPO / "tests" / "data" / "compile" / "splice_tools.json"
TOOL = "notes__delete_note.atb"  # the shortest schema of the test registry (fast)

pytestmark = pytest.mark.slow


def _compile(out: Path, model: str, flash_attn: bool) -> Path:
    """Compile the one tool these tests splice (notes/delete_note) into `out`."""
    from nexus_cli.splice.compile import compile_registries

    data = json.loads(SMALL.read_text())
    data["tools"] = [t for t in data["tools"] if t["name"] == "delete_note"]
    out.mkdir(parents=True, exist_ok=True)
    reg = out.parent / f"{out.name}-registry.json"
    reg.write_text(json.dumps(data))
    compile_registries([reg], model, out, flash_attn=flash_attn)
    return out


@pytest.fixture(scope="module")
def blocks(tmp_path_factory):
    """Compiled SmolLM2 blocks, flash attention off (V transposed) and on (V rows)."""
    root = tmp_path_factory.mktemp("splice-blocks")
    return {fa: _compile(root / f"smol-fa{int(fa)}", "smollm2-135m", fa) for fa in (False, True)}


def _ctx(model_name: str, flash_attn: bool, n_ctx: int = 512):
    from nexus_cli.adapters.llama import LlamaContext, load_model

    return LlamaContext(load_model(model_name), n_ctx=n_ctx, n_batch=512, n_seq_max=3, flash_attn=flash_attn)


def _open(path: Path):
    from nexus_cli.atb import open_block

    return open_block(path)


def _history(ctx, depth: int) -> int:
    from nexus_cli.splice.fidelity import history_tokens

    hist = history_tokens(ctx.model, depth)
    ctx.clear()
    ctx.decode(hist, 0, 0, logits_last=False)
    return len(hist)


# ------------------------------------------------------------------------------------------------ pure helpers


def test_recompute_tokens_and_schedule():
    from nexus_cli import kernels
    from nexus_cli.splice.engine import Schedule, parse_recompute, recompute_tokens

    assert recompute_tokens(200, 5.0) == 10 and recompute_tokens(201, 5.0) == 11 and recompute_tokens(92, 0.0) == 0
    assert recompute_tokens(92, 100.0) == 92 and recompute_tokens(7, 1.0) == 1
    s = Schedule()
    for n_past in (0, 100, 256, 257, 512, 1024, 5000):
        want = 5.0 if n_past <= 256 else min(100.0, 5.0 + (n_past - 256) / (256 * 3) * 95.0)
        assert s.pct(n_past) == pytest.approx(want, abs=1e-9)
        assert kernels.eff_pct(n_past, 256, 5.0, 4.0) == pytest.approx(want, abs=1e-9)
    assert Schedule(k=16).pct(1024) == pytest.approx(5 + 768 / (256 * 15) * 95)
    assert parse_recompute("auto") is None and parse_recompute("7.5%") == 7.5 and parse_recompute("100") == 100.0
    from nexus_cli.errors import UsageError

    for bad in ("-1", "101", "lots"):
        with pytest.raises(UsageError):
            parse_recompute(bad)


# ------------------------------------------------------------------------------------------------- fidelity


def test_anchored_splice_is_bit_identical(blocks):
    """Depth 0, R = 0, flash attention off: the splice's logits equal, bit for bit, a text prefill split the same
    way (schema in one decode, query in the next), so KL = 0."""
    from nexus_cli.splice.engine import SpliceEngine
    from nexus_cli.splice.fidelity import kl_top1, prefill_path, query_tokens, splice_path

    ctx = _ctx("smollm2-135m", False)
    try:
        blk = _open(blocks[False] / TOOL)
        n_past = _history(ctx, 0)
        assert n_past == blk.header.anchor_pos
        q = query_tokens(ctx.model)
        ref_split, _ = prefill_path(ctx, n_past, list(blk.tokens), q, split=True)
        res = splice_path(SpliceEngine(ctx), blk, n_past, q, recompute=0.0)
        assert res.recomputed_tokens == 0 and res.n_tokens == blk.header.n_tokens
        assert np.array_equal(res.logits, ref_split)
        kl, top1 = kl_top1(ref_split, res.logits)
        assert kl == 0.0 and top1
    finally:
        ctx.close()


def _full_recompute(model: str, block_dir: Path, flash_attn: bool, depth: int):
    from nexus_cli.splice.fidelity import run_fidelity

    ctx = _ctx(model, flash_attn)
    try:
        return run_fidelity(ctx, _open(block_dir / TOOL), depth, recompute=100.0, repeat=0)
    finally:
        ctx.close()


@pytest.mark.parametrize("flash_attn", [False, True], ids=["v-transposed", "v-rows"])
def test_full_recompute_is_at_the_floor_smollm2(blocks, flash_attn):
    rep = _full_recompute("smollm2-135m", blocks[flash_attn], flash_attn, depth=48)
    print(f"\nsmollm2 fa={flash_attn} R=100 depth 48: kl={rep.kl:.3g} floor={rep.floor_kl:.3g}")
    assert rep.recomputed_tokens == rep.n_tokens and rep.R_pct == 100.0
    assert rep.v_layout == (0 if flash_attn else 1)
    assert rep.kl <= rep.floor_kl and rep.top1


@pytest.mark.qwen
@pytest.mark.parametrize("flash_attn", [False, True], ids=["v-transposed", "v-rows"])
def test_full_recompute_is_at_the_floor_qwen(tmp_path, flash_attn):
    d = _compile(tmp_path / "qwen", "qwen2.5-0.5b", flash_attn)
    rep = _full_recompute("qwen2.5-0.5b", d, flash_attn, depth=40)
    print(f"\nqwen fa={flash_attn} R=100 depth 40: kl={rep.kl:.3g} floor={rep.floor_kl:.3g}")
    assert rep.recomputed_tokens == rep.n_tokens
    assert rep.kl <= rep.floor_kl and rep.top1


@pytest.mark.parametrize("flash_attn", [False, True], ids=["v-transposed", "v-rows"])
def test_bare_off_anchor_splice_has_a_finite_plausible_kl(blocks, flash_attn):
    """R = 0 away from the anchor is not exact (RoPE phase drift of the cached keys' context): report the KL,
    require it finite and in a plausible band (well below a broken cache's several nats)."""
    from nexus_cli.splice.fidelity import run_fidelity

    ctx = _ctx("smollm2-135m", flash_attn)
    try:
        rep = run_fidelity(ctx, _open(blocks[flash_attn] / TOOL), 96, recompute=0.0, repeat=0)
    finally:
        ctx.close()
    print(f"\nbare splice smollm2 fa={flash_attn} depth 96 (n_past {rep.n_past}): kl={rep.kl:.4g} "
          f"floor={rep.floor_kl:.3g} top1={rep.top1}")
    assert rep.recomputed_tokens == 0
    assert math.isfinite(rep.kl) and 0.0 < rep.kl < 1.0


# ----------------------------------------------------------------------------------- native vs llama.cpp itself


def _f16_ulp_diff(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Distance in F16 units in the last place (sign-magnitude bit patterns mapped onto a monotonic integer line)."""
    def ordered(x):
        i = x.view(np.uint16).astype(np.int32)
        return np.where(i & 0x8000, 0x8000 - (i & 0x7FFF), 0x8000 + i)

    return np.abs(ordered(a) - ordered(b))


def _pair_norm(k: np.ndarray, n_head: int, head_dim: int, n_rot: int, rope_type: int) -> np.ndarray:
    """For every element of K rows [..., n_head * head_dim], the norm of the RoPE pair it belongs to."""
    x = k.reshape(*k.shape[:-1], n_head, head_dim)
    r = np.abs(x).copy()
    half = n_rot // 2
    if rope_type == 0:  # NORM: (2i, 2i+1)
        n = np.sqrt(x[..., 0:n_rot:2] ** 2 + x[..., 1:n_rot:2] ** 2)
        r[..., 0:n_rot:2] = n
        r[..., 1:n_rot:2] = n
    else:  # NEOX: (i, i + n_rot/2)
        n = np.sqrt(x[..., :half] ** 2 + x[..., half:n_rot] ** 2)
        r[..., :half] = n
        r[..., half:n_rot] = n
    return r.reshape(k.shape)


@pytest.mark.parametrize("model", ["smollm2-135m", pytest.param("qwen2.5-0.5b", marks=pytest.mark.qwen)])
def test_native_rotation_matches_llama_position_shift(model):
    """Rotate a block's K rows with the native kernel and let llama.cpp shift the same cells with
    llama_memory_seq_add (its K-shift, applied at the next decode): the rows agree to F16 rounding."""
    from nexus_cli import kernels
    from nexus_cli.splice.compile import extract_cells, prefix_tokens

    delta = 300
    ctx = _ctx(model, False, n_ctx=1024)
    try:
        ident = ctx.identity
        prefix = prefix_tokens(ctx.model)
        body = ctx.model.tokenize("# Tool\n" + json.dumps({"name": "probe", "parameters": {"type": "object"}}) + "\n")
        m0, S = len(prefix), len(body)
        ctx.decode(prefix + body, 0, 0, logits_last=False)
        k0, _ = extract_cells(ctx, 0, m0, m0 + S)
        ctx.seq_add(0, m0, -1, delta)
        ctx.decode(prefix[:1], 0, 2)  # any decode applies the pending K-shift
        ctx.seq_rm(2, -1, -1)
        k_llama, _ = extract_cells(ctx, 0, m0 + delta, m0 + delta + S)
        k_native = np.stack([
            kernels.rope_rotate_f16(k0[l], ident.n_head_kv, ident.head_dim, ident.n_rot, ident.rope_type,
                                    ident.freq_base, ident.freq_scale, delta)
            for l in range(ident.n_layer)
        ])
    finally:
        ctx.close()
    assert k_native.view(np.uint16).shape == k_llama.shape
    # not vacuous: the shift moved the rows a lot
    moved = _f16_ulp_diff(k0.view(np.uint16), k_llama.view(np.uint16))
    assert np.median(moved) > 100
    ulp = _f16_ulp_diff(k_native.view(np.uint16), k_llama.view(np.uint16))
    a = k_native.view(np.float16).astype(np.float32)
    b = k_llama.view(np.float16).astype(np.float32)
    scale = np.abs(b).max()
    print(f"\n{model}: exact {np.mean(ulp == 0):.4f}, <=1 ulp {np.mean(ulp <= 1):.5f}, max ulp {ulp.max()}, "
          f"max abs diff {np.abs(a - b).max():.3g} of max |k| {scale:.3g}")
    # F16 rounding: each element within one F16 ulp of its pair's magnitude (a rotation mixes the two values of a
    # pair, so near-zero outputs inherit the rounding of their partner: a per-element ulp would be too strict)
    r = _pair_norm(k0.view(np.float16).astype(np.float32), ident.n_head_kv, ident.head_dim, ident.n_rot,
                   ident.rope_type)
    ulp_r = np.exp2(np.floor(np.log2(np.maximum(r, 2.0 ** -14))) - 10)
    assert np.all(np.abs(a - b) <= ulp_r), float(np.max(np.abs(a - b) / ulp_r))
    assert np.mean(ulp == 0) > 0.95


@pytest.mark.parametrize("flash_attn", [False, True], ids=["v-transposed", "v-rows"])
def test_native_blob_matches_llama_blob(blocks, flash_attn):
    """At the anchor (no rotation) the native blob equals, byte for byte, the blob our NumPy writer builds from the
    cells llama.cpp itself serialized for the same prefix + schema."""
    from nexus_cli.splice.compile import extract_cells, prefix_tokens
    from nexus_cli.splice.state import build_state_blob

    blk = _open(blocks[flash_attn] / TOOL)
    h = blk.header
    ctx = _ctx("smollm2-135m", flash_attn)
    try:
        prefix = prefix_tokens(ctx.model)
        ctx.decode(prefix, 0, 0, logits_last=False)  # split as compile splits it: batching changes numerics
        ctx.decode(list(blk.tokens), len(prefix), 0, logits_last=False)
        k, v = extract_cells(ctx, 0, h.anchor_pos, h.anchor_pos + h.n_tokens)
    finally:
        ctx.close()
    want = build_state_blob(1, range(h.anchor_pos, h.anchor_pos + h.n_tokens), k, v, not flash_attn)
    got = blk.splice_blob(h.anchor_pos, 1)
    assert blk.blob_size == len(want)
    assert got.tobytes() == want


def test_engine_refuses_a_cursor_that_is_not_the_end(blocks):
    from nexus_cli.errors import ModelError
    from nexus_cli.splice.engine import SpliceEngine

    ctx = _ctx("smollm2-135m", False)
    try:
        n_past = _history(ctx, 8)
        with pytest.raises(ModelError, match="live sequence ends"):
            SpliceEngine(ctx).splice(_open(blocks[False] / TOOL), n_past - 3, 0.0)
    finally:
        ctx.close()


# ------------------------------------------------------------------------------------------------- the CLI


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "nexus_cli.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def _assert_one_line_error(proc, *needles):
    assert proc.returncode != 0
    assert "Traceback" not in proc.stderr
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, proc.stderr
    for n in needles:
        assert n in lines[0], lines[0]


def test_cli_splice_json(blocks):
    proc = run_cli("splice", "--block", str(blocks[False] / TOOL), "--model", "smollm2-135m", "--depth", "0",
                   "--recompute", "0", "--repeat", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert set(out) == {"n_past", "R_pct", "recomputed_tokens", "kl", "top1", "floor_kl", "t_prefill_ms",
                        "t_splice_ms", "speedup", "splice_overhead_ms", "v_layout", "model"}
    assert out["model"] == "smollm2-135m" and out["v_layout"] == 1 and out["R_pct"] == 0.0
    assert out["top1"] is True and out["kl"] >= 0 and out["floor_kl"] >= 0
    assert out["t_prefill_ms"] > 0 and out["t_splice_ms"] > 0 and out["splice_overhead_ms"] > 0


def test_cli_refuses_a_block_of_the_other_model(blocks):
    proc = run_cli("splice", "--block", str(blocks[False] / TOOL), "--model", "qwen2.5-0.5b", "--depth", "4")
    _assert_one_line_error(proc, "fingerprint", "qwen2.5-0.5b")


def test_cli_refuses_a_tampered_rope_base(blocks, tmp_path):
    raw = bytearray((blocks[False] / TOOL).read_bytes())
    (base,) = struct.unpack_from("<f", raw, 68)
    struct.pack_into("<f", raw, 68, base * 10)
    struct.pack_into("<I", raw, 12, 0)
    struct.pack_into("<I", raw, 12, zlib.crc32(bytes(raw[:128])))  # a valid header: only the model check can object
    bad = tmp_path / "tampered.atb"
    bad.write_bytes(bytes(raw))
    from nexus_cli.atb import open_block

    assert open_block(bad).header.freq_base == base * 10  # the format check passes
    proc = run_cli("splice", "--block", str(bad), "--model", "smollm2-135m", "--depth", "4")
    _assert_one_line_error(proc, "freq_base")


def test_cli_refuses_a_truncated_block(blocks, tmp_path):
    raw = (blocks[False] / TOOL).read_bytes()
    bad = tmp_path / "truncated.atb"
    bad.write_bytes(raw[: len(raw) - 1000])
    proc = run_cli("splice", "--block", str(bad), "--model", "smollm2-135m", "--depth", "4")
    _assert_one_line_error(proc, "truncated")


def test_cli_refuses_the_wrong_v_layout(blocks):
    proc = run_cli("splice", "--block", str(blocks[False] / TOOL), "--model", "smollm2-135m", "--depth", "4",
                   "--flash-attn", "on")
    _assert_one_line_error(proc, "V layout")
