"""Crash safety: SIGKILL `nexus compile` and `nexus index` at random points (seeded), several times each.

After every kill, what was there before must still be intact and loadable (or be replaced by a complete new
version): each block the manifest lists opens with its payload checksum verified, the manifest parses, the index
loads with the real loader; no truncated or temporary file stands where a reader looks. The next run completes.

Kill times are uniform over the duration of an unkilled run of the same job (measured first), so they land in model
loading, prefill, block writes, manifest writes and the index swap alike. NEXUS_CRASH_KILLS (default 3) sets the
kills per command; NEXUS_CRASH_SEED the seed. The figures go to stderr (pytest -s) for the reliability report.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nexus_cli import atb

REPO = Path(__file__).resolve().parent.parent
NEXUS = REPO / ".venv" / "bin" / "nexus"
KILLS = int(os.environ.get("NEXUS_CRASH_KILLS", "3"))
SEED = int(os.environ.get("NEXUS_CRASH_SEED", "20261130"))

pytestmark = pytest.mark.slow


def _cmd(*args: str) -> list[str]:
    return [str(NEXUS), *args] if NEXUS.exists() else [sys.executable, "-m", "nexus_cli.cli", *args]


def _run(*args: str, timeout: float = 900) -> tuple[subprocess.CompletedProcess, float]:
    t = time.monotonic()
    r = subprocess.run(_cmd(*args), cwd=REPO, capture_output=True, text=True, timeout=timeout)
    return r, time.monotonic() - t


def _kill_at(args: list[str], delay: float) -> bool:
    """Start the command, SIGKILL it after `delay` seconds; True if it was still running (a real kill)."""
    p = subprocess.Popen(_cmd(*args), cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        p.wait(timeout=delay)
        return False  # finished before the kill
    except subprocess.TimeoutExpired:
        p.send_signal(signal.SIGKILL)
        p.wait()
        return True


def _kill_delay(rng: random.Random, run_s: float) -> float:
    """A kill time within an unkilled run of run_s seconds, however fast the machine runs it."""
    return rng.uniform(0.05, 0.95) * run_s


def _registry(path: Path, tools: list[dict], server: str) -> Path:
    path.write_text(json.dumps({"server": server, "tools": tools}))
    return path


def _tools(n: int, tag: str) -> list[dict]:
    verbs = ["list", "create", "delete", "rename", "archive", "restore"]
    return [{"name": f"{verbs[i % len(verbs)]}_item_{i}",
             "description": f"{verbs[i % len(verbs)].capitalize()} an item in the store ({tag}).",
             "inputSchema": {"type": "object", "properties": {"id": {"type": "string"},
                                                               "note": {"type": "string"}}, "required": ["id"]}}
            for i in range(n)]


# ---------------------------------------------------------------- compile

def _check_blocks(out: Path, model_fp: str) -> dict:
    """Every block the manifest lists is a complete, verified block of this model; no stray non-hidden files."""
    manifest = json.loads((out / "manifest.json").read_text("utf-8"))
    assert isinstance(manifest.get("tools"), list)
    stale = 0
    for e in manifest["tools"]:
        path = out / e["file"]
        assert path.is_file(), f"manifest lists {e['file']} but it is missing"
        with atb.open_block(path, verify=True) as b:
            assert bytes(b.header.fingerprint).hex() == model_fp
        if e.get("sha256"):
            import hashlib

            if hashlib.sha256(path.read_bytes()).hexdigest() != e["sha256"]:
                stale += 1  # replaced by a complete newer block before the manifest caught up (the next run sees it)
    for p in out.iterdir():
        if p.name.startswith("."):
            continue  # the writers' temp files: hidden, never read, cleaned by the next run
        assert p.suffix in (".atb", ".json"), f"unexpected file {p.name}"
        if p.suffix == ".atb":
            atb.open_block(p, verify=True).close()  # a block file is always complete (atomic rename)
    return {"entries": len(manifest["tools"]), "complete": manifest.get("complete"), "stale_sha": stale}


def test_sigkill_compile_keeps_previous_blocks(tmp_path):
    rng = random.Random(SEED)
    v1 = _registry(tmp_path / "v1.json", _tools(2, "first"), "store")
    v2 = _registry(tmp_path / "v2.json", _tools(4, "second edition"), "store")
    out = tmp_path / "blocks"
    r, t_v1 = _run("compile", str(v1), "--model", "smollm2-135m", "--out", str(out))
    assert r.returncode == 0, r.stderr
    fp = json.loads((out / "manifest.json").read_text())["model"]["fingerprint"]
    _check_blocks(out, fp)
    # how long a full v2 run takes here (in a scratch dir), to spread the kills over it
    r, t_v2 = _run("compile", str(v2), "--model", "smollm2-135m", "--out", str(tmp_path / "scratch"))
    assert r.returncode == 0, r.stderr
    shutil.rmtree(tmp_path / "scratch")

    kills, states = 0, []
    for i in range(KILLS):
        # a new edition each time: every tool changes, so every try rewrites blocks over the previous ones
        vi = _registry(tmp_path / f"v2-{i}.json", _tools(4, f"edition {i}"), "store")
        delay = _kill_delay(rng, t_v2)
        if _kill_at(["compile", str(vi), "--model", "smollm2-135m", "--out", str(out)], delay):
            kills += 1
        states.append((round(delay, 2), _check_blocks(out, fp)))
    r, _ = _run("compile", str(v2), "--model", "smollm2-135m", "--out", str(out))
    assert r.returncode == 0, r.stderr
    final = _check_blocks(out, fp)
    assert final == {"entries": 4, "complete": True, "stale_sha": 0}, final
    leftovers = [p.name for p in out.iterdir() if p.name.startswith(".")]
    assert leftovers == [], f"temp files survived the next run: {leftovers}"
    print(f"\n[crash-safety] compile: {kills} SIGKILLs delivered of {KILLS} tries (v1 run {t_v1:.1f} s, v2 run "
          f"{t_v2:.1f} s); states after each: {states}; final run completed", file=sys.stderr)
    assert kills >= 1


# ---------------------------------------------------------------- index

def _check_index(out: Path) -> int:
    from nexus_cli.routing.index import load_index

    idx = load_index(out)
    n = len(idx.tools)
    assert n > 0
    return n


def test_sigkill_index_keeps_previous_index(tmp_path):
    rng = random.Random(SEED + 1)
    v1 = _registry(tmp_path / "v1.json", _tools(3, "first"), "store")
    v2 = REPO / "tool_registries"
    out = tmp_path / "index"
    r, t_v1 = _run("index", str(v1), "--out", str(out))
    assert r.returncode == 0, r.stderr
    n_v1 = _check_index(out)
    r, t_v2 = _run("index", str(v2), "--out", str(tmp_path / "scratch"))
    assert r.returncode == 0, r.stderr
    n_v2 = _check_index(tmp_path / "scratch")
    shutil.rmtree(tmp_path / "scratch")

    kills, seen = 0, []
    for i in range(KILLS):
        delay = _kill_delay(rng, t_v2)
        if _kill_at(["index", str(v2), "--out", str(out)], delay):
            kills += 1
        n = _check_index(out)  # the old index or the complete new one, never a broken or missing one
        assert n in (n_v1, n_v2), n
        seen.append((round(delay, 2), n))
    r, _ = _run("index", str(v2), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert _check_index(out) == n_v2
    leftovers = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".index."))
    print(f"\n[crash-safety] index: {kills} SIGKILLs delivered of {KILLS} tries (v1 {t_v1:.1f} s, v2 {t_v2:.1f} s); "
          f"tools after each: {seen}; final run completed; leftover temp dirs: {leftovers}", file=sys.stderr)
    assert kills >= 1
    assert not leftovers, f"killed runs left temp dirs behind (regression: bug R5): {leftovers}"
