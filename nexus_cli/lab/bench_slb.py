"""nexus bench slb: latency of the INT8 semantic lookaside buffer scan against NumPy baselines.

Per database size N (dim 384, random unit vectors, fixed seed), it measures the median latency of:
  - cpp:        the native top-k scan of a prepared SLB alone (rows laid out as panels once where the CPU has
                AVX-512 VNNI; a scan of more than 16 MiB split over two cores), timed inside libnexus
                (nexus_slb_scan_topk_timed: no FFI in the timing);
  - cpp_row_major: the unprepared scan over the row-major rows, the same way (nexus_slb_topk_timed): the kernel the
                prepared one replaced, side by side;
  - python:     the prepared scan called from Python through the lean path (kernels.SlbScanner.topk),
                i.e. what a caller pays including ctypes;
  - numpy_f32:  float32 matvec + argpartition/argsort of the top k (the obvious exact baseline);
  - numpy_i8:   the natural NumPy INT8 approach. NumPy has no int8 x int8 -> int32 product (an int8 matmul
                accumulates in int8 and overflows), so the database is widened to int32 once, outside the timing,
                and each query is widened and multiplied with np.dot (integer matmul: no BLAS), then ranked the same way.
  - exact:      the exact top-k from Python (kernels.SlbExactScanner.topk: the INT8 scan shortlists, float32 dot
                products decide; nexus_slb_topk_exact), with how many rows it rescored.
While timing it checks its own results: the native top-k must equal reference.slb_topk exactly for every checked
query, the exact top-k reference.slb_topk_exact, and it reports the top-1 agreement of the INT8 scan and of the
exact scan with the float32 ranking (NumPy's argmax of db @ q) over many random queries.
"""

from __future__ import annotations

import time

import numpy as np

from .. import kernels, reference
from ..errors import NexusError
from .results import Run, environment, suite_dir, utc_stamp, write_json_doc
from .stats import median_ci

DEFAULT_SIZES = (250, 1000, 10_000, 100_000)
DEFAULT_DIM = 384
DEFAULT_REPS = 1000
K = 5
SEED = 0
N_QUERIES = 200  # queries for the top-1 agreement
N_VERIFY = 20  # queries whose native top-k is checked against the NumPy reference


def unit_rows(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim), dtype=np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    return x


def reps_for(n: int, dim: int, reps: int) -> int:
    """Fewer repetitions for big databases (a 100k x 384 scan reads 38 MB), never fewer than 15."""
    budget = int(4e9 // (n * dim))  # about 4e9 bytes scanned per method and size
    return max(15, min(reps, budget))


def summarize(ns: np.ndarray) -> dict:
    us = np.asarray(ns, dtype=np.float64) / 1e3
    return {
        "n": int(us.size),
        "min": float(us.min()),
        "p10": float(np.percentile(us, 10)),
        "p50": float(np.median(us)),
        "p90": float(np.percentile(us, 90)),
        "p99": float(np.percentile(us, 99)),
        "max": float(us.max()),
        "mean": float(us.mean()),
        "median_ci_us": median_ci(us).as_dict(),
    }


def _time_calls(fn, n_warmup: int, n_reps: int) -> np.ndarray:
    for _ in range(n_warmup):
        fn()
    out = np.empty(n_reps, dtype=np.float64)
    clock = time.perf_counter_ns
    for i in range(n_reps):
        t0 = clock()
        fn()
        out[i] = clock() - t0
    return out


def topk_f32(db: np.ndarray, q: np.ndarray, k: int) -> np.ndarray:
    s = db @ q
    part = np.argpartition(-s, k - 1)[:k] if k < s.size else np.arange(s.size)
    return part[np.argsort(-s[part], kind="stable")]


def topk_i8(db32: np.ndarray, q8: np.ndarray, k: int) -> np.ndarray:
    s = np.dot(db32, q8.astype(np.int32))
    part = np.argpartition(-s, k - 1)[:k] if k < s.size else np.arange(s.size)
    return part[np.argsort(-s[part], kind="stable")]


def measure_size(n: int, dim: int, reps: int, seed: int, progress=None) -> tuple[dict, dict]:
    rng = np.random.default_rng([seed, n, dim])
    db_f = unit_rows(rng, n, dim)
    queries_f = unit_rows(rng, N_QUERIES, dim)
    db_q, db_s = kernels.quantize_i8(db_f)
    qq, qs = kernels.quantize_i8(queries_f)
    k = min(K, n)
    n_reps = reps_for(n, dim, reps)
    n_warm = max(3, n_reps // 10)

    # correctness first: the native scan must be the reference's, bit for bit
    for i in range(min(N_VERIFY, N_QUERIES)):
        idx, sc = kernels.slb_topk(db_q, db_s, qq[i], float(qs[i]), k)
        ridx, rsc = reference.slb_topk(db_q, db_s, qq[i], float(qs[i]), k)
        if not (np.array_equal(idx, ridx) and np.array_equal(sc, rsc)):
            raise NexusError(f"slb bench: native top-{k} differs from the NumPy reference at N={n}, query {i}")

    q0, s0 = qq[0].copy(), float(qs[0])
    scanner = kernels.SlbScanner(db_q, db_s, k)
    for i in range(min(N_VERIFY, N_QUERIES)):
        idx, sc = scanner.topk(qq[i], float(qs[i]))
        ridx, rsc = reference.slb_topk(db_q, db_s, qq[i], float(qs[i]), k)
        if not (np.array_equal(idx, ridx) and np.array_equal(sc, rsc)):
            raise NexusError(f"slb bench: the prepared top-{k} differs from the NumPy reference at N={n}, query {i}")
    # the prepared scan and the row-major one alternate in rounds, so drift in the machine falls on both
    cpp_parts, row_parts = [], []
    rounds = 5
    for _ in range(rounds):
        cpp_parts.append(kernels.slb_scan_topk_timed(scanner, q0, s0, n_warm, max(1, n_reps // rounds)))
        row_parts.append(kernels.slb_topk_timed(db_q, db_s, q0, s0, k, n_warm, max(1, n_reps // rounds)))
    cpp_ns, row_ns = np.concatenate(cpp_parts), np.concatenate(row_parts)
    # what the CPU allows: reading the scan's bytes, and its vpdpbusd instructions alone (0 without VNNI)
    floor_read_ns, floor_dots_ns = kernels.slb_floor_timed(scanner, n_warm, n_reps)
    if progress:
        progress.advance(f"N={n} cpp")

    py_ns = _time_calls(lambda: scanner.topk(q0, s0), n_warm, n_reps)
    if progress:
        progress.advance(f"N={n} python")

    qf0 = queries_f[0].copy()
    f32_ns = _time_calls(lambda: topk_f32(db_f, qf0, k), n_warm, n_reps)
    if progress:
        progress.advance(f"N={n} numpy f32")

    db32 = db_q.astype(np.int32)  # widened once, outside the timing (4x the memory of the INT8 database)
    i8_ns = _time_calls(lambda: topk_i8(db32, q0, k), n_warm, n_reps)
    if not np.array_equal(topk_i8(db32, q0, 1)[:1], reference.slb_topk(db_q, None, q0, 1.0, 1)[0]):
        raise NexusError(f"slb bench: the NumPy int8 baseline disagrees with the reference at N={n}")
    if progress:
        progress.advance(f"N={n} numpy i8")

    exact = kernels.SlbExactScanner(db_f, k)
    for i in range(min(N_VERIFY, N_QUERIES)):
        idx, sc = exact.topk(queries_f[i])
        ridx, rsc = reference.slb_topk_exact(db_f, queries_f[i], k)
        if not (np.array_equal(idx, ridx) and np.array_equal(sc, rsc)):
            raise NexusError(f"slb bench: exact top-{k} differs from the float64 reference at N={n}, query {i}")
    exact_ns = _time_calls(lambda: exact.topk(qf0), n_warm, n_reps)
    if progress:
        progress.advance(f"N={n} exact")

    agree = agree_exact = 0
    rescored = []
    for i in range(N_QUERIES):
        top_i8 = scanner.topk(qq[i], float(qs[i]))[0][0]
        top_f32 = int(np.argmax(db_f @ queries_f[i]))
        agree += int(top_i8 == top_f32)
        agree_exact += int(exact.topk(queries_f[i])[0][0] == top_f32)
        rescored.append(exact.last_rescored)

    cpp, py, f32, i8 = summarize(cpp_ns), summarize(py_ns), summarize(f32_ns), summarize(i8_ns)
    row_major = summarize(row_ns)
    ex = summarize(exact_ns)
    row = {
        "n": n,
        "dim": dim,
        "k": k,
        "reps": n_reps,
        "cpp_us_p50": cpp["p50"],
        "cpp_row_major_us_p50": row_major["p50"],
        "speedup_cpp_vs_row_major": row_major["p50"] / cpp["p50"] if cpp["p50"] > 0 else None,
        "python_us_p50": py["p50"],
        "floor_read_us_p50": float(np.median(floor_read_ns)) / 1e3,
        "floor_dots_us_p50": float(np.median(floor_dots_ns)) / 1e3,
        "numpy_f32_us_p50": f32["p50"],
        "numpy_i8_us_p50": i8["p50"],
        "top1_agreement": agree / N_QUERIES,
        "exact_us_p50": ex["p50"],
        "exact_top1_agreement": agree_exact / N_QUERIES,
        "exact_rescored_median": float(np.median(rescored)),
        "exact_rescored_max": int(max(rescored)),
        "n_queries_agreement": N_QUERIES,
        "verified_queries": min(N_VERIFY, N_QUERIES),
        "speedup_cpp_vs_numpy_f32": f32["p50"] / cpp["p50"] if cpp["p50"] > 0 else None,
        # the exact scan answers as NumPy's float32 ranking does: the like-for-like ratio
        "speedup_exact_vs_numpy_f32": f32["p50"] / ex["p50"] if ex["p50"] > 0 else None,
        "summary_us": {"cpp": cpp, "cpp_row_major": row_major, "python": py, "numpy_f32": f32, "numpy_i8": i8, "exact": ex},
    }
    samples = {"cpp_ns": cpp_ns.tolist(), "cpp_row_major_ns": row_ns.tolist(), "python_ns": py_ns.tolist(), "numpy_f32_ns": f32_ns.tolist(),
               "numpy_i8_ns": i8_ns.tolist(), "exact_ns": exact_ns.tolist()}
    return row, samples


def run(sizes=DEFAULT_SIZES, dim: int = DEFAULT_DIM, reps: int = DEFAULT_REPS, seed: int = SEED,
        out_dir="results", progress=None, keep_samples: bool = True) -> dict:
    """Measure every size; write results/slb/slb-<stamp>.json and latest.json; return the document."""
    sizes = [int(s) for s in sizes]
    level = kernels.simd_level()
    run_ = Run("slb", params={"sizes": sizes, "dim": dim, "reps": reps, "k": K, "n_queries": N_QUERIES,
                              "n_verify": N_VERIFY, "data": "random unit vectors (standard normal, L2-normalized)"},
               seed=seed)
    if progress:
        progress.set_total(5 * len(sizes))
    rows, samples = [], {}
    for n in sizes:
        row, smp = measure_size(n, dim, reps, seed, progress)
        rows.append(row)
        if keep_samples:
            samples[str(n)] = smp
    summary = {"simd_level": level, "sizes": rows}
    doc = run_.document(summary, samples)
    doc["simd_level"] = level
    doc["sizes"] = rows
    folder = suite_dir(out_dir, "slb")
    path = folder / f"slb-{utc_stamp(run_.started)}.json"
    write_json_doc(path, doc)
    write_json_doc(folder / "latest.json", doc)
    doc["files"] = {"json": str(path), "latest": str(folder / "latest.json")}
    return doc


__all__ = ["run", "measure_size", "environment"]
