"""The shared file helpers (atomic writes, digests, pid checks) and the command defaults built on them."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nexus_cli import files
from nexus_cli.commands.options import settings

REPO = Path(__file__).resolve().parent.parent


def test_atomic_write_replaces_whole_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "sub" / "x.json"
    files.atomic_write_json(target, {"a": 1})
    files.atomic_write_json(target, {"a": [1, 2]}, compact=True)
    assert target.read_text() == '{"a":[1,2]}'
    assert [p.name for p in target.parent.iterdir()] == ["x.json"]
    assert oct(target.stat().st_mode & 0o777) == "0o644"


def test_atomic_write_leaves_the_old_file_when_serialization_fails(tmp_path):
    target = tmp_path / "x.json"
    files.atomic_write_json(target, {"a": 1})
    with pytest.raises(TypeError):
        files.atomic_write_json(target, {"a": object()})
    with pytest.raises(ValueError):
        files.atomic_write_json(target, {"a": float("nan")})
    assert json.loads(target.read_text()) == {"a": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_atomic_write_json_takes_numpy_values(tmp_path):
    np = pytest.importorskip("numpy")
    target = tmp_path / "n.json"
    files.atomic_write_json(target, {"f": np.float32(0.5), "v": np.arange(3)})
    assert json.loads(target.read_text()) == {"f": 0.5, "v": [0, 1, 2]}


def test_temporary_names_carry_the_writer_pid(tmp_path, monkeypatch):
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(Path(src).name)
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    files.atomic_write_bytes(tmp_path / "blob.bin", b"x")
    assert seen and seen[0].startswith(".blob.bin.") and seen[0].endswith(f".{os.getpid()}.tmp")


def test_sha256_helpers_agree_with_hashlib(tmp_path):
    data = os.urandom(5 * files.CHUNK // 4)  # crosses a chunk boundary
    p = tmp_path / "d"
    p.write_bytes(data)
    assert files.sha256_file(p) == files.sha256_bytes(data) == hashlib.sha256(data).hexdigest()


def test_pid_alive():
    assert files.pid_alive(os.getpid())
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    assert not files.pid_alive(proc.pid)


def test_settings_fill_only_what_the_user_left_out():
    defaults = {"model": "big", "trials": 15, "depths": [256, 512]}
    quick = {"model": "small", "trials": 3}
    assert settings({"model": None, "trials": None, "depths": None}, defaults) == defaults
    assert settings({"model": None, "trials": 7, "depths": None}, defaults, True, quick) == \
        {"model": "small", "trials": 7, "depths": [256, 512]}
    assert settings({"model": "mine", "trials": None, "depths": [1]}, defaults, True, quick) == \
        {"model": "mine", "trials": 3, "depths": [1]}


def _nexus(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "nexus_cli.cli", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=300, env={**os.environ, **(env or {})}, stdin=subprocess.DEVNULL)


def test_route_without_an_index_names_the_command_that_builds_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "NEXUS_INDEX"}
    p = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "route", "open a PR"], cwd=tmp_path,
                       capture_output=True, text=True, timeout=120, env={**env, "PYTHONPATH": str(REPO)})
    assert p.returncode == 2 and p.stdout == ""
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "no index at .nexus/index" in lines[0] and "nexus index REGISTRY" in lines[0]


@pytest.mark.slow
def test_index_and_route_use_the_default_index(tmp_path):
    """`nexus index REG` writes $NEXUS_INDEX (else .nexus/index) and `nexus route "..."` reads it with no flags."""
    env = {"NEXUS_INDEX": str(tmp_path / "idx")}
    p = _nexus("index", str(REPO / "tool_registries" / "github_like.json"), "--json", cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["out"] == str(tmp_path / "idx")
    p = _nexus("route", "please merge PR 12 in acme/api", "--no-args", "--json", cwd=REPO, env=env)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tool"] == "merge_pull_request"
