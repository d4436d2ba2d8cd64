"""Self-describing benchmark results: one JSON per run under results/<suite>/, plus latest.json and latest.png.

A results file answers, on its own, "what was measured, on what, with what, and how": the git commit (and whether the
tree was dirty), the versions of Nexus, llama-cpp-python, the vendored llama.cpp, NumPy, SciPy and torch, the CPU model,
core count and SIMD level, the model's identity and sha256, every parameter and the seed, the summary with its
intervals, and the raw samples the summary was computed from (so the intervals can be recomputed). It holds no
hostname, user name or absolute home path.

Writes are atomic: each file is written to a temporary name in the same folder, flushed, fsynced and renamed into
place, so a reader (or a crashed run) never sees half a file. `latest.json` is a copy of the newest timestamped file,
not a symlink (symlinks do not survive every checkout).

What the README and docs publish comes from `results/<suite>/latest.json`, so a run into the repository's own
results/ from a dirty tree keeps its timestamped file (marked `"publishable": false`) but leaves latest.json as it was;
a run whose load average exceeded the cores says so in its notes and on stderr (re-take it on an idle machine).

A suite measured on another model than the main one (DEFAULT_LLM) is a *variant* of it, named after the model: its
files sit beside the main ones as `latest-<variant>.json` / `.png` and `<suite>-<variant>-<stamp>.json`, so one run
never replaces another model's figures (Run(..., variant=model_variant(model))).

    from .results import Run
    run = Run("deep-splice", params={...}, seed=0, models={"llm": model_identity("qwen2.5-0.5b")})
    ...                                   # measure
    path = run.write(summary={...}, samples={...}, out_dir="results", figure=make_fig)   # make_fig(plt) -> Figure
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

from .. import __version__, files, kernels
from ..config import DEFAULT_LLM, MODELS, REPO_ROOT
from ..files import sha256_file
from ..models import canonical_name, is_verified, resolve_model

SCHEMA = "nexus-results/1"
# llama-cpp-python 0.3.36 vendors llama.cpp at this commit (see ../shared/design/llama-state.md); the installed
# package carries no commit string of its own, so it is recorded from the documented pin.
LLAMA_CPP_VENDORED_COMMIT = "0c1e5709"
PUBLISHED_RESULTS = REPO_ROOT / "results"  # the folder whose latest.json files the README and docs cite


def utc_stamp(t: float | None = None) -> str:
    """A UTC timestamp usable in file names and sortable: 20261130T025301Z."""
    return _dt.datetime.fromtimestamp(t if t is not None else time.time(), _dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ")


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def loadavg_1m() -> float | None:
    """The 1-minute load average, or None where the platform has none."""
    return os.getloadavg()[0] if hasattr(os, "getloadavg") else None


def git_info() -> dict:
    sha = _git("rev-parse", "HEAD")
    # results/ holds what runs write (each suite's latest.json), never what a run reads: a run after another is as
    # clean as the one before it
    status = _git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)results")
    return {"sha": sha, "short": sha[:8] if sha else None, "dirty": bool(status) if status is not None else None}


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def cpu_info() -> dict:
    """CPU model, logical cores (total and usable by this process), and the SIMD flags that matter to the kernels."""
    model = None
    flags: set[str] = set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                key, _, val = line.partition(":")
                key = key.strip()
                if key in ("model name", "Model", "cpu model") and model is None:
                    model = val.strip()
                elif key in ("flags", "Features") and not flags:
                    flags = set(val.split())
    except OSError:
        pass
    if model is None:
        model = platform.processor() or platform.machine()
    interesting = [
        "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx_vnni",
        "avx512_bf16", "amx_int8", "neon", "asimd", "asimddp", "sve",
    ]
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "model": model,
        "machine": platform.machine(),
        "logical_cores": os.cpu_count(),
        "usable_cores": usable,
        "flags": [f for f in interesting if f in flags],
        "loadavg_1m": loadavg_1m(),
    }


def simd_level() -> str | None:
    """The SIMD path libnexus's kernels dispatch to, if the native library is built and loadable."""
    try:
        fn = getattr(kernels, "simd_level", None)
        return str(fn()) if callable(fn) else None
    except Exception:  # noqa: BLE001 - the library may not be built; the results still describe everything else
        return None


def llama_system_info() -> str | None:
    """llama.cpp's own feature line (AVX2, AVX512, ...), only if llama_cpp is already imported (never imports it)."""
    mod = sys.modules.get("llama_cpp")
    if mod is None:
        return None
    try:
        raw = mod.llama_print_system_info()
        return raw.decode("utf-8", "replace").strip() if isinstance(raw, bytes) else str(raw).strip()
    except Exception:  # noqa: BLE001
        return None


def environment(git: dict | None = None) -> dict:
    """Everything about the machine and software a reader needs to interpret a measurement (no hostname); `git`, when
    given, is the tree's state read earlier (a run's start)."""
    return {
        "git": git if git is not None else git_info(),
        "nexus": __version__,
        "python": platform.python_version(),
        "os": f"{platform.system()} {platform.release()}",
        "packages": {
            name: _version(name)
            for name in ("llama-cpp-python", "numpy", "scipy", "torch", "sentence-transformers", "matplotlib")
        },
        "llama_cpp": {"vendored_commit": LLAMA_CPP_VENDORED_COMMIT, "system_info": llama_system_info()},
        "cpu": cpu_info(),
        "simd_level": simd_level(),
        "threads_env": {k: os.environ[k] for k in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY", "NEXUS_THREADS", "NEXUS_FORCE_SCALAR") if k in os.environ},
    }


def model_identity(name_or_path: str, kind: str = "gguf") -> dict:
    """Name, file name, size and sha256 of a model (the pinned digest, verified against the file by models.py)."""

    path = resolve_model(name_or_path, kind=kind)
    key = canonical_name(name_or_path)
    if key is not None and is_verified(MODELS[key]):
        spec = MODELS[key]
        weights = path if kind == "gguf" else path / spec.weights_name
        return {"name": key, "file": path.name, "size": weights.stat().st_size, "sha256": spec.sha256, "verified": True}
    weights = path if path.is_file() else None
    return {
        "name": key or path.name,
        "file": path.name,
        "size": weights.stat().st_size if weights else None,
        "sha256": sha256_file(weights) if weights else None,
        "verified": False,
    }


def _json_default(obj: Any):
    if hasattr(obj, "as_dict"):
        return obj.as_dict()
    if hasattr(obj, "tolist"):  # numpy arrays and scalars
        return obj.tolist()
    if hasattr(obj, "__fspath__"):
        return os.fspath(obj)
    if isinstance(obj, (set, frozenset)):
        return sorted(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def _sanitize(obj: Any) -> Any:
    """NaN/inf are not JSON: write them as null (strict parsers reject NaN)."""
    if isinstance(obj, float):
        return obj if obj == obj and obj not in (float("inf"), float("-inf")) else None
    if isinstance(obj, dict):
        return {str(k): _sanitize(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_sanitize(v) for v in obj]
    return obj


def to_jsonable(obj: Any) -> Any:
    """Round-trip through json with the numpy/dataclass-aware default, then replace NaN/inf with null."""
    return _sanitize(json.loads(json.dumps(obj, default=_json_default)))


def write_json_doc(path: Path, obj: Any) -> None:
    """A results document (NumPy values, dataclasses, NaN made JSON-safe) written atomically."""
    files.atomic_write_json(path, to_jsonable(obj))


def headless_pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt  # noqa: PLC0415

    return plt


def save_figure(fig, path: Path, dpi: int = 130) -> None:
    """Render a matplotlib figure to PNG and write it atomically."""
    import io  # noqa: PLC0415

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi, bbox_inches="tight", metadata={"Software": f"nexus {__version__}"})
    files.atomic_write_bytes(path, buf.getvalue())


def suite_dir(out_dir: str | os.PathLike, suite: str) -> Path:
    return Path(out_dir) / suite


def model_variant(model: str) -> str | None:
    """The variant a run on `model` writes: None for the main model, else the model's name (a .gguf path: its
    file name without the extension)."""
    name = canonical_name(str(model))
    if name == canonical_name(DEFAULT_LLM):
        return None
    return name or Path(str(model)).stem


def latest_name(variant: str | None = None, ext: str = "json") -> str:
    return f"latest.{ext}" if variant is None else f"latest-{variant}.{ext}"


def variants(out_dir: str | os.PathLike, suite: str) -> list[str]:
    """The variants of a suite that have a latest file in out_dir, sorted."""
    folder = suite_dir(out_dir, suite)
    if not folder.is_dir():
        return []
    return sorted(p.name[len("latest-"):-len(".json")] for p in folder.glob("latest-*.json"))


class Run:
    """One measurement run of a suite: collects the description at start, writes the results file at the end."""

    def __init__(self, suite: str, params: dict, seed: int | None = None, models: dict | None = None,
                 variant: str | None = None):
        self.suite = suite
        self.variant = variant
        self.params = dict(params)
        self.seed = seed
        self.models = dict(models or {})
        self.started = time.time()
        self._t0 = time.perf_counter()
        self.argv = ["nexus", *sys.argv[1:]] if Path(sys.argv[0]).name in ("nexus", "cli.py") else list(sys.argv)
        self.notes: list[str] = []
        self.load_start = loadavg_1m()
        # the tree the run measures is the one it starts on: an edit while it runs must not change its record
        self.git_start = git_info()

    def note(self, text: str) -> None:
        """A remark that belongs with the numbers (a skipped cell, a reduced run, an overflow)."""
        self.notes.append(text)

    def document(self, summary: dict, samples: dict | None = None) -> dict:
        env = environment(git=self.git_start)
        env["cpu"]["loadavg_1m_start"] = self.load_start  # loadavg_1m is read at the end of the run
        return to_jsonable(
            {
                "schema": SCHEMA,
                "suite": self.suite,
                "variant": self.variant,
                "created_utc": _dt.datetime.fromtimestamp(self.started, _dt.timezone.utc).isoformat(timespec="seconds"),
                "wall_s": round(time.perf_counter() - self._t0, 3),
                "argv": self.argv,
                "environment": env,
                "models": self.models,
                "params": self.params,
                "seed": self.seed,
                "summary": summary,
                "samples": samples or {},
                "notes": self.notes,
            }
        )

    def write(
        self,
        summary: dict,
        samples: dict | None = None,
        out_dir: str | os.PathLike = "results",
        figure: Callable[[Any], Any] | None = None,
    ) -> dict:
        """Write results/<suite>/<suite>[-<variant>]-<stamp>.json, latest[-<variant>].json and (if `figure`) the
        figure as latest[-<variant>].png. Returns the document with its paths under "files". From a dirty tree into
        the published results, latest is left alone and the figure is kept beside the stamped file instead."""
        cores = os.cpu_count() or 1
        load = max(x for x in (self.load_start, loadavg_1m(), 0.0) if x is not None)
        if load > cores:
            self.note(f"load average {load:.1f} over {cores} cores during the run: timings are not publishable; "
                      "re-take it on an idle machine")
            sys.stderr.write(f"warning: the load average reached {load:.1f} on {cores} cores during this run\n")
        doc = self.document(summary, samples)
        folder = suite_dir(out_dir, self.suite)
        stamp = utc_stamp(self.started)
        base = self.suite if self.variant is None else f"{self.suite}-{self.variant}"
        path = folder / f"{base}-{stamp}.json"
        dirty = bool((self.git_start or {}).get("dirty"))
        published_folder = folder.resolve().parent == Path(PUBLISHED_RESULTS).resolve()
        keep_latest = not (dirty and published_folder)
        doc["publishable"] = not dirty
        latest = folder / latest_name(self.variant)
        files = {"json": str(path)}
        if figure is not None:
            plt = headless_pyplot()
            fig = figure(plt)
            if fig is not None:
                png = folder / latest_name(self.variant, "png") if keep_latest else path.with_suffix(".png")
                save_figure(fig, png)
                plt.close(fig)
                files["png"] = str(png)
        write_json_doc(path, doc)
        if keep_latest:
            write_json_doc(latest, doc)
            files["latest"] = str(latest)
        else:
            sys.stderr.write(f"warning: the tree was dirty when this run started: {path.name} is kept, "
                             f"{self.suite}/{latest.name} (what the docs publish) is left as it was\n")
        doc["files"] = files
        return doc


def load_latest(out_dir: str | os.PathLike, suite: str, variant: str | None = None) -> dict | None:
    path = suite_dir(out_dir, suite) / latest_name(variant)
    if not path.is_file():
        return None
    return json.loads(path.read_text(encoding="utf-8"))
