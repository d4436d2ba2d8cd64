"""`nexus compile` on the real SmolLM2-135M: blocks and manifest, canonical rendering, incremental runs, and that a
kill -9 in the middle never leaves a truncated block or manifest."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from nexus_cli.registry import Tool, load_registries

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "compile"
SMALL = DATA / "splice_tools.json"
BATCH = DATA / "batch_tools.json"

pytestmark = pytest.mark.slow


def run_cli(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "nexus_cli.cli", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_render_schema_is_canonical():
    from nexus_cli.splice.compile import render_schema

    a = Tool("srv", "t", "Does a thing.", {"type": "object", "properties": {"b": {"type": "string"}, "a": {}}})
    b = Tool("srv", "t", "Does a thing.", {"properties": {"a": {}, "b": {"type": "string"}}, "type": "object"})
    assert render_schema(a) == render_schema(b)
    text = render_schema(a)
    assert text.startswith("# Tool\n{") and text.endswith("}\n")
    obj = json.loads(text[len("# Tool\n"):])
    assert list(obj) == ["description", "name", "parameters", "server"]
    assert ", " not in text and ": " not in text  # compact separators


def test_block_filenames_are_sanitized():
    from nexus_cli.splice.compile import block_filename

    assert block_filename("github", "create_issue") == "github__create_issue.atb"
    assert block_filename("my server/v2", "a b:c") == "my_server_v2__a_b_c.atb"
    assert "/" not in block_filename("../..", "../x")


def test_tool_key_depends_on_text_model_and_settings():
    from nexus_cli.splice.compile import compile_settings, tool_key

    s_off, s_on = compile_settings(False), compile_settings(True)
    k = tool_key("x", "f" * 32, s_off)
    assert k == tool_key("x", "f" * 32, s_off)
    assert len({k, tool_key("y", "f" * 32, s_off), tool_key("x", "e" * 32, s_off), tool_key("x", "f" * 32, s_on)}) == 4


def test_compile_writes_blocks_and_manifest(tmp_path):
    from nexus_cli.adapters.llama import load_model
    from nexus_cli.atb import open_block
    from nexus_cli.splice.compile import prefix_tokens, render_schema

    out = tmp_path / "blocks"
    proc = run_cli("compile", str(SMALL), "--model", "smollm2-135m", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert set(summary) == {"n_tools", "n_compiled", "n_skipped", "n_tokens_total", "bytes_total", "seconds",
                            "tokens_per_s", "manifest"}
    assert summary["n_tools"] == 3 and summary["n_compiled"] == 3 and summary["n_skipped"] == 0

    manifest = json.loads((out / "manifest.json").read_text())
    model = load_model("smollm2-135m")
    m0 = len(prefix_tokens(model))
    assert manifest["anchor"] == m0 and manifest["model"]["fingerprint"] == model.identity.fingerprint
    assert manifest["model"]["arch"] == "llama" and manifest["complete"] is True
    tools = {t.name: t for t in load_registries([SMALL])}
    assert [e["name"] for e in manifest["tools"]] == ["add_note", "search_notes", "delete_note"]
    total = 0
    for e in manifest["tools"]:
        path = out / e["file"]
        assert e["server"] == "notes" and e["file"] == f"notes__{e['name']}.atb"
        blk = open_block(path)
        h = blk.header
        want = model.tokenize(render_schema(tools[e["name"]]), add_special=False, parse_special=False)
        assert list(blk.tokens) == want and e["n_tokens"] == len(want) == h.n_tokens
        assert h.anchor_pos == m0 and h.fingerprint.hex() == model.identity.fingerprint
        assert (h.rope_type, h.n_layer, h.n_head_kv, h.head_dim, h.v_layout) == (0, 30, 3, 64, 1)
        assert h.freq_base == 100000.0
        assert np.isfinite(blk.k.astype(np.float32)).all() and np.abs(blk.k.astype(np.float32)).max() > 0
        import hashlib

        assert hashlib.sha256(path.read_bytes()).hexdigest() == e["sha256"]
        total += e["n_tokens"]
        blk.close()
    assert summary["n_tokens_total"] == total


def test_compile_is_incremental(tmp_path):
    from nexus_cli.splice.compile import compile_registries

    reg = tmp_path / "reg.json"
    data = json.loads(SMALL.read_text())
    reg.write_text(json.dumps(data))
    out = tmp_path / "blocks"
    first = compile_registries([reg], "smollm2-135m", out)
    assert (first.n_compiled, first.n_skipped) == (3, 0)
    mtimes = {p.name: p.stat().st_mtime_ns for p in out.glob("*.atb")}

    proc = run_cli("compile", str(reg), "--model", "smollm2-135m", "--out", str(out), "--json")
    assert proc.returncode == 0, proc.stderr
    second = json.loads(proc.stdout)
    assert second["n_compiled"] == 0 and second["n_skipped"] == 3
    assert {p.name: p.stat().st_mtime_ns for p in out.glob("*.atb")} == mtimes

    data["tools"][1]["description"] = "Find notes that contain all of the given words."
    reg.write_text(json.dumps(data))
    third = compile_registries([reg], "smollm2-135m", out)
    assert (third.n_compiled, third.n_skipped) == (1, 2)
    assert (out / "notes__search_notes.atb").stat().st_mtime_ns != mtimes["notes__search_notes.atb"]

    # a different V layout is a different compile setting: everything is rebuilt
    fourth = compile_registries([reg], "smollm2-135m", out, flash_attn=True)
    assert fourth.n_compiled == 3

    # a tool that leaves the registry takes its block with it
    data["tools"] = data["tools"][:2]
    reg.write_text(json.dumps(data))
    fifth = compile_registries([reg], "smollm2-135m", out, flash_attn=True)
    assert fifth.n_tools == 2 and not (out / "notes__delete_note.atb").exists()


def test_compile_reports_bad_registry_in_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    proc = run_cli("compile", str(bad), "--model", "smollm2-135m", "--out", str(tmp_path / "o"))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    assert "not valid JSON" in proc.stderr


def _check_dir_consistent(out: Path) -> int:
    """Every .atb opens with its checksums verified; the manifest, if any, parses and lists only good blocks."""
    from nexus_cli.atb import open_block

    n = 0
    for p in sorted(out.glob("*.atb")):
        blk = open_block(p, verify=True)
        blk.close()
        n += 1
    mf = out / "manifest.json"
    if mf.exists():
        manifest = json.loads(mf.read_text())
        for e in manifest["tools"]:
            assert (out / e["file"]).is_file()
    return n


def test_kill_9_mid_compile_leaves_no_partial_files(tmp_path):
    out = tmp_path / "blocks"
    proc = subprocess.Popen([sys.executable, "-m", "nexus_cli.cli", "compile", str(BATCH), "--model", "smollm2-135m",
                             "--out", str(out)], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if out.is_dir() and len(list(out.glob("*.atb"))) >= 3:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "compile finished before it could be interrupted"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    n_before = _check_dir_consistent(out)
    assert 3 <= n_before < 12

    # the next run finishes the work, reusing what survived, and clears the killed run's temp files
    done = run_cli("compile", str(BATCH), "--model", "smollm2-135m", "--out", str(out), "--json")
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["n_tools"] == 12 and summary["n_compiled"] + summary["n_skipped"] == 12
    assert _check_dir_consistent(out) == 12
    assert not [p for p in out.iterdir() if ".tmp" in p.name]
