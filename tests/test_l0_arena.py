"""The L0 exact-token radix arena over a real SmolLM2 context: exact reuse, counters, LRU eviction, errors."""

from __future__ import annotations

import numpy as np
import pytest

from nexus_cli.errors import ModelError, UsageError
from nexus_cli.serving.arena import L0Arena

SYSTEM = {"role": "system", "content": "You are an agent. Tools: create_issue(owner: string, repo: string, title: string), "
                                       "list_pulls(owner: string, repo: string)."}


@pytest.fixture(scope="module")
def model():
    from nexus_cli.adapters.llama import load_model

    return load_model("smollm2-135m")


def _ctx(model, n_seq_max=6, n_ctx=1024):
    from nexus_cli.adapters.llama import LlamaContext

    return LlamaContext(model, n_ctx=n_ctx, n_seq_max=n_seq_max, flash_attn=True)


def _chat(model, text):
    return model.chat_tokens([SYSTEM, {"role": "user", "content": text}])


def _turn(ctx, arena, tokens, min_prefix=1):
    acq = arena.acquire(tokens, min_prefix=min_prefix)
    ctx.decode(tokens[acq.n_reused:], acq.n_reused, arena.work_seq)
    logits = ctx.logits()
    arena.commit(tokens)
    return acq, logits


def test_reused_prefix_gives_the_logits_of_a_cold_prefill(model):
    a = _chat(model, "open an issue in octo/widgets titled crash")
    b = _chat(model, "list the pulls of octo/widgets please")
    with _ctx(model) as ctx:
        arena = L0Arena(ctx, n_slots=4)
        acq_a, _ = _turn(ctx, arena, a)
        assert not acq_a.hit and acq_a.n_reused == 0
        acq_b, warm = _turn(ctx, arena, b)
        lcp = next(i for i in range(min(len(a), len(b))) if a[i] != b[i])
        assert acq_b.hit and acq_b.slot == 0 and acq_b.lcp == lcp and acq_b.n_reused == lcp
        assert acq_b.copy_ns > 0
    with _ctx(model, n_seq_max=1) as cold_ctx:
        cold_ctx.decode(b, 0, 0)
        cold = cold_ctx.logits()
    from nexus_cli.adapters.llama import kl_divergence

    assert int(warm.argmax()) == int(cold.argmax()) and kl_divergence(cold, warm) < 1e-6
    # With flash attention and the cells in position order, this split (44 reused + 15 decoded) gives the very bits of
    # a cold prefill at the pinned llama.cpp; other split sizes can differ by float rounding (docs/serving.md).
    assert np.array_equal(warm, cold)


def test_full_prompt_match_still_decodes_the_last_token(model):
    a = _chat(model, "close issue 7 in acme/api")
    with _ctx(model) as ctx:
        arena = L0Arena(ctx, n_slots=2)
        _, first = _turn(ctx, arena, a)
        acq, again = _turn(ctx, arena, a)
        assert acq.hit and acq.lcp == len(a) and acq.n_reused == len(a) - 1
        assert np.array_equal(first, again)


def test_counters_min_prefix_and_commit_in_place(model):
    base = [{"role": "user", "content": "open an issue in acme/api titled crash"},
            {"role": "assistant", "content": '{"tool": "create_issue"}'}]
    t1 = model.chat_tokens([SYSTEM, base[0]])
    t2 = model.chat_tokens([SYSTEM, *base, {"role": "user", "content": "and list the pulls there"}])
    with _ctx(model) as ctx:
        arena = L0Arena(ctx, n_slots=3)
        _turn(ctx, arena, t1)
        acq, _ = _turn(ctx, arena, t2)  # the same conversation grew: its slot is extended, not a new one
        assert acq.hit and acq.slot == 0
        assert arena.occupied() == [0] and arena.slot_length(0) == len(t2)
        # a prompt that shares fewer tokens than min_prefix is a miss and copies nothing
        other = model.chat_tokens([{"role": "system", "content": "A different agent."},
                                   {"role": "user", "content": "hello"}])
        acq3, _ = _turn(ctx, arena, other, min_prefix=len(other))
        assert not acq3.hit and acq3.n_reused == 0
        st = arena.stats()
        assert st["lookups"] == 3 and st["hits"] == 1 and st["misses"] == 2
        assert st["copied_tokens"] == acq.n_reused and st["commits"] == 3 and st["occupied"] == 2


def test_lru_eviction(model):
    prompts = [_chat(model, f"request number {i} about repository r{i}") for i in range(4)]
    with _ctx(model) as ctx:
        arena = L0Arena(ctx, n_slots=2)
        _turn(ctx, arena, prompts[0])
        _turn(ctx, arena, prompts[1])
        assert sorted(arena.occupied()) == [0, 1]
        # touch slot 0 (a hit on prompt 0 again): slot 1 becomes the least recently used
        acq, _ = _turn(ctx, arena, prompts[0])
        assert acq.hit and acq.slot == 0
        _turn(ctx, arena, prompts[2])  # shares only the system prefix with slot 0: needs a slot -> evicts slot 1
        assert arena.evictions == 1
        held = {tuple(arena.slot_tokens(s)) for s in arena.occupied()}
        assert tuple(prompts[0]) in held and tuple(prompts[2]) in held and tuple(prompts[1]) not in held
        # the evicted slot's sequence was emptied in the KV cache as well
        assert all(ctx.seq_pos_max(arena.slot_seq(s)) + 1 == arena.slot_length(s) for s in arena.occupied())
        arena.clear()
        assert arena.occupied() == [] and ctx.seq_pos_max(arena.work_seq) == -1


def test_errors(model):
    with _ctx(model, n_seq_max=4) as ctx:
        with pytest.raises(ModelError, match="n_seq_max"):
            L0Arena(ctx, n_slots=32)
        with pytest.raises(UsageError):
            L0Arena(ctx, n_slots=0)
        arena = L0Arena(ctx, n_slots=3)
        toks = _chat(model, "hello")
        arena.acquire(toks)
        ctx.decode(toks, 0, arena.work_seq)
        with pytest.raises(ModelError, match="holds"):
            arena.commit(toks[:-1])
        assert arena.match([]) == (-1, 0)


def test_state_arena_reuses_only_the_owner_state_and_is_order_independent(model):
    from nexus_cli.serving.arena import StateArena

    a1 = _chat(model, "open an issue in acme/api titled crash")
    b1 = _chat(model, "list the pulls of octo/widgets please")
    a2 = model.chat_tokens([SYSTEM, {"role": "user", "content": "open an issue in acme/api titled crash"},
                            {"role": "assistant", "content": "create_issue"},
                            {"role": "user", "content": "and another one titled hang"}])

    def turn(arena, tokens, owner):
        acq = arena.acquire(tokens, owner=owner)
        arena.decode_with_eviction(tokens[acq.n_reused:], acq.n_reused)
        logits = arena.ctx.logits()
        arena.commit(tokens, owner=owner)
        return acq, logits

    with _ctx(model) as ctx:
        arena = StateArena(ctx, n_slots=2)
        turn(arena, a1, "A")
        acq_b, _ = turn(arena, b1, "B")  # shares the system prompt with A, but B has no state yet: a miss
        assert not acq_b.hit
        acq_a, warm = turn(arena, a2, "A")  # A's own previous state is reused
        assert acq_a.hit and acq_a.n_reused > len(a1) // 2
        acq_s, _ = turn(arena, b1, None)  # a stateless call never reuses and keeps nothing
        assert not acq_s.hit and sorted(arena.occupied()) == ["A", "B"]
        st = arena.stats()
        assert st["hits"] == 1 and st["misses"] == 3 and st["commits"] == 3 and st["host_bytes"] > 0
        turn(arena, b1, "C")  # a third owner evicts the least recently used one (B)
        assert sorted(arena.occupied()) == ["A", "C"] and arena.evictions == 1
    # the same two turns of A alone, on a fresh context, give the same bits
    with _ctx(model) as ctx2:
        solo = StateArena(ctx2, n_slots=2)
        turn(solo, a1, "A")
        _, alone = turn(solo, a2, "A")
    assert np.array_equal(warm, alone)
