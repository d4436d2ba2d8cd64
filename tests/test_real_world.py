"""The real world: all 955 tools of ../shared/registries load, index (the real `nexus index`), and each yields a
signature and a grammar or a stated reason; over generated requests for a seeded 24-tool sample, the arguments that
SmolLM2-135M generates under each tool's grammar all pass validation against the schema the server sent.
benchmarks/real_world_args.py runs the argument loop over all 955 (figures in docs/reliability.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

from nexus_cli.registry import load_registries
from nexus_cli.schema import compile_tool

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))
from gbnf_match import Grammar  # noqa: E402

N_TOOLS = 955
ARGS_SAMPLE = 24  # ~5 s of CPU per tool with SmolLM2-135M; the full run is benchmarks/real_world_args.py


def _bench():
    spec = importlib.util.spec_from_file_location("real_world_args", REPO / "benchmarks" / "real_world_args.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_every_tool_yields_signature_and_grammar_or_a_reason(shared_registries):
    tools = load_registries([shared_registries])
    assert len(tools) == N_TOOLS
    no_grammar = []
    for t in tools:
        spec = compile_tool(t)
        assert isinstance(spec.signature, str) and spec.signature.startswith(t.name), t.key
        assert not any("internal error" in p for p in spec.problems), (t.key, spec.problems)
        if spec.grammar is None:
            assert spec.problems, f"{t.key}: no grammar and no reason"
            no_grammar.append((t.key, spec.problems))
        else:
            Grammar(spec.grammar)  # parses (the reference GBNF parser)
    print(f"\n[real-world] {len(tools)} tools: {len(tools) - len(no_grammar)} with signature + grammar, "
          f"{len(no_grammar)} with a stated reason {no_grammar[:5]}", file=sys.stderr)


@pytest.mark.slow
def test_all_tools_index(shared_registries, tmp_path):
    out = tmp_path / "index"
    r = subprocess.run([str(REPO / ".venv" / "bin" / "nexus"), "index", str(shared_registries), "--out", str(out),
                        "--json"], cwd=REPO, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    assert report["n_tools"] == N_TOOLS, report
    # by default the tools Nexus ships example requests for get them (all but github-archived's 26)
    assert report["examples"]["n_tools_shipped"] == report["examples"]["n_tools_with"] == 929, report["examples"]
    assert report["examples"]["n_unmatched_tools"] == 0
    tools = json.loads((out / "tools.json").read_text())
    assert len(tools) == N_TOOLS
    failed = [t for t in tools if not t.get("ok", True)]
    for t in failed:
        assert t.get("problems"), f"{t['server']}/{t['name']} failed without a reason"
    print(f"\n[real-world] index: {report['n_tools']} tools, {report['n_vectors']} vectors, "
          f"{len(failed)} schema failures (with reasons)", file=sys.stderr)


@pytest.mark.slow
def test_generated_requests_yield_valid_arguments():
    bench = _bench()
    tools = bench.sample_tools(ARGS_SAMPLE, seed=7)
    res = bench.args_run(tools, "smollm2-135m", seed=7)
    print(f"\n[real-world] args: {res['requests']} requests over {res['tools']} tools, {res['valid']} valid, "
          f"{len(res['failures'])} failures, {len(res['no_grammar'])} without grammar, {res['seconds']} s",
          file=sys.stderr)
    assert res["requests"] == ARGS_SAMPLE - len(res["no_grammar"])
    assert res["failures"] == [], json.dumps(res["failures"][:5], indent=1)
