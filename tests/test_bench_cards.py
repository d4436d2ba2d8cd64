"""`nexus bench card-splice`'s comparison of which card tokens to recompute after a conversation (the first ones, or
those whose K/V deviate most from a full prefill, as CacheBlend chooses): the deviation measure, and the card
assembled from spliced cells and tokens decoded anew in place. Real SmolLM2."""

from __future__ import annotations

import tempfile

import numpy as np
import pytest


def test_deviation_weighs_every_layer_alike_and_reads_layer_one_apart():
    from nexus_cli.lab.bench_cards import _deviations

    rng = np.random.default_rng(0)
    k = rng.standard_normal((3, 5, 8)).astype(np.float32)
    v = rng.standard_normal((3, 5, 8)).astype(np.float32)
    k[2] *= 100.0  # a layer of large norms must not outweigh the others
    sk, sv = k.copy(), v.copy()
    sk[2, 1] *= 1.5  # token 1 off by half its norm in the large layer
    sv[1, 3] += 2.0  # token 3 off in layer 1 only
    total, layer1 = _deviations((k, v), (sk, sv))
    assert total.shape == layer1.shape == (5,)
    assert total[0] == total[2] == total[4] == 0.0
    assert total[1] > 0 and total[3] > 0
    assert int(np.argmax(layer1)) == 3 and layer1[1] == 0.0
    # relative to each layer's mean squared norm (of K and V together): scaling a layer's rows scales its errors
    # alike
    k2, sk2, v2, sv2 = k.copy(), sk.copy(), v.copy(), sv.copy()
    for a in (k2, sk2, v2, sv2):
        a[2] *= 10.0
    assert np.allclose(_deviations((k2, v2), (sk2, sv2))[0], total, rtol=1e-5)


@pytest.fixture(scope="module")
def setup():
    from nexus_cli.adapters.llama import LlamaContext, load_model
    from nexus_cli.arguments.cards import CardRepair, CardSplicer, CardStore
    from nexus_cli.lab import bench_cards as bc
    from nexus_cli.lab.bench_routing import pool_tools
    from nexus_cli.lab.common import registry_dir_default
    from nexus_cli.schema import compile_tool

    llm = load_model("smollm2-135m")
    tools = {t.key: t for t in pool_tools(registry_dir_default())}
    case, earlier = next((c, e) for c, e in bc._cases(bc.DEV_FILES, 1) if f"{c['server']}/{c['tool']}" in tools)
    spec = compile_tool(tools[f"{case['server']}/{case['tool']}"])
    conv = bc.conversation(llm, spec, case, earlier, 512)
    assert conv is not None
    _, _, tokens, span = conv
    ctx = LlamaContext(llm, n_ctx=bc.N_CTX, n_batch=512, n_seq_max=3, flash_attn=True)
    with tempfile.TemporaryDirectory() as cache:
        splicer = CardSplicer(ctx, CardStore(cache), bc.WORK, bc.SCRATCH, repair=CardRepair(((None, 0.0),)))
        ctx.decode(list(tokens[:span.head]), 0, bc.WORK, logits_last=False)
        splicer.store.block_for(ctx, span, bc.SCRATCH)
        yield bc, ctx, splicer, tokens, span
    ctx.close()


def test_assembled_card_keeps_spliced_cells_and_decodes_the_chosen_ones_after_the_conversation(setup):
    bc, ctx, splicer, tokens, span = setup
    assert span.head >= 512 and len(span.tokens) >= 8
    bc._reprefill(ctx, tokens, span.head)
    full = bc._card_cells(ctx, span)
    bc._spliced(ctx, splicer, tokens, span, 0.0)
    bare = bc._card_cells(ctx, span)
    ctx.seq_rm(bc.SHIFT, -1, -1)
    ctx.seq_cp(bc.WORK, bc.SHIFT, span.head, span.end)
    chosen = {0, 1, 5}
    logits = bc._selective(ctx, tokens, span, chosen)
    assert logits.shape == (ctx.model.n_vocab,) and np.isfinite(logits).all()
    assert ctx.seq_pos_max(bc.WORK) == len(tokens) - 1  # the conversation, the card and the tail, in order
    k, v = bc._card_cells(ctx, span)
    for j in range(len(span.tokens)):
        if j in chosen:
            continue
        assert np.array_equal(k[:, j], bare[0][:, j]) and np.array_equal(v[:, j], bare[1][:, j]), j
    # token 0 decoded after the conversation: what the full prefill holds, not the spliced cell (up to the float
    # order of another batch); layer 0 depends on the position only, so the difference is in the later layers
    off_fresh = np.abs(k[1:, 0] - full[0][1:, 0]).sum()
    off_bare = np.abs(bare[0][1:, 0] - full[0][1:, 0]).sum()
    assert off_fresh < 0.1 * off_bare
    # nothing chosen: the bare splice's cells throughout
    bc._selective(ctx, tokens, span, set())
    k0, _ = bc._card_cells(ctx, span)
    assert np.array_equal(k0, bare[0])
    ctx.seq_rm(bc.SHIFT, -1, -1)
