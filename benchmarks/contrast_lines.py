"""Contrast lines among sibling tools, a first look with the retriever alone on the leave-servers-out dev part.

    python benchmarks/contrast_lines.py [--siblings 3] [--out results]

Most routing misses over servers the router never saw pick another tool of the right server (85 of 164 on the dev
part): sibling tools whose descriptions differ by a word ("Generate a violin chart to show ..." against "Generate a
boxplot chart to show ..."), where the request says what the user wants ("showing the density shape") and not the
tool's name. Tool-DE's lever is a document expanded with when-to-use and contrast lines; here the local 1.5B model
writes, for each tool that has siblings, one sentence saying which requests need it rather than its nearest siblings
(the same server's tools closest to it by the router embedder), without naming any tool.

Each line is added to its tool as an extra text (a vector and BM25 words, as an example request is), the dev part's
index is built as `nexus bench routing-lso` builds it otherwise (no example requests, the default embedder), and both
dev sets (the dev servers' example requests and the requests written apart for them) are routed by the retriever
alone with and without the lines, paired request by request. Only the dev part is read. The lines are cached per
tool and siblings under ~/.cache/nexus/contrast/. Writes results/contrast-lines/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli import textgen  # noqa: E402
from nexus_cli.adapters.embedder import Embedder  # noqa: E402
from nexus_cli.adapters.llama import LlamaContext, load_model  # noqa: E402
from nexus_cli.config import DEFAULT_EMBEDDER  # noqa: E402
from nexus_cli.files import atomic_write_json  # noqa: E402
from nexus_cli.lab import stats  # noqa: E402
from nexus_cli.lab.bench_lso import DEV_WRITTEN, dev_sets  # noqa: E402
from nexus_cli.lab.bench_routing import _index_for, gold_keys  # noqa: E402
from nexus_cli.lab.results import Run, model_identity  # noqa: E402
from nexus_cli.routing.router import Router, RouterConfig  # noqa: E402

SUITE = "contrast-lines"
MODEL = "qwen2.5-1.5b"
BATCH = 8
MAX_NEW_TOKENS = 60
DESC_WORDS = 40
REVISION = 1  # of the prompt; bumped when it changes, so older lines are written again
SYSTEM = "You explain how tools of one service differ, for someone choosing between them. You answer in one sentence."
ASK = ("Write one sentence that says what a user's request is about when it needs tool A rather than the other tools: "
       "the situations, goals and words a user would mention. Do not name any tool.")


def card(tool) -> str:
    desc = textgen.truncate_words(textgen.clean_description(tool.description or ""), DESC_WORDS)
    return f"{textgen.readable_name(tool.name)}: {desc or '(no description)'}"


def siblings(tools, vectors: np.ndarray, n: int) -> dict[str, list]:
    """Per tool, the n tools of its own server closest to it (cosine of the router embedder's vectors of card())."""
    out = {}
    for i, t in enumerate(tools):
        same = [j for j, u in enumerate(tools) if u.server == t.server and j != i]
        same.sort(key=lambda j: -float(vectors[i] @ vectors[j]))
        out[t.key] = [tools[j] for j in same[:n]]
    return out


def prompt(tool, others) -> list[dict]:
    lines = "\n".join(f"- {card(o)}" for o in others)
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": f"Service: {tool.server}\nTool A: {card(tool)}\nThe other tools:\n{lines}\n\n{ASK}"}]


def line_key(tool, others) -> str:
    parts = [str(REVISION), MODEL, tool.content_hash(), *[o.content_hash() for o in others]]
    return hashlib.sha256("\x00".join(parts).encode()).hexdigest()[:24]


def write_lines(tools, sibs: dict, cache: Path) -> tuple[dict[str, str], float]:
    """{tool key: its contrast line} for every tool with siblings (read back from the cache or written), and the
    seconds spent writing."""
    cache.mkdir(parents=True, exist_ok=True)
    out, todo = {}, []
    for t in tools:
        if not sibs[t.key]:
            continue
        path = cache / f"{line_key(t, sibs[t.key])}.json"
        try:
            out[t.key] = json.loads(path.read_text(encoding="utf-8"))["line"]
        except (OSError, ValueError, KeyError):
            todo.append(t)
    t0 = time.time()
    if todo:
        ctx = LlamaContext(load_model(MODEL), n_ctx=BATCH * 640, n_batch=2048, n_seq_max=BATCH)
        for b0 in range(0, len(todo), BATCH):
            group = todo[b0:b0 + BATCH]
            prompts = [ctx.model.chat_tokens(prompt(t, sibs[t.key])) for t in group]
            gens = ctx.generate_many(prompts, MAX_NEW_TOKENS, stop=lambda toks: "\n" in ctx.detokenize(toks, special=False))
            for t, toks in zip(group, gens):
                line = " ".join(ctx.detokenize(toks, special=False).split())
                atomic_write_json(cache / f"{line_key(t, sibs[t.key])}.json", {"tool": t.key, "line": line})
                out[t.key] = line
            print(f"[{time.time() - t0:6.0f} s] {min(b0 + BATCH, len(todo))}/{len(todo)} lines written",
                  file=sys.stderr, flush=True)
    return out, time.time() - t0


def route_all(router, qs) -> list[dict]:
    rows = []
    for q in qs:
        res = router.route(q["query"], q.get("history"), with_args=False, rerank=False)
        picks = [f"{c.server}/{c.tool}" for c in res.candidates]
        gold = gold_keys(q)
        rows.append({"id": q.get("id"), "choice": picks[0], "top1": picks[0] in gold, "top3": bool(set(picks[:3]) & gold)})
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--siblings", type=int, default=3)
    ap.add_argument("--out", default="results")
    args = ap.parse_args()

    tools, sets = dev_sets()
    emb = Embedder(DEFAULT_EMBEDDER)
    vecs = np.asarray(emb.encode([card(t) for t in tools]), dtype=np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    sibs = siblings(tools, vecs, args.siblings)
    lines, write_s = write_lines(tools, sibs, Path.home() / ".cache" / "nexus" / "contrast")
    config = RouterConfig(reranker="none", prefix_store=False)
    base = Router(_index_for(tools, emb), config, embedder=emb)
    cand = Router(_index_for(tools, emb, examples={k: [v] for k, v in lines.items()}), config, embedder=emb)
    run = Run(SUITE, {"part": "dev", "tools": len(tools), "with_lines": len(lines), "siblings": args.siblings,
                      "model": MODEL, "revision": REVISION, "sets": {k: len(v) for k, v in sets.items()},
                      "written": str(DEV_WRITTEN.relative_to(ROOT)), "write_s": round(write_s, 1)},
              models={"embedder": model_identity(DEFAULT_EMBEDDER, kind="embedder"), "llm": model_identity(MODEL)})
    summary, samples = {}, {"lines": lines}
    for name, qs in sets.items():
        a, b = route_all(base, qs), route_all(cand, qs)
        fixed = sum(y["top1"] and not x["top1"] for x, y in zip(a, b))
        broken = sum(x["top1"] and not y["top1"] for x, y in zip(a, b))
        summary[name] = {"n": len(qs), "base_top1": stats.wilson(sum(r["top1"] for r in a), len(a)).as_dict(),
                         "lines_top1": stats.wilson(sum(r["top1"] for r in b), len(b)).as_dict(),
                         "base_top3": stats.wilson(sum(r["top3"] for r in a), len(a)).as_dict(),
                         "lines_top3": stats.wilson(sum(r["top3"] for r in b), len(b)).as_dict(),
                         "fixed": fixed, "broken": broken, "sign_test_p": stats.sign_test(fixed, broken)}
        samples[name] = {"base": a, "lines": b}
        s = summary[name]
        print(f"{name} ({len(qs)}): top-1 {s['base_top1']['value'] * 100:.1f} -> {s['lines_top1']['value'] * 100:.1f} %, "
              f"top-3 {s['base_top3']['value'] * 100:.1f} -> {s['lines_top3']['value'] * 100:.1f} %, "
              f"{fixed} fixed / {broken} broken (p = {s['sign_test_p']:.3f})")
    doc = run.write(summary, samples, out_dir=args.out)
    print(doc["files"]["json"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
