"""Sessions: a multi-turn conversation through the CLI (`nexus route --session DIR`), as a shell script runs it; the
conversation and KV state persist between invocations; a corrupt session is refused with one line. Real MiniLM +
SmolLM2."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"
NEXUS = [sys.executable, "-m", "nexus_cli.cli"]


def nexus(*args, timeout=600):
    env = {**os.environ, "NEXUS_DEBUG": "0"}
    return subprocess.run([*NEXUS, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout, env=env,
                          stdin=subprocess.DEVNULL)


@pytest.fixture(scope="module")
def forge_index(tmp_path_factory):
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.build import build_index

    out = tmp_path_factory.mktemp("session-idx") / "forge"
    build_index(load_registries([FORGE]), out, embedder=Embedder("minilm"), sources=[str(FORGE)])
    return out


def turn(index, sdir, query):
    p = nexus("route", query, "--index", str(index), "--registry", str(FORGE), "--model", "smollm2-135m",
              "--session", str(sdir), "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def one_error_line(p) -> str:
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, p.stderr
    return lines[0]


def test_multi_turn_session_through_the_cli(forge_index, tmp_path):
    sdir = tmp_path / "conv"
    r1 = turn(forge_index, sdir, "open an issue in acme/api titled Login crash")
    assert r1["tool"] == "create_issue" and r1["kv"]["turn"] == 1 and not r1["kv"]["hit"]
    doc1 = json.loads((sdir / "session.json").read_text())
    assert doc1["format"] == "nexus-session" and doc1["turns"] == 1 and len(doc1["messages"]) == 2
    kv1 = doc1["kv"]
    assert (sdir / kv1["file"]).stat().st_size == kv1["bytes"] and kv1["tokens"]

    r2 = turn(forge_index, sdir, "now close issue 3 there")
    assert r2["tool"] == "close_issue" and r2["kv"]["turn"] == 2
    # the KV state saved by turn 1 was restored: the new prompt reused its prefix instead of prefilling it again
    assert r2["kv"]["hit"] and r2["kv"]["reused"] > 0
    doc2 = json.loads((sdir / "session.json").read_text())
    assert doc2["turns"] == 2 and doc2["messages"][:2] == doc1["messages"] and len(doc2["messages"]) == 4
    assert doc2["messages"][2] == {"role": "user", "content": "now close issue 3 there"}
    assert json.loads(doc2["messages"][3]["content"])["tool"] == "forge/close_issue"
    # the previous KV file was replaced, not accumulated
    assert sorted(p.name for p in sdir.glob("kv-*.bin")) == [doc2["kv"]["file"]]
    assert not list(sdir.glob(".*.tmp"))

    # a routing-only turn continues the conversation and keeps the saved KV state as it was
    p = nexus("route", "and list the open pull requests", "--index", str(forge_index), "--session", str(sdir),
              "--no-args", "--json")
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["tool"] == "list_pull_requests"
    doc3 = json.loads((sdir / "session.json").read_text())
    assert doc3["turns"] == 3 and len(doc3["messages"]) == 6 and doc3["kv"] == doc2["kv"]
    assert (sdir / doc3["kv"]["file"]).is_file()


def test_corrupt_sessions_are_refused_with_one_line(forge_index, tmp_path):
    sdir = tmp_path / "conv"
    turn(forge_index, sdir, "list the open pull requests of octo/widgets")
    state = sdir / "session.json"
    good = state.read_text()

    state.write_text(good[: len(good) // 2])  # truncated JSON
    p = nexus("route", "and merge the first", "--index", str(forge_index), "--model", "smollm2-135m", "--session",
              str(sdir), "--no-args")
    assert p.returncode == 1 and p.stdout == ""
    assert "corrupt session" in one_error_line(p)

    state.write_text(good)
    kv = sdir / json.loads(good)["kv"]["file"]
    raw = bytearray(kv.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    kv.write_bytes(bytes(raw))
    p = nexus("route", "and merge the first", "--index", str(forge_index), "--model", "smollm2-135m", "--session",
              str(sdir), "--no-args")
    assert p.returncode == 1
    assert "checksum" in one_error_line(p)

    state.write_text(json.dumps({"format": "something-else"}))
    p = nexus("route", "x", "--index", str(forge_index), "--model", "smollm2-135m", "--session", str(sdir))
    assert p.returncode == 1 and "not a Nexus session file" in one_error_line(p)

    p = nexus("route", "x", "--index", str(forge_index), "--session", str(sdir), "--batch", str(FORGE))
    assert p.returncode == 2


def test_session_api_save_load_round_trip(forge_index, tmp_path):
    from nexus_cli.serving.session import Engine, EngineConfig, Session

    eng = Engine(forge_index, EngineConfig(model="smollm2-135m", n_ctx=4096, max_tokens=48), registry=[str(FORGE)])
    try:
        s = Session(eng)
        s.turn("star the repository acme/api")
        s.save(tmp_path / "s")
        n = len(s.tokens)
        eng.arena.clear()  # forget every warm slot: the state must come back from the file
        s2 = Session.load(tmp_path / "s", eng)
        assert s2.messages == s.messages and s2.tokens == s.tokens and s2.n_turns == 1
        slot, lcp = eng.arena.match(s.tokens)
        assert slot >= 0 and lcp == n
        assert eng.context().seq_pos_max(eng.arena.slot_seq(slot)) + 1 == n
    finally:
        eng.close()


def test_deep_splice_in_an_anchored_sidecar(forge_index, tmp_path):
    """The chosen tool's .atb block is spliced at its compile anchor in a sidecar sequence that starts at position 0:
    nothing is recomputed, and the next token is the one a plain prefill of the same text gives."""
    from nexus_cli.adapters.llama import LlamaContext
    from nexus_cli.serving.session import Engine, EngineConfig
    from nexus_cli.splice.compile import compile_registries, prefix_tokens

    one = tmp_path / "forge.json"
    full = json.loads(FORGE.read_text())
    one.write_text(json.dumps({"server": "forge", "tools": [t for t in full["tools"] if t["name"] == "close_issue"]}))
    compile_registries([str(one)], "smollm2-135m", tmp_path / "blocks", flash_attn=True)
    eng = Engine(forge_index, EngineConfig(model="smollm2-135m", with_args=False, n_ctx=2048,
                                           deep_splice=str(tmp_path / "blocks")))
    try:
        query = "close issue 12 in acme/api"
        r = eng.turn(query)
        sp = r.splice
        assert r.route.tool == "close_issue" and sp["status"] == "spliced" and sp["mode"] == "sidecar"
        model = eng.model()
        assert sp["n_past"] == len(prefix_tokens(model)) and sp["recomputed_tokens"] == 0
        assert eng.context().seq_pos_max(eng.sidecar_seq) == -1  # the sidecar is dropped after the turn
        from nexus_cli.splice.compile import block_filename
        from nexus_cli.splice.engine import open_checked_block

        block = open_checked_block(tmp_path / "blocks" / block_filename("forge", "close_issue"))
        q = model.tokenize(f"<|im_start|>user\n{query}<|im_end|>\n<|im_start|>assistant\n", add_special=False)
        with LlamaContext(model, n_ctx=1024, n_seq_max=1, flash_attn=True) as ctx:
            ctx.decode(prefix_tokens(model) + [int(t) for t in block.tokens] + q, 0, 0)
            assert int(ctx.logits().argmax()) == sp["top1"]
        r2 = eng.turn("list the open pull requests of acme/api")
        assert r2.splice["status"] == "no block"
    finally:
        eng.close()
