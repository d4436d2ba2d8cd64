"""A short run of each fuzz target (fuzz/README.md): 2,000 executions of the .atb reader target (libFuzzer, ASan +
UBSan) and of the schema compiler target (atheris), from the committed seed corpora. Also replays every committed
crash reproducer in fuzz/regressions/ (each crash the fuzzers ever found). Skipped, with the reason, when the fuzz
toolchain (clang++ with libFuzzer, or atheris) is absent: `make -C fuzz toolchain` installs it."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FUZZ = REPO / "fuzz"
VPY = REPO / ".venv" / "bin" / "python"
RUNS = "2000"


def _clang() -> str | None:
    return shutil.which("clang++-14") or shutil.which("clang++")


def _has_atheris() -> bool:
    py = str(VPY) if VPY.exists() else sys.executable
    return subprocess.run([py, "-c", "import atheris"], capture_output=True).returncode == 0


def _make(*targets: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(["make", "-s", "-C", str(FUZZ), *targets, f"SMOKE_RUNS={RUNS}"], capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.skipif(_clang() is None, reason="no clang++ with libFuzzer (make -C fuzz toolchain installs clang-14)")
def test_atb_reader_fuzz_smoke():
    r = _make("smoke-atb", timeout=600)  # the first call builds the target (~30 s)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"Done {RUNS} runs" in out, out[-2000:]
    assert "ERROR: AddressSanitizer" not in out and "runtime error:" not in out


@pytest.mark.skipif(_clang() is None, reason="no clang++ with libFuzzer (make -C fuzz toolchain installs clang-14)")
def test_atb_regressions_replay():
    r = _make("regress-atb", timeout=600)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


@pytest.mark.skipif(not _has_atheris(), reason="atheris is not installed in the venv (make -C fuzz toolchain)")
def test_schema_fuzz_smoke():
    r = _make("smoke-schema")
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert f"Done {RUNS} runs" in out, out[-2000:]


@pytest.mark.skipif(not _has_atheris(), reason="atheris is not installed in the venv (make -C fuzz toolchain)")
def test_schema_regressions_replay():
    r = _make("regress-schema")
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]


@pytest.mark.parametrize("ref", [pytest.param({"a": 1}, id="dict"), pytest.param(["#"], id="list"),
                                 pytest.param(3, id="int"), pytest.param(None, id="null")])
def test_schema_regression_ref_not_a_string(ref):
    """Found by schema_fuzz.py: a `$ref` that is not a string must give a stated reason, not an internal error."""
    from nexus_cli.schema import compile_tool

    spec = compile_tool({"name": "t", "inputSchema": {"type": "object", "properties": {"x": {"$ref": ref}}}})
    assert spec.problems and not any("internal error" in p for p in spec.problems), spec.problems


@pytest.mark.parametrize("meta", [{"a": 1}, ["x"]], ids=["dict", "list"])
def test_schema_regression_schema_keyword_not_a_string(meta):
    """Found by schema_fuzz.py: validate_arguments must report, never raise, whatever `$schema` holds."""
    from nexus_cli.schema import validate_arguments

    assert isinstance(validate_arguments({"$schema": meta, "type": "object"}, {}), list)
