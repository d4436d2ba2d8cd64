"""`nexus bench l0`: warm-hit rate and copy latency of the L0 exact-token radix arena (paper §VI-D, Table IV: 32 slots,
69.5 % warm hits, 3.04 µs copy P50 over 10 seeds) on a reproducible multi-turn agent workload.

The workload (one run per seed; everything drawn from `random.Random(seed)`):

* Agent profiles: PROFILES agents, each with its own system prompt (a role line and the compressed signatures of
  TOOLS_PER_PROFILE tools of the project's registry tool_registries/github_like.json, a fixed subset per profile).
  Profile popularity is Zipf(ZIPF_S): a few agents carry most conversations.
* Conversations: CONCURRENT conversations are open at any time (more than the 32 slots, so the arena must evict).
  A conversation has a profile; a PERSONALIZED fraction of them also carry a per-user line at the end of the system
  prompt (user name and date), as deployed agents often do. Each step picks one open conversation uniformly, appends a
  user turn (a request naming one of its profile's tools, with drawn values), and runs the turn; after each turn the
  conversation ends with probability P_END (or at MAX_TURNS) and a new one (new draws) takes its place.
* A turn: prompt = the chat template of [system, u1, a1, ..., u_t] (the model's own template); `arena.acquire`
  copies the best slot's prefix into the working sequence; the rest of the prompt is decoded for real (llama.cpp,
  flash attention on); then the assistant reply (a short JSON tool call built from the request) is decoded after it,
  as generated tokens would be; `arena.commit` keeps the whole sequence in a slot.

Counted per turn: a **hit** when the reused prefix covers at least the conversation's system prompt (what the brief
and the paper call a warm hit: the system prompt and tool signatures are not prefilled again); a **continuation** when
it covers everything the conversation held after its previous turn; the reused-token fraction; the copy latency
(the `llama_memory_seq_cp` call that shares the slot's cells with the working sequence, perf_counter_ns) and the
lookup latency (LCP over the slot table).

Check while timing: on the first VERIFY_PER_SEED hits of every seed, the logits after the reused prefix + suffix decode
are compared with a cold prefill of the same prompt in a spare sequence (top-1 agreement, KL, bit identity). With
flash attention llama.cpp's result does not depend on how a prompt is split into batches, so a reused prefix is exact;
it does depend, by float rounding, on the order of the sequence's cells in the cache (the CPU kernel accumulates V
in F16, in cell order), which fragmentation can permute. A top-1 disagreement is reported in the notes.
"""

from __future__ import annotations

import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from ..adapters.llama import LlamaContext, kl_divergence, load_model
from ..config import REPO_ROOT, TEST_LLM
from ..registry import load_registries
from ..schema import signature
from ..serving.arena import DEFAULT_SLOTS, L0Arena
from . import stats
from .results import Run, model_identity

SUITE = "l0"
PAPER = {"hit_rate": 0.695, "copy_p50_us": 3.04, "slots": 32, "seeds": 10}

PROFILES = 12
TOOLS_PER_PROFILE = 5
ZIPF_S = 1.0
CONCURRENT = 48
PERSONALIZED = 0.25
P_END = 0.25
MAX_TURNS = 6
VERIFY_PER_SEED = 2
N_CTX = 8192
DEFAULT_TURNS = 60
DEFAULT_SEEDS = 10
QUICK = {"seeds": 2, "turns": 20}

REGISTRY = REPO_ROOT / "tool_registries" / "github_like.json"

_ROLES = [
    "You are a release assistant for a software team.", "You are a code review helper.",
    "You are an on-call assistant that triages incidents.", "You are a repository maintenance bot.",
    "You help open source maintainers answer contributors.", "You are a project planning assistant.",
    "You are a documentation assistant.", "You are a security triage assistant.",
    "You are a continuous integration helper.", "You are a community moderation assistant.",
    "You are an onboarding assistant for new engineers.", "You are a dependency update assistant.",
]
_NAMES = ["alice", "bob", "chen", "dana", "emeka", "fatima", "goran", "hana", "ivan", "jun", "kofi", "lena"]
_OWNERS = ["acme", "octo-org", "data-team", "edge-inc", "openlab", "fintech-co", "nikola", "bigcorp"]
_REPOS = ["api", "website", "notes", "etl", "gateway", "docs", "linter", "payments", "monorepo", "cli"]
_WORDS = ["login", "cache", "timeout", "retry", "footer", "dark mode", "billing", "search", "upload", "metrics",
          "onboarding", "release", "docs", "tests", "deps", "auth"]
_ASKS = ["Please {v} in {o}/{r} about {w}.", "Can you {v} for {o}/{r}? It is about {w}.",
         "{V} in the {r} repo of {o}, topic: {w}.", "Now {v} for {o}/{r} ({w}).", "Next, {v} there about {w}."]


@dataclass
class Profile:
    index: int
    role: str
    tools: list[str]  # tool names
    system: str


@dataclass
class Conversation:
    profile: Profile
    system: str
    messages: list[dict] = field(default_factory=list)
    n_sys_tokens: int = 0
    held: int = 0  # tokens this conversation's sequence held after its previous turn
    turns: int = 0


def build_profiles(n: int = PROFILES, per: int = TOOLS_PER_PROFILE) -> list[Profile]:
    """Fixed agent profiles (the same for every seed) over tool_registries/github_like.json."""
    tools = load_registries([REGISTRY])
    rng = random.Random(12345)  # the profiles are part of the workload definition, not of a seed
    out = []
    for i in range(n):
        chosen = sorted(rng.sample(range(len(tools)), min(per, len(tools))))
        sigs = []
        for j in chosen:
            try:
                sigs.append(signature(tools[j]))
            except Exception:  # noqa: BLE001 - a schema the signature cannot render is shown by name
                sigs.append(f"{tools[j].name}(...)")
        role = _ROLES[i % len(_ROLES)]
        system = f"{role} You can call these tools of the {tools[0].server} server:\n" + "\n".join(sigs)
        out.append(Profile(i, role, [tools[j].name for j in chosen], system))
    return out


def _zipf_weights(n: int, s: float) -> list[float]:
    w = [1.0 / (k + 1) ** s for k in range(n)]
    t = sum(w)
    return [x / t for x in w]


def _new_conversation(rng: random.Random, profiles: list[Profile], weights: list[float], model) -> Conversation:
    p = rng.choices(profiles, weights=weights, k=1)[0]
    system = p.system
    if rng.random() < PERSONALIZED:
        system += f"\nThe user is {rng.choice(_NAMES)}; today is 2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}."
    conv = Conversation(profile=p, system=system, messages=[{"role": "system", "content": system}])
    # the system prompt's token count in this template: the common prefix of two chats that differ after it
    a = model.chat_tokens(conv.messages + [{"role": "user", "content": "a"}])
    b = model.chat_tokens(conv.messages + [{"role": "user", "content": "b"}])
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    conv.n_sys_tokens = n
    return conv


def _user_turn(rng: random.Random, conv: Conversation) -> tuple[str, str]:
    tool = rng.choice(conv.profile.tools)
    verb = tool.replace("_", " ")
    o, r, w = rng.choice(_OWNERS), rng.choice(_REPOS), rng.choice(_WORDS)
    text = rng.choice(_ASKS).format(v=verb, V=verb.capitalize(), o=o, r=r, w=w)
    reply = json.dumps({"tool": tool, "arguments": {"owner": o, "repo": r, "topic": w}})
    return text, reply


def run_seed(ctx, arena: L0Arena, model, profiles: list[Profile], seed: int, turns: int,
             verify: int = VERIFY_PER_SEED, ref_seq: int | None = None, progress=None) -> dict:
    """One seed of the workload on a cleared arena. Returns the per-turn records and checks."""
    rng = random.Random(seed)
    weights = _zipf_weights(len(profiles), ZIPF_S)
    arena.clear()
    convs = [_new_conversation(rng, profiles, weights, model) for _ in range(CONCURRENT)]
    rec = {"hit": [], "continuation": [], "copy_ns": [], "lookup_ns": [], "reused": [], "prompt": [],
           "first_turn": [], "verified": 0, "identical": 0, "top1": 0, "max_kl": 0.0, "max_abs_diff": 0.0}
    for _ in range(turns):
        ci = rng.randrange(len(convs))
        conv = convs[ci]
        text, reply = _user_turn(rng, conv)
        conv.messages.append({"role": "user", "content": text})
        prompt = model.chat_tokens(conv.messages, add_assistant=True)
        acq = arena.acquire(prompt, min_prefix=conv.n_sys_tokens)
        arena.decode_with_eviction(prompt[acq.n_reused:], acq.n_reused)
        if acq.hit and rec["verified"] < verify and ref_seq is not None:
            warm = ctx.logits()
            ctx.seq_rm(ref_seq, -1, -1)
            ctx.decode(prompt, 0, ref_seq)
            cold = ctx.logits()
            ctx.seq_rm(ref_seq, -1, -1)
            rec["verified"] += 1
            rec["identical"] += int(np.array_equal(warm, cold))
            rec["top1"] += int(int(np.argmax(warm)) == int(np.argmax(cold)))
            rec["max_kl"] = max(rec["max_kl"], kl_divergence(cold, warm))
            rec["max_abs_diff"] = max(rec["max_abs_diff"], float(np.max(np.abs(warm - cold))))
        conv.messages.append({"role": "assistant", "content": reply})
        full = model.chat_tokens(conv.messages, add_assistant=False)
        if full[: len(prompt)] != prompt:  # a template that re-renders earlier turns: keep the prompt only
            full = prompt
        else:
            arena.decode_with_eviction(full[len(prompt):], len(prompt))
        arena.commit(full)
        reused = acq.n_reused if acq.hit else 0
        rec["hit"].append(bool(acq.hit and reused >= conv.n_sys_tokens))
        rec["continuation"].append(bool(conv.held > 0 and reused >= conv.held))
        rec["first_turn"].append(conv.turns == 0)
        if acq.hit:
            rec["copy_ns"].append(acq.copy_ns)
        rec["lookup_ns"].append(acq.lookup_ns)
        rec["reused"].append(reused)
        rec["prompt"].append(len(prompt))
        conv.held = len(full)
        conv.turns += 1
        if conv.turns >= MAX_TURNS or rng.random() < P_END:
            convs[ci] = _new_conversation(rng, profiles, weights, model)
        if progress is not None:
            progress.advance(f"seed {seed}")
    rec["arena"] = arena.stats()
    return rec


def run(out_dir: str | Path = "results", quick: bool = False, seeds: int | None = None, turns: int | None = None,
        model: str = TEST_LLM, slots: int = DEFAULT_SLOTS, n_ctx: int = N_CTX, threads: int | None = None,
        progress=None) -> dict:
    """Run the suite and write results/l0/. Returns the results document."""
    seeds = seeds or (QUICK["seeds"] if quick else DEFAULT_SEEDS)
    turns = turns or (QUICK["turns"] if quick else DEFAULT_TURNS)
    params = {"seeds": seeds, "turns_per_seed": turns, "slots": slots, "n_ctx": n_ctx, "flash_attn": True,
              "profiles": PROFILES, "tools_per_profile": TOOLS_PER_PROFILE, "zipf_s": ZIPF_S,
              "concurrent_conversations": CONCURRENT, "personalized": PERSONALIZED, "p_end": P_END,
              "max_turns": MAX_TURNS, "verify_per_seed": VERIFY_PER_SEED, "registry": str(REGISTRY.name),
              "quick": quick}
    run_ = Run(SUITE, params=params, seed=0, models={"llm": model_identity(model)})
    llm = load_model(model)
    ref_seq = slots + 1
    ctx = LlamaContext(llm, n_ctx=n_ctx, n_batch=512, n_seq_max=slots + 2, flash_attn=True, n_threads=threads)
    try:
        arena = L0Arena(ctx, n_slots=slots, work_seq=0, first_slot_seq=1)
        profiles = build_profiles()
        if progress is not None:
            progress.set_total(seeds * turns)
        per_seed = []
        hits = conts = n_turns = verified = identical = 0
        copy_us: list[float] = []
        lookup_us: list[float] = []
        reused = prompt = 0
        max_diff = max_kl = 0.0
        top1 = 0
        evictions = 0
        t0 = time.perf_counter()
        for s in range(seeds):
            r = run_seed(ctx, arena, llm, profiles, seed=s, turns=turns, ref_seq=ref_seq, progress=progress)
            h, c, n = sum(r["hit"]), sum(r["continuation"]), len(r["hit"])
            per_seed.append({"seed": s, "turns": n, "hits": h, "hit_rate": h / n, "continuations": c,
                             "continuation_rate": c / n,
                             "copy_p50_us": float(np.median(r["copy_ns"])) / 1e3 if r["copy_ns"] else None,
                             "reused_token_fraction": sum(r["reused"]) / max(1, sum(r["prompt"])),
                             "evictions": r["arena"]["evictions"]})
            hits, conts, n_turns = hits + h, conts + c, n_turns + n
            copy_us += [x / 1e3 for x in r["copy_ns"]]
            lookup_us += [x / 1e3 for x in r["lookup_ns"]]
            reused += sum(r["reused"])
            prompt += sum(r["prompt"])
            verified += r["verified"]
            identical += r["identical"]
            top1 += r["top1"]
            max_kl = max(max_kl, r["max_kl"])
            max_diff = max(max_diff, r["max_abs_diff"])
            evictions += r["arena"]["evictions"]
        wall = time.perf_counter() - t0
    finally:
        ctx.close()
    seed_rates = [p["hit_rate"] for p in per_seed]
    summary = {
        "hit_rate": stats.wilson(hits, n_turns),
        "hit_rate_seed_mean": float(np.mean(seed_rates)),
        "hit_rate_seed_sd": float(np.std(seed_rates, ddof=1)) if len(seed_rates) > 1 else 0.0,
        "continuation_rate": stats.wilson(conts, n_turns),
        "reused_token_fraction": reused / max(1, prompt),
        "copy_us": stats.median_ci(copy_us) if copy_us else None,
        "copy_p50_us": stats.percentile(copy_us, 50) if copy_us else None,
        "copy_p99_us": stats.percentile(copy_us, 99) if copy_us else None,
        "lookup_p50_us": stats.percentile(lookup_us, 50) if lookup_us else None,
        "lookup_p99_us": stats.percentile(lookup_us, 99) if lookup_us else None,
        "turns": n_turns,
        "hits": hits,
        "evictions": evictions,
        "reference_check": {"checked": verified, "top1_agree": top1, "max_kl_nats": max_kl, "bit_identical": identical,
                            "max_abs_logit_diff": max_diff},
        "paper": PAPER,
        "per_seed": per_seed,
        "workload_wall_s": round(wall, 2),
    }
    if verified and top1 != verified:
        run_.note(f"reference check FAILED: {verified - top1} of {verified} warm-reuse next tokens differ from a cold "
                  f"prefill (max KL {max_kl:.3g} nats)")
    run_.note("reference check: warm-reuse logits vs a cold prefill of the same prompt in a spare sequence; llama.cpp's "
              "CPU decode is not batch-invariant at every split point and accumulates attention in cell order, so "
              "a reused prefix in a fragmented shared cache is exact only up to float rounding (docs/serving.md)")
    run_.note("copy = one llama_memory_seq_cp call (shares the slot's cells with the working sequence; unified KV cache), "
              f"n_ctx {n_ctx}: llama.cpp walks every cell of the cache, so the copy cost grows with n_ctx")
    run_.note("hit = the reused prefix covers the conversation's whole system prompt (role + tool signatures)")
    samples = {"copy_us": copy_us, "lookup_us": lookup_us}

    def figure(plt):
        if not copy_us:
            return None
        fig, ax = plt.subplots(1, 2, figsize=(9, 3.4))
        ax[0].hist(copy_us, bins=50, color="#4477aa")
        ax[0].axvline(PAPER["copy_p50_us"], color="k", ls="--", lw=1, label="paper P50 3.04 µs")
        ax[0].set_xlabel("copy latency (µs)")
        ax[0].set_ylabel("hits")
        ax[0].legend(fontsize=8)
        ax[1].bar(range(len(seed_rates)), [x * 100 for x in seed_rates], color="#66aa55")
        ax[1].axhline(PAPER["hit_rate"] * 100, color="k", ls="--", lw=1, label="paper 69.5 %")
        ax[1].set_xlabel("seed")
        ax[1].set_ylabel("warm-hit rate (%)")
        ax[1].set_ylim(0, 100)
        ax[1].legend(fontsize=8)
        fig.suptitle(f"L0 radix arena · {slots} slots · {model}")
        fig.tight_layout()
        return fig

    return run_.write(summary=summary, samples=samples, out_dir=out_dir, figure=figure)
