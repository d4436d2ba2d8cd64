"""nexus route: Router end to end with the real MiniLM embedder over the forge registry; gate; --json; --batch; errors."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nexus_cli.errors import NexusError
from nexus_cli.registry import load_registries
from nexus_cli.routing.build import build_index
from nexus_cli.routing.index import load_index
from nexus_cli.routing.rerank import LikelihoodReranker
from nexus_cli.routing.router import Router, RouterConfig

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"
NEXUS = [sys.executable, "-m", "nexus_cli.cli"]


def run_cli(*args, timeout=300):
    env = {**os.environ, "NEXUS_DEBUG": "0"}
    return subprocess.run([*NEXUS, *args], capture_output=True, text=True, cwd=REPO, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def embedder():
    from nexus_cli.adapters.embedder import Embedder

    return Embedder("minilm")


@pytest.fixture(scope="module")
def forge_dir(tmp_path_factory, embedder):
    out = tmp_path_factory.mktemp("route") / "forge"
    build_index(load_registries([FORGE]), out, embedder=embedder)
    return out


@pytest.fixture(scope="module")
def router(forge_dir, embedder):
    return Router(forge_dir, RouterConfig(reranker="none"), embedder=embedder)


def test_routes_obvious_requests(router):
    # requests phrased with the tools' own vocabulary: any working retriever gets these
    cases = {
        "create a pull request from feature/login into main": "create_pull_request",
        "merge pull request 57 in acme/api": "merge_pull_request",
        "fork the repository acme/api into my account": "fork_repository",
        "list the commits on the main branch of acme/api": "list_commits",
        "add the labels bug and urgent to issue 12": "add_labels",
    }
    for q, tool in cases.items():
        res = router.route(q, with_args=False)
        assert res.tool == tool, (q, res.candidates)
        assert res.server == "forge"


def test_result_shape_and_candidates(router):
    res = router.route("close issue 7 in acme/web", with_args=False)
    d = res.as_json()
    assert set(d) >= {"tool", "server", "arguments", "candidates", "gate", "signature", "timings_ms"}
    assert d["arguments"] is None
    assert len(d["candidates"]) == 5
    scores = [c["score"] for c in d["candidates"]]
    assert scores == sorted(scores, reverse=True)
    assert d["candidates"][0]["tool"] == d["tool"]
    assert set(d["gate"]) == {"margin", "tau", "escalated"}
    assert set(d["timings_ms"]) == {"embed", "scan", "rerank", "args", "total"}
    assert d["signature"].startswith(d["tool"] + "(")
    assert d["gate"]["margin"] == pytest.approx(scores[0] - scores[1], abs=1e-4)


def test_gate_follows_tau(forge_dir, embedder):
    idx = load_index(forge_dir)
    r = Router(idx, RouterConfig(reranker="none"), embedder=embedder)
    q = "show me pull request 42"
    base = r.route(q, with_args=False)
    r.tau = base.gate["margin"] + 1.0  # margin now below tau: must escalate
    assert r.route(q, with_args=False).gate["escalated"] is True
    r.tau = base.gate["margin"] - 1e-3
    assert r.route(q, with_args=False).gate["escalated"] is False


def test_escalation_uses_the_reranker(forge_dir, embedder):
    class Reverse:
        """A reranker that prefers the retriever's last candidate: proves the reranker decides on escalation."""

        def score(self, query, entries, base, context=""):
            return [-float(b) for b in base]

    r = Router(forge_dir, RouterConfig(reranker="none", rerank_k=4), embedder=embedder)
    r._reranker_name, r._reranker = "test", Reverse()
    q = "list open issues"
    r.tau = 10.0
    res = r.route(q, with_args=False)
    plain = Router(forge_dir, RouterConfig(reranker="none"), embedder=embedder).route(q, with_args=False)
    assert res.gate["escalated"] and res.tool == plain.candidates[3].tool
    r.tau = -10.0
    assert r.route(q, with_args=False).tool == plain.tool


def test_value_masking_averages_the_request_with_its_masked_form(forge_dir, embedder):
    idx = load_index(forge_dir)
    assert idx.value_masking and idx.manifest["gate"]["value_masking"]
    on = Router(idx, RouterConfig(reranker="none"), embedder=embedder)
    off = Router(idx, RouterConfig(reranker="none", value_masking=False), embedder=embedder)
    q = "merge acme/api#57 with the title 'Release 2.4'"
    s_on, _ = on.retrieve(q)
    s_off, _ = off.retrieve(q)
    masked, _ = off.retrieve("merge repository issue with the title text")
    # bfloat16 requests (where the CPU has it) embed a batch of two ~5e-4 away from one text at a time
    tol = 1e-6 if embedder.query_precision == "float32" else 2e-3
    np.testing.assert_allclose(s_on, (s_off + masked) / 2, rtol=0, atol=tol)
    assert np.abs(s_on - s_off).max() > 10 * tol  # masking really moved the scores
    # a request with no literal value scores exactly as before
    np.testing.assert_allclose(on.retrieve("list open issues")[0], off.retrieve("list open issues")[0])


def test_lexical_fusion_changes_scores(forge_dir, embedder):
    a = Router(forge_dir, RouterConfig(reranker="none", lex_weight=0.0), embedder=embedder)
    b = Router(forge_dir, RouterConfig(reranker="none", lex_weight=0.5), embedder=embedder)
    sa, _ = a.retrieve("rerun the failed workflow run")
    sb, _ = b.retrieve("rerun the failed workflow run")
    assert not np.allclose(sa, sb)
    assert np.all(sb >= sa - 1e-9)


def test_history_informs_routing_of_follow_ups(forge_dir, embedder):
    from nexus_cli.routing.router import routing_context

    # "retry that" alone says nothing about what "that" is (it routes elsewhere); the previous turn names a run
    history = [{"role": "user", "content": "the nightly workflow run 991 in acme/api failed"},
               {"role": "tool", "content": json.dumps([{"number": i, "title": "x" * 80} for i in range(20)])}]
    ctx = routing_context(history)
    assert "workflow run 991" in ctx and len(ctx) <= 300 and "x" * 80 not in ctx  # payload became a surrogate
    on = Router(forge_dir, RouterConfig(reranker="none"), embedder=embedder)
    off = Router(forge_dir, RouterConfig(reranker="none", history_weight=0.0), embedder=embedder)
    q = "retry that"
    with_h, _ = on.retrieve(q, history)
    without, _ = off.retrieve(q, history)
    alone, _ = on.retrieve(q)
    assert np.allclose(without, alone)  # weight 0: history ignored
    names = [t.name for t in on.index.tools]
    assert names[int(np.argmax(alone))] != "rerun_workflow"
    assert names[int(np.argmax(with_h))] == "rerun_workflow"
    assert on.route(q, history=history, with_args=False).tool == "rerun_workflow"


def test_arguments_model_loads_beside_the_routing(forge_dir, embedder, tmp_path):
    """A route with arguments starts loading the arguments' LLM once the request is encoded; llm() waits for that
    load and hands back its context, and a load that failed is raised by llm() in the caller, not lost in the
    thread. Without arguments nothing is loaded."""
    r = Router(forge_dir, RouterConfig(reranker="none", model="smollm2-135m"), embedder=embedder)
    r.route("close issue 3 in acme/api", with_args=False)
    assert r._llm is None and r._llm_loading is None
    res = r.route("close issue 3 in acme/api")
    assert res.arguments is not None and r._llm_loading is None and r.llm() is r._llm
    missing = tmp_path / "missing.gguf"
    broken = Router(forge_dir, RouterConfig(reranker="none", model=str(missing)), embedder=embedder)
    broken.prefetch_llm()
    with pytest.raises(NexusError):
        broken.llm()


def test_the_reranker_leaves_a_core_to_a_loading_arguments_model(forge_dir, embedder, monkeypatch):
    """While the arguments' model loads in its thread, the reranker's own model decodes on one thread fewer, and
    on all of them again afterwards; with no load in flight its thread count is left alone. The scores are the
    same either way."""
    import threading

    from nexus_cli.adapters.llama import LlamaContext

    calls: list = []
    original = LlamaContext.set_threads
    monkeypatch.setattr(LlamaContext, "set_threads", lambda self, n=None: calls.append(n) or original(self, n))
    r = Router(forge_dir, RouterConfig(reranker="likelihood", model="qwen2.5-1.5b", rerank_model="smollm2-135m"),
               embedder=embedder)
    q = "close issue 3 in acme/api"
    alone = r.route(q, with_args=False, rerank=True)
    assert calls == []
    release = threading.Event()
    r._llm_loading = threading.Thread(target=release.wait, daemon=True)  # a load in flight, as prefetch_llm's
    r._llm_loading.start()
    try:
        beside = r.route(q, with_args=False, rerank=True)
    finally:
        release.set()
        r._llm_loading.join()
        r._llm_loading = None
    n = r.rerank_llm().n_threads
    assert calls == [max(1, n - 1), None]
    assert [c.rerank_score for c in beside.candidates] == [c.rerank_score for c in alone.candidates]


def test_empty_query_is_an_error(router):
    with pytest.raises(NexusError, match="empty"):
        router.route("   ", with_args=False)


def test_unknown_reranker_is_a_clear_error(forge_dir, embedder):
    with pytest.raises(NexusError, match="unknown reranker 'cross'"):
        Router(forge_dir, RouterConfig(reranker="cross"), embedder=embedder)


# ---------------------------------------------------------------------------------------------- CLI


def test_cli_route_json(forge_dir):
    p = run_cli("route", "please merge PR 12 in acme/api", "--index", str(forge_dir), "--no-args", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["tool"] == "merge_pull_request" and d["server"] == "forge"
    assert len(d["candidates"]) == 5 and d["arguments"] is None
    assert {"margin", "tau", "escalated"} == set(d["gate"])


def test_cli_route_panel(forge_dir):
    p = run_cli("route", "create a new branch called hotfix in acme/api", "--index", str(forge_dir), "--no-args")
    assert p.returncode == 0, p.stderr
    assert "create_branch" in p.stdout and "candidates" in p.stdout and "gate" in p.stdout


def test_cli_route_batch(forge_dir, tmp_path):
    f = tmp_path / "q.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in [
        {"id": "a", "query": "merge pull request 3"},
        {"id": "b", "query": "who is the user octocat", "history": [{"role": "user", "content": "hi"}]},
        {"id": 7, "query": "fork acme/api"},
    ]) + "\n")
    p = run_cli("route", "--batch", str(f), "--index", str(forge_dir), "--no-args")
    assert p.returncode == 0, p.stderr
    lines = [json.loads(x) for x in p.stdout.splitlines()]
    assert [x["id"] for x in lines] == ["a", "b", 7]
    assert lines[0]["tool"] == "merge_pull_request" and lines[2]["tool"] == "fork_repository"


def test_cli_route_errors(forge_dir, tmp_path):
    p = run_cli("route", "hello", "--index", str(tmp_path / "nope"), "--no-args")
    assert p.returncode == 1 and "does not exist" in p.stderr and "Traceback" not in p.stderr
    assert len(p.stderr.strip().splitlines()) == 1
    p = run_cli("route", "--index", str(forge_dir), "--no-args")
    assert p.returncode == 2 and "QUERY" in p.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": 1}\n')
    p = run_cli("route", "--batch", str(bad), "--index", str(forge_dir), "--no-args")
    assert p.returncode == 1 and "query" in p.stderr and "Traceback" not in p.stderr
    hist = tmp_path / "h.json"
    hist.write_text('{"role": "user"}')
    p = run_cli("route", "x", "--history", str(hist), "--index", str(forge_dir), "--no-args")
    assert p.returncode == 1 and "history" in p.stderr


@pytest.mark.slow
def test_llm_reranker_scores_each_candidates_name_as_the_answer(forge_dir):
    """The name-choice reranker (real SmolLM2) gives every candidate the log-probability of being the answer: the
    answers are distinct, so their probabilities sum to at most 1; scoring one copy at a time gives the same values as
    scoring all copies in one batch; the same request gives the same scores."""
    from nexus_cli.adapters.llama import LlamaContext, LlamaModel
    from nexus_cli.routing.rerank import LLMReranker

    idx = load_index(forge_dir)
    by_name = {t.name: t for t in idx.tools}
    cands = [by_name[n] for n in ("list_issues", "merge_pull_request", "create_branch", "get_user")]
    model = LlamaModel("smollm2-135m")
    wide = LLMReranker(LlamaContext(model, n_ctx=2048, n_seq_max=LLMReranker.SEQ + 1 + len(cands)))
    narrow = LLMReranker(LlamaContext(model, n_ctx=2048, n_seq_max=LLMReranker.SEQ + 2))  # one copy at a time
    query = "merge pull request 12 in acme/api"
    lp = wide.name_logprobs(query, cands)
    assert len(lp) == len(cands) and all(np.isfinite(x) and x < 0 for x in lp)
    assert float(np.exp(lp).sum()) <= 1.0 + 1e-6
    assert narrow.name_logprobs(query, cands) == pytest.approx(lp, abs=2e-3)
    assert wide.name_logprobs(query, cands) == pytest.approx(lp, abs=1e-6)
    assert wide.choose(query, cands) == int(np.argmax(lp))
    # two candidates of one name are told apart by their server in the answer
    twin = dataclasses.replace(cands[0], server="other")
    assert LLMReranker.label(cands[0], [cands[0], twin]) == f"list_issues ({cands[0].server})"
    assert LLMReranker.label(cands[1], [cands[0], twin, cands[1]]) == "merge_pull_request"


@pytest.mark.slow
def test_llm_reranker_keeps_its_prompt_head_and_decides_alike_whatever_the_cache_holds(forge_dir, tmp_path):
    """The name choice decodes the head every prompt shares (the system turn, the user turn up to the first card)
    apart and keeps it on its sequence between decisions: after a decision the sequence holds the head alone; a
    decision gives the same scores with the head held, after the cache was emptied, after another user of the
    sequence overwrote it (the head is decoded again), and in another process that reads the head back from the
    prefix store (a damaged entry is decoded again); keep_head=False decodes each prompt whole and keeps nothing."""
    from nexus_cli.adapters.llama import LlamaContext, LlamaModel
    from nexus_cli.prefix_store import PrefixStore
    from nexus_cli.routing.rerank import LLMReranker

    idx = load_index(forge_dir)
    by_name = {t.name: t for t in idx.tools}
    cands = [by_name[n] for n in ("list_issues", "merge_pull_request", "create_branch")]
    model = LlamaModel("smollm2-135m")
    seq = LLMReranker.SEQ
    kept = LLMReranker(LlamaContext(model, n_ctx=2048, n_seq_max=seq + 1 + len(cands)))
    ctx = kept.ctx
    head = kept._head_tokens()
    query = "merge pull request 12 in acme/api"
    prompt = kept.prompt(query, cands)
    assert len(head) > 10 and prompt[:len(head)] == head
    assert kept.prompt("list the open issues", cands[::-1])[:len(head)] == head
    lp = kept.name_logprobs(query, cands)  # the head decoded for the first time
    assert ctx.seq_pos_max(seq) == len(head) - 1 and all(ctx.seq_pos_max(seq + 1 + n) == -1 for n in range(3))
    assert kept.name_logprobs(query, cands) == pytest.approx(lp, abs=1e-6)  # the head held
    ctx.clear()
    assert kept.name_logprobs(query, cands) == pytest.approx(lp, abs=1e-6)  # decoded again
    ctx.seq_rm(seq)
    ctx.decode(prompt[:5], 0, seq_id=seq)  # someone else's tokens on the sequence
    assert kept.name_logprobs(query, cands) == pytest.approx(lp, abs=1e-6)
    assert ctx.seq_pos_max(seq) == len(head) - 1
    # the head on disk: decoded and written by one reranker, read back by the next (a fresh context)
    store = PrefixStore(tmp_path / "heads")
    LLMReranker(LlamaContext(model, n_ctx=2048, n_seq_max=seq + 4), store=store).name_logprobs(query, cands)
    assert store.writes == 1 and store.misses == 1 and len(list((tmp_path / "heads").glob("*.npz"))) == 1
    again = PrefixStore(tmp_path / "heads")
    assert LLMReranker(LlamaContext(model, n_ctx=2048, n_seq_max=seq + 4), store=again).name_logprobs(
        query, cands) == pytest.approx(lp, abs=1e-6)
    assert again.hits == 1 and again.writes == 0
    next((tmp_path / "heads").glob("*.npz")).write_bytes(b"not a state")
    damaged = PrefixStore(tmp_path / "heads")
    assert LLMReranker(LlamaContext(model, n_ctx=2048, n_seq_max=seq + 4), store=damaged).name_logprobs(
        query, cands) == pytest.approx(lp, abs=1e-6)
    assert damaged.misses == 1 and damaged.writes == 1
    whole = LLMReranker(LlamaContext(model, n_ctx=2048, n_seq_max=seq + 1 + len(cands)), keep_head=False)
    lw = whole.name_logprobs(query, cands)
    assert whole.ctx.seq_pos_max(seq) == -1
    # decoded in one call or two, the scores differ only by llama.cpp's arithmetic, not in the answer
    assert int(np.argmax(lw)) == int(np.argmax(lp)) and lw == pytest.approx(lp, abs=0.3)


@pytest.mark.slow
def test_the_llm_reranker_runs_on_its_own_model(forge_dir, embedder):
    """`--rerank-model` gives the reranker its own LLM beside the arguments' one; the llm reranker's default is
    config.LLM_RERANKER_MODEL, the likelihood reranker's the arguments' model, except with the default arguments
    model (qwen2.5-1.5b), where it is qwen2.5-0.5b."""
    from nexus_cli.config import ARGUMENTS_LLM, LIKELIHOOD_RERANKER_LLM, LLM_RERANKER_MODEL

    default = Router(forge_dir, RouterConfig(reranker="likelihood"), embedder=embedder)
    assert default.config.model == ARGUMENTS_LLM == "qwen2.5-1.5b"
    assert default.rerank_model == LIKELIHOOD_RERANKER_LLM == "qwen2.5-0.5b"
    for spelled in ("qwen2.5-1.5b", "Qwen2.5-1.5B-coder"):  # an alias of the default is the default
        assert Router(forge_dir, RouterConfig(reranker="likelihood", model=spelled),
                      embedder=embedder).rerank_model == "qwen2.5-0.5b"
    assert Router(forge_dir, RouterConfig(reranker="likelihood", rerank_model="smollm2-135m"),
                  embedder=embedder).rerank_model == "smollm2-135m"
    assert Router(forge_dir, RouterConfig(reranker="llm"), embedder=embedder).rerank_model == LLM_RERANKER_MODEL
    from nexus_cli.models import model_key

    assert model_key("Qwen2.5-1.5B-coder") == model_key("qwen2.5-1.5b") == "qwen2.5-1.5b"
    assert model_key("/m/a.gguf") != model_key("/m/b.gguf")  # paths are not folded together

    assert Router(forge_dir, RouterConfig(reranker="none"), embedder=embedder).rerank_model is None
    r = Router(forge_dir, RouterConfig(reranker="llm", model="smollm2-135m", rerank_model="smollm2-135m"),
               embedder=embedder)
    assert r.rerank_model == "smollm2-135m" and r.rerank_llm() is r.llm()  # one model, one context
    res = r.route("merge pull request 57 in acme/api", with_args=False, rerank=True)
    assert res.reranker == "llm" and len([c for c in res.candidates if c.rerank_score is not None]) == r.rerank_k == 5
    lik = Router(forge_dir, RouterConfig(reranker="likelihood", model="smollm2-135m"), embedder=embedder)
    assert lik.rerank_model == "smollm2-135m"
    cfg = RouterConfig(reranker="llm", model="smollm2-135m")
    assert cfg.rerank_model is None and LLM_RERANKER_MODEL == "qwen2.5-1.5b"


def test_rrf_fuse_ranks_by_both_lists():
    from nexus_cli.routing.rerank import rrf_fuse

    fused = rrf_fuse([0.9, 0.8, 0.1], [-5.0, -1.0, -0.5], k=1)
    assert fused == pytest.approx([1 / 2 + 1 / 4, 1 / 3 + 1 / 3, 1 / 4 + 1 / 2])
    # the second list can overturn the first: candidate 1 is second by retrieval but first by likelihood by far
    fused = rrf_fuse([0.9, 0.8, 0.7, 0.6], [-4.0, -0.5, -3.0, -2.0], k=1)
    assert int(np.argmax(fused)) == 1 and fused[0] < fused[1]
    # ties keep the candidates' order (stable ranks)
    assert rrf_fuse([1.0, 1.0], [0.0, 0.0], k=60)[0] > rrf_fuse([1.0, 1.0], [0.0, 0.0], k=60)[1]


@pytest.mark.slow
def test_likelihood_reranker_scores_requests_under_each_tool(forge_dir):
    """Query likelihood with the real SmolLM2: the cached prefix state gives the same score as a fresh decode of the
    whole text, and a request in a tool's own terms is most probable under that tool."""
    from nexus_cli.adapters.llama import LlamaContext, LlamaModel, log_softmax
    from nexus_cli.routing.rerank import LikelihoodReranker

    idx = load_index(forge_dir)
    by_name = {t.name: t for t in idx.tools}
    cands = [by_name[n] for n in ("merge_pull_request", "list_issues", "create_branch", "get_user")]
    ctx = LlamaContext(LlamaModel("smollm2-135m"), n_ctx=1024)
    rr = LikelihoodReranker(ctx, cache_size=2)
    query = "merge pull request 12 in acme/api"
    lls = [rr.log_likelihood(query, e) for e in cands]
    assert all(np.isfinite(lls)) and all(x < 0 for x in lls)
    assert int(np.argmax(lls)) == 0, lls
    assert len(rr._prefix) == 2  # the LRU is bounded
    # cold prefixes are decoded together (two sequences at a time here), more of them than the LRU holds, one twice
    # (a batch's size changes llama.cpp's kernel paths: scores move by up to ~0.05 nats per token, as they already did
    # between a candidate's continuation scored alone and beside others)
    together = LikelihoodReranker(ctx, cache_size=2).log_likelihoods(query, cands + [cands[0]])
    np.testing.assert_allclose(together, lls + [lls[0]], atol=6e-2)
    assert int(np.argmax(together[:4])) == 0

    # reference: decode prefix + request in one go on a fresh sequence, average the request tokens' log-probs
    e = cands[0]
    prefix = ctx.tokenize(rr.prefix_text(e), add_special=False, parse_special=False)
    q = ctx.tokenize(" " + query, add_special=False, parse_special=False)
    ctx.seq_rm(3)
    ctx.decode(prefix + q, 0, seq_id=3, logits_all=True)
    n = len(prefix + q)
    ref = np.mean([log_softmax(ctx.logits(n - len(q) - 1 + i))[t] for i, t in enumerate(q)])
    ctx.seq_rm(3)
    cached_again = rr.log_likelihood(query, e)  # evicted by the LRU and rebuilt, or still cached
    assert cached_again == pytest.approx(lls[0], abs=1e-3)
    assert lls[0] == pytest.approx(ref, abs=2e-2)
    # a one-token request is scored from the prefix's cached next-token distribution alone, with nothing decoded
    one = ctx.tokenize(" merge", add_special=False, parse_special=False)
    assert len(one) == 1
    ctx.seq_rm(3)
    ctx.decode(prefix, 0, seq_id=3, logits_last=True)
    first_ref = log_softmax(ctx.logits())[one[0]]
    ctx.seq_rm(3)
    assert rr.log_likelihood("merge", e) == pytest.approx(first_ref, abs=2e-2)

    scores = rr.score(query, cands, [0.1, 0.4, 0.3, 0.2])
    assert len(scores) == len(cands) and int(np.argmax(scores)) in (0, 1)

    # score() judges the request with its values masked; the unmasked reranker judges it as written
    assert rr.scored_text(query) == "merge pull request number in repository"
    seen = []
    rr.log_likelihoods = lambda text, entries: seen.append(text) or [0.0] * len(entries)
    rr.score(query, cands, [0.1, 0.4, 0.3, 0.2])
    rr.mask_values = False
    rr.score(query, cands, [0.1, 0.4, 0.3, 0.2])
    assert seen == ["merge pull request number in repository", query]
    assert LikelihoodReranker(ctx).scored_text("42") == "number"


@pytest.mark.slow
def test_likelihood_prefixes_kept_on_disk_give_the_same_scores_in_a_new_process(forge_dir, tmp_path,
                                                                                monkeypatch):
    """PrefixStore: a reranker with an empty memory reads the prefixes an earlier one decoded from disk (nothing is
    decoded for them again) and scores exactly as the one that decoded them; a damaged or refused entry is a miss,
    removed and rewritten; the directory keeps to its size cap."""
    from nexus_cli.adapters.llama import LlamaContext, LlamaModel
    from nexus_cli.prefix_store import PrefixStore
    from nexus_cli.routing.rerank import LikelihoodReranker

    idx = load_index(forge_dir)
    by_name = {t.name: t for t in idx.tools}
    cands = [by_name[n] for n in ("merge_pull_request", "list_issues", "create_branch", "get_user")]
    query = "merge pull request 12 in acme/api"
    model = LlamaModel("smollm2-135m")
    first_ctx = LlamaContext(model, n_ctx=1024, n_seq_max=6)
    store = PrefixStore(tmp_path / "prefixes")
    first = LikelihoodReranker(first_ctx, store=store).log_likelihoods(query, cands)
    files = sorted((tmp_path / "prefixes").glob("*.npz"))
    assert len(files) == 4 and store.writes == 4 and store.hits == 0
    assert not list((tmp_path / "prefixes").glob(".*.tmp"))  # written by rename, nothing half-written left

    second_ctx = LlamaContext(model, n_ctx=1024, n_seq_max=6)  # "a new process": an empty cache and memory
    again = PrefixStore(tmp_path / "prefixes")
    reread = LikelihoodReranker(second_ctx, store=again)
    decoded = []
    real = second_ctx.decode_many
    second_ctx.decode_many = lambda items: decoded.append(len(items)) or real(items)
    assert reread.log_likelihoods(query, cands) == first
    assert decoded == [] and again.hits == 4 and again.writes == 0
    # the key covers the model, the V layout and the text: another layout or text is another entry
    other_layout = LlamaContext(model, n_ctx=1024, n_seq_max=6, flash_attn=not first_ctx.flash_attn)
    assert PrefixStore.key(other_layout, "x") != PrefixStore.key(first_ctx, "x") != PrefixStore.key(first_ctx, "y")

    # a damaged entry is a miss: decoded again, the file replaced
    files[0].write_bytes(b"not an npz")
    third = PrefixStore(tmp_path / "prefixes")
    # (a prefix decoded alone moves by llama.cpp's batch-size numerics, as in the test above)
    np.testing.assert_allclose(LikelihoodReranker(LlamaContext(model, n_ctx=1024, n_seq_max=6), store=third)
                               .log_likelihoods(query, cands), first, atol=6e-2)
    assert third.misses == 1 and third.hits == 3 and third.writes == 1
    # a state llama.cpp refuses (here: the other V layout's) is a miss too
    key = PrefixStore.key(first_ctx, LikelihoodReranker(first_ctx).prefix_text(cands[0]))
    blob, logp, n = third.get(key)
    foreign = LlamaContext(model, n_ctx=1024, n_seq_max=6, flash_attn=not first_ctx.flash_attn)
    foreign.decode(first_ctx.tokenize("some other text", add_special=False), 0, 2)
    odd = foreign.state_seq_get(2)
    third.put(key, (odd, logp, n))
    fourth = PrefixStore(tmp_path / "prefixes")
    np.testing.assert_allclose(LikelihoodReranker(LlamaContext(model, n_ctx=1024, n_seq_max=6), store=fourth)
                               .log_likelihoods(query, cands), first, atol=6e-2)
    assert fourth.misses == 0 and fourth.writes == 1  # read, refused by llama.cpp, decoded and written again
    # the size cap: the oldest files go first
    old = sorted((tmp_path / "prefixes").glob("*.npz"))
    for age, f in enumerate(old):
        os.utime(f, (1_000_000 + age, 1_000_000 + age))
    third.put(key, (blob, logp, n))  # the entry as it was, newest now
    os.utime(tmp_path / "prefixes" / f"{key}.npz", (2_000_000, 2_000_000))
    # room for the two newest and one more of the same size as the newest: the two oldest must go
    keep = [tmp_path / "prefixes" / f"{key}.npz"] + [f for f in reversed(old) if f.name != f"{key}.npz"][:1]
    capped = PrefixStore(tmp_path / "prefixes", max_bytes=sum(f.stat().st_size for f in keep) + keep[0].stat().st_size)
    capped.put("0" * 64, (blob, logp, n))  # the same contents as the newest, so the same size
    left = sorted((tmp_path / "prefixes").glob("*.npz"))
    assert len(left) == 3 and set(keep) < set(left) and (tmp_path / "prefixes" / ("0" * 64 + ".npz")) in left
    # NEXUS_PREFIX_CACHE=off turns the store off for the router
    monkeypatch.setenv("NEXUS_PREFIX_CACHE", "off")
    assert PrefixStore.default() is None
    monkeypatch.setenv("NEXUS_PREFIX_CACHE", str(tmp_path / "elsewhere"))
    assert PrefixStore.default().path == tmp_path / "elsewhere"


def test_likelihood_reranker_reads_a_tools_example_requests(tmp_path, embedder):
    """An index built with example requests stores them per tool; the likelihood reranker reads them (value-masked)
    as earlier requests of the same form, which makes a request phrased like an example more probable under that
    tool than under the same tool without examples (the real SmolLM2)."""
    from dataclasses import replace

    from nexus_cli.adapters.llama import LlamaContext, LlamaModel
    from nexus_cli.routing.rerank import LikelihoodReranker

    examples = {"forge/merge_pull_request": ["squash 'fix login' into main once checks pass", "ship PR 7"]}
    out = tmp_path / "forge-ex"
    build_index(load_registries([FORGE]), out, embedder=embedder, examples=examples)
    idx = load_index(out)
    by_name = {t.name: t for t in idx.tools}
    merge = by_name["merge_pull_request"]
    assert merge.examples == examples["forge/merge_pull_request"] and by_name["list_issues"].examples == []

    ctx = LlamaContext(LlamaModel("smollm2-135m"), n_ctx=1024)
    rr = LikelihoodReranker(ctx)
    cue = LikelihoodReranker.CUE
    text = rr.prefix_text(merge)
    assert text.endswith(f"{cue} squash text into main once checks pass\n{cue} ship PR number\n{cue}")
    plain = replace(merge, examples=[])
    assert rr.prefix_text(plain).endswith(f"\n{cue}") and "ship PR" not in rr.prefix_text(plain)
    shown = LikelihoodReranker.PREFIX_EXAMPLES
    crowded = replace(merge, examples=[f"merge request {chr(97 + i)}" for i in range(shown + 3)])
    assert rr.prefix_text(crowded).count(cue) == shown + 1  # only the first few, then the scored request's cue
    query = "squash 'bump deps' into main once checks pass"
    with_examples = rr.log_likelihoods(rr.scored_text(query), [merge])[0]
    without = LikelihoodReranker(ctx).log_likelihoods(rr.scored_text(query), [plain])[0]
    assert with_examples > without + 0.5, (with_examples, without)


@pytest.mark.slow
def test_auto_reranker_is_the_likelihood_reranker(forge_dir, embedder):
    """Without a trained cross-encoder in the index, `auto` escalates to the LLM's query likelihood (the measured best)."""
    r = Router(forge_dir, RouterConfig(model="smollm2-135m", rerank_k=6), embedder=embedder)
    assert r.reranker_name == "likelihood"
    plain = r.route("merge pull request 57 in acme/api", with_args=False, rerank=False)
    res = r.route("merge pull request 57 in acme/api", with_args=False, rerank=True)
    assert res.reranker == "likelihood" and res.timings_ms["rerank"] > 0
    top6 = {c.tool for c in Router(forge_dir, RouterConfig(reranker="none", top_k=6), embedder=embedder)
            .route("merge pull request 57 in acme/api", with_args=False).candidates}
    assert res.tool in top6  # the reranker reorders the retriever's candidates, it does not invent tools

    # reporting 5 candidates when the reranker judged 4: `score` is the retriever's for all five (one scale),
    # `rerank_score` is set for the four judged ones, which come first
    r4 = Router(forge_dir, RouterConfig(model="smollm2-135m", rerank_k=4, top_k=5), embedder=embedder)
    d = r4.route("merge pull request 57 in acme/api", with_args=False, rerank=True).as_json()
    judged = [c["rerank_score"] is not None for c in d["candidates"]]
    assert judged == [True, True, True, True, False]
    by_retrieval = sorted(d["candidates"], key=lambda c: -c["score"])
    assert {c["tool"] for c in d["candidates"][:4]} == {c["tool"] for c in by_retrieval[:4]}
    assert [c["rerank_score"] for c in d["candidates"][:4]] == sorted((c["rerank_score"] for c in d["candidates"][:4]),
                                                                     reverse=True)
    assert plain.reranker is None


def test_interchangeable_tools_do_not_make_the_gate_escalate(tmp_path, embedder):
    # a second server that serves forge's create_pull_request unchanged (and nothing else)
    forge = json.loads(FORGE.read_text())
    twin = next(t for t in forge["tools"] if t["name"] == "create_pull_request")
    mirror = tmp_path / "mirror.json"
    mirror.write_text(json.dumps({"server": "forge-mirror", "tools": [twin]}))
    out = tmp_path / "idx"
    rep = build_index(load_registries([FORGE, mirror]), out, embedder=embedder)
    assert rep.interchangeable == [["forge/create_pull_request", "forge-mirror/create_pull_request"]]
    r = Router(out, RouterConfig(reranker="none", top_k=5), embedder=embedder)
    res = r.route("open a pull request from feature/login into main", with_args=False)
    assert res.tool == "create_pull_request"
    names = [(c.server, c.tool) for c in res.candidates]
    other = "forge-mirror" if res.server == "forge" else "forge"
    assert (other, "create_pull_request") in names[:2]  # the twin scores (almost) the same
    assert res.interchangeable == [{"server": other, "tool": "create_pull_request"}]
    rival = next(c for c in res.candidates if c.tool != "create_pull_request")
    # the margin is over the best tool that is not the same tool again
    assert res.gate["margin"] == pytest.approx(res.candidates[0].score - rival.score, abs=1e-4)
    twin_gap = res.candidates[0].score - next(c.score for c in res.candidates[1:] if c.tool == "create_pull_request")
    assert twin_gap < 1e-3 < res.gate["margin"]  # top-1/top-2 over the twins would say "ambiguous"
    plain = r.route("list the commits on the main branch of acme/api", with_args=False)
    assert plain.interchangeable == []
    assert plain.as_json()["interchangeable"] == []
    # on escalation the reranker judges distinct tools; the copy follows its tool with the same score
    seen = []

    class Recording:
        def score(self, query, entries, base, context=""):
            seen.append([e.key for e in entries])
            return [float(b) for b in base]

    r._reranker_name, r._reranker, r.rerank_k, r.tau = "test", Recording(), 3, 10.0
    res = r.route("open a pull request from feature/login into main", with_args=False)
    assert len(seen[0]) == 3 and sum(k.endswith("/create_pull_request") for k in seen[0]) == 1
    first, second = res.candidates[:2]
    assert {first.server, second.server} == {"forge", "forge-mirror"} and first.tool == second.tool
    assert first.rerank_score == second.rerank_score is not None


def test_arguments_that_fail_validation_come_back_null_with_the_reason(router, monkeypatch):
    """A final failure is never passed off as arguments: `{}` or a partial object that fails the schema becomes null,
    the reasons in args_error (nexus route then exits 1)."""
    import nexus_cli.arguments as arguments_pkg  # the router imports generate_arguments from it at call time
    from nexus_cli.arguments.pipeline import ArgsResult

    def failing(*_a, **_k):
        return ArgsResult(arguments={}, raw="{}", valid=False, errors=["missing required 'owner'"])

    monkeypatch.setattr(arguments_pkg, "generate_arguments", failing)
    monkeypatch.setattr(router, "llm", lambda: None)
    monkeypatch.setattr(router, "argument_prefixes", lambda: None)
    d = router.route("close issue 7 in acme/web").as_json()
    assert d["arguments"] is None and d["args_error"] == "missing required 'owner'" and "guessed" not in d

    def fine(*_a, **_k):
        return ArgsResult(arguments={"owner": "acme", "repo": "web", "issue_number": 7}, raw="", valid=True,
                          guessed=["issue_number"])

    monkeypatch.setattr(arguments_pkg, "generate_arguments", fine)
    d = router.route("close issue 7 in acme/web").as_json()
    assert d["arguments"] == {"owner": "acme", "repo": "web", "issue_number": 7} and "args_error" not in d
    assert d["guessed"] == ["issue_number"]  # the pipeline's report, passed on as it is
    assert "guessed" not in router.route("close issue 7 in acme/web", with_args=False).as_json()


_ONESHOT = """
import sys
from nexus_cli import cli
cli.skip_teardown = lambda: None  # the check below reads sys.modules once main() returns: it must return
sys.argv = ["nexus", "route", sys.argv[1], "--json", "--no-args", "--index", sys.argv[2]]
try:
    cli.main()
finally:
    sys.stderr.write("LLAMA_LOADED=%s\\n" % ("llama_cpp" in sys.modules))
"""


def test_one_shot_route_loads_llama_cpp_only_when_the_gate_escalates(forge_dir, embedder):
    """A one-shot `nexus route --no-args` loads no LLM for a request the gate routes at once, and loads the
    reranker's for one it escalates (the default reranker of this index is the likelihood one)."""
    r = Router(forge_dir, RouterConfig(reranker="none"), embedder=embedder)
    queries = ["show me pull request 42", "open a PR", "list the open issues in acme/api", "merge it",
               "create a branch called fix/login", "what changed?", "delete the webhook"]
    gates = {q: r.route(q, with_args=False).gate["escalated"] for q in queries}
    assert set(gates.values()) == {True, False}, gates
    for escalated in (False, True):
        q = next(q for q, e in gates.items() if e is escalated)
        p = subprocess.run([sys.executable, "-c", _ONESHOT, q, str(forge_dir)], capture_output=True, text=True,
                           cwd=REPO, timeout=300)
        assert p.returncode == 0, p.stderr
        doc = json.loads(p.stdout)
        assert doc["gate"]["escalated"] is escalated
        assert f"LLAMA_LOADED={escalated}" in p.stderr, (q, p.stderr[-300:])
        if not escalated:
            assert doc["tool"] == r.route(q, with_args=False).tool and "reranker" not in doc


def test_the_name_choice_weighs_its_log_probabilities_by_the_models_own_weight(monkeypatch):
    """LLMReranker.score adds weight x (log p(name) - the best) to the retriever's score, the weight chosen per model
    (config.LLM_RERANKER_WEIGHTS: 0.05 for Qwen2.5-0.5B, 0.1 for Qwen2.5-1.5B), a given weight over either."""
    from types import SimpleNamespace

    from nexus_cli.routing.rerank import LLMReranker

    def ctx(name):
        return SimpleNamespace(model=SimpleNamespace(name=name))

    small, large, other = LLMReranker(ctx("qwen2.5-0.5b")), LLMReranker(ctx("qwen2.5-1.5b")), LLMReranker(ctx("x"))
    assert (small.weight, large.weight, other.weight) == (0.05, 0.1, 0.1)
    assert LLMReranker(ctx("qwen2.5-0.5b"), weight=0.2).weight == 0.2
    for r in (small, large):
        monkeypatch.setattr(r, "name_logprobs", lambda *_a, **_k: [-1.0, -3.0])
        got = r.score("q", ["a", "b"], [0.5, 0.6])
        assert got == pytest.approx([0.5, 0.6 - 2.0 * r.weight])
    # a retriever lead of 0.12 survives the 0.5B's 2-nat preference for the other tool, not the 1.5B's
    assert np.argmax(small.score("q", ["a", "b"], [0.5, 0.62])) == 1
    assert np.argmax(large.score("q", ["a", "b"], [0.5, 0.62])) == 0


def test_a_history_weight_outside_zero_to_one_is_refused():
    from nexus_cli.errors import UsageError

    for bad in (-0.1, 1.5):
        with pytest.raises(UsageError, match="history weight"):
            RouterConfig(history_weight=bad)
    assert RouterConfig(history_weight=1.0).history_weight == 1.0


class _StubLikelihood:
    """The cascade's likelihood judge, with fixed scores in the candidates' order; it records what it read."""

    RRF_K = LikelihoodReranker.RRF_K

    def __init__(self, ll):
        self.ll, self.read = ll, []

    def scored_text(self, query):
        return query.upper()

    def log_likelihoods(self, text, entries):
        self.read.append((text, list(entries)))
        return self.ll[: len(entries)]


class _StubChooser:
    """The cascade's name choice: the retriever's scores, with one unit more for a candidate named "c"."""

    def __init__(self):
        self.calls = 0

    def score(self, query, entries, base, context=""):
        self.calls += 1
        self.read = list(entries)
        return [b + (1.0 if e == "c" else 0.0) for e, b in zip(entries, base)]


def test_the_cascade_asks_the_name_choice_only_where_the_likelihood_disagrees_with_the_retriever():
    """CascadeReranker: the likelihood reads the first LIKELIHOOD_K (two) candidates; where the request is most likely
    after the retriever's first, its reciprocal-rank fusion stands (the other candidates after the two in the
    retriever's order, the name choice never asked); where it is most likely after another, or after the first by
    less than ASK_MARGIN, the name choice's scores over the first CHOICE_K (three) are the answer, the fourth and
    fifth after them in the retriever's order."""
    from nexus_cli.routing.rerank import CascadeReranker, rrf_fuse

    entries, base = ["a", "b", "c", "d", "e"], [0.9, 0.8, 0.7, 0.6, 0.5]
    assert (CascadeReranker.LIKELIHOOD_K, CascadeReranker.CHOICE_K) == (2, 3)
    # a third candidate the request would be most likely after is not read, so it cannot make the cascade ask
    agree, chooser = _StubLikelihood([-1.0, -2.0, -0.5]), _StubChooser()
    cascade = CascadeReranker(agree, chooser)
    got = cascade.score("close it", entries, base)
    assert agree.read == [("CLOSE IT", ["a", "b"])] and chooser.calls == 0 and cascade.asked == 0
    assert got[:2] == rrf_fuse(base[:2], [-1.0, -2.0], LikelihoodReranker.RRF_K)
    assert int(np.argmax(got)) == 0 and min(got[:2]) > got[2] > got[3] > got[4]
    # the retriever's first ahead by less than ASK_MARGIN a token: asked too
    narrow = CascadeReranker(_StubLikelihood([-1.0, -1.0 - CascadeReranker.ASK_MARGIN / 2, -1.5]), chooser)
    assert int(np.argmax(narrow.score("close it", entries, base))) == 2 and narrow.asked == 1 and chooser.calls == 1
    chooser.calls = 0
    disagree = CascadeReranker(_StubLikelihood([-2.0, -1.0, -1.5, -3.0]), chooser)
    got = disagree.score("close it", entries, base, context="earlier")
    assert chooser.calls == 1 and disagree.asked == 1 and int(np.argmax(got)) == 2
    assert chooser.read == ["a", "b", "c"] and len(got) == 5 and min(got[:3]) > got[3] > got[4]


def test_a_route_the_cascade_reranked_says_which_of_its_judges_decided(forge_dir, embedder):
    """RouteResult.name_choice: True where the cascade asked its name choice (the slow kind of decision), False where
    its likelihood decided, absent from the JSON where the cascade did not rerank."""
    from nexus_cli.routing.rerank import CascadeReranker

    r = Router(forge_dir, RouterConfig(reranker="none", rerank_k=4), embedder=embedder)
    r.tau = 10.0  # every decision escalates
    r._reranker_name = "cascade"
    decided = {}
    for name, ll in (("likelihood", [-1.0, -3.0]), ("name choice", [-3.0, -1.0])):
        r._reranker = CascadeReranker(_StubLikelihood(ll), _StubChooser())
        res = r.route("list open issues", with_args=False)
        assert res.reranker == "cascade" and res.as_json()["name_choice"] is res.name_choice
        decided[name] = res.name_choice
    assert decided == {"likelihood": False, "name choice": True}
    r.tau = -10.0  # the fast path: nothing reranked, nothing said
    res = r.route("list open issues", with_args=False)
    assert res.name_choice is None and "name_choice" not in res.as_json()


def test_the_cascade_is_a_reranker_the_router_and_the_cli_accept(forge_dir, embedder):
    from nexus_cli.config import LIKELIHOOD_RERANKER_LLM, LLM_RERANKER_MODEL

    router = Router(forge_dir, RouterConfig(reranker="cascade", warm=False), embedder=embedder)
    assert router.reranker_name == "cascade" and router.rerank_k == 5
    assert router.rerank_model == LLM_RERANKER_MODEL != LIKELIHOOD_RERANKER_LLM
    # auto, over an index without example requests: the cascade with the default model (its name choice runs on the
    # arguments' model), the likelihood reranker with another model or another reranker model
    assert Router(forge_dir, RouterConfig(warm=False), embedder=embedder).reranker_name == "cascade"
    for other in (dict(model="qwen2.5-0.5b"), dict(rerank_model="qwen2.5-0.5b")):
        assert Router(forge_dir, RouterConfig(warm=False, **other), embedder=embedder).reranker_name == "likelihood"
    p = run_cli("route", "x", "--index", str(forge_dir), "--no-args", "--reranker", "bogus")
    assert p.returncode != 0 and "cascade" in p.stderr
