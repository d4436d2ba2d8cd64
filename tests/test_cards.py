"""Compiled tool cards in the live path (arguments/cards.py): the argument prompt's tool block is compiled once per
model and tool and spliced after the conversation. Without a window the card lands where it was compiled and the
arguments are those of a full prefill, bit for bit in the logits; with a window it is re-anchored and repaired; a
corrupt, foreign or mismatched card file is refused and compiled again, never spliced. Real SmolLM2 (+ Qwen2.5-0.5B
for the foreign-model card)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"
HISTORY = [
    {"role": "user", "content": "I am working on the acme/api repository today"},
    {"role": "assistant", "content": "Sure, what should I do in acme/api?"},
]


@pytest.fixture(scope="module")
def forge_index(tmp_path_factory):
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.build import build_index

    out = tmp_path_factory.mktemp("cards-idx") / "forge"
    build_index(load_registries([FORGE]), out, embedder=Embedder("minilm"), sources=[str(FORGE)])
    return out


def _engine(index, cards: str | None, model: str = "smollm2-135m"):
    from nexus_cli.serving.engine import Engine, EngineConfig

    from nexus_cli.arguments.cards import CardRepair

    cfg = EngineConfig(model=model, reranker="none", card_splice=cards is not None, card_cache=cards, slots=4,
                       n_ctx=4096)
    engine = Engine(str(index), cfg)
    if cards is not None:  # half of the card decoded after a conversation, whatever the model's calibration says
        engine.card_splicer().repair = CardRepair(((None, 50.0),))
    return engine


def _spec(engine, tool: str):
    entry = next(t for t in engine.router.index.tools if t.name == tool)
    return engine.router.spec(entry)


def _prompt(engine, tool, query, history):
    from nexus_cli.arguments.cards import card_span
    from nexus_cli.arguments.prompt import build_messages, tool_block

    spec = _spec(engine, tool)
    model = engine.model()
    messages, _ = build_messages(spec, query, history)
    tokens = model.chat_tokens(messages)
    return spec, tokens, card_span(model, messages, tool_block(spec), tokens)


def test_the_card_span_is_the_prompts_own_tokens(forge_index):
    eng = _engine(forge_index, None)
    try:
        for history in (None, HISTORY):
            spec, tokens, span = _prompt(eng, "close_issue", "close issue 12 in acme/api", history)
            assert span is not None
            model = eng.model()
            assert model.detokenize(span.tokens).startswith("Tool:\n")
            assert list(tokens[span.head:span.end]) == list(span.tokens)
            assert list(tokens[:len(span.anchor)]) == list(span.anchor)
            assert "Request:" in model.detokenize(tokens[span.end:])
            if history is None:
                assert span.head == len(span.anchor)  # the card follows the anchor: it lands where it was compiled
            else:
                assert span.head > len(span.anchor) + 10
                assert "acme/api repository" in model.detokenize(tokens[len(span.anchor):span.head])
    finally:
        eng.close()


def _logits_after(engine, tokens, span, use_card: bool, head_pct: float | None = None, cells: bool = False):
    """The next-token logits after the whole prompt, decoded in full or with the card spliced (with the splicer's
    repair, or `head_pct` of the card decoded); with cells=True also the K/V cells of the card's positions."""
    from nexus_cli.splice.compile import extract_cells

    ctx = engine.context()
    seq = engine.WORK_SEQ
    ctx.seq_rm(seq, -1, -1)
    start = 0
    if use_card:
        start, report = engine.card_splicer().prepare(tokens, span, 0, head_pct)
        assert report["status"] == "spliced"
    kv = extract_cells(ctx, seq, span.head, span.end) if cells and use_card else None
    ctx.decode(tokens[start:], start, seq)
    out = np.array(ctx.logits(), copy=True)
    if cells and not use_card:
        kv = extract_cells(ctx, seq, span.head, span.end)
    ctx.seq_rm(seq, -1, -1)
    return (out, kv) if cells else out


def _kl(a, b) -> float:
    p, q = _softmax(a), _softmax(b)
    return float(np.sum(p * (np.log(p) - np.log(q))))


def test_a_card_without_a_window_is_exact_and_one_with_a_window_is_repaired(forge_index, tmp_path):
    eng = _engine(forge_index, str(tmp_path / "cards"))
    try:
        _, tokens, span = _prompt(eng, "close_issue", "close issue 12 in acme/api", None)
        full, full_kv = _logits_after(eng, tokens, span, use_card=False, cells=True)
        spliced, card_kv = _logits_after(eng, tokens, span, use_card=True, cells=True)
        # delta 0, nothing decoded again: the card's cells are the bytes a decode of the same tokens writes
        assert np.array_equal(full_kv[0], card_kv[0]) and np.array_equal(full_kv[1], card_kv[1])
        # the logits then differ from the full prefill only as much as any other placement of the cells in the
        # cache does (llama.cpp's CPU attention sums in cell order: the layout floor, ~3e-3 nats here)
        assert _kl(full, spliced) < 0.02
        assert eng.card_splicer().store.compiled == 1
        assert len(list((tmp_path / "cards").glob("*/*.atb"))) == 1

        _, tokens, span = _prompt(eng, "close_issue", "now close issue 12 there", HISTORY)
        assert eng.card_splicer().head_tokens(span) > 0
        full = _logits_after(eng, tokens, span, use_card=False)
        bare = _logits_after(eng, tokens, span, use_card=True, head_pct=0.0)
        repaired = _logits_after(eng, tokens, span, use_card=True, head_pct=50.0)
        assert eng.card_splicer().store.compiled == 1 and eng.card_splicer().store.memory_hits == 2  # the same card
        # re-anchored after a conversation it never attended to, the bare card is off; decoding its first half
        # after the conversation brings it most of the way back
        assert 0 < _kl(full, repaired) < _kl(full, bare) / 2, (_kl(full, repaired), _kl(full, bare))
    finally:
        eng.close()


def _softmax(x):
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(x - x.max())
    return e / e.sum()


class _GreedySteps:
    """Records each greedy step of the grammar-constrained generations: the token taken and the logits it came from."""

    def __init__(self, monkeypatch):
        from nexus_cli.adapters import llama

        self.steps: list[tuple[int, np.ndarray]] = []
        constrain = llama._GrammarCheck.constrain

        def recorded(check, tok, idx=-1):
            out = constrain(check, tok, idx)
            ptr = check._L.llama_get_logits_ith(check._ctx, idx)
            self.steps.append((out, np.ctypeslib.as_array(ptr, shape=(check._n_vocab,)).copy()))
            return out

        monkeypatch.setattr(llama._GrammarCheck, "constrain", recorded)

    def take(self) -> list[tuple[int, np.ndarray]]:
        steps, self.steps = self.steps, []
        return steps


# A repaired card is not the full prefill's cells, only close to them (the KL bounds above); a warm prefix reuse is off
# a cold prefill by the layout floor too. So two greedy answers may part only where the reference itself nearly ties:
# SmolLM2's runaway digit string in the turn below is one such place. Measured on two CPUs' llama.cpp builds: the
# repaired card parted 0.109 logits behind on one (AVX-512 without AMX) and not at all on the other, a warm plain
# engine 0.04 behind; the bare card (nothing decoded again) parted 0.34 and 0.86 behind, a quarter decoded 0.86.
NEAR_TIE_LOGITS = 0.2


def _same_greedy_path(card, reference) -> str | None:
    """None when the two lists of steps take the same tokens, or when they first part where the reference's own choice
    leads the card's by less than NEAR_TIE_LOGITS; otherwise where and by how much they part."""
    for i, ((tok, _), (ref_tok, ref_logits)) in enumerate(zip(card, reference)):
        if tok != ref_tok:
            gap = float(ref_logits[ref_tok] - ref_logits[tok])
            return None if gap < NEAR_TIE_LOGITS else f"step {i}: {tok} for {ref_tok}, {gap:.3f} logits behind"
    return None if len(card) == len(reference) else f"{len(card)} steps against {len(reference)}"


def test_a_turn_reports_its_card_and_gives_valid_arguments(forge_index, tmp_path, monkeypatch):
    # one token a step in both engines: what is compared is the card's cells, spliced or decoded; drafted batches
    # add their own float order (tests/test_adapter_llama.py)
    monkeypatch.setattr("nexus_cli.arguments.pipeline.DRAFTING", False)
    steps = _GreedySteps(monkeypatch)
    eng = _engine(forge_index, str(tmp_path / "cards"))
    plain = _engine(forge_index, None)
    try:
        first = eng.turn("close issue 12 in acme/api")
        card = first.kv["card"]
        assert card["status"] == "spliced" and card["card"] == "compiled" and card["recomputed"] == 0
        assert first.route.arguments == plain.turn("close issue 12 in acme/api").route.arguments  # exact at delta 0
        assert first.kv["decoded"] == first.kv["prompt"] - first.kv["reused"] - card["tokens"]
        plain.close()
        plain = _engine(forge_index, None)  # the reference below is a cold prefill of the whole prompt

        steps.take()
        again = eng.turn("now close issue 12 there", history=HISTORY)
        spliced_steps = steps.take()
        card = again.kv["card"]
        assert card["status"] == "spliced" and card["card"] == "memory" and card["recomputed"] > 0
        assert card["n_past"] > 0 and card["recomputed"] + card["spliced"] == card["tokens"] and again.args_valid
        # the card decoded in full takes the same greedy path, but at the reference's own near ties
        reference = plain.turn("now close issue 12 there", history=HISTORY)
        parted = _same_greedy_path(spliced_steps, steps.take())
        assert spliced_steps and parted is None, parted
        assert set(again.route.arguments) == set(reference.route.arguments)
    finally:
        eng.close()
        plain.close()


def test_a_greedy_path_parts_only_at_a_near_tie():
    logits = np.zeros(8, dtype=np.float32)
    tied, clear = logits.copy(), logits.copy()
    tied[[3, 5]] = [2.0, 1.96]
    clear[[3, 5]] = [2.0, 1.0]
    assert _same_greedy_path([(1, logits), (5, tied)], [(1, logits), (3, tied)]) is None
    assert "logits behind" in _same_greedy_path([(1, logits), (5, clear)], [(1, logits), (3, clear)])
    assert "steps against" in _same_greedy_path([(1, logits)], [(1, logits), (3, clear)])


def _card_file(root: Path) -> Path:
    files = list(root.glob("*/*.atb"))
    assert len(files) == 1, files
    return files[0]


def test_a_corrupt_or_mismatched_card_is_refused_and_compiled_again(forge_index, tmp_path):
    root = tmp_path / "cards"
    eng = _engine(forge_index, str(root))
    try:
        ref = eng.turn("close issue 12 in acme/api").route.arguments
    finally:
        eng.close()
    path = _card_file(root)
    good = path.read_bytes()

    def fresh_turn():
        e = _engine(forge_index, str(root))
        try:
            r = e.turn("close issue 12 in acme/api")
            return r, e.card_splicer().store
        finally:
            e.close()

    r, store = fresh_turn()  # a new process finds the card on disk
    assert r.kv["card"]["card"] == "disk" and store.refused == 0 and r.route.arguments == ref

    raw = bytearray(good)
    raw[-100] ^= 0xFF  # a flipped byte in the V payload
    path.write_bytes(bytes(raw))
    r, store = fresh_turn()
    assert r.kv["card"]["card"] == "compiled" and store.refused == 1
    assert "checksum" in store.last_refusal.lower() or "crc" in store.last_refusal.lower(), store.last_refusal
    assert r.route.arguments == ref and path.read_bytes() == good  # compiled again: the same bytes

    path.write_bytes(good[:1000])  # truncated
    r, store = fresh_turn()
    assert r.kv["card"]["card"] == "compiled" and store.refused == 1 and path.read_bytes() == good


@pytest.mark.qwen
def test_a_card_of_another_model_is_refused(forge_index, tmp_path):
    """A card file from another model under this model's name (copied by hand) is refused by its fingerprint."""
    from nexus_cli.arguments.cards import card_key

    root = tmp_path / "cards"
    eng = _engine(forge_index, str(root))
    try:
        eng.turn("close issue 12 in acme/api")
    finally:
        eng.close()
    smol_card = _card_file(root)

    qwen = _engine(forge_index, str(root), model="qwen2.5-0.5b")
    try:
        _, tokens, span = _prompt(qwen, "close_issue", "close issue 12 in acme/api", None)
        target = qwen.card_splicer().store.path_for(qwen.context(), card_key(qwen.context(), span))
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(smol_card, target)
        r = qwen.turn("close issue 12 in acme/api")
        store = qwen.card_splicer().store
        assert r.kv["card"]["card"] == "compiled" and store.refused == 1
        assert "fingerprint" in store.last_refusal, store.last_refusal
        assert r.args_valid and r.route.arguments.get("number") == 12
    finally:
        qwen.close()


def test_card_splicing_off_prefills_the_card(forge_index, tmp_path, monkeypatch):
    monkeypatch.setenv("NEXUS_CARD_CACHE", "off")
    from nexus_cli.serving.engine import Engine, EngineConfig

    eng = Engine(str(forge_index), EngineConfig(model="smollm2-135m", reranker="none", slots=4, n_ctx=4096))
    try:
        assert eng.card_splicer() is None
        r = eng.turn("close issue 12 in acme/api")
        assert "card" not in r.kv and r.kv["decoded"] == r.kv["prompt"] - r.kv["reused"]
    finally:
        eng.close()


def test_sessions_on_the_command_line_splice_cards_unless_told_not_to(forge_index, tmp_path):
    """`nexus route --session` as a script runs it: turn 2 (a conversation before the card) splices the card compiled
    in turn 1 from the card cache; --no-cards decodes it."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "NEXUS_DEBUG": "0", "NEXUS_CARD_CACHE": str(tmp_path / "cards")}

    def turn(sdir, query, *extra):
        p = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "route", query, "--index", str(forge_index),
                            "--model", "smollm2-135m", "--reranker", "none", "--session", str(sdir), "--json", *extra],
                           capture_output=True, text=True, cwd=REPO, timeout=600, env=env, stdin=subprocess.DEVNULL)
        assert p.returncode == 0, p.stderr
        return json.loads(p.stdout)

    first = turn(tmp_path / "a", "close issue 12 in acme/api")
    assert first["tool"] == "close_issue" and first["kv"]["card"]["card"] == "compiled"
    second = turn(tmp_path / "a", "now close issue 14 there")
    card = second["kv"]["card"]
    assert second["tool"] == "close_issue" and card["n_past"] > 0
    assert card["status"] == "decoded" or (card["status"] == "spliced" and card["card"] == "disk")
    off = turn(tmp_path / "b", "close issue 12 in acme/api", "--no-cards")
    assert "card" not in off["kv"] and off["arguments"] == first["arguments"]


def test_a_card_cache_that_cannot_be_written_decodes_the_card(forge_index, tmp_path):
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    eng = _engine(forge_index, str(blocker / "cards"))
    plain = _engine(forge_index, None)
    try:
        r = eng.turn("close issue 12 in acme/api")
        card = r.kv["card"]
        assert card["status"] == "decoded" and "card cache" in card["reason"] and r.args_valid
        assert r.route.arguments == plain.turn("close issue 12 in acme/api").route.arguments
    finally:
        eng.close()
        plain.close()
