"""The llama.cpp adapter on the real SmolLM2-135M: identity, tokens, decoding at positions, cell edits, sequence
state (and our NumPy reader/writer of its blob, byte for byte), generation with and without a grammar."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from nexus_cli.config import MODELS
from nexus_cli.errors import ModelError, SchemaError

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smol():
    from nexus_cli.adapters.llama import load_model

    return load_model("smollm2-135m")


@pytest.fixture()
def ctx(smol):
    from nexus_cli.adapters.llama import LlamaContext

    c = LlamaContext(smol, n_ctx=512, n_batch=64, n_seq_max=3, flash_attn=False)
    yield c
    c.close()


def test_identity_of_smollm2(smol):
    ident = smol.identity
    assert (ident.arch, ident.n_layer, ident.n_head, ident.n_head_kv, ident.head_dim) == ("llama", 30, 9, 3, 64)
    assert ident.rope_type == 0 and ident.n_rot == 64  # NORM: adjacent pairs
    assert ident.freq_base == 100000.0 and ident.freq_scale == 1.0 and ident.yarn_ext_factor == 0.0
    assert ident.n_ctx_train == 8192 and ident.n_ctx_orig == 8192
    assert ident.chat_template == "chatml"
    assert ident.sha256 == MODELS["smollm2-135m"].sha256
    assert ident.fingerprint == ident.sha256[:32] and len(ident.fingerprint_bytes) == 16
    d = ident.to_dict()
    json.dumps(d)
    assert d["fingerprint"] == ident.fingerprint and d["name"] == "smollm2-135m"


def test_fingerprint_is_cached_by_path_size_mtime(smol):
    from nexus_cli.adapters.llama import _fingerprint_cache_path, file_sha256

    saved = json.loads(_fingerprint_cache_path().read_text())
    assert any(k.startswith(str(smol.path.resolve()) + "|") and v == smol.identity.sha256 for k, v in saved.items())
    assert file_sha256(smol.path) == smol.identity.sha256


def test_fingerprint_changes_with_the_bytes(tmp_path, monkeypatch):
    from nexus_cli.adapters import llama

    monkeypatch.setenv("NEXUS_MODELS", str(tmp_path))
    f = tmp_path / "w.bin"
    f.write_bytes(b"weights-1")
    a = llama.file_sha256(f)
    f.write_bytes(b"weights-2")
    b = llama.file_sha256(f)
    assert a != b and len(a) == 64


def test_tokens_and_chat_template(smol):
    toks = smol.tokenize("Hello world, this is a test.")
    assert toks and smol.detokenize(toks) == "Hello world, this is a test."
    text = smol.apply_chat_template([{"role": "user", "content": "hi"}], add_assistant=True)
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    ct = smol.chat_tokens([{"role": "user", "content": "hi"}])
    assert ct[0] == smol.tokenize("<|im_start|>")[0] and len(smol.tokenize("<|im_start|>")) == 1


def test_decode_splits_long_inputs_and_tracks_positions(ctx, smol):
    toks = (smol.tokenize("One two three four five six seven eight nine ten. ") * 20)[:150]
    ctx.decode(toks, 0, 0)  # 150 tokens through n_batch = 64: three llama_decode calls
    assert ctx.seq_pos_max(0) == 149 and ctx.seq_pos_min(0) == 0
    lg = ctx.logits()
    assert lg.shape == (smol.n_vocab,) and np.all(np.isfinite(lg))
    # a batch that does not continue the sequence is refused with a clear error, not a crash
    with pytest.raises(ModelError):
        ctx.decode(toks[:3], 10, 0)


def test_decode_many_matches_decoding_each_sequence_alone(ctx, smol):
    texts = ["Merge the pull request.", "List the open issues of the repository, newest first.", "Hello"]
    toks = [smol.tokenize(t) for t in texts]
    alone = []
    for tk in toks:
        ctx.seq_rm(0)
        ctx.decode(tk, 0, 0)
        alone.append(ctx.logits())
    ctx.seq_rm(0)
    # three sequences in one call; the next item would overflow n_batch = 64, so it goes into a second call
    long = (smol.tokenize("one two three four five six seven eight ") * 10)[:60]
    together = ctx.decode_many([(tk, 0, seq) for seq, tk in enumerate(toks)])
    assert [ctx.seq_pos_max(s) for s in range(3)] == [len(tk) - 1 for tk in toks]
    for a, b in zip(alone, together):
        assert int(np.argmax(a)) == int(np.argmax(b))
        np.testing.assert_allclose(a, b, atol=2e-2 * max(1.0, float(np.abs(a).max())))
    ctx.seq_rm(0)
    [split] = ctx.decode_many([(long, 0, 0)])
    ctx.seq_rm(0)
    ctx.decode(long, 0, 0)
    np.testing.assert_allclose(split, ctx.logits(), atol=2e-2 * max(1.0, float(np.abs(split).max())))
    with pytest.raises(ModelError):  # an item longer than n_batch is refused, not split
        ctx.decode_many([(long * 2, 0, 1)])
    with pytest.raises(ModelError):  # and so is one that does not continue its sequence
        ctx.decode_many([(toks[0], 5, 2)])


def test_cell_edits(ctx, smol):
    toks = smol.tokenize("The quick brown fox jumps over the lazy dog again and again.")
    n = len(toks)
    ctx.decode(toks, 0, 0)
    ctx.seq_cp(0, 1, 0, 5)
    assert ctx.seq_pos_max(1) == 4
    ctx.seq_rm(0, 5, -1)
    assert ctx.seq_pos_max(0) == 4
    ctx.seq_rm(1, -1, -1)
    assert ctx.seq_pos_max(1) == -1
    ctx.decode(toks[5:], 5, 0)
    assert ctx.seq_pos_max(0) == n - 1
    ctx.clear()
    assert ctx.seq_pos_max(0) == -1


def test_state_roundtrip_into_another_sequence(ctx, smol):
    toks = smol.tokenize("Sequence state carries the raw K and V rows of every cell of one sequence.")
    nxt = smol.tokenize(" Next")
    ctx.decode(toks, 0, 0, logits_last=False)
    blob = ctx.state_seq_get(0)
    ctx.state_seq_set(blob, 2)
    assert ctx.seq_pos_max(2) == len(toks) - 1
    ctx.decode(nxt, len(toks), 0)
    a = ctx.logits()
    ctx.decode(nxt, len(toks), 2)
    b = ctx.logits()
    assert np.array_equal(a, b)


@pytest.mark.parametrize("flash_attn", [False, True], ids=["fa-off", "fa-on"])
def test_blob_reader_and_writer_match_llama_bytes(smol, flash_attn):
    """parse_state_blob / build_state_blob reproduce llama.cpp's own blob exactly, in both V layouts."""
    from nexus_cli.adapters.llama import LlamaContext
    from nexus_cli.splice.state import build_state_blob, parse_state_blob

    c = LlamaContext(smol, n_ctx=256, n_batch=64, n_seq_max=2, flash_attn=flash_attn)
    try:
        toks = smol.tokenize("A blob holds positions, sequence ids, then K rows and V in the cache's layout.")
        c.decode(toks, 0, 0, logits_last=False)
        blob = c.state_seq_get(0)
        st = parse_state_blob(blob)
        assert st.v_trans == (not flash_attn) and c.v_layout == (0 if flash_attn else 1)
        assert st.n_cells == len(toks) and list(st.pos) == list(range(len(toks)))
        row = smol.identity.n_head_kv * smol.identity.head_dim
        assert st.k.shape == (30, len(toks), row)
        assert st.v.shape == ((30, row, len(toks)) if st.v_trans else (30, len(toks), row))
        assert build_state_blob(0, st.pos, st.k, st.v, st.v_trans) == blob
    finally:
        c.close()


def test_generate_greedy_is_deterministic_and_grammar_constrains(ctx, smol):
    prompt = smol.chat_tokens([{"role": "user", "content": "Name one colour. Reply with one word."}])
    a = ctx.generate(prompt, max_tokens=6)
    b = ctx.generate(prompt, max_tokens=6)
    assert a.text == b.text and a.tokens == b.tokens and a.stop in ("eog", "max_tokens")
    assert a.n_prompt == len(prompt) and a.t_first_token_ms > 0 and a.t_total_ms >= a.t_first_token_ms
    grammar = 'root ::= "{\\"colour\\": \\"" [a-z]+ "\\"}"'
    g = ctx.generate(prompt, max_tokens=24, grammar=grammar)
    assert re.fullmatch(r'\{"colour": "[a-z]+"\}', g.text), g.text
    assert g.stop == "eog"
    with pytest.raises(SchemaError):
        ctx.generate(prompt, max_tokens=4, grammar="root ::= (")


def test_logit_bias_moves_the_greedy_choice(ctx, smol):
    """A bias on one alternative's token decides a choice the grammar leaves open, either way."""
    prompt = smol.chat_tokens([{"role": "user", "content": "Pick a colour."}])
    grammar = 'root ::= "red" | "blue"'
    first = {w: smol.tokenize(w, parse_special=False)[0] for w in ("red", "blue")}
    assert first["red"] != first["blue"]
    for want, other in (("red", "blue"), ("blue", "red")):
        g = ctx.generate(prompt, max_tokens=4, grammar=grammar, logit_bias={first[want]: 30.0, first[other]: -30.0})
        assert g.text == want, g.text
    plain = ctx.generate(prompt, max_tokens=4, grammar=grammar)
    assert ctx.generate(prompt, max_tokens=4, grammar=grammar, logit_bias={}).text == plain.text


def test_lazy_grammar_picks_the_same_tokens_as_the_grammar_in_the_chain(ctx, smol):
    """Greedy decoding tests the unconstrained choice against the grammar and masks the whole vocabulary only when
    it is rejected; the tokens must be those of the reference (the grammar in the sampler chain, every candidate
    masked at every step), with and without a logit bias, also where the grammar rejects the model's choice."""
    from nexus_cli.registry import Tool
    from nexus_cli.schema import compile_tool

    spec = compile_tool(Tool("forge", "create_issue", "Open an issue.", {
        "type": "object", "required": ["owner", "repo", "title"], "properties": {
            "owner": {"type": "string"}, "repo": {"type": "string"}, "title": {"type": "string"},
            "labels": {"type": "array", "items": {"type": "string"}},
            "priority": {"type": "string", "enum": ["p0", "p1", "p2"]}, "count": {"type": "integer"}}}))
    cases = [
        ("Open an issue in acme/api titled Login broken, label it bug, priority p1.", spec.grammar),
        ("Name one colour. Reply with one word.", 'root ::= "{\\"colour\\": \\"" [a-z]+ "\\"}"'),
        ("Count to three.", 'root ::= [0-9] [0-9] [0-9] "-" ("zebra" | "quokka")'),
    ]
    rejected = 0
    for text, grammar in cases:
        prompt = smol.chat_tokens([{"role": "user", "content": text}])
        bias = {smol.tokenize(" the", parse_special=False)[0]: 5.0, smol.tokenize("{", parse_special=False)[0]: -2.0}
        for lift in ({}, bias):
            ref = ctx.generate(prompt, max_tokens=48, grammar=grammar, logit_bias=lift, lazy_grammar=False)
            lazy = ctx.generate(prompt, max_tokens=48, grammar=grammar, logit_bias=lift)
            assert lazy.tokens == ref.tokens and lazy.stop == ref.stop, (text, lazy.text, ref.text)
            assert ref.grammar_rejections == 0
            rejected += lazy.grammar_rejections
    assert rejected > 0  # the full-vocabulary path ran too
    assert re.fullmatch(r"[0-9]{3}-(zebra|quokka)", lazy.text), lazy.text


def test_drafted_generation_keeps_the_greedy_tokens_and_only_their_cells(ctx, smol):
    """A draft only proposes: with the right tokens drafted, with wrong ones, with the grammar in the chain or
    checked lazily, the output is the plain greedy one, and the sequence then holds the prompt and the output,
    nothing a rejected draft left behind."""
    from nexus_cli.registry import Tool
    from nexus_cli.schema import compile_tool

    spec = compile_tool(Tool("forge", "create_issue", "Open an issue.", {
        "type": "object", "required": ["owner", "repo", "title"], "properties": {
            "owner": {"type": "string"}, "repo": {"type": "string"}, "title": {"type": "string"}}}))
    prompt = smol.chat_tokens([{"role": "user", "content": "Open an issue in acme/api titled Login broken."}])
    for lazy in (True, False):
        plain = ctx.generate(prompt, max_tokens=48, grammar=spec.grammar, lazy_grammar=lazy)
        cells = ctx.seq_pos_max(0)
        assert plain.drafted == plain.accepted == 0
        oracle = lambda out: plain.tokens[len(out):len(out) + 5]  # noqa: E731 - the answer itself, ahead
        wrong = lambda out: smol.tokenize(" zebra quokka", parse_special=False)  # noqa: E731
        half = lambda out: (plain.tokens[len(out):len(out) + 1]  # noqa: E731 - one right, then wrong ones
                            + smol.tokenize(" zebra", parse_special=False))
        for draft in (oracle, wrong, half):
            res = ctx.generate(prompt, max_tokens=48, grammar=spec.grammar, lazy_grammar=lazy, draft=draft)
            assert res.tokens == plain.tokens and res.stop == plain.stop
            assert ctx.seq_pos_max(0) == cells
            assert 0 <= res.accepted <= res.drafted
        assert ctx.generate(prompt, max_tokens=48, grammar=spec.grammar, lazy_grammar=lazy,
                            draft=oracle).accepted >= len(plain.tokens) // 2
    # cut short by max_tokens: the drafted cells past the output are removed too
    short = ctx.generate(prompt, max_tokens=5, grammar=spec.grammar)
    cells = ctx.seq_pos_max(0)
    drafted = ctx.generate(prompt, max_tokens=5, grammar=spec.grammar,
                           draft=lambda out: plain.tokens[len(out):len(out) + 3])
    assert drafted.tokens == short.tokens and drafted.stop == "max_tokens" and ctx.seq_pos_max(0) == cells


def test_close_string_ends_the_string_being_written_at_the_next_token(ctx, smol):
    """close_string asks for a closing quote: the next token begins with one (the grammar's choice among those), the
    output still follows the grammar, what came before is the greedy output, and the sequence holds exactly the
    prompt and the output, with or without drafts."""
    grammar = 'root ::= "{\\"title\\": \\"" [a-zA-Z ]{1,40} "\\", \\"tag\\": \\"" [a-z]{1,10} "\\"}"'
    prompt = smol.chat_tokens([{"role": "user", "content": "Make a JSON title for: The login button does nothing "
                                                           "when clicked"}])
    plain = ctx.generate(prompt, max_tokens=64, grammar=grammar)
    first = json.loads(plain.text)
    assert len(first["title"]) > 6

    def in_title(out):  # the title has three or more characters and is still open
        text = smol.detokenize(out)
        return text.startswith('{"title": "') and '"' not in text[len('{"title": "'):] and len(text) >= 14

    for draft in (None, lambda out: plain.tokens[len(out):len(out) + 3]):
        res = ctx.generate(prompt, max_tokens=64, grammar=grammar, close_string=in_title, draft=draft)
        answer = json.loads(res.text)
        assert res.closed == 1 and set(answer) == {"title", "tag"}
        assert first["title"].startswith(answer["title"]) and len(answer["title"]) < len(first["title"])
        n = len(answer["title"]) + len('{"title": "')
        assert smol.detokenize(res.tokens)[:n] == plain.text[:n]
        assert smol.token_to_piece(res.tokens[[len(smol.detokenize(res.tokens[:i])) >= n
                                               for i in range(len(res.tokens) + 1)].index(True)]).startswith(b'"')
        assert ctx.seq_pos_max(0) == len(prompt) + len(res.tokens) - 1
    # never asked: the plain greedy answer
    assert ctx.generate(prompt, max_tokens=64, grammar=grammar, close_string=lambda out: False).tokens \
        == plain.tokens


def test_generate_reuses_a_warm_prefix(ctx, smol):
    prompt = smol.chat_tokens([{"role": "user", "content": "Say yes."}])
    cold = ctx.generate(prompt, max_tokens=6)
    ctx.seq_rm(0, len(prompt) - 3, -1)
    warm = ctx.generate(prompt[len(prompt) - 3:], max_tokens=6, start_pos=len(prompt) - 3)
    assert warm.tokens == cold.tokens and warm.n_prompt == 3


def test_generate_many_matches_one_sequence_at_a_time(ctx, smol):
    """Greedy batched generation (the prompts' shared start decoded once, one token per sequence per step): one
    prompt alone gives exactly `generate`'s tokens; in a batch, every token of every sequence is the greedy choice
    after its own prompt and tokens, up to float noise (a batch sums in another order: near-ties may flip, so the
    check is against the logits, not against the tokens of a separate run). A stop callback ends a sequence."""
    asks = ["Name one colour.", "Name one animal.", "Count from one to five."]
    prompts = [smol.chat_tokens([{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": a}])
               for a in asks]
    assert prompts[0][:5] == prompts[1][:5]  # they share a start, the path that copies one sequence's cells
    assert ctx.generate_many(prompts[:1], max_tokens=12)[0] == ctx.generate(prompts[0], max_tokens=12).tokens
    together = ctx.generate_many(prompts, max_tokens=12)
    assert all(ctx.seq_pos_max(s) < 0 for s in range(len(prompts)))  # the sequences are emptied afterwards
    for p, out in zip(prompts, together):
        assert out and len(p) + len(out) <= ctx.n_batch
        ctx.seq_rm(0)
        ctx.decode(p + out, 0, 0, logits_all=True)
        for k, tok in enumerate(out):  # output row len(p) - 1 + k predicts token k (the whole thing is one chunk)
            row = ctx.logits(len(p) - 1 + k)
            assert row[tok] >= row.max() - 0.1, (k, tok, int(row.argmax()))
        ctx.seq_rm(0)
    stopped = ctx.generate_many(prompts, max_tokens=12, stop=lambda toks: len(toks) >= 2)
    assert all(len(t) <= 2 for t in stopped) and [t[:1] for t in stopped] == [t[:1] for t in together]
    sampled = ctx.generate_many(prompts, max_tokens=8, temperature=0.8, seed=3)
    assert sampled == ctx.generate_many(prompts, max_tokens=8, temperature=0.8, seed=3)  # seeded: reproducible
    with pytest.raises(ModelError):
        ctx.generate_many(prompts + prompts, max_tokens=4)  # more prompts than sequences


def test_context_refuses_overflow(ctx, smol):
    with pytest.raises(ModelError):
        ctx.decode([smol.tokenize("x")[0]] * 10, ctx.n_ctx - 5, 0)
