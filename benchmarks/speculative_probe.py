"""Would Qwen2.5-0.5B drafting for Qwen2.5-1.5B pay on top of the argument drafter? Measured, not assumed.

    .venv/bin/python benchmarks/speculative_probe.py --cases benchmarks/queries/args_cases_b.jsonl \
        --out results/drafts/speculative-0.5b/probe-b.json

For each case (the gold tool, the product's prompt and grammar), the 1.5B model writes its answer greedily, one
token a step (the reference tokens T). Then, at every step of T:
- the ArgumentDrafter's guess for that step (arguments/drafts.py): does its first token equal T's next token?
- the 0.5B model, fed the same prompt and T (teacher forcing, one batch), and its greedy next token at each step
  (unconstrained: the grammar could only raise its agreement where T's token is the one the grammar allows).
The decode costs are timed in the same process: one 1.5B token, a 1.5B batch of 4 (the verification of 3 drafted
tokens), one 0.5B token, and each model's prefill of a case's prompt. A simple model of the two schemes then gives
the decode time of each case's answer: (a) the argument drafter alone (steps it covers verified in batches of 4 with
the drafter's guesses, others one 1.5B token each), (b) the same plus, at steps the drafter does not cover, up to 3
0.5B tokens drafted one at a time and verified in a 1.5B batch of 4, the 0.5B prefill of the prompt added once.
It is an estimate built from measured costs and measured agreement, stated as such.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.adapters.llama import LlamaContext, load_model  # noqa: E402
from nexus_cli.arguments.drafts import ArgumentDrafter  # noqa: E402
from nexus_cli.arguments.pipeline import STRING_MIN_BOUND  # noqa: E402
from nexus_cli.arguments.prompt import build_messages, source_text  # noqa: E402
from nexus_cli.lab.bench_routing import load_queries, pool_tools  # noqa: E402
from nexus_cli.lab.common import registry_dir_default  # noqa: E402
from nexus_cli.lab.results import environment, write_json_doc  # noqa: E402
from nexus_cli.schema import compile_tool, with_string_limit  # noqa: E402

MAX_DRAFT = 3


def _timed(fn, reps: int = 9) -> float:
    fn()  # warm-up
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t) * 1e3)
    return statistics.median(ts)


def step_costs(ctx15, ctx05, prompt) -> dict:
    n = len(prompt)
    ctx15.clear()
    ctx15.decode(prompt, 0, 0)
    ctx05.clear()
    ctx05.decode(prompt, 0, 0)

    def one15():
        ctx15.seq_rm(0, n, -1)
        ctx15.decode(prompt[:1], n, 0)

    def four15():
        ctx15.seq_rm(0, n, -1)
        ctx15.decode(prompt[:4], n, 0, logits_all=True)

    def one05():
        ctx05.seq_rm(0, n, -1)
        ctx05.decode(prompt[:1], n, 0)

    return {"one_15b_ms": _timed(one15), "batch4_15b_ms": _timed(four15), "one_05b_ms": _timed(one05)}


def simulate(covered: list[bool], spec_run: list[int], costs: dict) -> tuple[float, float]:
    """Decode ms of (a) drafter alone, (b) drafter + 0.5B drafts, over one answer. covered[i]: the drafter's guess
    at step i is T[i]; spec_run[i]: how many of T[i:i+3] the 0.5B's greedy tokens match in a row."""
    c1, c4, c05 = costs["one_15b_ms"], costs["batch4_15b_ms"], costs["one_05b_ms"]

    def run(with_small: bool) -> float:
        i, t = 0, 0.0
        n = len(covered)
        while i < n:
            if covered[i]:  # a batch verifying the drafter's guesses: up to 3 kept, the step's own token besides
                j = i
                while j < n and covered[j] and j - i < MAX_DRAFT:
                    j += 1
                t += c4
                i = j + 1
            elif with_small:
                k = min(spec_run[i], MAX_DRAFT)
                t += MAX_DRAFT * c05 + c4
                i += k + 1
            else:
                t += c1
                i += 1
        return t

    return run(False), run(True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cases", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--max-cases", type=int)
    a = ap.parse_args()
    t_all = time.perf_counter()
    env = environment()
    m15, m05 = load_model("qwen2.5-1.5b"), load_model("qwen2.5-0.5b")
    probe = "open a pull request in acme/api"
    if m15.tokenize(probe) != m05.tokenize(probe):
        raise SystemExit("the two models tokenize differently: a 0.5B draft could not be verified by the 1.5B")
    ctx15 = LlamaContext(m15, n_ctx=4096, n_batch=512, n_seq_max=1)
    ctx05 = LlamaContext(m05, n_ctx=4096, n_batch=512, n_seq_max=1)
    by_key = {t.key: t for t in pool_tools(registry_dir_default())}
    cases = load_queries(a.cases)[: a.max_cases] if a.max_cases else load_queries(a.cases)
    rows, costs = [], None
    for c in cases:
        spec = compile_tool(by_key[f"{c['server']}/{c['tool']}"])
        messages, window = build_messages(spec, c["query"], c.get("history"))
        prompt = m15.chat_tokens(messages)
        if prompt != m05.chat_tokens(messages):
            raise SystemExit("the two models' chat templates differ")
        source = source_text(c["query"], window)
        source_chars = len(str(c["query"])) + sum(len(m["content"]) for m in window)
        gbnf = with_string_limit(spec.grammar, max(STRING_MIN_BOUND, source_chars + 16))
        if costs is None:
            costs = step_costs(ctx15, ctx05, prompt)
        ctx15.clear()
        ref = ctx15.generate(prompt, max_tokens=256, grammar=gbnf, temperature=0.0)
        T = ref.tokens
        if not T:
            continue
        drafter = ArgumentDrafter(m15, spec.schema, source)
        covered = []
        for i in range(len(T)):
            guess = drafter(T[:i])
            covered.append(bool(guess) and guess[0] == T[i])
        ctx05.clear()
        t0 = time.perf_counter()
        ctx05.decode(prompt, 0, 0)
        prefill05 = (time.perf_counter() - t0) * 1e3
        preds = [int(np.argmax(ctx05.logits(-1)))]
        if len(T) > 1:
            ctx05.decode(T[:-1], len(prompt), 0, logits_all=True)
            preds += [int(np.argmax(ctx05.logits(j))) for j in range(len(T) - 1)]
        agree = [p == t for p, t in zip(preds, T)]
        spec_run = []
        for i in range(len(T)):
            k = 0
            while k < MAX_DRAFT and i + k < len(T) and agree[i + k]:
                k += 1
            spec_run.append(k)
        a_ms, b_ms = simulate(covered, spec_run, costs)
        rows.append({"id": c.get("id"), "tokens": len(T), "drafter_covers": sum(covered),
                     "small_agrees": sum(agree), "small_agrees_where_drafter_does_not":
                         sum(1 for cv, ag in zip(covered, agree) if ag and not cv),
                     "steps_drafter_does_not_cover": sum(1 for cv in covered if not cv),
                     "decode_ms_drafter": a_ms, "decode_ms_drafter_and_small": b_ms + prefill05,
                     "prefill_05b_ms": prefill05})
    tot = {k: sum(r[k] for r in rows) for k in ("tokens", "drafter_covers", "small_agrees",
                                                "small_agrees_where_drafter_does_not", "steps_drafter_does_not_cover")}
    ratios = [r["decode_ms_drafter"] / r["decode_ms_drafter_and_small"] for r in rows]
    summary = {"cases": len(rows), **tot, "costs_ms": costs,
               "small_agreement_where_drafter_does_not_cover": tot["small_agrees_where_drafter_does_not"]
               / max(1, tot["steps_drafter_does_not_cover"]),
               "median_ratio_drafter_over_drafter_and_small": statistics.median(ratios),
               "median_decode_ms_drafter": statistics.median(r["decode_ms_drafter"] for r in rows),
               "median_decode_ms_drafter_and_small": statistics.median(r["decode_ms_drafter_and_small"] for r in rows)}
    doc = {"schema": "nexus-probe/1", "argv": sys.argv, "environment": env, "cases_file": a.cases,
           "wall_s": time.perf_counter() - t_all, "summary": summary, "rows": rows}
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_json_doc(out, doc)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
