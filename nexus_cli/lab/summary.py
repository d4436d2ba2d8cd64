"""Markdown tables of the latest results beside the paper's numbers (../shared/design/anchors.md).

    nexus results summary [--out results] [--readme]   # writes results/SUMMARY.md and prints it

Every number is read from results/<suite>/latest.json; nothing is typed in by hand except the paper's column.
"""

from __future__ import annotations

from pathlib import Path

from ..config import REPO_ROOT
from ..files import atomic_write_bytes
from .results import latest_name, load_latest, variants


def _ci(iv, digits=1, scale=1.0, suffix=""):
    if not iv or iv.get("value") is None:
        return "—"
    return f"{iv['value'] * scale:.{digits}f}{suffix} [{iv['lo'] * scale:.{digits}f}, {iv['hi'] * scale:.{digits}f}]"


def _sp(s):
    return "—" if not s else f"{s['value']:.2f}x [{s['lo']:.2f}, {s['hi']:.2f}]"


def _floor_bound(worst: float) -> str:
    """"floor 0" when every floor was exactly 0, else its bound."""
    return "floor 0" if worst == 0 else f"floor ≤ {_kl(worst)}"


def _kl(v):
    if v is None:
        return "—"
    return "0" if v == 0 else (f"{v:.1e}" if v < 1e-3 else f"{v:.4f}")


def _paper_cell(pp):
    return "—" if not pp else f"{pp['speedup']:.2f}x ({pp['prefill_ms']}/{pp['splice_ms']} ms)"


def _pct0(v):
    return "—" if v is None else f"{v * 100:.0f}"


def _load(cpu: dict) -> str:
    if cpu.get("loadavg_1m_start") is not None:
        return f"load avg {cpu['loadavg_1m_start']:.1f} at start, {cpu.get('loadavg_1m') or 0:.1f} at end"
    return f"load avg {cpu.get('loadavg_1m') or 0:.1f} at end"


def _params_brief(p: dict) -> str:
    keys = ("model", "trials", "depths", "ks", "offsets", "queries", "sizes", "n_queries", "n_cases", "quick")
    return ", ".join(f"{k}={p[k]}" for k in keys if k in p)


def _machine(doc):
    env = doc["environment"]
    cpu = env["cpu"]
    git = env["git"]
    m = next(iter(doc.get("models", {}).values()), {}) or {}
    return (f"{cpu['model']}, {cpu['usable_cores']} cores, SIMD {env.get('simd_level') or '?'}; {_load(cpu)}; git {git['short']}{'+dirty' if git['dirty'] else ''}; "
            f"model {m.get('name', '—')} ({(m.get('sha256') or '')[:12]}); {doc['created_utc']}; wall {doc['wall_s'] / 60:.1f} min")


def deep_splice(doc) -> list[str]:
    s = doc["summary"]
    p = doc["params"]
    out = [f"### Deep splice (Table III, Fig. 4) — n = {p['trials']} trials/cell, S = {s['S']} schema tokens",
           "", f"_{_machine(doc)}_", "",
           "| K | n_past | R % | cold prefill ms | cold splice ms | cold speedup | paper | warm prefill ms | warm splice ms | warm speedup | top-1 | KL max | floor |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for _, c in sorted(s["cells"].items(), key=lambda kv: (kv[1]["K"], kv[1]["depth"])):
        pp = c.get("paper")
        out.append(
            f"| {c['K']:g} | {c['depth']} | {c['R_pct']:.1f} | {_ci(c['cold']['prefill_ms'], 0)} | {_ci(c['cold']['splice_ms'], 0)} | "
            f"{_sp(c['cold']['speedup'])} | {_paper_cell(pp)} | "
            f"{_ci(c['warm']['prefill_ms'], 1)} | {_ci(c['warm']['splice_ms'], 1)} | {_sp(c['warm']['speedup'])} | "
            f"{'OK' if c['top1_all'] else 'flip'} | {_kl(c['kl_max'])} | {_kl(c['floor_kl'])} |")
    tg = s["targets"]
    out += ["", f"Targets: warm speedup ≥ 3x at n_past 256 with top-1 kept — {'met' if tg['warm_speedup_d256_ge_3x']['met'] else 'missed'} "
            f"({', '.join(f'{k}: {v:.2f}x' for k, v in tg['warm_speedup_d256_ge_3x']['values'].items())}); "
            f"KL ≤ floor where R = 100 % — {tg['kl_le_floor_where_R100']['met']}; "
            f"cold speedup ≥ paper in every cell — {'met' if tg['cold_speedup_ge_paper']['met'] else 'missed'}"
            + (f" (short by {tg['cold_speedup_ge_paper']['shortfall']})" if tg['cold_speedup_ge_paper']['shortfall'] else "") + "."]
    return out


def dkl(doc) -> list[str]:
    s = doc["summary"]
    out = [f"### Bare-splice KL vs offset (Fig. 1) — {doc['params']['queries']} queries/offset", "", f"_{_machine(doc)}_", "",
           "| offset | n_past | KL mean [95 % CI] | KL max | top-1 % [95 % CI] | floor max | control KL mean [95 % CI] | max abs(bare - control) |",
           "|---|---|---|---|---|---|---|---|"]
    has_ctl = False
    for r in s["rows"]:
        ctl = r.get("position_matched_kl_mean")
        has_ctl = has_ctl or ctl is not None
        out.append(f"| {r['offset']} | {r['n_past']} | {_ci(r['kl_mean'], 4)} | {_kl(r['kl_max'])} | {_ci(r['top1'], 0, 100)} | "
                   f"{_kl(r['floor_max'])} | {_ci(ctl, 4) if ctl else '—'} | "
                   f"{_kl(r['rotation_kl_excess_max']) if ctl else '—'} |")
    ll = s.get("legolink")
    out += ["", "Paper (14B): 0.008–0.038 nats off-anchor, top-1 = 1.0 everywhere; LegoLink 5.7 nats at 1024."]
    if has_ctl:
        out.append("Control: the block computed by llama.cpp directly at the splice positions after the compile prefix "
                   "only (no re-rotation, the history still unseen): its KL is the context drift alone; where the "
                   "bare splice matches it, the re-anchoring adds nothing and the divergence is the model's.")
    if ll:
        out.append(f"LegoLink port (k = {ll['k']}) at offset {ll['offset']}: KL {_ci(ll['kl_mean'], 4)} nats, top-1 "
                   f"{_ci(ll['top1'], 0, 100)} %, against the bare splice's {_kl(ll['bare_kl_mean_same_offset'])} at the same offset"
                   + (f"; floor with a second block's cells in the cache {_kl(ll['layout_floor_mean'])}"
                      if ll.get("layout_floor_mean") is not None else "") + ".")
        sc = ll.get("scattered")
        if sc:
            out.append(f"Scattered recompute ({len(sc['indices'])} block tokens spread evenly, each with its causal "
                       f"context) at the same offset: KL {_ci(sc['kl_mean'], 4)} nats, top-1 {_ci(sc['top1'], 0, 100)} %.")
    return out


def gate(doc) -> list[str]:
    s = doc["summary"]
    out = [f"### Reference-free drift gate (Table II) — {s['heads']}", "", f"_{_machine(doc)}_", "",
           "| n_past | ctx | max drift | mean drift | Spearman ρ [95 % CI] | paper ρ |", "|---|---|---|---|---|---|"]
    for r in s["rows"]:
        pp = r.get("paper")
        out.append(f"| {r['n_past']} | {r['ctx']} | {r['max_drift']:.3f} | {r['mean_drift']:.3f} | {_ci(r['rho'], 3)} | "
                   f"{pp['rho'] if pp else '—'} |")
    out += ["", f"Mean ρ = {s['mean_rho']:.3f} (target ≥ 0.40; paper 0.193) → {'go' if s['gate_go'] else 'no-go'}."]
    return out


def _interchangeable(row) -> str:
    """Accuracy when a pick of the same tool on another server counts (runs before that column existed: —)."""
    a = row.get("accuracy_interchangeable")
    return "—" if not a else f"{a['value'] * 100:.1f}"


def routing(doc) -> list[str]:
    s = doc["summary"]
    p = doc["params"]
    with_examples = (f" — indexes built with the example requests of `{p['examples']}`" if p.get("examples")
                     else " — indexes built with the shipped example requests (the default)" if p.get("shipped_examples")
                     else "")
    out = [f"### Routing vs registry size (Fig. 5, Table IV) — {p['n_queries']} queries{with_examples}", "",
           f"_{_machine(doc)}_", "",
           "| N | accuracy % [95 % CI] | + interchangeable % | paper | no reranker % | retriever top-1 / top-3 % | SLB top-1 / top-3 % | τ | fire % | scan in-situ µs | scan native µs | oracle |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in s["rows"]:
        o = r.get("oracle")
        otxt = "—" if not o else (f"{_ci(o['accuracy'], 1, 100)} ({o['prompt_tokens_max']} tok)" if o["status"] == "ran"
                                   else f"overflow: {o['prompt_tokens_max']} tok > {o['context']}")
        out.append(
            f"| {r['size']} | {_ci(r['accuracy'], 1, 100)} | {_interchangeable(r)} | {_pct0(r.get('paper_accuracy'))} | "
            f"{r['accuracy_no_rerank']['value'] * 100:.1f} | {r['retriever_top1']['value'] * 100:.1f} / {r['retriever_top3']['value'] * 100:.1f} | "
            f"{r['slb_top1']['value'] * 100:.1f} / {r['slb_top3']['value'] * 100:.1f} | {r['tau_median']:.4f} | "
            f"{r['fire_rate']['value'] * 100:.1f} | {_ci(r['scan_in_situ_us'], 1)} | {_ci(r['scan_native_us'], 2)} | {otxt} |")
    out += ["", "+ interchangeable: a pick of the same tool on another server (equal name, description and parameters, "
            "registry.interchangeable_groups) counted as right too.",
            "", "Paper (14B, 100 GitHub queries): 92/90/89/89 % at N = 10/50/100/250 (N = 250: [81.4, 93.7]); SLB top-1/top-3 "
            "74/95 %; oracle 98 % at N = 10, overflow from N = 50; τ = 0.0136, fire 20.8 %; scan 17.6 µs in situ, 8.25 µs native."]
    return out


def args(doc) -> list[str]:
    s = doc["summary"]
    out = [f"### Arguments — {doc['params']['n_cases']} cases", "", f"_{_machine(doc)}_", "",
           "| quantity | Nexus [95 % CI] | paper |", "|---|---|---|",
           f"| routing accuracy % | {_ci(s['routing'], 1, 100)} (n={s['routing']['n']}) | 86.7 [70.3, 94.7] (n=30) |",
           f"| specified-argument accuracy % (routed) | {_ci(s['specified_args'], 1, 100)} (n={s['specified_args']['n']}) | 100 (≥ 91.2, n=40) |",
           *([f"| specified-argument accuracy % (routed to the gold tool itself) | "
              f"{_ci(s['specified_args_gold_tool_only'], 1, 100)} (n={s['specified_args_gold_tool_only']['n']}) | — |"]
             if s.get("specified_args_gold_tool_only") else []),
           f"| end-to-end argument accuracy % | {_ci(s['end_to_end_args'], 1, 100)} (n={s['end_to_end_args']['n']}) | 80 [67.0, 88.8] (n=50) |",
           f"| JSON validity % | {_ci(s['json_validity'], 1, 100)} | 100 (≥ 88.6) |",
           f"| schema validity % | {_ci(s['schema_validity'], 1, 100)} | — |",
           f"| signature tokens median / p99 | {s['signature_tokens']['median']:.0f} / {s['signature_tokens']['p99']:.0f} | 19 / 32 |"]
    fa = s.get("first_arg")
    if fa:
        st = fa["steady"]
        out += [f"| first-arg token, signature (steady) ms | {_ci(st['signature_ms'], 1)} | 443.8 |",
                f"| first-arg token, full-schema re-prefill (steady) ms | {_ci(st['full_schema_ms'], 1)} | 737.3 |",
                f"| speedup (steady) | {_sp(st['speedup'])} | 1.66x |",
                f"| speedup (cold, whole prompt) | {_sp(fa['cold']['speedup'])} | — |",
                f"| main-context token saving per turn | {fa['token_saving_turn'] * 100:.1f} % | ≈ 80 % |"]
    return out


def routing_lso(doc) -> list[str]:
    s, p = doc["summary"], doc["params"]
    return [f"### Routing on servers never trained on — {p['part']} part, {p['tools']} tools, {s['n']} requests",
            "", f"_{_machine(doc)}_", "",
            f"Embedder `{p['embedder']}`, reranker {p['reranker']} ({p.get('model') or '—'}), no example requests.", "",
            "| quantity | Nexus [95 % CI] |", "|---|---|",
            f"| top-1 % | {_ci(s['top1'], 1, 100)} |",
            f"| top-3 % | {_ci(s['top3'], 1, 100)} |",
            f"| top-1 % counting interchangeable copies | {_ci(s['top1_interchangeable'], 1, 100)} |",
            f"| follow-ups top-1 % (n = {s['n_follow_up']}) | {_ci(s['follow_up_top1'], 1, 100)} |",
            f"| decisions escalated % | {_ci(s['escalated'], 1, 100)} |",
            f"| median decision ms | {s['ms_median']:.0f} |"] + [
            f"| median escalated decision ms, {what} | {_ci(s[key]['median'], 0)} |"
            for key, what in (("ms_escalated", "prefixes cold"), ("ms_escalated_warm", "prefixes warm")) if s.get(key)]


def card_splice(doc) -> list[str]:
    s = doc["summary"]
    out = ["### Cards in sessions", "", f"_{_machine(doc)}_", "",
           "| depth | n | card decoded after the conversation % | re-prefill ms | splice ms | speedup | "
           "same arguments % | KL / floor (nats) |", "|---|---|---|---|---|---|---|---|"]
    for depth, c in s["test"].items():
        if not isinstance(c, dict) or "speedup" not in c:
            continue
        out.append(f"| {depth} | {c['n']} | {', '.join(f'{h:g}' for h in c['head_pct'])} | "
                   f"{_ci(c['reprefill_ms'], 0)} | {_ci(c['splice_ms'], 0)} | {_sp(c['speedup'])} | "
                   f"{_ci(c['same_arguments'], 1, 100)} | {_kl(c['kl_mean'])} / {_kl(c['floor_kl_mean'])} |")
    return out


def drafts(doc) -> list[str]:
    s = doc["summary"]
    pl, dr = s["plain"], s["drafted"]
    kept = s["draft_kept_share"]
    return [f"### Drafted argument decoding — {s['n_cases']} cases", "", f"_{_machine(doc)}_",
            "", "| quantity | one token a step | drafted |", "|---|---|---|",
            f"| specified argument values right % | {_ci(pl['specified_args'], 1, 100)} | "
            f"{_ci(dr['specified_args'], 1, 100)} |",
            f"| valid argument objects % | {_ci(pl['valid'], 1, 100)} | {_ci(dr['valid'], 1, 100)} |",
            f"| argument call ms (median) | {_ci(pl['ms'], 0)} | {_ci(dr['ms'], 0)} |",
            f"| speedup (median of paired ratios) | | {_sp(s['speedup_paired'])} |",
            f"| identical arguments % | | {_ci(s['identical_arguments'], 1, 100)} |",
            f"| draft tokens kept | | {s['draft_tokens_kept']} of {s['draft_tokens']}"
            + (f" ({kept * 100:.0f} %)" if kept is not None else "") + " |"]


def slb(doc) -> list[str]:
    rows = doc["summary"].get("sizes", [])
    out = ["### SLB scan (Table IV)", "", f"_{_machine(doc)}_", "", "| N | C++ µs p50 | Python FFI µs p50 | NumPy f32 µs p50 |",
           "|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['n']} | {r['cpp_us_p50']:.2f} | {r['python_us_p50']:.2f} | {r['numpy_f32_us_p50']:.2f} |")
    out += ["", "Paper: 8.25 µs native, 17.6 µs with the Python FFI boundary (N = 250)."]
    return out


def latency(doc) -> list[str]:
    s = doc["summary"]
    out = ["### Latency: each step against its baseline", "", f"_{_machine(doc)}_", "",
           "| step | Nexus | baseline | baseline / Nexus |", "|---|---|---|---|"]
    for n, r in s["kernel"].items():
        out.append(f"| SLB top-5 scan, {int(n):,} x 384 (µs; top-1 agreement with f32 {r['top1_agreement']:.3f}) | "
                   f"{r['cpp_us_p50']:.2f} | NumPy f32 {r['numpy_f32_us_p50']:.1f} | {r['speedup_cpp_vs_numpy_f32']:.1f}x |")
        if r.get("cpp_row_major_us_p50") is not None:
            out.append(f"| the same scan, row-major rows (the kernel the panels replaced) | {r['cpp_us_p50']:.2f} | "
                       f"{r['cpp_row_major_us_p50']:.2f} | {r['speedup_cpp_vs_row_major']:.2f}x |")
        if r.get("floor_read_us_p50"):  # what one core of this CPU allows (0: no AVX-512 VNNI)
            out.append(f"| the CPU's ceilings for that scan, one core: reading its bytes / its vpdpbusd alone (µs) | "
                       f"{r['cpp_us_p50']:.2f} | {r['floor_read_us_p50']:.2f} / {r['floor_dots_us_p50']:.2f} | "
                       f"{r['floor_read_us_p50'] / r['cpp_us_p50']:.2f}x |")
        if r.get("exact_us_p50") is not None:
            out.append(f"| exact top-5 from Python, {int(n):,} x 384 (µs; top-1 agreement with f32 "
                       f"{r['exact_top1_agreement']:.3f}) | {r['exact_us_p50']:.2f} | NumPy f32 "
                       f"{r['numpy_f32_us_p50']:.1f} | {r['numpy_f32_us_p50'] / r['exact_us_p50']:.1f}x |")
    for n, r in s["scan_step"].items():
        out.append(f"| scan step, {r['tools']} tools / {r['vectors']:,} vectors (µs; scores identical: "
                   f"{'yes' if r['identical_scores'] else 'NO'}) | {_ci(r['product']['median_ci_us'], 1)} | "
                   f"previous {r['previous']['median_us']:.1f} | {_sp(r['speedup'])} |")
    e = s["encoder"]
    out.append(f"| request encoder, warm, {e['requests']} requests (ms) | {_ci(e['product_native_f16']['median_ci_ms'], 2)} | "
               f"NumPy f32 {e['numpy_f32']['median_ms']:.2f}; sentence-transformers "
               f"{e['sentence_transformers']['median_ms']:.2f} | {_sp(e['speedup_vs_numpy_f32'])}; "
               f"{_sp(e['speedup_vs_sentence_transformers'])} |")
    for n, r in s["warm_route"].items():
        out.append(f"| warm request (encode + scan + gate), {r['index_tools']} tools (ms) | "
                   f"{_ci(r['total']['median_ci_ms'], 2)} | — | — |")
    for n, o in s["oneshot"].items():
        base = o.get("baseline")
        inter = o["product"].get("interleaved")  # runs alternating with the baseline per request (not before)
        note = f" (alternating per request: {inter['median_ms']:.0f})" if inter and base else ""
        out.append(f"| one-shot `nexus route --json --no-args`, {n} index, {o['escalated_share'] * 100:.0f} % escalated "
                   f"(ms) | {_ci(o['product']['all']['median_ci_ms'], 0)}{note} | "
                   + (f"{o['baseline_ref']} {base['all']['median_ms']:.0f} | {_sp(o['speedup'])} |" if base else "— | — |"))
    d = s.get("demo")
    if d:
        base, p = d.get("baseline"), d["product"]
        steps = f"rerank {p['rerank']['median_ms']:.0f}, arguments {p['args']['median_ms']:.0f}"
        out.append(f"| `make demo`'s request one-shot with arguments, wall (ms; {steps}; same answers: "
                   f"{'yes' if d.get('same_answers', True) else 'no'}) | {_ci(p['wall']['median_ci_ms'], 0)} | "
                   + (f"{d['baseline_ref']} {base['wall']['median_ms']:.0f} | {_sp(d['speedup'])} |" if base
                      else "— | — |"))
    for key, what in (("index_build", "without synthesis"), ("index_build_demo", "(`make demo`'s registry)")):
        ib = s.get(key)
        if ib:
            base = ib.get("baseline")
            out.append(f"| `nexus index` of {ib['tools']} tools {what}, a fresh process each round (ms; target "
                       f"{ib['target_s']} s) | {_ci(ib['wall']['median_ci_ms'], 0)} | "
                       + (f"{ib['baseline_ref']} {base['wall']['median_ms']:.0f} | {_sp(ib['speedup'])} |" if base
                          else "— | — |"))
    return out


def l0(doc) -> list[str]:
    s = doc["summary"]
    return ["### L0 radix arena (Table IV)", "", f"_{_machine(doc)}_", "",
            f"Warm-hit rate {_ci(s['hit_rate'], 1, 100)} % (paper 69.5 %); copy P50 "
            f"{s['copy_p50_us']:.2f} µs (paper 3.04 µs)." if s.get("copy_p50_us") is not None else
            f"Warm-hit rate {_ci(s['hit_rate'], 1, 100)} % (paper 69.5 %)."]


def serve(doc) -> list[str]:
    s = doc["summary"]
    load, term, gone = s["load"], s["sigterm"], s["disconnect"]
    g = load["rss_growth_after_first"]
    return ["### nexus serve under hostile clients", "", f"_{_machine(doc)}_", "",
            f"{load['clients']} clients x {load['requests_per_client']} requests (valid calls mixed with malformed, "
            f"oversized and unknown frames, bad arguments, cancellations): {load['sent']} sent, {load['correct']} "
            f"answered as expected, {load['n_failures']} failures; VmRSS after {load['rss_after_first_n']} answers "
            f"{(load['rss'].get('after_first_kb') or 0) / 1024:.1f} MB, after all "
            f"{(load['rss'].get('after_all_kb') or 0) / 1024:.1f} MB ({'—' if g is None else f'{g * 100:+.2f} %'}). "
            f"SIGTERM under load: exit {term['exit_code']} in {term['seconds_to_exit']:.2f} s, "
            f"{term['n_failures']} wrong answers. Client gone mid-request: exit {gone['exit_code']}."]


def poisoning(doc) -> list[str]:
    s = doc["summary"]
    rows = ["### Hostile servers in the registry", "", f"_{_machine(doc)}_", "",
            f"Baseline top-1 {_ci(s['baseline']['top1'], 1, 100)} % over {s['baseline']['n']} requests "
            f"(reranker {s['baseline']['reranker']}).", "",
            "| attack | hostile tools | quarantined | stolen, defences off | stolen, on | top-1 off | top-1 on | "
            "prompts carrying instructions off / on |", "|---|---|---|---|---|---|---|---|"]
    for attack, c in s["attacks"].items():
        off, on = c["off"], c["on"]
        rows.append(f"| {attack} | {len(c['hostile_tools'])} | {len(c['quarantined'])} | {off['stolen']} | "
                    f"{on['stolen']} | {_ci(off['top1'], 1, 100)} | {_ci(on['top1'], 1, 100)} | "
                    f"{len(off['prompt_leaks'])} / {len(on['prompt_leaks'])} |")
    return rows


def _dirty(doc) -> str:
    """A mark for a run a reader should not trust as published: a dirty tree or a loaded machine."""
    git = doc["environment"]["git"]
    cpu = doc["environment"]["cpu"]
    load = max(cpu.get("loadavg_1m_start") or 0, cpu.get("loadavg_1m") or 0)
    notes = (["dirty tree"] if git.get("dirty") else []) + ([f"load {load:.1f}"] if load > (cpu.get("usable_cores") or 2) else [])
    return f" ({', '.join(notes)})" if notes else ""


def _headline_rows(out_dir: Path) -> list[str]:
    rows = []

    def add(suite, quantity, value, paper, variants_too=False):
        """One row per results file: the main model's, and with variants_too each other model's (named in it)."""
        for variant in [None, *(variants(out_dir, suite) if variants_too else [])]:
            doc = load_latest(out_dir, suite, variant)
            if doc is None:
                continue
            try:
                v = value(doc["summary"], doc["params"])
            except (KeyError, TypeError, IndexError, StopIteration):
                continue
            name = f"results/{suite}/{latest_name(variant)}"
            label = f"{quantity}, {doc['params'].get('model', variant)}" if variants_too else quantity
            rows.append(f"| {label} | {v} | {paper} | [`{name}`]({name}){_dirty(doc)} |")

    def routing_at(size):
        return lambda s, p: _ci(next(r for r in s["rows"] if r["size"] == size)["accuracy"], 1, 100) + " %"

    add("routing", "routing top-1 at N = 250 and over all 955 tools", lambda s, p: " / ".join(
        f"{'all' if r['size'] == 'ALL' else 'N = ' + r['size']}: {_ci(r['accuracy'], 1, 100)} %"
        for r in s["rows"] if r["size"] in ("250", "ALL"))
        + (f" (examples: `{p['examples']}`, embedder `{Path(str(p['embedder'])).name}`)" if p.get("examples")
           else " (the shipped example requests, the default)" if p.get("shipped_examples") else ""),
        "89 % at 250")
    add("routing-lso", "routing on servers never trained on, no examples (top-1 / top-3)", lambda s, p: (
        f"{_ci(s['top1'], 1, 100)} / {_ci(s['top3'], 1, 100)} % ({p['tools']} tools, {s['n']} requests, {p['part']})"),
        "—")
    add("args", "specified arguments right (routed cases)", lambda s, p: _ci(s["specified_args"], 1, 100) + " %", "100 %")
    add("args", "first argument token: signature vs full schema (steady)",
        lambda s, p: _sp(s["first_arg"]["steady"]["speedup"]), "1.66x")
    add("drafts", "argument call, drafted tokens verified in batches against one token a step (identical arguments)",
        lambda s, p: f"{_sp(s['speedup_paired'])} ({_ci(s['identical_arguments'], 1, 100)} %)", "—",
        variants_too=True)
    add("deep-splice", "deep splice at n_past 256, K = 4: warm speedup (KL / floor)", lambda s, p: (lambda c: (
        f"{_sp(c['warm']['speedup'])} (KL {_kl(c['kl_max'])} / floor {_kl(c['floor_kl'])})"))(
        next(c for c in s["cells"].values() if c["K"] == 4 and c["depth"] == 256)), "—", variants_too=True)
    add("dkl", "bare splice KL off the anchor (mean, min–max over offsets)", lambda s, p: (
        f"{min(r['kl_mean']['value'] for r in s['rows'] if r['offset']):.3f}–"
        f"{max(r['kl_mean']['value'] for r in s['rows'] if r['offset']):.3f} nats "
        f"({_floor_bound(max(r['floor_max'] for r in s['rows']))})"), "0.008–0.038 nats", variants_too=True)
    add("gate", "reference-free drift gate, mean Spearman ρ", lambda s, p: f"{s['mean_rho']:.3f}", "0.193",
        variants_too=True)
    add("slb", "SLB scan, N = 250, d = 384: native / from Python", lambda s, p: (lambda r: (
        f"{r['cpp_us_p50']:.2f} µs / {r['python_us_p50']:.2f} µs"))(next(r for r in s["sizes"] if r["n"] == 250)),
        "8.25 µs / 17.6 µs")
    add("latency", "warm request (encode + scan + gate), 955 tools / one-shot `nexus route --no-args`", lambda s, p: (
        f"{s['warm_route']['all']['total']['median_ms']:.1f} ms / "
        f"{s['oneshot']['all']['product']['all']['median_ms']:.0f} ms"), "—")
    add("l0", "L0 arena warm-hit rate", lambda s, p: _ci(s["hit_rate"], 1, 100) + " %", "69.5 %")
    add("poisoning", "requests one hostile server steals (worst attack), defences on / off", lambda s, p: (
        f"{s['worst_stolen_on']} / {s['worst_stolen_off']} of {s['baseline']['n']}"), "—")
    add("serve", "nexus serve, 8 hostile clients: wrong or lost answers, memory 1k → 10k requests", lambda s, p: (
        f"{s['load']['n_failures']} of {s['load']['sent']}, {s['load']['rss_growth_after_first'] * 100:+.1f} %"), "—")
    return rows


def headline(out_dir: Path) -> str:
    """The README's table: one line per headline figure, each naming the results file that holds it."""
    rows = _headline_rows(Path(out_dir))
    return "\n".join(["| quantity | Nexus [95 % CI] | paper (Qwen2.5-14B, M4 Max) | results file |",
                      "|---|---|---|---|", *rows]) + "\n"


SECTIONS = [("deep-splice", deep_splice), ("dkl", dkl), ("gate", gate), ("routing", routing),
            ("routing-lso", routing_lso), ("args", args), ("drafts", drafts), ("card-splice", card_splice), ("slb", slb), ("latency", latency), ("l0", l0), ("poisoning", poisoning), ("serve", serve)]


def render(out_dir: Path) -> str:
    lines = ["# Latest results", "", "Generated by `nexus results summary` from `results/*/latest.json`; "
             "the paper's numbers are from ../shared/design/anchors.md (Qwen2.5-14B Q4_K_M on an Apple M4 Max). "
             "Definitions: docs/measurements.md.", ""]
    walls = []
    for suite, _ in SECTIONS:
        for variant in [None, *variants(out_dir, suite)]:
            doc = load_latest(out_dir, suite, variant)
            if doc is not None:
                walls.append(f"| {suite}{f' ({variant})' if variant else ''} | {doc['wall_s'] / 60:.1f} | "
                              f"{_load(doc['environment']['cpu'])} | {_params_brief(doc['params'])} |")
    if walls:
        lines += ["### Wall times of the latest runs", "", "| suite | minutes | load average | parameters |",
                  "|---|---|---|---|", *walls, ""]
    for suite, fn in SECTIONS:
        doc = load_latest(out_dir, suite)
        if doc is None:
            lines += [f"### {suite}", "", "_not run yet_", ""]
        for variant in [None, *variants(out_dir, suite)]:
            doc = load_latest(out_dir, suite, variant)
            if doc is None:
                continue
            try:
                section = fn(doc)
            except (KeyError, TypeError) as e:
                lines += [f"### {suite}", "", f"_latest.json has an unexpected shape ({type(e).__name__}: {e})_", ""]
                continue
            if variant:  # the same table on another model: its heading says which
                section = [section[0] + f" — {variant}", *section[1:]]
            lines += section + [""]
    return "\n".join(lines)


README_BEGIN = "<!-- results:begin (generated by nexus results summary --readme) -->"
README_END = "<!-- results:end -->"


def with_tables(readme: str, tables: str) -> str:
    """The README text with the block between README_BEGIN and README_END replaced by `tables` (headings demoted
    one level so they sit under the README's own section). Raises ValueError if the markers are missing."""
    b, e = readme.find(README_BEGIN), readme.find(README_END)
    if b < 0 or e < b:
        raise ValueError("README.md has no results block markers")
    body = "\n".join(("#" + ln) if ln.startswith("### ") else ln for ln in tables.splitlines()
                     if not ln.startswith("# Latest results"))
    return readme[: b + len(README_BEGIN)] + "\n" + body.strip() + "\n" + readme[e:]


def write_summary(out: str | Path = REPO_ROOT / "results", readme: bool = False) -> str:
    """Render results/SUMMARY.md from <out>/*/latest.json (and, with `readme`, README.md's results block); returns
    the Markdown."""
    text = render(Path(out))
    atomic_write_bytes(Path(out) / "SUMMARY.md", text.encode("utf-8"))
    if readme:
        path = REPO_ROOT / "README.md"
        atomic_write_bytes(path, with_tables(path.read_text(encoding="utf-8"), headline(Path(out))).encode("utf-8"))
    return text
