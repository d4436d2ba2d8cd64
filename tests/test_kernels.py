"""libnexus kernels against their NumPy references, on the SIMD path and the forced scalar path."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import numpy as np
import pytest

from nexus_cli import _native, kernels, reference
from nexus_cli.errors import NativeError, NexusError, UsageError

LENGTHS = [1, 3, 7, 15, 16, 17, 31, 33, 63, 65, 127, 129, 384]
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _levels() -> list[str]:
    saved = kernels.simd_level()
    out = []
    for name in ("scalar", "avx2", "avx512", "avx512_vnni", "neon"):
        try:
            kernels.set_simd_level(name)
            out.append(name)
        except NativeError:
            pass
    kernels.set_simd_level(saved)
    return out


LEVELS = _levels()


@pytest.fixture
def restore_level():
    saved = kernels.simd_level()
    yield
    kernels.set_simd_level(saved)


# ---------------------------------------------------------------- dispatch

def test_native_dense_layers_are_chosen_only_where_they_were_measured_faster(restore_level):
    # nexus_linear_f16 beats NumPy's float32 BLAS on AVX-512 only (docs/routing.md, "Latency"); AVX2 and NEON lose
    for name in LEVELS:
        kernels.set_simd_level(name)
        assert kernels.native_dense_pays() == (name in ("avx512", "avx512_vnni")), name


def test_import_does_not_load_library():
    code = "import nexus_cli._native as n, nexus_cli.kernels, nexus_cli.atb; print(n.is_loaded())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, check=True)
    assert out.stdout.strip() == "False"


def test_levels_and_override(restore_level):
    assert "scalar" in LEVELS
    assert kernels.simd_level() in LEVELS
    kernels.set_simd_level("scalar")
    assert kernels.simd_level() == "scalar" and kernels.simd_level_id() == 0
    with pytest.raises(UsageError):
        kernels.set_simd_level("sse9")
    with pytest.raises(NativeError, match="unknown SIMD level 9"):
        kernels.set_simd_level(9)


def test_force_scalar_env_is_honoured():
    code = "from nexus_cli import kernels; print(kernels.simd_level())"
    env = dict(os.environ, NEXUS_FORCE_SCALAR="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=True)
    assert out.stdout.strip() == "scalar"
    env["NEXUS_FORCE_SCALAR"] = "0"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=True)
    assert out.stdout.strip() == LEVELS[-1]


def test_force_scalar_subprocess_matches_reference():
    """The whole SLB + RoPE check once more in a process started with NEXUS_FORCE_SCALAR=1."""
    code = r"""
import json, numpy as np
from nexus_cli import kernels, reference
rng = np.random.default_rng(3)
db = rng.integers(-128, 128, (65, 129), dtype=np.int8); q = rng.integers(-128, 128, 129, dtype=np.int8)
k = rng.standard_normal((4, 2 * 64)).astype(np.float16)
rot = kernels.rope_rotate_f16(k, 2, 64, 64, 2, 10000.0, 1.0, 77)
print(json.dumps({"level": kernels.simd_level(),
                  "dots": bool((kernels.slb_dots(db, q) == reference.slb_dots(db, q)).all()),
                  "rope": rot.view(np.uint16).tolist()}))
"""
    env = dict(os.environ, NEXUS_FORCE_SCALAR="1")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=True)
    res = json.loads(out.stdout)
    assert res["level"] == "scalar" and res["dots"]
    rng = np.random.default_rng(3)
    rng.integers(-128, 128, (65, 129), dtype=np.int8), rng.integers(-128, 128, 129, dtype=np.int8)
    k = rng.standard_normal((4, 128)).astype(np.float16)
    here = kernels.rope_rotate_f16(k, 2, 64, 64, 2, 10000.0, 1.0, 77)  # this process: the best SIMD level
    assert here.view(np.uint16).tolist() == res["rope"]


# ---------------------------------------------------------------- eq. (2)

@pytest.mark.parametrize("n_past,k,want", [
    (0, 4, 5.0), (256, 4, 5.0), (512, 4, 36.6667), (1024, 4, 100.0), (9999, 4, 100.0),
    (512, 16, 11.3333), (1024, 16, 24.0), (2048, 16, 49.3333),
])
def test_eff_pct_paper_table(n_past, k, want):
    assert kernels.eff_pct(n_past, k=k) == pytest.approx(want, abs=1e-4)
    assert kernels.eff_pct(n_past, k=k) == pytest.approx(reference.eff_pct(n_past, k=k), abs=1e-12)


def test_eff_pct_rejects_bad_arguments():
    with pytest.raises(NativeError, match="k must be a finite number > 1"):
        kernels.eff_pct(10, k=1.0)
    with pytest.raises(NativeError, match="n_past must be >= 0"):
        kernels.eff_pct(-5)


# ---------------------------------------------------------------- RoPE

ROPE_CASES = [
    # n_heads, head_dim, n_rot, rope_type, base, scale, delta
    (2, 64, 64, 0, 10000.0, 1.0, 37),
    (2, 64, 64, 2, 1_000_000.0, 1.0, 1500),
    (3, 128, 64, 2, 10000.0, 0.25, 300),    # partial rotation, freq_scale
    (2, 80, 40, 0, 10000.0, 1.0, -123),     # partial NORM, negative delta
    (1, 34, 34, 2, 500000.0, 1.0, 2047),    # odd number of pairs
    (1, 258, 258, 0, 10000.0, 0.5, 100000),
    (4, 6, 2, 0, 10000.0, 2.0, 5),
]


@pytest.mark.parametrize("case", ROPE_CASES)
def test_rope_matches_float64_reference_and_scalar(case, restore_level):
    n_heads, head_dim, n_rot, rtype, base, scale, delta = case
    rng = np.random.default_rng(hash(case) % 2**32)
    k = (rng.uniform(-4, 4, (7, n_heads * head_dim))).astype(np.float16)
    want = reference.rope_rotate_f16(k, n_heads, head_dim, n_rot, rtype, base, scale, delta)
    results = {}
    for level in LEVELS:
        kernels.set_simd_level(level)
        got = kernels.rope_rotate_f16(k, n_heads, head_dim, n_rot, rtype, base, scale, delta)
        assert got.dtype == np.float16
        assert reference.f16_ulp_distance(got, want).max() <= 1
        rest = got.reshape(7, n_heads, head_dim)[..., n_rot:]
        assert np.array_equal(rest.view(np.uint16), k.reshape(7, n_heads, head_dim)[..., n_rot:].view(np.uint16))
        inplace = k.view(np.uint16).copy()
        kernels.rope_rotate_f16(inplace, n_heads, head_dim, n_rot, rtype, base, scale, delta, out=inplace)
        assert np.array_equal(inplace, got.view(np.uint16))
        results[level] = got.view(np.uint16)
    for level in LEVELS:  # every SIMD level is bit-identical to scalar
        assert np.array_equal(results[level], results["scalar"]), level


@pytest.mark.parametrize("head_dim", [x * 2 for x in LENGTHS])
def test_rope_awkward_widths(head_dim, restore_level):
    rng = np.random.default_rng(head_dim)
    k = rng.uniform(-2, 2, (3, head_dim)).astype(np.float16)
    out = {}
    for level in LEVELS:
        kernels.set_simd_level(level)
        for rtype in (0, 2):
            got = kernels.rope_rotate_f16(k, 1, head_dim, head_dim, rtype, 10000.0, 1.0, 11)
            want = reference.rope_rotate_f16(k, 1, head_dim, head_dim, rtype, 10000.0, 1.0, 11)
            assert reference.f16_ulp_distance(got, want).max() <= 1
            out[(level, rtype)] = got.view(np.uint16)
    for (level, rtype), v in out.items():
        assert np.array_equal(v, out[("scalar", rtype)])


def test_rope_errors():
    k = np.zeros((1, 8), np.float16)
    with pytest.raises(NativeError, match="n_rot must be even"):
        kernels.rope_rotate_f16(k, 1, 8, 3, 0, 10000.0, 1.0, 1)
    with pytest.raises(NativeError, match="rope_type"):
        kernels.rope_rotate_f16(k, 1, 8, 8, 1, 10000.0, 1.0, 1)
    with pytest.raises(UsageError, match="shape"):
        kernels.rope_rotate_f16(k, 2, 8, 8, 0, 10000.0, 1.0, 1)
    with pytest.raises(UsageError, match="dtype"):
        kernels.rope_rotate_f16(k.astype(np.float32), 1, 8, 8, 0, 10000.0, 1.0, 1)


# ---------------------------------------------------------------- INT8 SLB

@pytest.mark.parametrize("dim", LENGTHS)
def test_quantize_matches_reference_every_level(dim, restore_level):
    rng = np.random.default_rng(dim)
    x = rng.standard_normal((12, dim)).astype(np.float32)
    x[3] = 0  # all-zero row: scale 1
    x[4, 0] = 0.5 * (x[4, 0] if x[4, 0] else 1.0)
    x[5] = rng.integers(-127, 128, dim).astype(np.float32) + 0.5  # quotients on the halves (scale near 1)
    x[5, 0] = 127.0
    x[6] = rng.standard_normal(dim).astype(np.float32) * np.float32(1e-30)  # tiny, still quantizable
    x[7] = -x[5]
    rq, rs = reference.quantize_i8(x)
    for level in LEVELS:
        kernels.set_simd_level(level)
        q, s = kernels.quantize_i8(x)
        assert np.array_equal(q, rq) and np.array_equal(s, rs), level
    assert s[3] == 1.0 and not q[3].any()
    assert np.abs(q).max() <= 127


def test_quantize_rounds_half_away_from_zero_every_level(restore_level):
    x = np.array([[127.0, 0.5, -0.5, 1.5, -2.5, 0.49999997, -0.49999997, 126.5, -126.5, 0.0, -0.0, 2.5,
                   3.5, -3.5, 1.0000001, 0.5000001, 64.5, -64.5]], np.float32)  # scale exactly 1
    for level in LEVELS:
        kernels.set_simd_level(level)
        q, s = kernels.quantize_i8(x)
        assert s[0] == 1.0, level
        assert q.tolist() == [[127, 1, -1, 2, -3, 0, 0, 127, -127, 0, 0, 3, 4, -4, 1, 1, 65, -65]], level
    bad = np.ones((2, 20), np.float32)
    bad[1, 17] = np.nan
    for level in LEVELS:
        kernels.set_simd_level(level)
        with pytest.raises(NativeError, match=r"x\[1, 17\] is not finite"):
            kernels.quantize_i8(bad)


@pytest.mark.parametrize("dim", LENGTHS)
def test_slb_dots_exact_every_level(dim, restore_level):
    rng = np.random.default_rng(100 + dim)
    db = rng.integers(-128, 128, (37, dim), dtype=np.int8)
    db[0] = -128
    db[1] = 127
    q = rng.integers(-128, 128, dim, dtype=np.int8)
    q[0] = -128
    want = reference.slb_dots(db, q)
    for level in LEVELS:
        kernels.set_simd_level(level)
        assert np.array_equal(kernels.slb_dots(db, q), want), level


@pytest.mark.parametrize("dim", LENGTHS)
def test_slb_topk_every_level(dim, restore_level):
    rng = np.random.default_rng(200 + dim)
    x = rng.standard_normal((300, dim)).astype(np.float32)
    x[150] = x[20]  # exact ties: the lower index first
    x[299] = x[20]
    db, scales = kernels.quantize_i8(x)
    q, qs = db[20].copy(), float(scales[20])
    for k in (1, 3, 10, 64, 65, 300, 500):
        want_idx, want_sc = reference.slb_topk(db, scales, q, qs, k)
        for level in LEVELS:
            kernels.set_simd_level(level)
            idx, sc = kernels.slb_topk(db, scales, q, qs, k)
            assert np.array_equal(idx, want_idx) and np.array_equal(sc, want_sc), (level, k)
    order = kernels.slb_topk(db, scales, q, qs, 300)[0].tolist()  # equal rows sit together, lower index first
    p = order.index(20)
    assert order[p:p + 3] == [20, 150, 299]
    scanner = kernels.SlbScanner(db, scales, 10)
    s_idx, s_sc = scanner.topk(q, qs)
    assert np.array_equal(s_idx, reference.slb_topk(db, scales, q, qs, 10)[0])
    strided = np.repeat(q, 2)[::2]  # the same values through a strided view: copied as they are
    assert np.array_equal(scanner.topk(strided, qs)[0], s_idx)
    for bad in (q.astype(np.uint8), q.astype(np.int16), q[:-1], q.reshape(1, -1), list(q)):
        with pytest.raises(UsageError, match="int8 array"):
            scanner.topk(bad, qs)
    idx, sc = kernels.slb_topk(db, None, q, 1.0, 4)
    assert np.array_equal(idx, reference.slb_topk(db, None, q, 1.0, 4)[0])


@pytest.mark.parametrize("dim", LENGTHS)
def test_prepared_slb_scan_equals_the_reference_every_level(dim, restore_level):
    """A prepared SLB (panels on a VNNI CPU: rows in groups of 64, dims padded to 4) scans exactly like the plain call
    and the NumPy reference, for row counts around the panel and block sizes and the extreme int8 values."""
    rng = np.random.default_rng(250 + dim)
    for n in (1, 63, 64, 65, 256, 257, 300):
        db = rng.integers(-128, 128, (n, dim), dtype=np.int8)
        db[0] = -128
        db[n // 2] = 127
        db[n - 1] = db[0]  # a tie: the lower index first
        scales = rng.uniform(0.5, 1.5, n).astype(np.float32)
        q = rng.integers(-128, 128, dim, dtype=np.int8)
        q[0] = -128
        qs = 0.01
        for k in (1, 5, 64, 65):
            want_idx, want_sc = reference.slb_topk(db, scales, q, qs, k)
            for level in LEVELS:
                kernels.set_simd_level(level)
                scanner = kernels.SlbScanner(db, scales, k)
                for scan in range(3):  # the first two scans read the rows as they are, the third the panels
                    idx, sc = scanner.topk(q, qs)
                    assert np.array_equal(idx, want_idx) and np.array_equal(sc, want_sc), (n, k, level, scan)


def test_prepared_slb_scan_split_over_threads_equals_one_pass(restore_level):
    """A scan of more than 16 MiB of rows is split over the cores (where there are two); the merged answer is the
    single pass's, ties across the split included."""
    rng = np.random.default_rng(7)
    n, dim = 45_000, 384
    db = rng.integers(-127, 128, (n, dim), dtype=np.int8)
    q = rng.integers(-127, 128, dim, dtype=np.int8)
    best = np.sign(q).astype(np.int8) * 127
    for row in (40_000, 10, 22_600, 44_999):  # the same best row in both halves: the lower index first
        db[row] = best
    want_idx, want_sc = reference.slb_topk(db, None, q, 1.0, 8)
    assert want_idx[:4].tolist() == [10, 22_600, 40_000, 44_999]
    for level in LEVELS:
        kernels.set_simd_level(level)
        scanner = kernels.SlbScanner(db, None, 8)
        for scan in range(3):
            idx, sc = scanner.topk(q, 1.0)
            assert np.array_equal(idx, want_idx) and np.array_equal(sc, want_sc), (level, scan)
        assert np.array_equal(kernels.slb_topk(db, None, q, 1.0, 8)[0], want_idx), level


def test_scans_that_score_every_row_split_over_threads_as_one_pass(restore_level):
    """Above 16 MiB of rows every row's score is also computed over the cores: the exact scan, the top-k beyond
    64 and the router's per-tool scores of one and two texts (before and after the panels) give the single
    pass's answers, bit for bit as their NumPy references."""
    rng = np.random.default_rng(8)
    n, dim = 44_000, 384  # 16.1 MiB of INT8 rows: two parts
    x = rng.standard_normal((n, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[43_000] = x[5]  # an exact tie across the split: the lower index first
    queries = rng.standard_normal((3, dim)).astype(np.float32)
    queries[0] = x[5]
    owners = np.arange(n) // 4
    n_tools = int(owners[-1]) + 1
    for level in LEVELS:
        kernels.set_simd_level(level)
        scanner = kernels.SlbExactScanner(x, 5)
        for q in queries:
            idx, sc = scanner.topk(q)
            want_idx, want_sc = reference.slb_topk_exact(x, q, 5)
            assert np.array_equal(idx, want_idx) and np.array_equal(sc, want_sc), level
        assert scanner.topk(queries[0])[0][:2].tolist() == [5, 43_000]
        db, scales = scanner.db, scanner.scales
        qq, qs = kernels.quantize_i8(queries[1].reshape(1, -1))
        want_idx, want_sc = reference.slb_topk(db, scales, qq[0], float(qs[0]), 100)
        got_idx, got_sc = kernels.slb_topk(db, scales, qq[0], float(qs[0]), 100)
        assert np.array_equal(got_idx, want_idx) and np.array_equal(got_sc, want_sc), level
        scorer = kernels.SlbToolScorer(db, scales, owners, n_tools, floor_k=3, base=-1.0)
        want = [reference.slb_tool_scores(db, scales, owners, n_tools, q, 3, -1.0) for q in queries[1:]]
        for scan in range(3):  # the third scan reads the panels
            assert np.array_equal(scorer.scores(queries[1]), want[0]), (level, scan)
            two = scorer.request(queries[1:])
            assert np.array_equal(two, (want[0].astype(np.float64) + want[1]) / 2), (level, scan)


def test_prepared_slb_errors():
    db = np.ones((4, 8), dtype=np.int8)
    f32 = np.ones((4, 8), dtype=np.float32)
    lib = _native.lib()
    h = _native.out("ptr")
    with pytest.raises(NativeError, match="both or neither"):
        _native.check(lib.nexus_slb_create(db.ctypes.data, None, f32.ctypes.data, None, 4, 8, _native.ref(h)))
    with pytest.raises(NativeError, match="dim must be"):
        _native.check(lib.nexus_slb_create(db.ctypes.data, None, None, None, 4, 0, _native.ref(h)))
    prepared = kernels.PreparedSlb(db, None)
    out = np.empty(4, dtype=np.int64)
    scores = np.empty(4, dtype=np.float32)
    n_out = _native.out("i32")
    with pytest.raises(NativeError, match="without its float32 rows"):
        _native.check(lib.nexus_slb_scan_topk_exact(prepared.handle, f32[0].ctypes.data, 2, out.ctypes.data,
                                                    scores.ctypes.data, _native.ref(n_out), None))
    with pytest.raises(NativeError, match="k must be"):
        _native.check(lib.nexus_slb_scan_topk(prepared.handle, db[0].ctypes.data, 1.0, 0, out.ctypes.data,
                                              scores.ctypes.data, _native.ref(n_out)))
    scanner = kernels.SlbScanner(db, None, 2)
    ns = kernels.slb_scan_topk_timed(scanner, db[0], 1.0, 1, 5)
    assert ns.shape == (5,) and (ns >= 0).all()
    prepared.close()
    with pytest.raises(NexusError, match="closed"):
        prepared.handle


@pytest.mark.parametrize("dim", LENGTHS)
def test_slb_topk_exact_is_the_float32_ranking_every_level(dim, restore_level):
    """The exact scan equals ranking the float32 rows themselves, where the INT8 scan alone does not."""
    rng = np.random.default_rng(300 + dim)
    x = rng.standard_normal((400, dim)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    x[150] = x[20]  # exact ties: the lower index first
    x[399] = x[20]
    x[30] = x[40] + np.float32(1e-4) * rng.standard_normal(dim).astype(np.float32)  # near-ties INT8 cannot see
    queries = rng.standard_normal((60, dim)).astype(np.float32)
    queries[0] = x[20]
    queries[1] = x[40]
    int8_disagree = 0
    for level in LEVELS:
        kernels.set_simd_level(level)
        scanner = kernels.SlbExactScanner(x, 5)
        for i, q in enumerate(queries):
            idx, sc = scanner.topk(q)
            want_idx, want_sc = reference.slb_topk_exact(x, q, 5)
            assert np.array_equal(idx, want_idx) and np.array_equal(sc, want_sc), (level, i)
            assert 5 <= scanner.last_rescored <= x.shape[0]
            qq, qs = kernels.quantize_i8(q.reshape(1, -1))
            int8_disagree += int(kernels.slb_topk(scanner.db, scanner.scales, qq[0], float(qs[0]), 1)[0][0]
                                 != want_idx[0])
    if dim > 1:  # (in one dimension every unit row is +-1: all ties)
        assert scanner.topk(queries[0])[0][:3].tolist() == [20, 150, 399]
    if dim >= 64:  # the shortlist is a shortlist: most rows are never rescored
        assert scanner.last_rescored < x.shape[0] // 4
    assert int8_disagree > 0 or dim < 64  # the near-ties do flip the INT8 scan's own winner
    for k in (1, 64, 65, 400, 500):  # both selection paths, and k beyond n
        scanner = kernels.SlbExactScanner(x, k)
        idx, sc = scanner.topk(queries[2])
        want_idx, want_sc = reference.slb_topk_exact(x, queries[2], k)
        assert np.array_equal(idx, want_idx) and np.array_equal(sc, want_sc), k


def test_slb_topk_exact_errors():
    x = np.ones((4, 8), dtype=np.float32)
    with pytest.raises(UsageError, match="k must be"):
        kernels.SlbExactScanner(x, 0)
    with pytest.raises(UsageError, match="float32"):
        kernels.SlbExactScanner(x.astype(np.float64), 2)
    x[1, 3] = np.inf
    with pytest.raises(NativeError, match="not finite"):
        kernels.SlbExactScanner(x, 2)
    scanner = kernels.SlbExactScanner(np.ones((4, 8), dtype=np.float32), 2)
    with pytest.raises(UsageError, match="8 values"):
        scanner.topk(np.ones(5, dtype=np.float32))
    # a float64 query is converted (the copy's fast path takes float32 only); the same answer
    q = np.linspace(-1, 1, 8)
    want = [a.copy() for a in scanner.topk(q.astype(np.float32))]
    got = scanner.topk(q)
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    with pytest.raises(UsageError, match="8 values"):
        scanner.topk(np.ones(5))  # a float64 query of the wrong length: refused on the conversion path too


def test_slb_topk_timed_and_errors():
    rng = np.random.default_rng(5)
    db = rng.integers(-127, 128, (50, 16), dtype=np.int8)
    q = db[0].copy()
    ns = kernels.slb_topk_timed(db, None, q, 1.0, 3, 2, 7)
    assert ns.shape == (7,) and (ns >= 0).all()
    with pytest.raises(UsageError, match="dims"):
        kernels.slb_dots(db, q[:5])
    with pytest.raises(UsageError, match="int8"):
        kernels.slb_dots(db.astype(np.int16), q)
    with pytest.raises(UsageError, match="C-contiguous"):
        kernels.slb_dots(db[:, ::2], q[::2])
    with pytest.raises(NativeError, match="n_reps must be >= 1"):
        kernels.slb_topk_timed(db, None, q, 1.0, 3, 0, 0)


def test_slb_floor_timed_reads_the_scan_bytes_and_issues_its_instructions():
    """The ceilings `nexus bench slb` sets beside the scan: positive times where the CPU has AVX-512 VNNI (more rows,
    more time), zeros where it has not."""
    rng = np.random.default_rng(6)
    small = kernels.SlbScanner(rng.integers(-127, 128, (64, 384), dtype=np.int8), None, 5)
    large = kernels.SlbScanner(rng.integers(-127, 128, (4096, 384), dtype=np.int8), None, 5)
    (r1, d1), (r2, d2) = kernels.slb_floor_timed(small, 3, 51), kernels.slb_floor_timed(large, 3, 51)
    assert r1.shape == d1.shape == (51,)
    if kernels.simd_level() == "avx512_vnni":
        assert (r1 > 0).all() and (d1 > 0).all()
        assert np.median(r2) > 2 * np.median(r1) and np.median(d2) > 2 * np.median(d1)  # 64 times the bytes
    else:
        assert not r1.any() and not d1.any()
    with pytest.raises(UsageError, match="n_reps"):
        kernels.slb_floor_timed(small, 0, 0)


# ---------------------------------------------------------------- trie

def test_trie_matches_python_trie():
    rng = np.random.default_rng(11)
    with kernels.Trie() as t:
        ref = reference.PyTrie()
        seqs = []
        for i in range(800):
            s = rng.integers(0, 12, rng.integers(1, 7)).tolist()
            seqs.append(s)
            t.insert(s, i)
            ref.insert(s, i)
        assert t.stats() == (ref.n_sequences, ref.n_nodes)
        assert len(t) == ref.n_sequences
        for s in seqs[:300]:
            for j in range(len(s) + 1):
                assert t.next(s[:j]) == ref.next(s[:j])
        assert t.next([99, 98]) == ([], None)
        assert t.next([]) == ref.next([])
        wide = kernels.Trie()  # more next tokens than the initial buffer
        for tok in range(200):
            wide.insert([1, tok], tok)
        assert wide.next([1])[0] == list(range(200))
        wide.close()
        with pytest.raises(NativeError, match="value must be >= 0"):
            t.insert([1], -1)
        with pytest.raises(NativeError, match="at least one token"):
            t.insert([], 1)


# ---------------------------------------------------------------- arena

def test_arena_threads():
    arena = kernels.Arena(128, 512)
    live: dict[int, tuple[int, int]] = {}
    lock = threading.Lock()
    errors: list[str] = []

    def worker(tid: int):
        rng = np.random.default_rng(tid)
        mine = []
        for _ in range(600):
            if len(mine) < 6 and (rng.random() < 0.6 or not mine):
                n = int(rng.integers(1, 1500))
                try:
                    addr = arena.alloc(n)
                except NativeError as e:
                    if e.status != _native.ERR_NOMEM:
                        errors.append(str(e))
                    continue
                if addr % 128:
                    errors.append("misaligned")
                with lock:
                    for a, (b, _) in live.items():
                        if addr < b and a < addr + n:
                            errors.append("overlap")
                    live[addr] = (addr + n, tid)
                arena.view(addr, n)[:] = tid
                mine.append((addr, n))
            else:
                addr, n = mine.pop(int(rng.integers(len(mine))))
                if not (arena.view(addr, n) == tid).all():
                    errors.append("corrupted")
                with lock:
                    del live[addr]
                arena.free(addr)
        for addr, _ in mine:
            with lock:
                del live[addr]
            arena.free(addr)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert errors == []
    st = arena.stats()
    assert st["used_slabs"] == 0 and st["n_allocs"] == 0 and st["total_slabs"] == 512
    addr = arena.alloc(128 * 512)  # all buddies merged back
    with pytest.raises(NativeError, match="double free|not a live allocation"):
        arena.free(addr + 128)
    arena.free(addr)
    with pytest.raises(NativeError, match="not a live allocation"):
        arena.free(addr)
    with pytest.raises(NativeError, match="not allocated by this arena"):
        arena.free(8)
    arena.close()
    arena.close()


def test_missing_library_says_how_to_build_it(tmp_path):
    code = ("from nexus_cli import kernels\n"
            "from nexus_cli.errors import NexusError\n"
            "try:\n    kernels.simd_level()\nexcept NexusError as e:\n    print(e.message, '|', e.hint)\n")
    env = dict(os.environ, NEXUS_LIB=str(tmp_path / "nope.so"))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, env=env, check=True)
    assert "libnexus not found at" in out.stdout and "make native" in out.stdout


# ---------------------------------------------------------------- per-tool scores (the router's dense step)

def _previous_dense(db, scales, owners, n_tools, query, k):
    """What the router computed before the per-tool scorer (lab.bench_latency.previous_dense, the benchmark's
    baseline): a top-k scan, then each tool's maximum in NumPy."""
    from types import SimpleNamespace

    from nexus_cli.lab import bench_latency

    slb = SimpleNamespace(vectors=db, scales=scales, owners=owners, n_tools=n_tools, n_vectors=db.shape[0])
    return bench_latency.previous_dense(slb, query, k)[0]


def test_slb_tool_scores_match_reference_and_the_topk_view_every_level(restore_level):
    rng = np.random.default_rng(77)
    for trial in range(60):
        n_tools = int(rng.integers(1, 30))
        counts = rng.integers(0, 6, n_tools)
        counts[int(rng.integers(0, n_tools))] += 1  # at least one row
        owners = np.repeat(np.arange(n_tools), counts)
        n, dim = int(counts.sum()), int(rng.choice(LENGTHS))
        x = rng.standard_normal((n, dim)).astype(np.float32)
        if n > 2:
            x[n - 1] = x[0]  # exact ties across tools
        db, scales = kernels.quantize_i8(x)
        query = rng.standard_normal(dim).astype(np.float32)
        for floor_k in (0, 1, 3, n - 1, n, n + 5):
            want = reference.slb_tool_scores(db, scales, owners, n_tools, query, floor_k, -1.0)
            for level in LEVELS:
                kernels.set_simd_level(level)
                got = kernels.SlbToolScorer(db, scales, owners, n_tools, floor_k, -1.0).scores(query)
                assert np.array_equal(got, want), (trial, floor_k, level)
            if floor_k >= 1:  # bit for bit what the top-k scan and a NumPy maximum gave
                assert np.array_equal(want, _previous_dense(db, scales, owners, n_tools, query, floor_k)), trial
    # a tool without rows gets base (no floor) or the floor
    db, scales = kernels.quantize_i8(rng.standard_normal((4, 8)).astype(np.float32))
    owners = np.array([0, 0, 2, 2])
    got = kernels.SlbToolScorer(db, scales, owners, 3, 0, -5.0).scores(np.ones(8, np.float32)).copy()
    assert got[1] == -5.0 and got[0] > -5.0
    got = kernels.SlbToolScorer(db, scales, owners, 3, 2, -5.0).scores(np.ones(8, np.float32))
    q, qs = kernels.quantize_i8(np.ones((1, 8), np.float32))
    second_best = np.sort(reference.slb_scores(db, scales, q[0], float(qs[0])))[::-1][1]
    assert got[1] == second_best


def test_slb_request_scan_is_the_numpy_fusion_of_its_texts_every_level(restore_level):
    """SlbToolScorer.request (nexus_slb_scan_request): per text the per-tool dense score plus the weighted BM25 of its
    tokens scaled by its maximum, the mean over the texts, bit for bit as scoring.fuse, BM25.scores and the mean in
    NumPy; one to three texts (two share a pass over the rows), no lexical part, a text none of whose tokens any tool
    holds, scans before and after the panels are made."""
    from nexus_cli.routing.lexical import BM25
    from nexus_cli.routing.scoring import fuse

    rng = np.random.default_rng(78)
    words = [f"w{i}" for i in range(30)]
    for trial in range(12):
        n_tools = int(rng.integers(1, 40))
        counts = rng.integers(1, 5, n_tools)
        owners = np.repeat(np.arange(n_tools), counts)
        dim = int(rng.choice([7, 64, 384]))
        db, scales = kernels.quantize_i8(rng.standard_normal((int(counts.sum()), dim)).astype(np.float32))
        bm25 = BM25([list(rng.choice(words, size=int(rng.integers(1, 12)))) for _ in range(n_tools)])
        for level in LEVELS:
            kernels.set_simd_level(level)
            scorer = kernels.SlbToolScorer(db, scales, owners, n_tools, floor_k=3, base=-1.0)
            for n_texts in (1, 2, 3, 2, 2):
                vecs = [rng.standard_normal(dim).astype(np.float32) for _ in range(n_texts)]
                toks = [list(rng.choice(words + ["unseen"], size=int(rng.integers(0, 6)))) for _ in range(n_texts)]
                toks[0] = ["unseen"]  # no tool holds it: nothing added
                for lw in (0.0, 0.35):
                    want = None
                    for v, tk in zip(vecs, toks):
                        f = fuse(scorer.scores(v).copy(), bm25.scores(tk), lw)
                        want = f if want is None else want + f
                    want = want / n_texts
                    got = scorer.request(vecs, bm25.request_postings(toks), lw)
                    assert np.array_equal(got, want), (trial, level, n_texts, lw)
                    # the texts' vectors as one [texts, dim] array (how the router passes them): the same scores
                    assert np.array_equal(scorer.request(np.stack(vecs), bm25.request_postings(toks), lw), want)
                    if lw == 0.0:
                        assert np.array_equal(scorer.request(vecs), want)
    with pytest.raises(UsageError, match="at least one text"):
        scorer.request([])
    with pytest.raises(UsageError, match="postings of each text"):
        scorer.request([vecs[0]], None, 0.5)
    with pytest.raises(UsageError, match="postings of each text"):
        scorer.request([vecs[0]], bm25.request_postings([["w1"], ["w2"]]), 0.5)


def test_request_scan_refuses_postings_it_cannot_read():
    from nexus_cli.routing.lexical import BM25

    db, scales = kernels.quantize_i8(np.ones((4, 8), np.float32))
    scorer = kernels.SlbToolScorer(db, scales, np.array([0, 0, 1, 2]), 3)
    v = np.ones(8, np.float32)
    bm25 = BM25([["a", "b"], ["b"], ["c"]])
    records, ends = bm25.request_postings([["b", "a", "zz", "b"]])  # sorted, each once; 0 for one no tool holds
    assert ends == [3] and records == [bm25._postings("a")[3], bm25._postings("b")[3], 0]
    a_record = bm25._postings("a")[2]
    assert [int(w) for w in a_record] == [bm25._postings("a")[0].ctypes.data, bm25._postings("a")[1].ctypes.data, 1]
    records, ends = bm25.request_postings([["b", "a"], ["zz"], ["c", "c"]])
    assert len(records) == 4 and ends == [2, 3, 4] and records[2] == 0
    idx = np.array([0, 5], dtype=np.int64)
    term = np.array([1.0, 1.0])
    bad = kernels.postings_record(idx, term)
    with pytest.raises(NativeError, match="names tool 5 outside 0..2"):
        scorer.request([v], ([bad.ctypes.data], [1]), 0.5)
    negative = np.array([idx.ctypes.data, term.ctypes.data, 2**64 - 1], dtype=np.uint64)  # a count of -1
    with pytest.raises(NativeError, match="count must be >= 0"):
        scorer.request([v], ([negative.ctypes.data], [1]), 0.5)
    # a token no tool holds (record 0) adds nothing
    assert np.array_equal(scorer.request([v], ([0], [1]), 0.5).copy(), scorer.request([v], ([], [0]), 0.5))
    with pytest.raises(UsageError, match="must end at the last postings record"):
        scorer.request([v], ([bad.ctypes.data], [2]), 0.5)
    with pytest.raises(UsageError, match="contiguous int64 tools"):
        kernels.postings_record(idx.astype(np.int32), term)
    with pytest.raises(UsageError, match="contiguous int64 tools"):
        kernels.postings_record(idx, term[:1])


def test_slb_tool_scorer_errors():
    db, scales = kernels.quantize_i8(np.ones((3, 4), np.float32))
    with pytest.raises(UsageError, match="grouped by tool"):
        kernels.SlbToolScorer(db, scales, np.array([1, 0, 0]), 2)
    with pytest.raises(UsageError, match="grouped by tool"):
        kernels.SlbToolScorer(db, scales, np.array([0, 0, 2]), 2)
    with pytest.raises(UsageError, match="owners has shape"):
        kernels.SlbToolScorer(db, scales, np.array([0, 0]), 2)
    with pytest.raises(UsageError, match="floor_k"):
        kernels.SlbToolScorer(db, scales, np.array([0, 0, 1]), 2, floor_k=-1)
    scorer = kernels.SlbToolScorer(db, scales, np.array([0, 0, 1]), 2)
    with pytest.raises(UsageError, match="float array of 4"):
        scorer.scores(np.ones(5, np.float32))
    with pytest.raises(NativeError, match="not finite"):
        scorer.scores(np.array([1, np.nan, 0, 0], np.float32))


# ---------------------------------------------------------------- dense layer with float16 weights, layer norm

@pytest.mark.parametrize("act", [None, "gelu"])
def test_linear_f16_matches_float64_reference_every_level(act, restore_level):
    rng = np.random.default_rng(11 if act else 12)
    for m, k, n in [(1, 1, 1), (3, 7, 15), (6, 16, 16), (7, 17, 17), (13, 33, 63), (2, 384, 64), (5, 65, 65),
                    (12, 384, 130), (1, 129, 200)]:
        x = (rng.standard_normal((m, k)) * 2).astype(np.float32)
        w = rng.standard_normal((k, n)).astype(np.float16)
        b = rng.standard_normal(n).astype(np.float32)
        want = reference.linear_f16(x, w, b, act).astype(np.float64)
        # float32 sums of k products: within k * 2^-24 of the magnitudes summed (and GELU's erf formula, 1.5e-7)
        bound = (np.abs(x).astype(np.float64) @ np.abs(w.astype(np.float64)) + np.abs(b)) * (k + 2) * 2.0 ** -24
        bound += 3e-7 * (np.abs(want) + 1)
        for level in LEVELS:
            kernels.set_simd_level(level)
            got = kernels.linear_f16(x, w, b, act)
            assert got.dtype == np.float32 and got.shape == (m, n)
            assert np.all(np.abs(got - want) <= bound), (level, m, k, n)
            nob = kernels.linear_f16(x, w, None, act)
            assert np.all(np.abs(nob - reference.linear_f16(x, w, None, act)) <= bound + np.abs(b) * 1e-6 + 1e-6)
    # a batch shape is kept; the packed layout pads the last panel with zeros
    layer = kernels.LinearF16.from_weight(rng.standard_normal((8, 70)).astype(np.float32))
    assert layer.panels.shape == (2, 8, kernels.LINEAR_PANEL) and not layer.panels[1, :, 6:].any()
    assert layer(np.ones((2, 3, 8), np.float32)).shape == (2, 3, 70)


def test_gelu_is_berts_exact_gelu():
    x = np.linspace(-12, 12, 2001).astype(np.float32)
    eye = np.eye(1, dtype=np.float16)
    got = kernels.linear_f16(x.reshape(-1, 1), eye, None, "gelu")[:, 0].astype(np.float64)
    assert np.all(np.abs(got - reference.gelu(x)) <= 2e-7 * np.maximum(1, np.abs(x)))


def test_layer_norm_matches_reference():
    rng = np.random.default_rng(3)
    for m, n in [(1, 1), (4, 7), (9, 384)]:
        x = (rng.standard_normal((m, n)) * 3 + 1).astype(np.float32)
        r = rng.standard_normal((m, n)).astype(np.float32)
        g = rng.random(n).astype(np.float32) + 0.5
        b = rng.standard_normal(n).astype(np.float32)
        for res in (None, r):
            got = kernels.layer_norm(x, g, b, 1e-12, res)
            assert np.allclose(got, reference.layer_norm(x, g, b, 1e-12, res), atol=2e-6, rtol=1e-6)


def test_panels_from_pytorch_rows_equal_panels_of_the_transpose():
    """pack_f16_panels_rows (the encoder's load path: Linear weights as stored, side by side, transposed in libnexus)
    writes exactly what pack_f16_panels, its NumPy reference, writes for their concatenation's transpose: also when a
    layer is not a whole number of panels, when one starts inside a panel, and when k is not a multiple of the
    native transpose's 64-dim blocks."""
    rng = np.random.default_rng(7)
    for shapes in ([(384, 384)] * 3, [(1536, 384)], [(384, 1536)], [(128, 16), (64, 16), (5, 16)], [(100, 8), (64, 8)],
                   [(3, 4)], [(100, 70), (37, 70), (64, 70)], [(1, 130), (200, 130)]):
        ws = [rng.standard_normal(s).astype(np.float16) for s in shapes]
        got = kernels.pack_f16_panels_rows(ws)
        assert got.dtype == np.float16 and got.flags.c_contiguous
        np.testing.assert_array_equal(got, kernels.pack_f16_panels(np.concatenate(ws).T))
    with pytest.raises(UsageError):
        kernels.pack_f16_panels_rows([np.zeros((64, 4), np.float16), np.zeros((64, 5), np.float16)])
    # the native call refuses columns past the panels it is given
    out = np.zeros((1, 4, 64), np.float16)
    rows = np.zeros((8, 4), np.float16)
    fn = _native.lib().nexus_pack_f16_rows
    with pytest.raises(NexusError, match="do not fit"):
        _native.check(fn(rows.ctypes.data, 8, 4, 60, 64, out.ctypes.data))
    with pytest.raises(NexusError, match="k must be"):
        _native.check(fn(rows.ctypes.data, 8, 0, 0, 64, out.ctypes.data))


def test_linear_and_layer_norm_errors():
    w = np.zeros((4, 3), np.float16)
    with pytest.raises(UsageError, match="shape \\[..., 4\\]"):
        kernels.LinearF16.from_weight(w)(np.zeros((2, 5), np.float32))
    with pytest.raises(UsageError, match="float32"):
        kernels.LinearF16.from_weight(w)(np.zeros((2, 4), np.float64))
    with pytest.raises(UsageError, match="unknown activation"):
        kernels.LinearF16.from_weight(w, act="relu")
    with pytest.raises(UsageError, match="bias has 2 entries"):
        kernels.LinearF16.from_weight(w, np.zeros(2, np.float32))
    with pytest.raises(UsageError, match="gamma and beta"):
        kernels.layer_norm(np.zeros((2, 4), np.float32), np.ones(3, np.float32), np.zeros(4, np.float32), 1e-5)
