"""The shipped example requests (tool_registries/examples/): every one names a real tool of the shared registries,
and none is a near-copy of a held-out benchmark query (they are scored against those queries)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from nexus_cli.registry import load_example_requests, load_registries

REPO = Path(__file__).resolve().parent.parent
EXAMPLES = REPO / "tool_registries" / "examples" / "shared_registries.jsonl"
# The held-out query sets scored over indexes that hold the examples. Not routing_heldout_servers.jsonl (the test
# servers) nor routing_dev_servers.jsonl (the dev servers): they are scored only by `nexus bench routing-lso`, over
# indexes built without examples by an embedder that never saw their servers' examples, so an example that resembles
# one of their requests reaches neither side of that measurement. The *_history.jsonl sets are copies of requests of
# these files and of routing.jsonl with another conversation's history (benchmarks/history_pairs.py), scored the
# same way only; routing_test_followups.jsonl holds follow-ups over the test servers and routing_test_servers_b.jsonl
# and routing_test_servers_c.jsonl requests written later for them (routing_dev_servers_c.jsonl the same for the dev
# servers), all scored the same way only.
LSO_ONLY = {"routing_heldout_servers.jsonl", "routing_dev_servers.jsonl", "routing_dev_servers_history.jsonl",
            "routing_test_history.jsonl", "routing_test_followups.jsonl", "routing_test_servers_b.jsonl",
            "routing_test_servers_c.jsonl", "routing_test_servers_c_history.jsonl", "routing_dev_servers_c.jsonl"}
# The requests that leave required values out are never routed: benchmarks/args_eval.py gives them their gold tool
# and benchmarks/guessed_values.py scores the values it names, so an example like one of them reaches no measurement.
GOLD_TOOL_ONLY = {"args_unstated.jsonl", "args_unstated_b.jsonl", "args_unstated_c.jsonl", "args_unstated_d.jsonl",
                  "args_unstated_e.jsonl"}
HELD_OUT = sorted(p for p in (REPO / "benchmarks" / "queries").glob("*.jsonl")
                  if p.name not in LSO_ONLY | GOLD_TOOL_ONLY)
NEAR_COPY = 0.5  # Jaccard index of the word sets at which a request counts as a copy of a held-out query


def words(text: str) -> frozenset[str]:
    return frozenset(re.findall(r"\w+", text.lower()))


def test_every_example_names_a_real_tool(shared_registries):
    examples = load_example_requests([EXAMPLES])
    keys = {t.key for t in load_registries([shared_registries])}
    unknown = sorted(k for k in examples if k not in keys)
    assert not unknown, f"examples name tools that do not exist: {unknown[:5]}"
    assert len(examples) >= 900 and all(len(q) >= 3 for q in examples.values())


def test_no_example_is_a_near_copy_of_a_held_out_query():
    held_out = [words(json.loads(line)["query"]) for path in HELD_OUT
                for line in path.read_text().splitlines() if line.strip()]
    assert len(held_out) > 300
    close = []
    for key, queries in load_example_requests([EXAMPLES]).items():
        for q in queries:
            w = words(q)
            if any(len(w & h) >= NEAR_COPY * len(w | h) for h in held_out):
                close.append((key, q))
    assert not close, f"{len(close)} example requests nearly copy held-out queries, e.g. {close[:3]}"
