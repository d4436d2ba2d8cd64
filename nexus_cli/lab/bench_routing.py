"""Fig. 5 / Table IV: end-to-end routing accuracy against registry size, with the concatenate-all-schemas oracle.

Registries per size N (every size contains every gold tool of its queries, plus distractors drawn reproducibly):
the queries (in file order) are split into groups whose distinct gold tools number at most N/2; each group gets a
registry of its gold tools plus N - |gold| distractors drawn without replacement from the rest of the pool (the
"all" set of benchmarks/registry_sets.json) by `random.Random(f"{seed}/{N}/{group}")`. N = ALL is the whole pool,
one group. Each registry is indexed with the project's index stage (embedder, INT8 SLB, BM25, gate calibration on
registry-derived probes only); indexes are cached under .nexus/bench-routing/ by a hash of their tool list.

Per query: the Router's decision with the gate (the reranker runs only when the margin < tau) — the headline —,
the same with the reranker forced off (the reranker lift is the difference) and forced on; the retriever's top-1 /
top-3 recall (SLB + BM25 fusion, before any reranking) and the dense SLB alone; the gate's escalation; the scan
time in situ (one ctypes call of the native top-k from Python: FFI included) and natively (timed inside libnexus,
`kernels.slb_topk_timed`). A decision is correct when (server, tool) is the gold one or one listed as acceptable.

The default is the product's (`auto`, as `nexus route` chooses per index): the likelihood reranker on escalation
(the LLM's query likelihood fused with the retriever's ranks, docs/routing.md), none for an index whose embedder was
fine-tuned on example requests (`--embedder FOLDER` of such a model); `--reranker none` measures the retriever and
gate alone. A decision also counts as right "+ interchangeable" when it picks the same tool on another server
(`with_interchangeable`).

Oracle: every schema of the registry rendered as `nexus compile` renders it, concatenated into the system turn, then
the query; the LLM answers with a `server/name` constrained by a grammar to the registry's tools (greedy). The
schema prompt is prefilled once per group and reused across its queries. Where the prompt exceeds the oracle
context (--oracle-ctx, default 8192 tokens) the size is reported as overflow with its token count. The oracle runs
on whole groups in file order until --oracle-max-queries (default 100, the paper's query count) are covered.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from pathlib import Path

import numpy as np

from .. import kernels
from ..adapters.embedder import index_embedder
from ..adapters.llama import LlamaContext, load_model
from ..config import DEFAULT_EMBEDDER, DEFAULT_LEX_WEIGHT, DEFAULT_LLM, REPO_ROOT
from ..errors import NexusError, UsageError
from ..registry import load_example_requests, load_registries
from ..routing.build import BUILD_REVISION, build_index, embedder_name_of, match_examples
from ..routing.shipped_examples import with_shipped
from ..routing.router import Router, RouterConfig
from ..routing.scoring import dense_tool_scores
from ..splice.render import render_schema
from . import stats
from .common import NULL_PROGRESS, Progress, registry_dir_default
from .results import Run, model_identity

SUITE = "routing"
DEFAULT_QUERIES = REPO_ROOT / "benchmarks" / "queries" / "routing.jsonl"
SETS_FILE = REPO_ROOT / "benchmarks" / "registry_sets.json"
CACHE = REPO_ROOT / ".nexus" / "bench-routing"
DEFAULTS = dict(sizes="10,50,100,250,ALL", model=DEFAULT_LLM, embedder=DEFAULT_EMBEDDER, max_queries=None)
QUICK = dict(sizes="10,50", max_queries=30, oracle=True)
PAPER = {
    "accuracy": {10: 0.92, 50: 0.90, 100: 0.89, 250: 0.89}, "ci_250": [0.814, 0.937],
    "slb_top1_250": 0.74, "slb_top3_250": 0.95, "oracle": {10: 0.98, "overflow_from": 50},
    "tau": 0.0136, "fire_rate": 0.208, "scan_in_situ_us": 17.6, "scan_native_us": 8.25, "queries": 100,
}


def load_queries(path: str | os.PathLike, max_queries: int | None = None) -> list[dict]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.strip()
            if line:
                out.append(json.loads(line))
    return out[:max_queries] if max_queries else out


def gold_keys(q: dict) -> set[str]:
    keys = {f"{q['server']}/{q['tool']}"}
    for a in q.get("acceptable") or []:
        keys.add(f"{a['server']}/{a['tool']}")
    return keys


def with_interchangeable(keys: set[str], index) -> set[str]:
    """keys plus, for each of them in the index, the same tool on the other servers (registry.interchangeable_groups):
    a second, looser scoring beside the strict one, since no request can prefer one copy of the same tool."""
    pos = {t.key: i for i, t in enumerate(index.tools)}
    out = set(keys)
    for k in keys:
        if k in pos:
            out.update(index.tools[j].key for j in index.interchangeable(pos[k]))
    return out


def pool_tools(registry_dir: Path, set_name: str = "all"):
    sets = json.loads(SETS_FILE.read_text(encoding="utf-8"))["sets"]
    if set_name not in sets:
        raise UsageError(f"registry set '{set_name}' is not in {SETS_FILE}")
    files = [str(registry_dir / f) for f in sets[set_name]["files"]]
    missing = [f for f in files if not Path(f).exists()]
    if missing:
        raise NexusError(f"registry file {missing[0]} is missing", hint="--registry-dir points at ../shared/registries")
    return load_registries(files)


def plan_registries(queries: list[dict], tools: list, size: int | None, seed: int) -> list[tuple[list[int], list]]:
    """[(query indices, registry tools)] for one size (None = ALL)."""
    by_key = {t.key: t for t in tools}
    if size is None:
        return [(list(range(len(queries))), list(tools))]
    cap = max(1, size // 2)
    groups: list[tuple[list[int], list[str]]] = []
    cur_q: list[int] = []
    cur_g: list[str] = []
    for i, q in enumerate(queries):
        g = f"{q['server']}/{q['tool']}"
        if g not in by_key:
            raise NexusError(f"query {q.get('id')}: gold tool {g} is not in the registry pool")
        if g not in cur_g and len(cur_g) >= cap:
            groups.append((cur_q, cur_g))
            cur_q, cur_g = [], []
        cur_q.append(i)
        if g not in cur_g:
            cur_g.append(g)
    if cur_q:
        groups.append((cur_q, cur_g))
    out = []
    keys = [t.key for t in tools]
    for gi, (qi, gold) in enumerate(groups):
        rng = random.Random(f"{seed}/{size}/{gi}")
        rest = [k for k in keys if k not in set(gold)]
        n_extra = max(0, min(size - len(gold), len(rest)))
        extra = rng.sample(rest, n_extra)
        chosen = set(gold) | set(extra)
        out.append((qi, [t for t in tools if t.key in chosen]))  # registry order, not draw order
    return out


def _embedder_key(embedder) -> str:
    """The embedder's folder and its weights' size and mtime (a fine-tune rewritten in place changes them)."""
    path = Path(getattr(embedder, "path", "") or "")
    weights = [w for w in sorted(path.glob("*.safetensors")) + sorted(path.glob("*.bin")) if w.is_file()]
    stamp = [(w.name, w.stat().st_size, int(w.stat().st_mtime)) for w in weights]
    # and the encoder that ran it: sentence-transformers and the NumPy/native encoder agree to ~2e-7, not bit for bit
    return json.dumps({"embedder": str(path.resolve()) if str(path) else getattr(embedder, "name", "?"),
                       "weights": stamp, "encoder": type(embedder).__name__})


def _index_for(tools, embedder, examples: dict | None = None, synthesize=None, lex_weight: float | None = None,
               finetune: bool = False) -> Path:
    """A cached index of `tools`; `synthesize` (a synthesize.RequestWriter) builds it as `nexus index --synthesize`,
    lex_weight as `nexus index --lex-weight` (None: its default), finetune as `nexus index --finetune` (its default
    recipe, from the embedder's model)."""
    parts = sorted(t.content_hash() for t in tools)
    parts.append(_embedder_key(embedder))  # a cached index is only as good as the model that embedded it
    if examples:  # the examples this registry uses are part of what the index is
        parts.append(json.dumps(match_examples(tools, examples)[0], ensure_ascii=False))
    if synthesize is not None:  # and so are the requests written for it (read back from the writer's cache)
        parts.append(json.dumps(synthesize.write(tools)[0], ensure_ascii=False, sort_keys=True))
    if lex_weight is not None and lex_weight != DEFAULT_LEX_WEIGHT:  # the default's key stays what it was
        parts.append(f"lex_weight={float(lex_weight)!r}")
    if finetune:
        parts.append("finetune")
    h = hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]
    path = CACHE / f"idx-{len(tools)}-{h}-r{BUILD_REVISION}"
    if not (path / "manifest.json").is_file():
        # fine-tuning loads the embedder's model by name to train it, so it is given the name alone
        build_index(tools, path, embedder=None if finetune else embedder, embedder_name=embedder_name_of(embedder),
                    examples=examples, synthesize=synthesize, finetune=finetune,
                    lex_weight=DEFAULT_LEX_WEIGHT if lex_weight is None else float(lex_weight))
    return path


# ------------------------------------------------------------------------------------------------------- oracle

ORACLE_SYSTEM = ("You route user requests to tools. The available tools follow, one per \"# Tool\" line, each a JSON "
                 "object with its name, server, description and parameters.\n")
ORACLE_ASK = "Answer with the one tool that serves the user's request, written as server/name."


def _gbnf_literal(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


class Oracle:
    def __init__(self, model_name: str, n_ctx: int):
        self.llm = load_model(model_name)
        self.n_ctx = n_ctx
        self._ctx = None

    def prompt_prefix(self, tools) -> list[int]:
        text = "<|im_start|>system\n" + ORACLE_SYSTEM + "".join(render_schema(t) for t in tools) + ORACLE_ASK + "<|im_end|>\n"
        return self.llm.tokenize(text, add_special=True, parse_special=True)

    def query_tokens(self, q: dict) -> list[int]:
        parts = []
        for turn in q.get("history") or []:
            role = turn.get("role", "user")
            role = role if role in ("user", "assistant") else "user"
            parts.append(f"<|im_start|>{role}\n{turn.get('content', '')}<|im_end|>\n")
        parts.append(f"<|im_start|>user\n{q['query']}<|im_end|>\n<|im_start|>assistant\n")
        return self.llm.tokenize("".join(parts), add_special=False, parse_special=True)

    def context(self):
        if self._ctx is None:
            self._ctx = LlamaContext(self.llm, n_ctx=self.n_ctx, n_batch=512, n_seq_max=1)
        return self._ctx

    def run_group(self, tools, queries: list[dict]) -> list[dict]:
        ctx = self.context()
        prefix = self.prompt_prefix(tools)
        keys = [t.key for t in tools]
        grammar = "root ::= " + " | ".join(_gbnf_literal(k) for k in keys) + "\n"
        ctx.clear()
        t0 = time.perf_counter()
        ctx.decode(prefix, 0, 0, logits_last=False)
        t_prefix = (time.perf_counter() - t0) * 1e3
        out = []
        for q in queries:
            qt = self.query_tokens(q)
            res = ctx.generate(qt, max_tokens=64, grammar=grammar, temperature=0.0, start_pos=len(prefix))
            out.append({"id": q.get("id"), "choice": res.text.strip(), "correct": res.text.strip() in gold_keys(q),
                        "ttft_ms": res.t_first_token_ms, "prefix_ms": t_prefix, "prompt_tokens": len(prefix) + len(qt)})
        return out

    def close(self):
        if self._ctx is not None:
            self._ctx.close()
            self._ctx = None


# --------------------------------------------------------------------------------------------------------- run


def parse_sizes(text: str | list) -> list[int | None]:
    items = text if isinstance(text, list) else [s for s in str(text).replace(" ", "").split(",") if s]
    out = []
    for s in items:
        s = str(s)
        if s.upper() == "ALL":
            out.append(None)
        else:
            try:
                n = int(s)
            except ValueError:
                raise UsageError(f"--sizes takes integers and ALL, not '{s}'") from None
            if n < 2:
                raise UsageError("registry sizes must be >= 2")
            out.append(n)
    return out


def run(
    registry_dir: str | None = None,
    sizes: str = DEFAULTS["sizes"],
    queries: str | None = None,
    model: str = DEFAULT_LLM,
    embedder: str = DEFAULT_EMBEDDER,
    examples: str | None = None,
    shipped_examples: bool = True,
    oracle: bool = True,
    oracle_ctx: int = 8192,
    oracle_max_queries: int | None = 100,
    reranker: str = "auto",
    max_queries: int | None = None,
    seed: int = 0,
    n_boot: int = 2000,
    out_dir: str = "results",
    quick: bool = False,
    progress: Progress = NULL_PROGRESS,
    write: bool = True,
) -> dict:
    reg_dir = Path(registry_dir) if registry_dir else registry_dir_default()
    qpath = Path(queries) if queries else DEFAULT_QUERIES
    size_list = parse_sizes(sizes)
    qs = load_queries(qpath, max_queries)
    tools = pool_tools(reg_dir)
    params = dict(registry_dir=os.path.relpath(reg_dir, REPO_ROOT), sizes=[s or "ALL" for s in size_list],
                  queries=os.path.relpath(qpath, REPO_ROOT), n_queries=len(qs), pool="all", pool_tools=len(tools),
                  model=model, embedder=embedder,
                  examples=os.path.relpath(examples, REPO_ROOT) if examples else None,
                  shipped_examples=shipped_examples, oracle=oracle, oracle_ctx=oracle_ctx,
                  oracle_max_queries=oracle_max_queries, reranker=reranker,
                  max_queries=max_queries, n_boot=n_boot, quick=quick,
                  grouping="queries in file order, <= N/2 distinct gold tools per group, distractors seeded per group")
    models = {"embedder": model_identity(embedder, kind="embedder")}
    if oracle:
        models["llm"] = model_identity(model)
    run_ = Run(SUITE, params, seed=seed, models=models)

    # indexes and requests embedded as `nexus index` and `nexus route --batch` embed them (one encoder for both)
    emb = index_embedder(embedder)
    run_.params["encoder"] = type(emb).__name__
    example_requests = load_example_requests([examples]) if examples else None
    plans = {s: plan_registries(qs, tools, s, seed) for s in size_list}
    progress.set_total(sum(len(qs) for _ in size_list))
    orc = Oracle(model, oracle_ctx) if oracle else None
    rows, samples = [], {}
    shared_llm = None
    try:
        for size in size_list:
            label = "ALL" if size is None else str(size)
            per_q = []
            taus, fires_calib, oracle_rows, oracle_tokens = [], [], [], []
            native_ns, reg_sizes, rerankers_used = [], [], set()
            oracle_fits = False
            if orc is not None:
                for qi, reg in plans[size]:
                    longest_q = max(len(orc.query_tokens(qs[i])) for i in qi)
                    oracle_tokens.append(len(orc.prompt_prefix(reg)) + longest_q)
                oracle_fits = max(oracle_tokens) + 64 <= oracle_ctx
            for gi, (qi, reg) in enumerate(plans[size]):
                # as `nexus index` builds it: the shipped requests for the tools they cover, unless turned off
                ipath = _index_for(reg, emb, with_shipped(reg, example_requests)[0] if shipped_examples
                                   else example_requests)
                router = Router(ipath, RouterConfig(reranker=reranker, model=model,
                                                    prefix_store=False), embedder=emb,
                                llm=shared_llm)
                shared_llm = router._llm  # one LLM context for every size and group (loaded once)
                taus.append(router.tau)
                rerankers_used.add(router.reranker_name)
                fires_calib.append(router.index.manifest["gate"].get("fire_rate"))
                reg_sizes.append(len(reg))
                keys = [t.key for t in router.index.tools]
                for i in qi:
                    q = qs[i]
                    gold = gold_keys(q)
                    r_gate = router.route(q["query"], q.get("history"), with_args=False)
                    # rerankers are deterministic: the gated decision already is the forced one on its side of τ
                    reranking = router.reranker_name != "none"
                    if r_gate.gate["escalated"] and reranking:
                        r_on = r_gate
                        r_off = router.route(q["query"], q.get("history"), with_args=False, rerank=False)
                    else:
                        r_off = r_gate
                        r_on = (router.route(q["query"], q.get("history"), with_args=False, rerank=True)
                                if reranking else r_off)
                    scores, tm = router.retrieve(q["query"], q.get("history"))
                    order = np.argsort(-scores, kind="stable")[:3]
                    qvec = router.embedder.encode_one(q["query"])

                    dense, _ = dense_tool_scores(router.index.slb, qvec)
                    dorder = np.argsort(-dense, kind="stable")[:3]
                    per_q.append({
                        "id": q.get("id"), "set": q.get("set"), "gold": f"{q['server']}/{q['tool']}",
                        "choice": f"{r_gate.server}/{r_gate.tool}",
                        "correct": f"{r_gate.server}/{r_gate.tool}" in gold,
                        "correct_interchangeable": f"{r_gate.server}/{r_gate.tool}" in with_interchangeable(
                            gold, router.index),
                        "correct_no_rerank": f"{r_off.server}/{r_off.tool}" in gold,
                        "correct_always_rerank": f"{r_on.server}/{r_on.tool}" in gold,
                        "escalated": bool(r_gate.gate["escalated"]), "margin": r_gate.gate["margin"],
                        "retr_top1": keys[int(order[0])] in gold, "retr_top3": any(keys[int(j)] in gold for j in order),
                        "slb_top1": keys[int(dorder[0])] in gold, "slb_top3": any(keys[int(j)] in gold for j in dorder),
                        "scan_in_situ_us": tm["scan_native"] * 1e3, "scan_fused_us": tm["scan"] * 1e3,
                        "route_ms": r_gate.timings_ms["total"], "group": gi,
                    })
                    progress.advance(f"N={label}")
                # native scan latency, timed inside libnexus, for one representative query vector of this registry
                qv = router.embedder.encode_one(qs[qi[0]]["query"])
                qq, qsc = kernels.quantize_i8(np.ascontiguousarray(qv.reshape(1, -1), dtype=np.float32))
                slb = router.index.slb
                native_ns.extend(kernels.slb_topk_timed(slb.vectors, slb.scales, qq[0], float(qsc[0]),
                                                        slb.n_vectors, 50, 200).tolist())
                if orc is not None and oracle_fits and (oracle_max_queries is None or len(oracle_rows) < oracle_max_queries):
                    oracle_rows.extend(orc.run_group(reg, [qs[i] for i in qi]))  # whole groups, in file order
            n = len(per_q)
            k_ok = sum(p["correct"] for p in per_q)
            row = {
                "size": label, "n_queries": n, "registries": len(plans[size]),
                "registry_tools": int(np.median(reg_sizes)),
                "accuracy": stats.wilson(k_ok, n),
                # an interchangeable pick (the same tool on another server) counted as right too
                "accuracy_interchangeable": stats.wilson(sum(p["correct_interchangeable"] for p in per_q), n),
                "accuracy_no_rerank": stats.wilson(sum(p["correct_no_rerank"] for p in per_q), n),
                "accuracy_always_rerank": stats.wilson(sum(p["correct_always_rerank"] for p in per_q), n),
                "reranker_lift_pp": 100.0 * (k_ok - sum(p["correct_no_rerank"] for p in per_q)) / n if n else None,
                "retriever_top1": stats.wilson(sum(p["retr_top1"] for p in per_q), n),
                "retriever_top3": stats.wilson(sum(p["retr_top3"] for p in per_q), n),
                "slb_top1": stats.wilson(sum(p["slb_top1"] for p in per_q), n),
                "slb_top3": stats.wilson(sum(p["slb_top3"] for p in per_q), n),
                "reranker": ",".join(sorted(rerankers_used)),  # what `auto` chose for these indexes
                "tau_median": float(np.median(taus)),
                "fire_rate": stats.wilson(sum(p["escalated"] for p in per_q), n),
                "fire_rate_calibration": float(np.median([f for f in fires_calib if f is not None])) if any(f is not None for f in fires_calib) else None,
                "scan_in_situ_us": stats.median_ci([p["scan_in_situ_us"] for p in per_q], n_boot, seed),
                "scan_native_us": stats.median_ci([x / 1e3 for x in native_ns], n_boot, seed),
                "route_ms": stats.median_ci([p["route_ms"] for p in per_q], n_boot, seed),
            }
            by_set = {}
            for sname in sorted({p["set"] for p in per_q if p["set"]}):
                sub = [p for p in per_q if p["set"] == sname]
                by_set[sname] = stats.wilson(sum(p["correct"] for p in sub), len(sub))
            row["accuracy_by_set"] = by_set
            if orc is not None:
                if not oracle_fits:
                    row["oracle"] = {"status": "overflow", "prompt_tokens_max": max(oracle_tokens),
                                     "prompt_tokens_median": int(np.median(oracle_tokens)), "context": oracle_ctx}
                else:
                    ok = sum(r["correct"] for r in oracle_rows)
                    row["oracle"] = {"status": "ran", "accuracy": stats.wilson(ok, len(oracle_rows)),
                                     "prompt_tokens_max": max(oracle_tokens), "context": oracle_ctx,
                                     "ttft_ms": stats.median_ci([r["ttft_ms"] for r in oracle_rows], n_boot, seed)}
            if size is not None and size in PAPER["accuracy"]:
                row["paper_accuracy"] = PAPER["accuracy"][size]
            rows.append(row)
            samples[f"N={label}"] = {"queries": per_q, "scan_native_ns": native_ns,
                                     "oracle": oracle_rows, "oracle_prompt_tokens": oracle_tokens}
    finally:
        if orc is not None:
            orc.close()

    near250 = next((r for r in rows if r["size"] == "250"), None)
    summary = {
        "rows": rows,
        "paper": PAPER,
        "target_ge_95_at_250": (near250["accuracy"].value >= 0.95) if near250 else None,
    }
    if not write:
        return run_.document(summary, samples)
    return run_.write(summary, samples, out_dir=out_dir, figure=lambda plt: figure(plt, rows))


def figure(plt, rows):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    labels = [r["size"] for r in rows]
    xs = list(range(len(rows)))
    acc = [r["accuracy"] for r in rows]
    ax.errorbar(xs, [a.value * 100 for a in acc], yerr=[[100 * (a.value - a.lo) for a in acc], [100 * (a.hi - a.value) for a in acc]],
                marker="o", capsize=3, label="Nexus (gated reranker), Wilson 95 % CI")
    nr = [r["accuracy_no_rerank"] for r in rows]
    ax.plot(xs, [a.value * 100 for a in nr], marker=".", ls=":", label="retriever only (no reranker)")
    pp = [(i, r["paper_accuracy"] * 100) for i, r in enumerate(rows) if "paper_accuracy" in r]
    if pp:
        ax.plot(*zip(*pp), marker="x", ls="--", color="grey", label="paper (14B, 100 GitHub queries)")
    for i, r in enumerate(rows):
        o = r.get("oracle")
        if not o:
            continue
        if o["status"] == "ran":
            a = o["accuracy"]
            ax.errorbar([i], [a.value * 100], yerr=[[100 * (a.value - a.lo)], [100 * (a.hi - a.value)]], marker="s",
                        color="tab:red", capsize=3, ls="none", label="concatenate-all oracle" if i == 0 else None)
        else:
            ax.annotate(f"oracle overflow\n{o['prompt_tokens_max']} tok", (i, 50), ha="center", fontsize=7, color="tab:red")
    ax.set_xticks(xs, labels)
    ax.set_xlabel("registry size N (tools)")
    ax.set_ylabel("routing accuracy (%)")
    ax.set_ylim(0, 102)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower left")
    ax.set_title("Routing accuracy vs registry size (Fig. 5)", fontsize=10)
    fig.tight_layout()
    return fig
