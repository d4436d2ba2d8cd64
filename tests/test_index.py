"""nexus index: SLB format round trip, atomic writes, gate calibration, CLI errors. Uses the real MiniLM embedder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nexus_cli import textgen
from nexus_cli.errors import FormatError, NexusError
from nexus_cli.registry import load_registries
from nexus_cli.routing import build as routing_build
from nexus_cli.routing.build import EXAMPLES_PER_TOOL, adversarial_pairs, build_index, match_examples, tool_texts
from nexus_cli.routing.index import DETAIL_KEYS, HEAD_KEYS, load_index
from nexus_cli.routing.router import Router, RouterConfig
from nexus_cli.routing.scoring import dense_tool_scores
from nexus_cli.routing.slb import read_slb, write_slb

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"
NEXUS = [sys.executable, "-m", "nexus_cli.cli"]


def run_cli(*args, cwd=REPO, timeout=300):
    env = {**os.environ, "NEXUS_DEBUG": "0"}
    return subprocess.run([*NEXUS, *args], capture_output=True, text=True, cwd=cwd, timeout=timeout, env=env)


@pytest.fixture(scope="session")
def embedder():
    from nexus_cli.adapters.embedder import Embedder

    return Embedder("minilm")


@pytest.fixture(scope="session")
def forge_tools():
    return load_registries([FORGE])


@pytest.fixture(scope="session")
def forge_index(tmp_path_factory, embedder, forge_tools):
    out = tmp_path_factory.mktemp("idx") / "forge"
    rep = build_index(forge_tools, out, embedder=embedder, sources=[str(FORGE)])
    return out, rep


# ---------------------------------------------------------------------------------------------- text recipes


def test_name_words_and_readable_names():
    assert textgen.name_words("create_pull_request") == ["create", "pull", "request"]
    assert textgen.name_words("getPullRequestFiles") == ["get", "pull", "request", "files"]
    assert textgen.name_words("browser-navigate") == ["browser", "navigate"]
    assert textgen.readable_name("get_pr_diff") == "get pull request diff"


def test_word_characters_are_ascii_letters_digits_and_u00c0_to_uffff():
    """name_words splits at every other character; the separator class is spelled as explicit ranges (it compiles
    faster than its negated form), so every code point is checked against the rule it stands for."""
    for cp in range(0x110000):
        is_word = chr(cp).isascii() and chr(cp).isalnum() or 0xC0 <= cp <= 0xFFFF
        assert bool(textgen._NON_WORD.fullmatch(chr(cp))) != is_word, hex(cp)


def test_probe_queries_are_deterministic_and_from_the_tool(forge_tools):
    import random

    t = next(x for x in forge_tools if x.name == "create_pull_request")
    a = textgen.probe_queries(t, random.Random(1), 4)
    b = textgen.probe_queries(t, random.Random(1), 4)
    assert a == b and 1 <= len(a) <= 4
    assert all(isinstance(q, str) and q for q in a)


# ---------------------------------------------------------------------------------------------- SLB file


def test_slb_roundtrip_and_corruption(tmp_path):
    from nexus_cli import kernels

    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 33)).astype(np.float32)
    q, s = kernels.quantize_i8(x)
    owners = np.array([0, 0, 1, 2, 2, 2, 3])
    p = tmp_path / "slb.bin"
    write_slb(p, ["a", "bé"], [0, 1, 1, 0], ["t0", "t1", "outil_2", "t3"], owners, s, q)
    slb = read_slb(p)
    assert slb.servers == ["a", "bé"] and slb.names == ["t0", "t1", "outil_2", "t3"]
    assert list(slb.tool_server) == [0, 1, 1, 0]
    assert np.array_equal(slb.vectors, q) and np.array_equal(slb.scales, s) and np.array_equal(slb.owners, owners)
    data = bytearray(p.read_bytes())
    data[-1] ^= 0x55
    p.write_bytes(bytes(data))
    with pytest.raises(FormatError, match="checksum"):
        read_slb(p)
    p.write_bytes(bytes(data[:-5]))
    with pytest.raises(FormatError):
        read_slb(p)
    p.write_bytes(b"not an slb file at all" * 8)
    with pytest.raises(FormatError, match="magic"):
        read_slb(p)


def test_dense_scores_match_float_cosine(forge_index, embedder):
    out, _ = forge_index
    idx = load_index(out)
    q = embedder.encode_one("merge the pull request")
    dense, _ = dense_tool_scores(idx.slb, q)
    # reference: dequantized vectors, max per tool
    deq = idx.slb.vectors.astype(np.float32) * idx.slb.scales[:, None]
    ref = np.full(idx.slb.n_tools, -np.inf)
    np.maximum.at(ref, idx.slb.owners, deq @ q)
    assert np.max(np.abs(dense - ref)) < 0.02
    assert int(np.argmax(dense)) == int(np.argmax(ref))


def test_native_scan_step_keeps_every_score_of_the_one_it_replaced(forge_index, embedder):
    """The router's dense step (one native call: quantize, scan, per-tool max, floor) gives the same scores, bit for
    bit, as the top-k scan + NumPy maximum it replaced (`nexus bench latency`'s baseline), and so does the whole
    scan step over both with BM25 fusion; the benchmark's scan measurement checks the same on its own."""
    from nexus_cli.lab.bench_latency import measure_scan, previous_dense
    from nexus_cli.routing.scoring import SCAN_K, request_scores, request_texts

    out, _ = forge_index
    idx = load_index(out)
    assert idx.slb.n_vectors > SCAN_K // 4
    prepared = []
    for q in ["merge the pull request", "open a PR in acme/api from feature/x titled 'Fix login'", "list issues"]:
        texts = request_texts(q, idx.value_masking)
        vecs = list(embedder.encode_few(texts))
        for v in vecs:
            assert np.array_equal(dense_tool_scores(idx.slb, v)[0], previous_dense(idx.slb, v)[0])
        a, _ = request_scores(idx.slb, idx.bm25, idx.lex_weight(), texts, vecs)
        b, _ = request_scores(idx.slb, idx.bm25, idx.lex_weight(), texts, vecs, dense_fn=previous_dense)
        assert np.array_equal(a, b)
        prepared.append((texts, vecs))
    res = measure_scan(idx, prepared, reps=2)
    assert res["identical_scores"] is True and res["product"]["n"] == res["previous"]["n"] == 6


def test_rank_is_a_stable_sort_and_the_gates_margin():
    """The native ranking (kernels.ToolRanker, scoring.rank): the k best tools as a stable descending sort orders them
    (ties to the lower index, NaN last), and gate_margin of the first with its interchangeable copies excluded, also
    when every other tool is a copy of the top one."""
    from nexus_cli import kernels
    from nexus_cli.routing.scoring import gate_margin

    rng = np.random.default_rng(5)
    for trial in range(300):
        n = int(rng.integers(1, 60))
        scores = np.round(rng.standard_normal(n), 1)  # many exact ties
        if trial % 10 == 0:
            scores[rng.integers(0, n)] = np.nan
        if trial % 7 == 0:
            scores[rng.integers(0, n)] = -np.inf
        groups = rng.integers(-3, max(1, n // 3), n).astype(np.int32)
        groups[groups < 0] = -1
        if trial % 11 == 0:
            groups[:] = 0  # one group: no other tool
        twins = {i: tuple(int(j) for j in np.flatnonzero(groups == groups[i]) if j != i) if groups[i] >= 0 else ()
                 for i in range(n)}
        for k in (1, 2, 5, n, n + 3):
            order, margin = kernels.ToolRanker(groups, k).rank(scores)
            want = np.argsort(-scores, kind="stable")[:min(k, n)]
            assert np.array_equal(order, want), (trial, k)
            assert margin == gate_margin(scores, int(want[0]), twins[int(want[0])]), (trial, k)


def test_index_group_ids_name_the_interchangeable_copies(forge_index):
    out, _ = forge_index
    idx = load_index(out)
    ids = idx.group_ids
    assert ids.shape == (len(idx.heads),) and ids.dtype == np.int32
    for i in range(len(ids)):
        twins = idx.interchangeable(i)
        assert (ids[i] == -1) == (not twins)
        assert all(ids[j] == ids[i] for j in twins)


# ---------------------------------------------------------------------------------------------- build


def test_build_index_contents(forge_index, forge_tools):
    out, rep = forge_index
    names = sorted(p.name for p in out.iterdir())
    assert names == ["lexical.json", "manifest.json", "slb.bin", "tool_details.json", "tools.json"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["format"] == "nexus-index" and m["n_tools"] == len(forge_tools) == 24
    assert m["n_vectors"] > m["n_tools"]  # multi-vector recipe
    g = m["gate"]
    assert g["n_pairs"] > 0 and g["n_probes"] > 0
    assert 0.0 < g["fire_rate"] <= 0.35
    assert rep.tau == pytest.approx(g["tau"])
    tools = json.loads((out / "tools.json").read_text())
    details = json.loads((out / "tool_details.json").read_text())
    assert [sorted(t) for t in tools[:1]] == [sorted(HEAD_KEYS)] and [sorted(d) for d in details[:1]] == [sorted(DETAIL_KEYS)]
    n = next(i for i, t in enumerate(tools) if t["name"] == "create_pull_request")
    assert tools[n]["signature"].startswith("create_pull_request(") and "owner" in tools[n]["signature"]
    assert details[n]["grammar"] and "root" in details[n]["grammar"]
    assert m["interchangeable"] == []
    idx = load_index(out)
    assert idx.slb.n_tools == 24 and idx.bm25 is not None
    # no temporary directories left behind
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]


def test_adversarial_pairs_are_nearest_neighbours():
    v = np.eye(4, dtype=np.float32)
    v[1] = [0.8, 0.6, 0, 0]
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    pairs = adversarial_pairs(v)
    assert pairs == [(0, 1)]  # the near-duplicates; the orthogonal tools' "nearest" neighbours are not adversarial
    assert (0, 1) in adversarial_pairs(v, closer_fraction=1.0)
    assert len(adversarial_pairs(v, closer_fraction=1.0)) > 1


def test_adversarial_pairs_leave_out_exact_duplicates():
    # tools 0 and 1 are the same text (two server generations); 2 and 3 are near-duplicates that a reranker can split
    v = np.array([[1, 0, 0, 0], [1, 0.001, 0, 0], [0, 0, 1, 0], [0, 0, 0.8, 0.6], [0, 1, 0, 0]], dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    assert adversarial_pairs(v) == [(2, 3)]
    assert adversarial_pairs(v, duplicate_cosine=1.01) == [(0, 1), (2, 3)]


def test_rebuild_is_atomic_on_failure(tmp_path, embedder, forge_tools, monkeypatch):
    out = tmp_path / "idx"
    build_index(forge_tools[:6], out, embedder=embedder)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def boom(*a, **k):
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(routing_build, "write_slb", boom)  # the name the build calls
    with pytest.raises(RuntimeError):
        build_index(forge_tools, out, embedder=embedder)
    after = {p.name: p.read_bytes() for p in out.iterdir()}
    assert before == after  # the old index is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["idx"]  # temp dir cleaned up


def test_refuses_to_replace_a_foreign_directory(tmp_path, embedder, forge_tools):
    out = tmp_path / "precious"
    out.mkdir()
    (out / "thesis.tex").write_text("do not delete")
    with pytest.raises(NexusError, match="not a Nexus index"):
        build_index(forge_tools[:3], out, embedder=embedder)
    assert (out / "thesis.tex").read_text() == "do not delete"


def test_bad_schema_is_recorded_not_fatal(tmp_path, embedder):
    reg = tmp_path / "odd.json"
    reg.write_text(json.dumps({"server": "odd", "tools": [
        {"name": "fine_tool", "description": "Reads a file from disk", "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}}},
        {"name": "weird_tool", "description": "Has a schema that is a string", "inputSchema": {"type": "string"}},
    ]}))
    rep = build_index(load_registries([reg]), tmp_path / "i", embedder=embedder)
    assert "odd/weird_tool" in rep.problems
    tools = json.loads((tmp_path / "i" / "tools.json").read_text())
    assert tools[1]["ok"] is False and tools[1]["problems"]
    assert json.loads((tmp_path / "i" / "tool_details.json").read_text())[1]["grammar"] is None


def test_a_route_without_arguments_reads_no_tool_details(forge_index, tmp_path):
    """Format 3: a route without arguments reads each tool's head (tools.json) and the manifest's interchangeable
    groups, never tool_details.json; the reranker and the arguments read it on first use, and a damaged one is a
    FormatError then."""
    out, _ = forge_index
    idx = load_index(out)
    r = Router(idx, RouterConfig(reranker="none", warm=False))
    res = r.route("merge pull request 12 in acme/api", with_args=False)
    assert res.tool == "merge_pull_request" and res.signature.startswith("merge_pull_request(")
    assert idx._tools is None
    assert idx.tools[0].grammar is not None and idx._tools is not None
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    (broken / "tool_details.json").write_text("[{\"grammar\": 1}]")
    damaged = load_index(broken)
    assert Router(damaged, RouterConfig(reranker="none", warm=False)).route("merge pull request 12",
                                                                           with_args=False).tool
    with pytest.raises(FormatError, match="tool_details.json does not match slb.bin"):
        damaged.tools


@pytest.mark.parametrize("version", [2, 3])
def test_an_older_format_index_still_loads(forge_index, tmp_path, monkeypatch, version):
    """An index in an older format (3: each tool's BM25 token list in lexical.json instead of each token's postings;
    2: also one tools.json with every field and no groups in the manifest; what `nexus bench latency` gives a
    baseline commit that reads only that) loads with the same entries and routes alike, the same scores."""
    from nexus_cli.lab import bench_latency

    out, _ = forge_index
    monkeypatch.setattr(bench_latency, "WORKTREES", tmp_path)
    assert json.loads((out / "manifest.json").read_text())["version"] == 4
    assert "postings" in json.loads((out / "lexical.json").read_text())
    old = bench_latency._as_format(out, version)
    m = json.loads((old / "manifest.json").read_text())
    assert m["version"] == version and bench_latency._as_format(old, version) == old
    assert "docs" in json.loads((old / "lexical.json").read_text())
    if version == 2:
        assert "interchangeable" not in m and sorted(m["files"]) == ["lexical.json", "slb.bin", "tools.json"]
        assert not (old / "tool_details.json").exists()
    a, b = load_index(out), load_index(old)
    assert b.tools == a.tools and b.heads == a.heads
    for q in ("open a pull request in acme/api from feature/login into main", "list the issues", "merge it"):
        ra = Router(a, RouterConfig(reranker="none", warm=False)).route(q, with_args=False)
        rb = Router(b, RouterConfig(reranker="none", warm=False)).route(q, with_args=False)
        assert ra.as_json()["candidates"] == rb.as_json()["candidates"]
    m["version"] = 1
    (old / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError, match="v1 is not supported"):
        load_index(old)


def test_a_damaged_lexical_file_is_refused(forge_index, tmp_path):
    out, _ = forge_index
    broken = tmp_path / "broken"
    shutil.copytree(out, broken)
    lex = json.loads((broken / "lexical.json").read_text())
    lex["doc_lengths"] = lex["doc_lengths"][:-1]
    (broken / "lexical.json").write_text(json.dumps(lex))
    with pytest.raises(FormatError, match="lexical.json does not match slb.bin"):
        load_index(broken)
    (broken / "lexical.json").write_text("{\"tokens\": []}")
    with pytest.raises(FormatError, match="neither postings nor token lists"):
        load_index(broken)
    (broken / "lexical.json").write_text("{cut")
    with pytest.raises(FormatError, match="lexical.json is unreadable"):
        load_index(broken)


def test_load_index_errors(tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        load_index(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="not a Nexus index"):
        load_index(tmp_path / "empty")


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_index_json(tmp_path):
    out = tmp_path / "cli-idx"
    p = run_cli("index", str(FORGE), "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    rep = json.loads(p.stdout)
    assert rep["n_tools"] == 24 and rep["gate"]["tau"] > 0
    assert rep["interchangeable"] == []  # one server: no copies
    assert (out / "manifest.json").is_file()


def test_cli_index_bad_registry(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    p = run_cli("index", str(bad), "--out", str(tmp_path / "x"))
    assert p.returncode == 1
    assert "not valid JSON" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = run_cli("index", str(tmp_path / "missing.json"), "--out", str(tmp_path / "x"))
    assert p.returncode == 1 and "does not exist" in p.stderr and "Traceback" not in p.stderr
    assert not (tmp_path / "x").exists()


def test_mask_values_replaces_literal_values_by_their_kind():
    from nexus_cli.textgen import mask_values

    assert mask_values("open a PR in acme/api from feature/x titled 'Fix login'") == \
        "open a PR in repository from repository titled text"
    assert mask_values("get me the details of https://github.com/acme/api/pull/512") == "get me the details of github link"
    assert mask_values("show 9fceb02 in rust-lang/rust") == "show commit in repository"
    assert mask_values("close acme/api#58 as a duplicate of #12") == "close repository issue as a duplicate of number"
    assert mask_values("read ~/notes.txt, /etc/hosts and ./a/b") == "read path , path and path"
    assert mask_values("show me README.md from vercel/next.js") == "show me file from repository"
    # apostrophes inside words are not quotes; a request without values is unchanged
    assert mask_values("what's changed that I haven't staged yet?") == "what's changed that I haven't staged yet?"


def test_request_texts_add_the_masked_form_only_when_it_differs():
    from nexus_cli.routing.build import request_texts

    assert request_texts("list my repositories", True) == ["list my repositories"]
    assert request_texts("star acme/api", True) == ["star acme/api", "star repository"]
    assert request_texts("star acme/api", False) == ["star acme/api"]


def test_embedder_uses_the_models_own_query_and_document_prompts(tmp_path, embedder):
    """A model that names "query"/"document" prompts in its config (e5, bge, EmbeddingGemma) gets them: requests and
    probes as queries, tool texts as documents. MiniLM names none, so its texts are embedded as written."""
    from nexus_cli.adapters.embedder import Embedder

    assert embedder.prompts == {}
    prompted = tmp_path / "minilm-prompted"
    prompted.mkdir()
    for item in embedder.path.iterdir():
        (prompted / item.name).symlink_to(item)
    cfg_file = prompted / "config_sentence_transformers.json"
    cfg = json.loads(cfg_file.read_text()) if cfg_file.exists() else {}
    cfg["prompts"] = {"query": "search query: ", "document": "search document: ", "other": "x: "}
    cfg_file.unlink(missing_ok=True)
    cfg_file.write_text(json.dumps(cfg))
    model = Embedder(prompted)
    assert model.prompts == {"query": "search query: ", "document": "search document: "}
    text = "merge the open pull request"
    as_query = embedder.encode_one("search query: " + text)
    as_document = embedder.encode(["search document: " + text])[0]
    np.testing.assert_allclose(model.encode_one(text), as_query, atol=1e-5)
    np.testing.assert_allclose(model.encode_few([text, text + " now"])[0], as_query, atol=1e-5)
    np.testing.assert_allclose(model.encode([text], role="query")[0], as_query, atol=1e-5)
    np.testing.assert_allclose(model.encode([text])[0], as_document, atol=1e-5)
    assert float(as_query @ as_document) < 0.999  # the two roles really differ
    with pytest.raises(ValueError):
        model.encode([text], role="tool")


def test_bfloat16_queries_stay_close_to_float32_and_documents_stay_exact(embedder):
    """Queries may run in bfloat16 (the fast path's main cost); they must stay within a cosine of 0.999 of the float32
    vector and keep unit norm, while documents (the SLB) are always float32."""
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.errors import ModelError

    exact = Embedder("minilm", query_precision="float32")
    half = Embedder("minilm", query_precision="bfloat16")
    texts = ["open a pull request from feature/login into main", "what's the weather in Lisbon tomorrow?"]
    for a, b in ((exact.encode_one(texts[0]), half.encode_one(texts[0])),
                 *zip(exact.encode_few(texts), half.encode_few(texts)),
                 *zip(exact.encode(texts, role="query"), half.encode(texts, role="query"))):
        assert b.dtype == np.float32
        assert abs(float(np.linalg.norm(b)) - 1.0) < 1e-5
        assert 0.999 < float(a @ b) < 1.0 + 1e-6
        assert not np.array_equal(a, b)  # the bfloat16 model really ran
    np.testing.assert_array_equal(exact.encode(texts), half.encode(texts))
    assert embedder.query_precision in ("float32", "bfloat16")  # "auto": whichever this CPU runs natively
    with pytest.raises(ModelError, match="precision must be"):
        Embedder("minilm", query_precision="float16")


# ---------------------------------------------------------------------------------------------- example requests


def test_load_example_requests_parses_dedupes_and_refuses_bad_lines(tmp_path):
    from nexus_cli.registry import load_example_requests

    good = tmp_path / "ex.jsonl"
    good.write_text('{"server": "forge", "tool": "merge_pull_request", "query": "squash  it in"}\n\n'
                    '{"server": "forge", "tool": "merge_pull_request", "query": "squash it in"}\n'
                    '{"server": "forge", "tool": "merge_pull_request", "query": "ship PR 7"}\n'
                    '{"server": "other", "tool": "x", "query": "y"}\n')
    ex = load_example_requests([good])
    assert ex == {"forge/merge_pull_request": ["squash it in", "ship PR 7"], "other/x": ["y"]}
    cases = {
        '{"server": "forge", "tool": "t"}\n': "line 1: 'query' must be a non-empty string",
        '{"server": "forge", "tool": "t", "query": "q"}\n{nope\n': "line 2: not valid JSON",
        '["forge", "t", "q"]\n': "line 1: expected an object",
        "\n\n": "holds no requests",
    }
    for text, message in cases.items():
        bad = tmp_path / "bad.jsonl"
        bad.write_text(text)
        with pytest.raises(FormatError, match=message):
            load_example_requests([bad])
    (tmp_path / "latin1.jsonl").write_bytes(b'{"server": "f", "tool": "t", "query": "caf\xe9"}\n')
    with pytest.raises(FormatError, match="not UTF-8"):
        load_example_requests([tmp_path / "latin1.jsonl"])
    with pytest.raises(FormatError, match="cannot read"):
        load_example_requests([tmp_path / "missing.jsonl"])


def test_example_requests_become_vectors_of_their_tool(tmp_path, embedder, forge_tools):
    cap = EXAMPLES_PER_TOOL
    many = [f"ship pull request number {i} once CI is green" for i in range(cap)]
    many += ["what is a good recipe for potato salad", "translate this poem into Latin"]
    examples = {"forge/merge_pull_request": many, "forge/list_issues": ["which bugs are still open in acme/api"],
                "elsewhere/tool": ["not in this registry"]}
    out = tmp_path / "ex-idx"
    rep = build_index(forge_tools, out, embedder=embedder, examples=examples)
    base = sum(len(tool_texts(t, "multi")) for t in forge_tools)
    assert rep.n_vectors == base + cap + 1  # capped per tool; the unknown tool's request is not used
    assert rep.examples["n_requests"] == cap + 1 and rep.examples["n_tools_with"] == 2
    assert rep.examples["unmatched_sample"] == ["elsewhere/tool"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["recipe"]["examples"] == rep.examples
    idx = load_index(out)
    names = [t.name for t in forge_tools]
    merge = names.index("merge_pull_request")
    # the extra vectors belong to their tool and come after its own texts (main vector still first)
    owned = np.flatnonzero(idx.slb.owners == merge)
    assert len(owned) == len(tool_texts(forge_tools[merge], "multi")) + cap
    assert np.all(np.diff(owned) == 1)
    # a request that is one of the examples now meets its own vector: cosine ~1 for that tool
    dense, _ = dense_tool_scores(idx.slb, embedder.encode_one(many[1]))
    assert int(np.argmax(dense)) == merge and dense[merge] > 0.98
    dense, _ = dense_tool_scores(idx.slb, embedder.encode_one(many[-1]))  # beyond the cap: not stored
    assert dense[merge] < 0.9


def test_example_requests_join_their_tools_bm25_document(tmp_path, embedder, forge_tools):
    """The words of a tool's examples (value-masked, capped like the vectors) are BM25 words of that tool."""
    cap = EXAMPLES_PER_TOOL
    own = ["land the kumquat branch into main in acme/zebrafish"] + [f"merge number {i}" for i in range(cap - 1)]
    examples = {"forge/merge_pull_request": own + ["beyond the cap: rutabaga"]}
    out = tmp_path / "lex-idx"
    build_index(forge_tools, out, embedder=embedder, examples=examples)
    idx = load_index(out)
    merge = [t.name for t in forge_tools].index("merge_pull_request")
    kumquat = idx.bm25.scores(textgen.lex_tokens("kumquat"))
    assert int(np.argmax(kumquat)) == merge and np.count_nonzero(kumquat) == 1
    assert not idx.bm25.scores(textgen.lex_tokens("rutabaga")).any()  # beyond the cap
    assert not idx.bm25.scores(textgen.lex_tokens("zebrafish")).any()  # a value: masked out of the document
    plain = tmp_path / "plain-idx"
    build_index(forge_tools, plain, embedder=embedder)
    assert not load_index(plain).bm25.scores(textgen.lex_tokens("kumquat")).any()


def test_lexical_tokens_split_cjk_text_into_character_pairs():
    """Tokenizer 2: a run of Han, kana or Hangul becomes its overlapping character pairs (a lone character stays
    itself), and CJK, full-width and general punctuation separate words; other text tokenizes as in tokenizer 1."""
    lt = textgen.lex_tokens
    assert lt("抖音热搜") == ["抖音", "音热", "热搜"]
    assert lt("获取抖音热搜榜单，展示当下") == ["获取", "取抖", "抖音", "音热", "热搜", "搜榜", "榜单", "展示", "示当", "当下"]
    assert lt("trains between 杭州 and 南京") == ["train", "between", "杭州", "南京"]
    assert lt("삼성전자 1월") == ["삼성", "성전", "전자", "월"]
    assert lt("少数派「效率技巧」") == ["少数", "数派", "效率", "率技", "技巧"]
    assert lt("the “main” branch…now") == ["main", "branch", "now"]
    for text in ("create_pull_request in acme/api", "café résumé for Zoë", "list the open PRs"):
        assert lt(text) == lt(text, 1)
    assert lt("抖音热搜", 1) == ["抖音热搜"] and lt("the “main” branch", 1) == ["“main”", "branch"]


def test_a_chinese_request_meets_its_tools_chinese_description(tmp_path, embedder):
    """The index records its tokenizer; a request shares character pairs with the tool described in Chinese. An index
    written with tokenizer 1 tokenizes its requests as tokenizer 1 did, and an unknown tokenizer is refused."""
    from nexus_cli.registry import Tool

    tools = [Tool("hub", "get-douyin-trending", "获取抖音热搜榜单，展示当下最热门的社会话题", {"type": "object"}),
             Tool("hub", "get-zhihu-trending", "获取知乎热榜，包含时事热点、社会话题", {"type": "object"}),
             Tool("hub", "get-weather", "Current weather for a city", {"type": "object"})]
    out = tmp_path / "cjk-idx"
    build_index(tools, out, embedder=embedder)
    lexical = json.loads((out / "lexical.json").read_text("utf-8"))
    assert lexical["tokenizer"] == f"textgen.lex_tokens/v{textgen.LEX_TOKENIZER}" and textgen.LEX_TOKENIZER == 2
    idx = load_index(out)
    assert idx.bm25.tokenizer == 2
    scores = idx.bm25.scores(idx.bm25.tokens("抖音热搜"))
    assert int(np.argmax(scores)) == 0 and scores[2] == 0
    # the same postings labelled as tokenizer 1: requests are then tokenized whole, as that index's tools were
    lexical["tokenizer"] = "textgen.lex_tokens/v1"
    (out / "lexical.json").write_text(json.dumps(lexical), "utf-8")
    old = load_index(out)
    assert old.bm25.tokenizer == 1 and old.bm25.tokens("抖音热搜") == ["抖音热搜"]
    lexical["tokenizer"] = "textgen.lex_tokens/v9"
    (out / "lexical.json").write_text(json.dumps(lexical), "utf-8")
    with pytest.raises(FormatError, match="tokenizer"):
        load_index(out)


def test_cli_index_bad_examples_file(tmp_path):
    bad = tmp_path / "ex.jsonl"
    bad.write_text('{"server": "forge", "tool": "merge_pull_request"}\n')
    p = run_cli("index", str(FORGE), "--examples", str(bad), "--out", str(tmp_path / "x"))
    assert p.returncode == 1 and "line 1: 'query' must be a non-empty string" in p.stderr
    assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "x").exists()


def test_finetune_trains_on_the_example_requests(tmp_path, embedder, forge_tools, monkeypatch):
    import nexus_cli.adapters.embedder as embedder_module
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.routing import finetune

    examples = {"forge/merge_pull_request": ["ship PR 7 once it is green", "squash it into main"],
                "forge/list_issues": ["which bugs are still open in acme/api"]}
    per_tool, _ = match_examples(forge_tools, examples)
    seen, bases = [], []
    train = embedder_module.finetune_biencoder

    def spy(base, triples, out, **kw):  # the triples handed to the trainer, and the model each round starts from
        seen.extend(triples)
        bases.append(str(base))
        return train(base, triples, out, **kw)

    monkeypatch.setattr(finetune, "finetune_biencoder", spy)  # the name the fine-tuning calls
    info = finetune.finetune_embedder(forge_tools, embedder, tmp_path / "ft", examples=per_tool, batch_size=8)
    assert "example" in info["data"] and info["n_triples"] == 3
    # 3 requests against their tool's text + 2 against the other request of their tool (the example-positives
    # default), in batches of 8: one step an epoch
    assert info["example_positives"] is finetune.FINETUNE_EXAMPLE_POSITIVES is True and info["n_items"] == 5
    assert info["epochs"] == finetune.FINETUNE_EPOCHS == info["train"]["steps"]
    # the second round (the default) starts from the first round's model, which also mined its negatives, and
    # replaces it in the folder; no round-2 folder is left behind
    assert finetune.FINETUNE_ROUNDS == 2 and info["rounds"] == 2
    second = info["second_round"]
    assert second["epochs"] == finetune.FINETUNE_SECOND_ROUND_EPOCHS == second["train"]["steps"]
    assert bases == [str(embedder.path), str(tmp_path / "ft")] and second["n_items"] == 5
    assert not (tmp_path / "ft.round2").exists()
    docs = {t.name: textgen.doc_text(t) for t in forge_tools}
    gold = {"ship PR 7 once it is green": "merge_pull_request", "squash it into main": "merge_pull_request",
            "which bugs are still open in acme/api": "list_issues"}
    assert sorted(q for q, _, _ in seen[:3]) == sorted(gold)
    for q, pos, negs in seen[:3]:  # one mined hard negative by default
        assert pos == docs[gold[q]] and len(negs) == 1 and negs[0] != pos and negs[0] in docs.values()
    tuned = Embedder(str(tmp_path / "ft"))  # a loadable sentence-transformers folder
    assert tuned.encode_one("squash it into main").shape == (384,)
    # the router embeds requests with it in NumPy: the folder the fine-tuning writes (its own module and pooling
    # formats, its 96-token limit kept in tokenizer_config.json) gives sentence-transformers' float32 vectors
    from nexus_cli.adapters.embedder import NumpyBertEncoder

    numpy_tuned = NumpyBertEncoder(tmp_path / "ft")
    exact = Embedder(str(tmp_path / "ft"), query_precision="float32")
    assert numpy_tuned.max_length == exact.model.max_seq_length
    texts = ["squash it into main", "which bugs are still open in acme/api " * 20]
    assert float(np.abs(numpy_tuned.encode(texts) - exact.encode(texts, role="query")).max()) < 2e-5

    # the folder records how it was trained, so an index built later with it as `--embedder` knows that its
    # embedder was fine-tuned on example requests; the router's `auto` reranker stays off where the index's own
    # tools have example requests too, and reranks a registry without any (tools the embedder never saw)
    from nexus_cli.routing.router import Router, RouterConfig

    assert json.loads((tmp_path / "ft" / finetune.FINETUNE_RECORD).read_text())["on_examples"] is True
    out = tmp_path / "tuned-index"
    build_index(forge_tools, out, embedder=tuned, embedder_name=str(tmp_path / "ft"), examples=examples)
    assert load_index(out).manifest["embedder"]["examples_finetuned"] is True
    assert Router(out, RouterConfig(), embedder=tuned).reranker_name == "none"
    plain = tmp_path / "tuned-index-no-examples"
    build_index(forge_tools, plain, embedder=tuned, embedder_name=str(tmp_path / "ft"))
    assert load_index(plain).manifest["embedder"]["examples_finetuned"] is True
    assert Router(plain, RouterConfig(model="smollm2-135m"), embedder=tuned).reranker_name == "likelihood"
    stock = tmp_path / "stock-index"
    build_index(forge_tools, stock, embedder=embedder)
    assert load_index(stock).manifest["embedder"]["examples_finetuned"] is False
    assert Router(stock, RouterConfig(model="smollm2-135m"), embedder=embedder).reranker_name == "likelihood"


def test_finetune_mines_several_negatives_and_example_positives(tmp_path, embedder, forge_tools, monkeypatch):
    import nexus_cli.adapters.embedder as embedder_module
    from nexus_cli.routing import finetune

    examples = {"forge/merge_pull_request": ["ship PR 7 once it is green", "squash it into main"],
                "forge/list_issues": ["which bugs are still open in acme/api"]}
    per_tool, _ = match_examples(forge_tools, examples)
    seen = {}

    def spy(base, items, out, labels=None, **kw):  # record what the trainer gets instead of training
        seen.update(items=list(items), labels=list(labels))
        return {"steps": 0}

    monkeypatch.setattr(finetune, "finetune_biencoder", spy)  # the name the fine-tuning calls
    info = finetune.finetune_embedder(forge_tools, embedder, tmp_path / "ft", examples=per_tool, n_hard=3, rounds=1,
                                    example_positives=True)
    docs = {t.name: textgen.doc_text(t) for t in forge_tools}
    cls = {d: k for k, d in enumerate(dict.fromkeys(docs.values()))}
    # 3 requests with the tool text as positive, and 2 more (the merge tool has two requests) whose positive is
    # the tool's other request; the list tool's lone request has no other request to pair with
    assert info["n_triples"] == 3 and info["n_items"] == 5 and "3 mined hard negatives" in info["loss"]
    items, labels = seen["items"], seen["labels"]
    for (q, pos, negs), (pos_class, neg_classes) in zip(items, labels):
        owner = "list_issues" if "bugs" in q else "merge_pull_request"
        assert len(negs) == 3 and len(set(negs)) == 3 and docs[owner] not in negs
        assert pos_class == cls[docs[owner]] and neg_classes == [cls[n] for n in negs]
    assert [(q, pos) for q, pos, _ in items[3:]] == [("ship PR 7 once it is green", "squash it into main"),
                                                      ("squash it into main", "ship PR 7 once it is green")]
    with pytest.raises(NexusError, match="n_hard must be at least 1"):
        finetune.finetune_embedder(forge_tools, embedder, tmp_path / "bad", examples=per_tool, n_hard=0)
    with pytest.raises(NexusError, match="rounds must be 1 or 2"):
        finetune.finetune_embedder(forge_tools, embedder, tmp_path / "bad", examples=per_tool, rounds=3)
    # registry-derived requests (no examples) keep one item per request: pairing was measured on examples only
    info = finetune.finetune_embedder(forge_tools, embedder, tmp_path / "ft2", n_queries=2, example_positives=True)
    assert info["example_positives"] is False and info["n_items"] == info["n_triples"] == len(seen["items"])


def test_finetune_skips_the_second_round_when_the_first_spent_the_budget(tmp_path, embedder, forge_tools,
                                                                          monkeypatch):
    import nexus_cli.adapters.embedder as embedder_module
    from nexus_cli.routing import finetune

    per_tool, _ = match_examples(forge_tools, {"forge/list_issues": ["which bugs are open", "open bugs?"]})
    starts = []

    def spy(base, items, out, **kw):  # stands in for a first round that used the whole budget
        Path(out).mkdir(parents=True, exist_ok=True)
        starts.append(str(base))
        return {"steps": 0}

    monkeypatch.setattr(finetune, "finetune_biencoder", spy)  # the name the fine-tuning calls
    info = finetune.finetune_embedder(forge_tools, embedder, tmp_path / "ft", examples=per_tool, time_budget_s=0.0)
    assert starts == [str(embedder.path)] and info["rounds"] == 1
    assert info["second_round"]["skipped"].startswith("the time budget of 0 s was spent")
    assert json.loads((tmp_path / "ft" / finetune.FINETUNE_RECORD).read_text())["second_round"] == info["second_round"]


def test_same_answer_mask_leaves_out_other_texts_of_the_query_s_class():
    from nexus_cli.adapters.embedder import same_answer_mask

    # queries 0 and 1 share a class (two requests of one tool); query 2's hard negative is query 0's class
    mask = same_answer_mask([7, 7, 9], [9, 8, 7])
    assert mask.tolist() == [[False, True, False, False, False, True],
                             [True, False, False, False, False, True],
                             [False, False, False, True, False, False]]


def test_finetune_biencoder_trains_in_both_precisions(tmp_path, embedder):
    from nexus_cli.adapters.embedder import Embedder, finetune_biencoder
    from nexus_cli.errors import ModelError

    triples = [("merge it", "merge a pull request", "list issues"), ("ship it", "ship it now", None)]
    for precision in ("bfloat16", "float32"):
        log = finetune_biencoder(embedder.path, triples, tmp_path / precision, batch_size=2, precision=precision)
        assert log["precision"] == precision and log["steps"] == 1 and np.isfinite(log["loss_last"])
        assert Embedder(str(tmp_path / precision)).encode_one("merge it").shape == (384,)
    with pytest.raises(ModelError, match="precision must be"):
        finetune_biencoder(embedder.path, triples, tmp_path / "bad", precision="fp8")
    with pytest.raises(ModelError, match="one class per positive and per negative"):
        finetune_biencoder(embedder.path, triples, tmp_path / "bad", labels=[(0, []), (1, [])])
    assert not (tmp_path / "bad").exists()


def test_cli_index_rejects_zero_finetune_epochs(tmp_path):
    p = run_cli("index", str(FORGE), "--finetune", "--finetune-epochs", "0", "--out", str(tmp_path / "x"))
    assert p.returncode != 0 and "--finetune-epochs must be at least 1" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x").exists()
    p = run_cli("index", str(FORGE), "--finetune", "--finetune-rounds", "3", "--out", str(tmp_path / "x"))
    assert p.returncode != 0 and "--finetune-rounds must be 1 or 2, got 3" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "x").exists()


def test_cli_index_can_leave_out_example_positives(tmp_path):
    examples = tmp_path / "examples.jsonl"
    examples.write_text("".join(json.dumps({"server": "forge", "tool": t, "query": q}) + "\n" for t, q in [
        ("merge_pull_request", "ship PR 7 once it is green"), ("merge_pull_request", "squash it into main"),
        ("list_issues", "which bugs are still open in acme/api"), ("list_issues", "show me the open tickets")]))
    out = tmp_path / "idx"
    p = run_cli("index", str(FORGE), "--examples", str(examples), "--finetune", "--finetune-epochs", "1",
                "--no-finetune-example-positives", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr
    record = load_index(out).manifest["embedder"]["finetuned"]
    assert record["example_positives"] is False and record["n_items"] == record["n_triples"] == 4
    # the second round ran (the default) and was trained the same way
    assert record["rounds"] == 2 and record["second_round"]["example_positives"] is False
    assert record["second_round"]["n_items"] == 4
