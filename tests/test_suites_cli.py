"""Smoke tests of the measurement suites through the real CLI, with SmolLM2 and tiny parameters.

They check the shape of the results documents (and that files land where they should), never timings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
REGISTRIES = ROOT.parent / "shared" / "registries"

pytestmark = pytest.mark.slow


def _have(name: str) -> bool:
    from nexus_cli.config import MODELS
    from nexus_cli.models import is_verified

    return is_verified(MODELS[name])


def _native() -> bool:
    try:
        from nexus_cli import kernels

        kernels.simd_level()
        return True
    except Exception:  # noqa: BLE001
        return False


needs_smollm = pytest.mark.skipif(not _have("smollm2-135m") or not _native() or not REGISTRIES.is_dir(),
                                  reason="needs SmolLM2, libnexus and ../shared/registries")


def nexus(*args: str, timeout: int = 600) -> dict:
    env = dict(os.environ, NEXUS_THREADS=os.environ.get("NEXUS_THREADS", "2"))
    proc = subprocess.run([sys.executable, "-m", "nexus_cli.cli", *args, "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout)


def _common(doc: dict, suite: str, out: Path) -> None:
    """A SmolLM2 run is a variant of the suite (the main model's figures are latest.json): its own latest files."""
    assert doc["schema"] == "nexus-results/1" and doc["suite"] == suite and doc["variant"] == "smollm2-135m"
    assert doc["environment"]["git"] is not None and doc["environment"]["cpu"]["model"]
    assert doc["models"]["llm"]["sha256"] == "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
    latest = json.loads((out / suite / "latest-smollm2-135m.json").read_text())
    assert latest["created_utc"] == doc["created_utc"] and not (out / suite / "latest.json").exists()
    assert (out / suite / "latest-smollm2-135m.png").read_bytes()[:4] == b"\x89PNG"


@needs_smollm
def test_deep_splice_smoke(tmp_path):
    doc = nexus("bench", "deep-splice", "--model", "smollm2-135m", "--K", "4", "--depths", "160", "--trials", "1",
                "--out", str(tmp_path))
    _common(doc, "deep-splice", tmp_path)
    cell = doc["summary"]["cells"]["K4/d160"]
    assert cell["n_past"] == 160 and cell["R_pct"] == pytest.approx(5.0)
    for mode in ("cold", "warm"):
        sp = cell[mode]["speedup"]
        assert sp["lo"] <= sp["value"] <= sp["hi"] and sp["value"] > 0
        assert cell[mode]["prefill_ms"]["n"] == 1
    assert cell["kl_max"] >= 0 and cell["floor_kl"] >= 0 and isinstance(cell["top1_all"], bool)
    assert len(doc["samples"]["d160"]["cold_prefill_ms"]) == 1
    assert set(doc["summary"]["targets"]) >= {"warm_speedup_d256_ge_3x", "kl_le_floor_where_R100", "cold_speedup_ge_paper"}


@needs_smollm
def test_dkl_smoke(tmp_path):
    doc = nexus("sweep", "dkl", "--model", "smollm2-135m", "--offsets", "0,32", "--queries", "1",
                "--legolink-offset", "32", "--out", str(tmp_path))
    _common(doc, "dkl", tmp_path)
    rows = doc["summary"]["rows"]
    assert [r["offset"] for r in rows] == [0, 32]
    assert all(r["top1"]["n"] == 1 and r["kl_mean"]["value"] >= 0 for r in rows)
    ll = doc["summary"]["legolink"]
    assert ll["offset"] == 32 and ll["k"] == 16 and ll["kl_mean"]["value"] >= 0


@needs_smollm
def test_gate_smoke(tmp_path):
    doc = nexus("sweep", "gate", "--model", "smollm2-135m", "--depths", "128", "--out", str(tmp_path))
    _common(doc, "gate", tmp_path)
    rows = doc["summary"]["rows"]
    assert [(r["n_past"], r["ctx"]) for r in rows] == [(128, "on"), (128, "off")]
    assert all(r["heads"] == 30 * 3 for r in rows)  # SmolLM2: 30 layers x 3 KV heads
    assert all(-1 <= r["rho"]["value"] <= 1 for r in rows)
    assert len(doc["samples"]["d128/on"]["proxy"]) == 90


def _have_minilm() -> bool:
    return _have("minilm")


@needs_smollm
@pytest.mark.skipif(not _have_minilm(), reason="needs the MiniLM embedder")
def test_routing_smoke(tmp_path):
    doc = nexus("bench", "routing", "--sizes", "10", "--max-queries", "3", "--reranker", "none", "--no-oracle",
                "--out", str(tmp_path))
    assert doc["suite"] == "routing" and (tmp_path / "routing" / "latest.png").is_file()
    assert doc["params"]["shipped_examples"] is True  # its indexes as `nexus index` builds them by default
    row = doc["summary"]["rows"][0]
    assert row["size"] == "10" and row["n_queries"] == 3 and row["registry_tools"] == 10
    assert 0 <= row["accuracy"]["lo"] <= row["accuracy"]["value"] <= row["accuracy"]["hi"] <= 1
    assert row["scan_native_us"]["value"] > 0 and row["tau_median"] >= 0
    assert len(doc["samples"]["N=10"]["queries"]) == 3


@needs_smollm
@pytest.mark.skipif(not _have_minilm(), reason="needs the MiniLM embedder")
def test_args_smoke(tmp_path):
    doc = nexus("bench", "args", "--model", "smollm2-135m", "--max-cases", "2", "--pool", "cases", "--reranker", "none",
                "--trials", "1", "--out", str(tmp_path))
    s = doc["summary"]
    assert doc["suite"] == "args" and s["routing"]["n"] == 2
    # by default: the blind set, an index with the shipped example requests
    assert doc["params"]["cases"] == ["benchmarks/queries/args_cases_j.jsonl"]
    assert doc["params"]["examples"].endswith("shared_registries.jsonl")
    assert list(s["by_file"]) == ["args_cases_j.jsonl"] and s["by_file"]["args_cases_j.jsonl"]["cases"] == 2
    assert s["signature_tokens"]["median"] > 0
    if s["routing"]["value"] > 0:
        fa = s["first_arg"]
        assert fa["steady"]["speedup"]["value"] > 0 and 0 < fa["token_saving_turn"] < 1


@needs_smollm
def test_drafts_smoke(tmp_path):
    doc = nexus("bench", "drafts", "--model", "smollm2-135m", "--max-cases", "2", "--out", str(tmp_path))
    s = doc["summary"]
    assert doc["suite"] == "drafts" and doc["variant"] == "smollm2-135m" and s["n_cases"] == 2
    assert doc["params"]["cases"][0] == "benchmarks/queries/args_cases_g.jsonl"
    assert (tmp_path / "drafts" / "latest-smollm2-135m.json").is_file()
    for case in doc["samples"]["cases"]:
        assert case["plain"]["drafted"] == 0 and 0 <= case["drafted"]["accepted"] <= case["drafted"]["drafted"]
        assert case["identical"] == (case["plain"]["arguments"] == case["drafted"]["arguments"])
    assert s["draft_tokens"] > 0 and s["speedup_paired"]["value"] > 0


@pytest.mark.skipif(not _native() or not REGISTRIES.is_dir() or not _have_minilm(),
                    reason="needs libnexus, ../shared/registries and the MiniLM embedder")
def test_routing_lso_smoke(tmp_path):
    """Leave-servers-out routing: an index of the dev servers only, no example requests, the dev servers' own example
    requests routed; every request's gold tool is among the part's tools."""
    split = json.loads((ROOT / "benchmarks" / "server_splits.json").read_text())
    assert not set(split["dev"]) & set(split["train"]) and not set(split["test"]) & set(split["train"])
    doc = nexus("bench", "routing-lso", "--part", "dev", "--embedder", "minilm", "--reranker", "none",
                "--max-queries", "6", "--out", str(tmp_path))
    s, p = doc["summary"], doc["params"]
    assert doc["suite"] == "routing-lso" and p["part"] == "dev" and p["examples"] is None and s["n"] == 6
    assert p["lex_weight"] == 0.2  # the index's own (nexus index's default)
    assert 0 <= s["top1"]["value"] <= s["top3"]["value"] <= 1
    rows = doc["samples"]["queries"]
    assert all(r["gold"].split("/", 1)[0] in split["dev"] for r in rows)
    assert (tmp_path / "routing-lso" / "latest.json").is_file()


@pytest.mark.skipif(not _native() or not REGISTRIES.is_dir() or not _have_minilm() or not _have("smollm2-135m"),
                    reason="needs libnexus, ../shared/registries, the MiniLM embedder and SmolLM2")
def test_routing_lso_times_escalated_decisions_cold_and_warm(tmp_path):
    """Every escalated request is routed again with its candidates' prefixes decoded: the same choice, timed apart
    (the warm decision); `--no-warm` skips that pass."""
    args = ("bench", "routing-lso", "--part", "dev", "--embedder", "minilm", "--reranker", "likelihood",
            "--model", "smollm2-135m", "--max-queries", "8", "--out", str(tmp_path))
    doc = nexus(*args)
    s, rows = doc["summary"], doc["samples"]["queries"]
    escalated = [r for r in rows if r["escalated"]]
    assert escalated and doc["params"]["warm"] is True
    assert all(r["choice_warm"] == r["choice"] and r["ms_warm"] > 0 for r in escalated)
    assert not any("ms_warm" in r for r in rows if not r["escalated"])
    assert s["warm_same_choice"] == len(escalated) == s["ms_escalated_warm"]["median"]["n"] == s["ms_escalated"]["median"]["n"]
    cold = nexus(*args, "--no-warm")["summary"]
    assert "ms_escalated_warm" not in cold and cold["ms_escalated"]["median"]["n"] == len(escalated)


@pytest.mark.skipif(not _native() or not REGISTRIES.is_dir() or not _have_minilm(),
                    reason="needs libnexus, ../shared/registries and the MiniLM embedder")
def test_routing_lso_reports_each_query_set_and_takes_a_history_weight(tmp_path):
    """Requests given another conversation's history (benchmarks/history_pairs.py) are reported per set, and
    `--history-weight` reaches the router."""
    qfile = ROOT / "benchmarks" / "queries" / "routing_dev_servers_history.jsonl"
    doc = nexus("bench", "routing-lso", "--part", "dev", "--embedder", "minilm", "--reranker", "none",
                "--queries", str(qfile), "--max-queries", "4", "--history-weight", "0.2", "--out", str(tmp_path))
    s, p = doc["summary"], doc["params"]
    assert p["history_weight"] == 0.2 and s["n"] == 4 and s["n_follow_up"] == 4
    assert set(s["by_set"]) == {"dev-written+switch", "dev-written+same"}
    assert sum(row["n"] for row in s["by_set"].values()) == 4
    assert all(r["set"] in s["by_set"] for r in doc["samples"]["queries"])


@pytest.mark.skipif(not _native() or not _have_minilm(), reason="needs libnexus and the MiniLM embedder")
def test_a_bench_index_can_be_built_with_another_bm25_weight(tmp_path, monkeypatch):
    """`nexus bench routing-lso --lex-weight W` routes over an index built as `nexus index --lex-weight W`, cached
    apart from the default's."""
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.config import DEFAULT_LEX_WEIGHT
    from nexus_cli.lab import bench_routing
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.index import load_index

    monkeypatch.setattr(bench_routing, "CACHE", tmp_path)
    tools = load_registries([ROOT / "tool_registries" / "github_like.json"])[:6]
    emb = Embedder("minilm")
    default, lighter = bench_routing._index_for(tools, emb), bench_routing._index_for(tools, emb, lex_weight=0.1)
    assert default != lighter and bench_routing._index_for(tools, emb, lex_weight=DEFAULT_LEX_WEIGHT) == default
    assert load_index(default).lex_weight() == DEFAULT_LEX_WEIGHT and load_index(lighter).lex_weight() == 0.1


def test_scattered_indices_spread_over_the_block():
    from nexus_cli.lab.sweep_dkl import scattered_indices

    assert scattered_indices(160, 16) == list(range(0, 160, 10))
    assert scattered_indices(5, 16) == [0, 1, 2, 3, 4]
    idx = scattered_indices(97, 16)
    assert len(idx) == 16 and idx[0] == 0 and idx[-1] < 97 and idx == sorted(set(idx))


@needs_smollm
def test_recomputing_every_block_token_in_place_is_a_full_prefill():
    """The two partial recomputes of the dkl suite, taken to k = S, must give back the text prefill's next-token
    distribution within the floor of a cache that holds another sequence's cells (layout_floor_logits): they repair in
    place with the right causal context, where the bare splice stays above it."""
    from nexus_cli.adapters.llama import kl_divergence, load_model
    from nexus_cli.lab.common import DEFAULT_TOOL, compile_block, context, find_tool
    from nexus_cli.lab.sweep_dkl import layout_floor_logits, legolink_recompute, scattered_recompute
    from nexus_cli.splice.engine import SpliceEngine
    from nexus_cli.splice.fidelity import filler_tokens, query_tokens
    from nexus_cli.splice.render import prefix_tokens

    llm = load_model("smollm2-135m")
    block = compile_block("smollm2-135m", find_tool(DEFAULT_TOOL))
    schema = [int(t) for t in block.tokens]
    S = len(schema)
    hist = prefix_tokens(llm) + filler_tokens(llm, 96)
    n_past = len(hist)
    q = query_tokens(llm, "Open a pull request in acme/api from feature/login into main.")
    ctx = context(llm, n_past + 2 * S + len(q) + 8)  # the head recompute holds a second copy of the block
    try:
        engine = SpliceEngine(ctx)
        ctx.decode(hist, 0, 0, logits_last=False)
        ctx.decode(schema + q, n_past, 0)
        ref = ctx.logits()
        ctx.seq_rm(0, n_past, -1)
        ctx.decode(schema, n_past, 0, logits_last=False)
        ctx.decode(q, n_past + S, 0)
        floor = kl_divergence(ref, ctx.logits())
        layout = kl_divergence(ref, layout_floor_logits(ctx, schema, q, n_past))
        kls = {}
        for name, repair in (("bare", None), ("head", legolink_recompute), ("scattered", scattered_recompute)):
            ctx.seq_rm(0, n_past, -1)
            engine.splice(block, n_past, 0.0, then_tokens=None)
            if repair is not None:
                repair(ctx, schema, n_past, S)
            ctx.decode(q, n_past + S, 0)
            kls[name] = kl_divergence(ref, ctx.logits())
    finally:
        ctx.close()
    bound = 2 * max(floor, layout, 1e-4)
    assert kls["head"] <= bound and kls["scattered"] <= bound, (kls, floor, layout)
    assert kls["bare"] > bound, (kls, floor, layout)  # the block never saw the history: the repair had work to do


@needs_smollm
def test_deep_splice_resumes_a_stopped_run_where_it_stopped(tmp_path, monkeypatch):
    """A run stopped after its first depth keeps that depth on disk; the same run started again measures only the
    second, lists both segments and removes its checkpoint. --fresh, another setting or a dirty tree start over."""
    from nexus_cli.lab import bench_deep_splice as stage
    from nexus_cli.lab import results
    from nexus_cli.lab.common import Progress

    monkeypatch.setattr(results, "git_info", lambda: {"sha": "f" * 40, "short": "ffffffff", "dirty": False})
    seen: list[str] = []

    def stop_at_second_depth(desc):
        seen.append(desc)
        if desc.startswith("depth 192"):
            raise KeyboardInterrupt

    settings = dict(model="smollm2-135m", ks=[4.0], depths=[160, 192], trials=1, out_dir=str(tmp_path),
                    registry_dir=str(REGISTRIES), n_boot=50)
    with pytest.raises(KeyboardInterrupt):
        stage.run(**settings, progress=Progress(on_advance=stop_at_second_depth))
    partial = tmp_path / "deep-splice" / ".partial-smollm2-135m.json"
    kept = json.loads(partial.read_text())
    assert set(kept["samples"]) == {"d160"} and len(kept["segments"]) == 1

    seen.clear()
    doc = stage.run(**settings, progress=Progress(on_advance=seen.append))
    assert seen[:2] == ["depth 160 (kept from an earlier segment)"] * 2 and seen[2:] == ["depth 192"] * 2
    assert doc["samples"]["d160"] == kept["samples"]["d160"]
    assert set(doc["summary"]["cells"]) == {"K4/d160", "K4/d192"} and len(doc["summary"]["segments"]) == 2
    assert any(n.startswith("resumed: 1 depth(s)") for n in doc["notes"]) and not partial.exists()

    # what is kept is used only by the same run: not with --fresh, other settings, or from a dirty tree
    with pytest.raises(KeyboardInterrupt):
        stage.run(**settings, progress=Progress(on_advance=stop_at_second_depth))
    for kwargs in ({"fresh": True}, {"trials": 2}):
        seen.clear()
        with pytest.raises(KeyboardInterrupt):
            stage.run(**{**settings, **kwargs}, progress=Progress(on_advance=stop_at_second_depth))
        assert not any("kept" in d for d in seen)
    partial.unlink()
    monkeypatch.setattr(results, "git_info", lambda: {"sha": "f" * 40, "short": "ffffffff", "dirty": True})
    with pytest.raises(KeyboardInterrupt):
        stage.run(**settings, progress=Progress(on_advance=stop_at_second_depth))
    assert not partial.exists()
