"""nexus bench latency: where users wait, each step against its baseline, side by side in one run.

Four measurements over the requests of benchmarks/queries/routing.jsonl (text only: nothing is scored against a
gold tool) and two indexes of the shared registries built with the shipped router embedder: `small` (a reproducible
draw of --small tools, no example requests: a user's own registry) and `all` (the whole pool with the example
requests of tool_registries/examples/: the most vectors a router scans). Indexes are cached like the routing
benchmark's (.nexus/bench-routing/).
1. The SLB kernel (top-5 of 250 x 384 and 100,000 x 384 random unit rows, as `nexus bench slb`): the prepared scan
   timed inside libnexus against the row-major scan it replaced and NumPy float32, the INT8 top-1's agreement with
   float32, and the exact scan (float32 answer) from Python.
2. The router's scan step of one request, its texts' vectors and lexical tokens given: dense scores per tool, BM25,
   fusion, the top candidates and the gate's margin (scoring.request_scores + scoring.rank). The product's step
   (kernels.SlbToolScorer.request: quantization, scan, per-tool reduction, fusion and the mean over the texts in one
   native call; the ranking from a partition) against the one it replaced (a native dense call per text, fusion in
   NumPy, a full sort, the margin from a copy of every score), alternating per request; every request's scores and
   margin must be identical both ways and with the top-256 dense step before that (`previous_dense`; checked,
   reported). The lexical tokenization the step is given is timed apart.
3. The warm request encoder: the request's texts (scoring.request_texts) embedded by the product's encoder (the float16
   model's layers in libnexus) against the same forward pass in NumPy float32 and against sentence-transformers,
   each after warm-up, alternating the first two per request; the third runs after them (torch's threads and NumPy's
   slow each other in one process). Reported with the largest cosine distance to the NumPy float32 embedding and
   the requests whose top tool (scan over the `all` index) differs from it.
4. A warm request end to end (encode + scan + gate, retriever only: Router.retrieve and the margin), and one-shot
   `nexus route --json --no-args` processes over each index: this tree against --baseline-ref (a commit,
   checked out in .nexus/bench-latency/ with its own libnexus build, and with the packages its pyproject.toml pins
   where this environment differs, installed for it alone, and the index in the format its code writes),
   alternating, after one untimed run of each
   (Python's bytecode cache written, as for a user; PYTHONDONTWRITEBYTECODE is cleared for these processes).
   Over `all` the product's reranker is none (an example-tuned embedder over examples), so no request loads an LLM;
   over `small` the requests the gate escalates load the likelihood reranker's LLM: reported apart.
5. `make demo`'s request one-shot with arguments (`nexus route DEMO_REQUEST --json` over tool_registries indexed by
   this tree): the process's wall time and the command's own step timings, this tree against
   --demo-baseline-ref, the first side alternating by round (--demo-rounds; 0 skips it), and whether both gave the
   same answers. The one-shot processes run with the user's OpenMP wait policy, not the benchmark's own.
Medians with bootstrap 95 % intervals; ratios as stats.speedup_ci (baseline / product).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from .. import kernels, textgen
from ..adapters.embedder import Embedder, NumpyBertEncoder, index_embedder
from ..config import DEFAULT_EMBEDDER, REPO_ROOT
from ..errors import NexusError, UsageError
from ..models import resolve_model
from ..registry import load_example_requests
from ..routing.index import load_index
from ..routing.router import Router, RouterConfig
from ..routing.scoring import SCAN_K, dense_tool_scores, gate_margin, rank, request_scores, request_texts
from . import bench_slb, common, stats
from .bench_routing import _index_for, pool_tools
from .common import NULL_PROGRESS, registry_dir_default
from .results import Run

SUITE = "latency"
DEFAULT_QUERIES = REPO_ROOT / "benchmarks" / "queries" / "routing.jsonl"
EXAMPLES = REPO_ROOT / "tool_registries" / "examples" / "shared_registries.jsonl"
WORKTREES = REPO_ROOT / ".nexus" / "bench-latency"
# the demo's baseline: the last commit before the one-shot route's arguments model loaded beside a reranker on one
# thread fewer and its process ended without teardown (the 18c2df6 of the other one-shot rows wrote arguments with
# the 0.5B model, the default then: another answer's cost, not a baseline for the same work)
DEFAULTS = dict(small=250, reps=20, oneshot_requests=8, oneshot_rounds=3, baseline_ref="18c2df6", demo_rounds=5,
                demo_baseline_ref="39f5b35", index_rounds=3, index_baseline_ref="4d41b6e")
QUICK = dict(small=50, reps=3, oneshot_requests=2, oneshot_rounds=1, baseline_ref=None, demo_rounds=0,
             demo_baseline_ref=None, index_rounds=0, index_baseline_ref=None)
# A registry of about 300 tools for `nexus index` (the routing issue's size): five servers of ../shared/registries,
# 298 tools, no example requests
INDEX_REGISTRY_FILES = ("github.json", "playwright.json", "kubernetes.json", "github_legacy.json", "github-archived.json")
DEMO_REGISTRY = REPO_ROOT / "tool_registries"  # `make demo` indexes this folder and routes DEMO_REQUEST over it
DEMO_REQUEST = "open a pull request in acme/api from feature/login into main titled Add login page"
TOP = 10  # candidates ranked after the scores, as the router ranks them


def previous_dense(slb, qvec: np.ndarray, k: int = SCAN_K) -> tuple[np.ndarray, float]:
    """The dense step the native per-tool scorer replaced: quantize in one call, a top-k scan in another, then each
    tool's maximum in NumPy (a tool with no vector among the k best gets the k-th score)."""
    q, qs = kernels.quantize_i8(np.ascontiguousarray(qvec.reshape(1, -1), dtype=np.float32))
    k = min(k, slb.n_vectors)
    t0 = time.perf_counter()
    idx, sc = kernels.slb_topk(slb.vectors, slb.scales, q[0], float(qs[0]), k)
    dt = time.perf_counter() - t0
    floor = float(sc[-1]) if len(sc) and k < slb.n_vectors else -1.0
    out = np.full(slb.n_tools, floor, dtype=np.float32)
    np.maximum.at(out, slb.owners[np.asarray(idx, dtype=np.int64)], np.asarray(sc, dtype=np.float32))
    return out, dt


def _load_requests(path: Path) -> list[str]:
    out = []
    for n, line in enumerate(Path(path).read_text("utf-8").splitlines(), 1):
        if line.strip():
            try:
                out.append(json.loads(line)["query"])
            except (ValueError, KeyError, TypeError):
                raise UsageError(f"{path}:{n}: each line needs a \"query\"") from None
    if not out:
        raise UsageError(f"{path} holds no requests")
    return out


def _ms(samples_s) -> dict:
    a = np.asarray(samples_s, dtype=np.float64) * 1e3
    return {"n": int(a.size), "median_ms": float(np.median(a)), "median_ci_ms": stats.median_ci(a).as_dict(),
            "p90_ms": float(np.percentile(a, 90))}


def _us(samples_s) -> dict:
    a = np.asarray(samples_s, dtype=np.float64) * 1e6
    return {"n": int(a.size), "median_us": float(np.median(a)), "median_ci_us": stats.median_ci(a).as_dict(),
            "p90_us": float(np.percentile(a, 90))}


def _ratio(baseline_s, product_s) -> dict:
    return stats.speedup_ci(baseline_s, product_s).as_dict()


# ----------------------------------------------------------------------------------------------- 1. kernel

def measure_kernel(seed: int, quick: bool) -> dict:
    rows = {}
    for n in ((250, 10_000) if quick else (250, 100_000)):
        row, _ = bench_slb.measure_size(n, 384, 200 if quick else 2000, seed)
        rows[str(n)] = {k: row[k] for k in ("n", "dim", "k", "reps", "cpp_us_p50", "cpp_row_major_us_p50",
                                            "speedup_cpp_vs_row_major", "python_us_p50", "floor_read_us_p50",
                                            "floor_dots_us_p50", "numpy_f32_us_p50",
                                            "speedup_cpp_vs_numpy_f32", "top1_agreement", "exact_us_p50",
                                            "exact_top1_agreement")}
    return rows


# ----------------------------------------------------------------------------------------------- 2. scan step

def _scan_step(index, lex_weight: float, texts, vecs, tokens) -> tuple[np.ndarray, float]:
    """The product's step: one native call for the request's dense and fused scores, then the ranking and margin."""
    scores, _ = request_scores(index.slb, index.bm25, lex_weight, texts, vecs, tokens=tokens)
    order, margin = rank(index, scores, TOP)
    return scores, margin


def _python_fusion_step(index, lex_weight: float, texts, vecs, tokens, dense_fn=dense_tool_scores):
    """The step it replaced: a native dense call per text, fusion and the mean in NumPy, a full sort, the margin
    from a copy of every score."""
    scores, _ = request_scores(index.slb, index.bm25, lex_weight, texts, vecs, dense_fn=dense_fn, tokens=tokens)
    order = np.argsort(-scores, kind="stable")[:TOP]
    return scores, gate_margin(scores, int(order[0]), index.interchangeable(int(order[0])))


def measure_scan(index, prepared, reps: int) -> dict:
    """prepared: [(texts, vectors)] per request. Each request's lexical tokens are made once, beside its vectors
    (timed apart: `lexical_tokens`). Alternates product / previous per request, reps rounds; the scores and margins
    must be identical both ways and with the top-256 dense step before that (`previous_dense`; checked, reported)."""
    lw = index.lex_weight()
    same = True
    tokens = index.bm25.tokens if index.bm25 is not None else textgen.lex_tokens
    prepared = [(texts, vecs, [tokens(t) for t in texts]) for texts, vecs in prepared]
    for texts, vecs, toks in prepared:  # warm-up, and the identity check
        a, ma = _scan_step(index, lw, texts, vecs, toks)
        b, mb = _python_fusion_step(index, lw, texts, vecs, toks)
        c, mc = _python_fusion_step(index, lw, texts, vecs, toks, dense_fn=previous_dense)
        same = same and bool(np.array_equal(a, b) and np.array_equal(a, c) and ma == mb == mc)
    prod, prev, kern, lex = [], [], [], []
    clock = time.perf_counter
    for _ in range(reps):
        for texts, vecs, toks in prepared:
            t0 = clock()
            _scan_step(index, lw, texts, vecs, toks)
            t1 = clock()
            _python_fusion_step(index, lw, texts, vecs, toks)
            t2 = clock()
            for t in texts:
                tokens(t)
            t3 = clock()
            prod.append(t1 - t0)
            prev.append(t2 - t1)
            lex.append(t3 - t2)
            _, dt = dense_tool_scores(index.slb, vecs[0])
            kern.append(dt)
    return {"tools": index.slb.n_tools, "vectors": index.slb.n_vectors, "requests": len(prepared),
            "texts_per_request": float(np.mean([len(t) for t, _, _ in prepared])),
            "product": _us(prod), "previous": _us(prev), "speedup": _ratio(prev, prod),
            "dense_call_only": _us(kern), "lexical_tokens": _us(lex), "identical_scores": same}


# ----------------------------------------------------------------------------------------------- 3. encoder

def measure_encoder(requests, value_masking: bool, all_index, reps: int) -> dict:
    path = resolve_model(DEFAULT_EMBEDDER, kind="embedder")
    native = NumpyBertEncoder(path, native=True)
    f32 = NumpyBertEncoder(path, native=False)
    if not native.half:
        raise NexusError(f"{DEFAULT_EMBEDDER} is not a float16 model: its layers do not run in libnexus")
    texts = [request_texts(q, value_masking) for q in requests]
    for t in texts[:5]:
        native.encode_few(t)
        f32.encode_few(t)
    t_nat, t_f32 = [], []
    clock = time.perf_counter
    for _ in range(reps):
        for t in texts:
            t0 = clock()
            native.encode_few(t)
            t1 = clock()
            f32.encode_few(t)
            t2 = clock()
            t_nat.append(t1 - t0)
            t_f32.append(t2 - t1)
    v_nat = [native.encode_few(t) for t in texts]
    v_f32 = [f32.encode_few(t) for t in texts]
    torch_enc = Embedder(DEFAULT_EMBEDDER)
    for t in texts[:5]:
        torch_enc.encode_few(t)
    t_torch = []
    for _ in range(max(1, reps // 4)):
        for t in texts:
            t0 = clock()
            torch_enc.encode_few(t)
            t_torch.append(clock() - t0)
    v_torch = [torch_enc.encode_few(t) for t in texts]

    def cos_dist(a, b):
        return float(max(1.0 - float(np.dot(x, y)) for x, y in zip(a, b)))

    def top1(v):
        return int(np.argmax(dense_tool_scores(all_index.slb, v[0])[0]))

    tops = [(top1(a), top1(b), top1(c)) for a, b, c in zip(v_nat, v_f32, v_torch)]
    out = {
        "requests": len(texts), "texts": int(sum(len(t) for t in texts)),
        "product_native_f16": _ms(t_nat), "numpy_f32": _ms(t_f32), "sentence_transformers": _ms(t_torch),
        "speedup_vs_numpy_f32": _ratio(t_f32, t_nat), "speedup_vs_sentence_transformers": _ratio(t_torch, t_nat),
        "max_cosine_distance_vs_numpy_f32": max(cos_dist(a, b) for a, b in zip(v_nat, v_f32)),
        "max_cosine_distance_vs_sentence_transformers": max(cos_dist(a, c) for a, c in zip(v_nat, v_torch)),
        "top1_differs_vs_numpy_f32": sum(a != b for a, b, _ in tops),
        "top1_differs_vs_sentence_transformers": sum(a != c for a, _, c in tops),
        # what a warm process (batches, sessions, `nexus serve`, the warm route below) runs on this CPU; a one-shot
        # process runs the native layers everywhere
        "warm_layers": "native_f16" if kernels.native_dense_pays() else "numpy_f32",
    }
    return out


# ----------------------------------------------------------------------------------------------- 4. requests

def measure_warm_route(index_dir: Path, requests, reps: int) -> dict:
    router = Router(index_dir, RouterConfig(reranker="none", prefix_store=False))
    clock = time.perf_counter
    for q in requests[:5]:
        router.retrieve(q)
    total, embed = [], []
    for _ in range(reps):
        for q in requests:
            t0 = clock()
            scores, tm = router.retrieve(q)
            top = int(np.argmax(scores))
            gate_margin(scores, top, router.index.interchangeable(top))
            total.append(clock() - t0)
            embed.append(tm["embed"] / 1e3)
    return {"index_tools": router.index.slb.n_tools, "requests": len(requests), "total": _ms(total),
            "embed": _ms(embed)}


def unsatisfied(requirements: list[str]) -> list[str]:
    """The requirement strings the installed distributions do not satisfy (absent, or another version)."""
    from importlib.metadata import PackageNotFoundError, version

    from packaging.requirements import Requirement

    out = []
    for line in requirements:
        req = Requirement(line)
        try:
            ok = req.specifier.contains(version(req.name), prereleases=True)
        except PackageNotFoundError:
            ok = False
        if not ok:
            out.append(str(req))
    return out


def _baseline_packages(tree: Path, progress) -> tuple[Path | None, list[str]]:
    """The requirements of the baseline commit's pyproject.toml that the running environment does not satisfy,
    installed (without their dependencies) into the checkout's own folder, which the baseline's processes put first
    on their path: so the baseline runs with the packages its commit pinned (typer 0.29 before 5d5b2ac), not the
    product's. Returns (that folder or None, the requirements installed there)."""
    import tomllib

    missing = unsatisfied(tomllib.loads((tree / "pyproject.toml").read_text("utf-8"))["project"]["dependencies"])
    if not missing:
        return None, []
    site = tree / ".baseline-site"
    stamp = site / "requirements.json"
    if not stamp.is_file() or json.loads(stamp.read_text()) != missing:
        progress.advance(f"installing the baseline's {', '.join(missing)}")
        try:
            subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                            "--upgrade", "--target", str(site), *missing], check=True, capture_output=True, text=True)
        except subprocess.CalledProcessError as e:
            raise NexusError(f"cannot install the baseline's {', '.join(missing)}: "
                             f"{(e.stderr or '').strip().splitlines()[-1:]}") from None
        stamp.write_text(json.dumps(missing))
    return site, missing


def _index_format_of(tree: Path) -> int:
    """The index format a checkout's code writes (routing.index.INDEX_FORMAT_VERSION)."""
    env = {**os.environ, "PYTHONPATH": str(tree)}
    probe = "from nexus_cli.routing.index import INDEX_FORMAT_VERSION as v; print(v)"
    out = subprocess.run([sys.executable, "-c", probe],
                         cwd=str(tree), env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise NexusError(f"cannot read the index format of {tree}: {out.stderr.strip().splitlines()[-1:]}")
    return int(out.stdout.strip())


def _as_format(index_dir: Path, version: int) -> Path:
    """A format-4 index rewritten in an older format, for a baseline commit that reads only that, as that commit's
    `nexus index` writes the same tools: format 3 keeps each tool's BM25 token list in lexical.json where format 4
    keeps each token's postings (build revision 9 changed only that); format 2 also has tools.json with every key of
    tools.json and tool_details.json and no interchangeable groups in the manifest (revision 8 changed only that). The
    same slb.bin either way."""
    from ..files import atomic_write_json, sha256_file
    from ..routing.lexical import docs_of

    manifest = json.loads((index_dir / "manifest.json").read_text("utf-8"))
    if manifest["version"] == version:
        return index_dir
    out = WORKTREES / "indexes" / f"{index_dir.name}-format{version}"
    if (out / "manifest.json").is_file():
        return out
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(index_dir, tmp)
    if manifest["version"] >= 4 and (tmp / "lexical.json").is_file():
        lex = json.loads((tmp / "lexical.json").read_text("utf-8"))
        atomic_write_json(tmp / "lexical.json", {"tokenizer": lex["tokenizer"],
                                                 "docs": docs_of(lex["doc_lengths"], lex["postings"])}, compact=True)
    if version == 2:
        heads = json.loads((tmp / "tools.json").read_text("utf-8"))
        details = json.loads((tmp / "tool_details.json").read_text("utf-8"))
        atomic_write_json(tmp / "tools.json", [{**h, **d} for h, d in zip(heads, details)], compact=True)
        (tmp / "tool_details.json").unlink()
        manifest.pop("interchangeable", None)
    manifest["version"] = version
    manifest["files"] = {p.name: sha256_file(p) for p in sorted(tmp.iterdir())
                         if p.is_file() and p.name != "manifest.json"}
    atomic_write_json(tmp / "manifest.json", manifest, compact=True)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def _baseline_tree(ref: str, progress) -> tuple[Path, Path]:
    """A checkout of `ref` with its own libnexus build: (tree, library)."""
    try:
        sha = subprocess.run(["git", "rev-parse", "--verify", f"{ref}^{{commit}}"], cwd=REPO_ROOT, check=True,
                             capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        raise UsageError(f"--baseline-ref {ref} is not a commit of this repository") from None
    tree = WORKTREES / sha[:12]
    lib = tree / "build" / "libnexus.so"
    if not (tree / ".git").exists():
        WORKTREES.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "worktree", "add", "--detach", "-f", str(tree), sha], cwd=REPO_ROOT, check=True,
                       capture_output=True)
    if not lib.is_file():
        progress.advance(f"building libnexus of {sha[:12]}")
        for cmd in (["cmake", "-S", str(tree), "-B", str(tree / "build"), "-DCMAKE_BUILD_TYPE=Release"],
                    ["cmake", "--build", str(tree / "build"), "-j", "2", "--target", "nexus"]):
            subprocess.run(cmd, check=True, capture_output=True)
    return tree, lib


def _side_env(tree: Path, lib: Path, site: Path | None) -> dict:
    """The environment of a process of one side: its tree (and the packages installed for it alone) first on the
    path, its own libnexus."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=os.pathsep.join(str(p) for p in (site, tree) if p), NEXUS_LIB=str(lib))
    return env


def _oneshot(tree: Path, lib: Path, index_dir: Path, query: str, site: Path | None = None,
             with_args: bool = False) -> tuple[float, dict]:
    env = _side_env(tree, lib, site)
    # a user's `nexus route` runs with OpenMP's own wait policy unless they set one; the passive policy the
    # benchmarks' own process takes (lab/common.py) made the demo's argument decoding ~0.4 s slower
    if common.USER_OMP_WAIT_POLICY is None:
        env.pop("OMP_WAIT_POLICY", None)
    else:
        env["OMP_WAIT_POLICY"] = common.USER_OMP_WAIT_POLICY
    cmd = [sys.executable, "-m", "nexus_cli.cli", "route", query, "--json", "--index", str(index_dir)]
    if not with_args:
        cmd.append("--no-args")
    t0 = time.perf_counter()
    p = subprocess.run(cmd, cwd=str(tree), env=env, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if p.returncode != 0:
        raise NexusError(f"one-shot route from {tree} failed: {p.stderr.strip().splitlines()[-1:]}")
    return dt, json.loads(p.stdout)


def _trees(baseline_ref: str | None, progress):
    """(trees, sites, baseline packages) of the product and, with a baseline_ref, the baseline: each side's tree and
    libnexus, and the packages installed for it alone."""
    trees = {"product": (REPO_ROOT, Path(os.environ.get("NEXUS_LIB") or REPO_ROOT / "build" / "libnexus.so"))}
    sites: dict[str, Path | None] = {"product": None}
    baseline_packages: list[str] = []
    if baseline_ref:
        trees["baseline"] = _baseline_tree(baseline_ref, progress)
        sites["baseline"], baseline_packages = _baseline_packages(trees["baseline"][0], progress)
    return trees, sites, baseline_packages


def _sides(index_dir: Path, baseline_ref: str | None, progress):
    """_trees, with each side's index in the format its own code reads: (trees, sites, indexes, baseline
    packages)."""
    trees, sites, baseline_packages = _trees(baseline_ref, progress)
    indexes = {"product": index_dir}
    if baseline_ref:
        fmt = _index_format_of(trees["baseline"][0])
        if fmt not in (2, 3, 4):
            raise UsageError(f"--baseline-ref {baseline_ref} writes index format {fmt}; this benchmark gives a "
                             "baseline format 2, 3 or 4")
        indexes["baseline"] = _as_format(index_dir, fmt)
    return trees, sites, indexes, baseline_packages


def measure_oneshot(index_dir: Path, requests, rounds: int, baseline_ref: str | None, progress) -> dict:
    trees, sites, indexes, baseline_packages = _sides(index_dir, baseline_ref, progress)
    # Each round runs every request on one side, then on the other (the side that goes first alternates), so a
    # process follows one of its own kind, as consecutive `nexus route` calls do; then the same requests alternating
    # side by side per request, where each process follows the other side's (the baseline imports torch: the product
    # then starts with the caches that process left). Both orders are reported; the first is the headline.
    times = {k: [] for k in trees}
    interleaved = {k: [] for k in trees}
    esc = {k: [] for k in trees}
    decisions = {k: {} for k in trees}
    for q in requests:  # untimed: bytecode written, files in the page cache
        for k, (tree, lib) in trees.items():
            _oneshot(tree, lib, indexes[k], q, sites[k])
    order = list(trees)
    for r in range(rounds):
        sides = order if r % 2 == 0 else order[::-1]
        for k in sides:
            tree, lib = trees[k]
            for q in requests:
                dt, doc = _oneshot(tree, lib, indexes[k], q, sites[k])
                times[k].append(dt)
                esc[k].append(bool(doc["gate"]["escalated"]))
                decisions[k][q] = f"{doc['server']}/{doc['tool']}"
        for q in requests:
            for k in sides:
                tree, lib = trees[k]
                interleaved[k].append(_oneshot(tree, lib, indexes[k], q, sites[k])[0])
        progress.advance(f"one-shot round {r + 1}")
    out = {"requests": len(requests), "rounds": rounds, "escalated_share": float(np.mean(esc["product"])),
           "order": "each side's requests in a block, the first side alternating by round"}
    for k in trees:
        t = np.asarray(times[k])
        routed = t[~np.asarray(esc[k])]
        out[k] = {"all": _ms(t), "not_escalated": _ms(routed) if routed.size else None,
                  "interleaved": _ms(interleaved[k])}
    if baseline_ref:
        out["baseline_ref"] = baseline_ref
        out["baseline_packages"] = baseline_packages  # installed for the baseline alone (_baseline_packages)
        out["baseline_index_format"] = int(json.loads((indexes["baseline"] / "manifest.json").read_text())["version"])
        out["speedup"] = _ratio(times["baseline"], times["product"])
        out["speedup_interleaved"] = _ratio(interleaved["baseline"], interleaved["product"])
        out["same_decisions"] = sum(decisions["product"][q] == decisions["baseline"][q] for q in requests)
    return out


def measure_demo(rounds: int, baseline_ref: str | None, progress) -> dict:
    """`make demo`'s request, one-shot with arguments (`nexus route DEMO_REQUEST --json` over the index `make demo`
    builds, this tree's `nexus index tool_registries`): the process's wall time and the command's own timings,
    this tree against the baseline, the first side alternating by round, after one untimed run of each."""
    index_dir = WORKTREES / "demo-index"
    p = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "index", str(DEMO_REGISTRY), "--out", str(index_dir)],
                       cwd=str(REPO_ROOT), capture_output=True, text=True)
    if p.returncode != 0:
        raise NexusError(f"indexing {DEMO_REGISTRY.name} failed: {p.stderr.strip().splitlines()[-1:]}")
    trees, sites, indexes, baseline_packages = _sides(index_dir, baseline_ref, progress)
    for k, (tree, lib) in trees.items():  # untimed: bytecode written, both models' files in the page cache
        _oneshot(tree, lib, indexes[k], DEMO_REQUEST, sites[k], with_args=True)
    wall = {k: [] for k in trees}
    steps = {k: {s: [] for s in ("embed", "rerank", "args", "total")} for k in trees}
    answers = {k: set() for k in trees}
    for r in range(rounds):
        for k in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            tree, lib = trees[k]
            dt, doc = _oneshot(tree, lib, indexes[k], DEMO_REQUEST, sites[k], with_args=True)
            wall[k].append(dt)
            for step in steps[k]:
                steps[k][step].append(float(doc["timings_ms"][step]) / 1e3)
            answers[k].add(json.dumps([doc["server"], doc["tool"], doc.get("arguments")], sort_keys=True))
        progress.advance(f"demo round {r + 1}")
    out: dict = {"request": DEMO_REQUEST, "registry": str(DEMO_REGISTRY.relative_to(REPO_ROOT)), "rounds": rounds}
    for k in trees:
        out[k] = {"wall": _ms(wall[k]), **{step: _ms(v) for step, v in steps[k].items()},
                  "answers": sorted(answers[k])}
    if baseline_ref:
        out["baseline_ref"] = baseline_ref
        out["baseline_packages"] = baseline_packages
        out["speedup"] = _ratio(wall["baseline"], wall["product"])
        out["same_answers"] = answers["baseline"] == answers["product"]
    return out


def _index_once(tree: Path, lib: Path, site: Path | None, sources: list[Path], out: Path) -> tuple[float, dict]:
    """One `nexus index SOURCES --out OUT --no-shipped-examples --json` from a tree, a fresh process into an empty
    folder: (wall seconds, its report)."""
    shutil.rmtree(out, ignore_errors=True)
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "index", *map(str, sources), "--out", str(out),
                        "--no-shipped-examples", "--json"], cwd=str(tree), env=_side_env(tree, lib, site),
                       capture_output=True, text=True)
    dt = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)
    if p.returncode != 0:
        raise NexusError(f"nexus index from {tree} failed: {p.stderr.strip().splitlines()[-1:]}")
    return dt, json.loads(p.stdout)


def measure_index_build(sources: list[Path], rounds: int, baseline_ref: str | None, progress,
                        label: str = "index") -> dict:
    """`nexus index` of a registry without synthesis, as a user runs it: a fresh process each round into an empty
    folder, its wall time and the command's own step times, this tree against the baseline (the first side
    alternating by round), after one untimed run of each (files in the page cache, bytecode written). Every round
    loads the embedder and embeds every tool text again (nothing is cached between runs of `nexus index`).
    `--no-shipped-examples`: the figure is for a registry nobody wrote example requests for."""
    missing = [str(f) for f in sources if not f.exists()]
    if missing:
        raise UsageError(f"the index registry is missing {missing[0]}")
    trees, sites, baseline_packages = _trees(baseline_ref, progress)
    out = WORKTREES / "index-build"
    for k, (tree, lib) in trees.items():
        _index_once(tree, lib, sites[k], sources, out)
    wall = {k: [] for k in trees}
    steps: dict[str, dict[str, list]] = {k: {} for k in trees}
    reports = {}
    for r in range(rounds):
        for k in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
            tree, lib = trees[k]
            dt, doc = _index_once(tree, lib, sites[k], sources, out)
            wall[k].append(dt)
            reports[k] = doc
            for step, sec in doc["seconds"].items():
                steps[k].setdefault(step, []).append(float(sec))
        progress.advance(f"{label} round {r + 1}")
    doc = reports["product"]
    result: dict = {"registry": [str(f.relative_to(REPO_ROOT)) if f.is_relative_to(REPO_ROOT) else f.name
                                 for f in sources],
                    "tools": doc["n_tools"], "vectors": doc["n_vectors"], "rounds": rounds, "target_s": 120}
    for k in trees:
        result[k] = {"wall": _ms(wall[k]), "steps_ms": {s2: _ms(v) for s2, v in steps[k].items()},
                     "tau": reports[k]["gate"]["tau"]}
    result["wall"], result["steps_ms"] = result["product"]["wall"], result["product"]["steps_ms"]
    if baseline_ref:
        result["baseline_ref"] = baseline_ref
        result["baseline_packages"] = baseline_packages
        result["speedup"] = _ratio(wall["baseline"], wall["product"])
    return result


# ----------------------------------------------------------------------------------------------- run

def run(small: int = 250, reps: int = 20, oneshot_requests: int = 8, oneshot_rounds: int = 3,
        baseline_ref: str | None = None, queries: str | None = None, registry_dir=None, seed: int = 0,
        quick: bool = False, out_dir="results", progress=NULL_PROGRESS, demo_rounds: int = 0,
        demo_baseline_ref: str | None = None, index_rounds: int = 0, index_baseline_ref: str | None = None) -> dict:
    requests = _load_requests(Path(queries) if queries else DEFAULT_QUERIES)
    if quick:
        requests = requests[:12]
    run_ = Run(SUITE, params={"small": small, "reps": reps, "oneshot_requests": oneshot_requests,
                              "oneshot_rounds": oneshot_rounds, "baseline_ref": baseline_ref,
                              "demo_rounds": demo_rounds, "demo_baseline_ref": demo_baseline_ref,
                              "index_rounds": index_rounds, "index_baseline_ref": index_baseline_ref,
                              "queries": str(queries or DEFAULT_QUERIES.relative_to(REPO_ROOT)),
                              "requests": len(requests), "embedder": DEFAULT_EMBEDDER, "quick": quick,
                              "simd_level": kernels.simd_level()}, seed=seed)
    progress.set_total(6 + 2 * oneshot_rounds + demo_rounds + 2 * index_rounds)
    reg_dir = Path(registry_dir) if registry_dir else registry_dir_default()
    pool = pool_tools(reg_dir)
    if not 2 <= small <= len(pool):
        raise UsageError(f"--small must be between 2 and {len(pool)}")
    small_tools = sorted(random.Random(f"{seed}/latency/{small}").sample(range(len(pool)), small))
    emb = index_embedder(DEFAULT_EMBEDDER)  # as `nexus index` embeds
    progress.advance("indexes")
    small_dir = _index_for([pool[i] for i in small_tools], emb)
    examples = load_example_requests([EXAMPLES])
    all_dir = _index_for(pool, emb, examples=examples)
    del emb
    indexes = {"small": load_index(small_dir), "all": load_index(all_dir)}

    summary: dict = {"kernel": measure_kernel(seed, quick)}
    progress.advance("kernel")

    summary["encoder"] = measure_encoder(requests, indexes["all"].value_masking, indexes["all"], max(1, reps // 4))
    progress.advance("encoder")

    enc = NumpyBertEncoder(resolve_model(DEFAULT_EMBEDDER, kind="embedder"))
    summary["scan_step"] = {}
    for name, idx in indexes.items():
        prepared = []
        for q in requests:
            texts = request_texts(q, idx.value_masking)
            prepared.append((texts, enc.encode_few(texts)))  # [texts, dim], as the router passes them
        summary["scan_step"][name] = measure_scan(idx, prepared, reps)
    progress.advance("scan step")

    summary["warm_route"] = {name: measure_warm_route(d, requests, max(1, reps // 4))
                             for name, d in (("small", small_dir), ("all", all_dir))}
    progress.advance("warm route")

    # `all`: its example-tuned embedder routes on the retriever alone (reranker auto = none), so a one-shot process
    # is the route path itself; `small`: a registry without examples, where escalated requests load the reranker
    summary["oneshot"] = {name: measure_oneshot(d, requests[:oneshot_requests], oneshot_rounds, baseline_ref, progress)
                          for name, d in (("all", all_dir), ("small", small_dir))}
    summary["indexes"] = {k: str(Path(v).relative_to(REPO_ROOT)) for k, v in (("small", small_dir), ("all", all_dir))}
    if demo_rounds:
        summary["demo"] = measure_demo(demo_rounds, demo_baseline_ref, progress)
    if index_rounds:
        summary["index_build"] = measure_index_build([reg_dir / name for name in INDEX_REGISTRY_FILES], index_rounds,
                                                     index_baseline_ref, progress)
        summary["index_build_demo"] = measure_index_build([DEMO_REGISTRY], index_rounds, index_baseline_ref, progress,
                                                          label="demo index")

    return run_.write(summary, out_dir=out_dir)
