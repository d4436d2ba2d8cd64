"""One coarse re-entrant lock serializes a whole turn on the shared context: 4 threads x 25 turns give bit-identical
outputs to the same turns run serially (paper §VI-C). The engine runs in deterministic mode (StateArena): the lock alone
keeps turns from racing on the context, but llama.cpp's logits also depend, by float rounding, on where a prompt's cells
sit in a shared cache, which depends on how the threads' turns interleaved; the deterministic arena rebuilds the cache
per turn so a turn's computation depends only on its own conversation. Real MiniLM + SmolLM2; the per-turn work is kept small: routing
with the conversation as history, then a short grammar-constrained generation (pick one of the top candidates)
through the L0 arena on the shared llama.cpp context."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"
QUERIES = [json.loads(line)["query"] for line in (REPO / "tool_registries" / "demo_queries.jsonl").read_text().splitlines()
           if line.strip()]
THREADS = 4
TURNS = 25


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.build import build_index
    from nexus_cli.serving.session import Engine, EngineConfig

    out = tmp_path_factory.mktemp("conc-idx") / "forge"
    emb = Embedder("minilm")
    build_index(load_registries([FORGE]), out, embedder=emb, sources=[str(FORGE)])
    eng = Engine(out, EngineConfig(model="smollm2-135m", with_args=False, n_ctx=4096, reranker="none",
                                      deterministic=True), embedder=emb)
    yield eng
    eng.close()


def tiny_turn(engine, conv: list[dict], query: str, owner: str):
    """Route with history, then pick one of the top-3 candidates by a grammar-constrained generation."""
    with engine.lock:  # the whole turn; engine.turn takes the same (re-entrant) lock inside
        res = engine.turn(query, history=conv or None, with_args=False, owner=owner)
        r = res.route
        names = [c.tool for c in r.candidates[:3]]
        msgs = [{"role": "system", "content": "Answer with the name of the tool that serves the request."},
                {"role": "user", "content": f"{query}\nTools: {', '.join(names)}"}]
        toks = engine.model().chat_tokens(msgs)
        grammar = "root ::= " + " | ".join(f'"{n}"' for n in names)
        g, _acq, _slot, _held = engine.generate(toks, grammar=grammar, max_tokens=12, owner=owner)
    conv += [{"role": "user", "content": query}, {"role": "assistant", "content": g.text}]
    return (r.server, r.tool, tuple((c.server, c.tool, c.score) for c in r.candidates), r.gate["margin"],
            g.text, tuple(g.tokens))


def conversation_queries(k: int) -> list[str]:
    return [QUERIES[(k * 7 + i) % len(QUERIES)] for i in range(TURNS)]


def test_four_threads_give_the_serial_outputs(engine):
    serial: dict[int, list] = {}
    for k in range(THREADS):
        conv: list[dict] = []
        serial[k] = [tiny_turn(engine, conv, q, f"conv{k}") for q in conversation_queries(k)]
    engine.arena.clear()

    concurrent: dict[int, list] = {k: [] for k in range(THREADS)}
    errors: list[BaseException] = []
    start = threading.Barrier(THREADS)

    def worker(k: int) -> None:
        try:
            conv: list[dict] = []
            start.wait()
            for q in conversation_queries(k):
                concurrent[k].append(tiny_turn(engine, conv, q, f"conv{k}"))
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for k in range(THREADS):
        assert len(concurrent[k]) == TURNS
        for i in range(TURNS):
            assert concurrent[k][i] == serial[k][i], f"thread {k} turn {i} differs"
    assert engine.turns == 2 * THREADS * TURNS
    # the generations really went through the shared arena
    st = engine.arena.stats()
    assert st["hits"] > 0 and st["copied_tokens"] > 0
