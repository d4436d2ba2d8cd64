"""Requests a registry writes for itself (routing/synthesize.py, `nexus index --synthesize`): the checks on a written
request, the per-tool cache (re-indexing writes only for changed tools, a damaged entry is written again), resume
after an interruption, and the index built with them. The LLM is the real SmolLM2-135M (the test model)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from nexus_cli.registry import Tool, load_registries
from nexus_cli.routing import synthesize
from nexus_cli.routing.build import tool_texts
from nexus_cli.routing.synthesize import RequestWriter, check_request, parse_lines, prompt_messages, tool_hash

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"

MERGE = Tool("forge", "merge_pull_request", "Merge a pull request.", {
    "type": "object", "required": ["owner", "repo", "pull_number"],
    "properties": {"owner": {"type": "string"}, "repo": {"type": "string"}, "pull_number": {"type": "integer"}}})


def test_parse_lines_strips_numbering_bullets_and_quotes():
    text = '1. merge PR 12 in acme/api\n- "ship #40 on acme/web"\n\n  * merge it\n2) land pull 7 please'
    assert parse_lines(text) == ["merge PR 12 in acme/api", "ship #40 on acme/web", "merge it", "land pull 7 please"]


def test_check_request_keeps_a_users_message_and_says_why_not():
    assert check_request(MERGE, "please merge PR 12 in acme/api") is None
    assert check_request(MERGE, "merge it") == "length"
    assert check_request(MERGE, " ".join(["word"] * 41)) == "length"
    assert check_request(MERGE, "call merge_pull_request on 12 for acme/api") == "names the tool"
    # the schema requires a number: a request that gives none cannot fill pull_number
    assert check_request(MERGE, "merge the open pull request in acme/api") == "no number for a required numeric input"
    no_number = replace(MERGE, input_schema={"type": "object", "properties": {"q": {"type": "string"}}})
    assert check_request(no_number, "merge the open pull request in acme/api") is None


def test_prompt_shows_the_tool_and_the_hash_follows_its_content():
    msgs = prompt_messages(MERGE)
    assert msgs[-1]["role"] == "user" and "merge pull request" in msgs[-1]["content"]
    assert "pull_number (integer, required)" in msgs[-1]["content"]
    assert all("merge" not in m["content"].lower() for m in msgs[:-1])  # the worked example is another tool
    assert tool_hash(MERGE) == tool_hash(replace(MERGE))
    assert tool_hash(MERGE) != tool_hash(replace(MERGE, description="Merge a pull request (squash)."))


@pytest.fixture(scope="module")
def forge_tools():
    return load_registries([FORGE])[:5]


@pytest.mark.slow
def test_writer_caches_per_tool_and_writes_again_only_what_changed(tmp_path, forge_tools):
    writer = RequestWriter("smollm2-135m", cache_dir=tmp_path, batch=4)
    first, rec = writer.write(forge_tools)
    assert rec["n_written"] == 5 and rec["n_cached"] == 0 and set(first) == {t.key for t in forge_tools}
    assert rec["n_requests"] == sum(len(v) for v in first.values()) > 0
    for t in forge_tools:
        assert all(check_request(t, q) is None for q in first[t.key])
        assert len(first[t.key]) <= synthesize.REQUESTS_PER_TOOL
    files = sorted(tmp_path.glob("*.json"))
    assert len(files) == 5 and not list(tmp_path.glob(".*"))  # one file a tool, no temporary left

    again, rec = writer.write(forge_tools)
    assert again == first and rec["n_written"] == 0 and rec["n_cached"] == 5

    (tmp_path / f"{tool_hash(forge_tools[0])}.json").write_text('{"tool": "forge/x", "requ')  # damaged entry
    changed = [replace(forge_tools[1], description=forge_tools[1].description + " Also lists drafts.")]
    _, rec = writer.write(forge_tools)
    assert rec["n_written"] == 1  # only the damaged one
    _, rec = writer.write(changed)
    assert rec["n_written"] == 1 and len(list(tmp_path.glob("*.json"))) == 6


@pytest.mark.slow
def test_an_interrupted_run_resumes_where_it_stopped(tmp_path, forge_tools, monkeypatch):
    writer = RequestWriter("smollm2-135m", cache_dir=tmp_path, batch=2)
    real = type(writer.ctx).generate_many
    calls = [0]

    def interrupted(self, *a, **k):
        calls[0] += 1
        if calls[0] == 2:
            raise KeyboardInterrupt
        return real(self, *a, **k)

    monkeypatch.setattr(type(writer.ctx), "generate_many", interrupted)
    with pytest.raises(KeyboardInterrupt):
        writer.write(forge_tools)
    assert len(list(tmp_path.glob("*.json"))) == 2  # the first batch, whole; nothing of the second
    monkeypatch.setattr(type(writer.ctx), "generate_many", real)
    _, rec = writer.write(forge_tools)
    assert rec["n_cached"] == 2 and rec["n_written"] == 3


@pytest.mark.slow
def test_cli_index_synthesize_builds_vectors_from_the_written_requests(tmp_path):
    reg = tmp_path / "reg.json"
    doc = json.loads(FORGE.read_text())
    doc["tools"] = doc["tools"][:4]
    reg.write_text(json.dumps(doc))
    out = tmp_path / "idx"
    env = {**os.environ, "NEXUS_DEBUG": "0"}
    cmd = [sys.executable, "-m", "nexus_cli.cli", "index", str(reg), "--out", str(out), "--embedder", "minilm",
           "--synthesize", "--synthesize-model", "smollm2-135m"]
    p = subprocess.run(cmd + ["--json"], capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    syn = rep["examples"]["synthesized"]
    assert syn["model"] == "smollm2-135m" and syn["n_tools"] == 4 and syn["n_requests"] == rep["examples"]["n_requests"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["recipe"]["examples"]["synthesized"]["n_tools"] == 4
    tools = load_registries([reg])
    assert syn["n_requests"] > 0  # the requests are vectors of their tools, beside the tools' own texts
    assert rep["n_vectors"] == sum(len(tool_texts(t, "multi")) for t in tools) + syn["n_requests"]
    p = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=600, env=env)
    assert p.returncode == 0 and "0 written now, 4 from the cache" in p.stdout, p.stdout + p.stderr


def test_cli_index_synthesize_refuses_an_unknown_model(tmp_path):
    p = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "index", str(FORGE), "--out", str(tmp_path / "i"),
                        "--synthesize", "--synthesize-model", "no-such-model"],
                       capture_output=True, text=True, cwd=REPO, timeout=120, env={**os.environ, "NEXUS_DEBUG": "0"})
    assert p.returncode != 0 and "unknown model 'no-such-model'" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and not (tmp_path / "i").exists()
