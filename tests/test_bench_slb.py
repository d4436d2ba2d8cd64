"""`nexus bench slb --json`: runs end to end and prints a results document of the documented shape (no timing
assertions: only structure and the self-checks)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def _nexus() -> list[str]:
    exe = REPO / ".venv" / "bin" / "nexus"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "nexus_cli.cli"]


def test_bench_slb_json(tmp_path):
    cmd = _nexus() + ["bench", "slb", "--sizes", "250,300", "--reps", "20", "--json", "--out", str(tmp_path)]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=300,
                          env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["suite"] == "slb"
    assert doc["simd_level"] in ("scalar", "avx2", "avx512", "avx512_vnni", "neon")
    assert [r["n"] for r in doc["sizes"]] == [250, 300]
    for r in doc["sizes"]:
        for key in ("cpp_us_p50", "python_us_p50", "numpy_f32_us_p50", "numpy_i8_us_p50"):
            assert isinstance(r[key], float) and r[key] > 0
        assert r["dim"] == 384 and r["reps"] == 20
        assert 0.0 <= r["top1_agreement"] <= 1.0
        assert r["verified_queries"] > 0
    env = doc["environment"]
    assert "git" in env and "cpu" in env and doc["params"]["dim"] == 384 and doc["seed"] == 0
    assert len(doc["samples"]["250"]["cpp_ns"]) == 20
    latest = json.loads((tmp_path / "slb" / "latest.json").read_text())
    assert latest["sizes"] == doc["sizes"]
    stamped = [p for p in (tmp_path / "slb").iterdir() if p.name.startswith("slb-")]
    assert len(stamped) == 1 and not [p for p in (tmp_path / "slb").iterdir() if p.name.endswith(".tmp")]


def test_bench_slb_rejects_bad_sizes(tmp_path):
    proc = subprocess.run(_nexus() + ["bench", "slb", "--sizes", "a,b", "--out", str(tmp_path)], capture_output=True,
                          text=True, cwd=REPO, timeout=120, env=dict(os.environ, PYTHONPATH=str(REPO)))
    assert proc.returncode == 2 and "--sizes" in proc.stderr
