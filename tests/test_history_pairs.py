"""benchmarks/history_pairs.py: requests that are not follow-ups, given another conversation's history."""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

import history_pairs  # noqa: E402

QUERIES = ROOT / "benchmarks" / "queries"


def _q(id_, server, history=None):
    q = {"id": id_, "query": f"request {id_}", "server": server, "tool": "t", "set": "s"}
    if history:
        q["history"] = [{"role": "user", "content": history}]
    return q


def test_each_fresh_request_gets_a_history_of_another_service_and_of_its_own():
    reqs = [_q("a", "git"), _q("b", "maps"), _q("f1", "git", "list branches"), _q("f2", "maps", "coffee nearby")]
    out = {r["id"]: r for r in history_pairs.pairs(reqs)}
    assert set(out) == {"a+switch", "a+same", "b+switch", "b+same"}  # follow-ups are sources, not copied
    assert out["a+switch"]["history_from"] == "f2" and out["a+same"]["history_from"] == "f1"
    assert out["b+switch"]["history"] == reqs[2]["history"] and out["b+same"]["set"] == "s+same"
    assert out["a+switch"]["query"] == "request a" and out["a+switch"]["server"] == "git"


def test_a_request_whose_gold_servers_hold_every_follow_up_gets_no_switch():
    reqs = [_q("a", "git") | {"acceptable": [{"server": "maps", "tool": "t"}]},
            _q("f1", "git", "x"), _q("f2", "maps", "y")]
    assert [r["id"] for r in history_pairs.pairs(reqs)] == ["a+same"]


def test_the_committed_sets_are_the_scripts_output():
    for inputs, out in ((["routing_dev_servers.jsonl"], "routing_dev_servers_history.jsonl"),
                        (["routing.jsonl", "routing_heldout_servers.jsonl"], "routing_test_history.jsonl")):
        rows = history_pairs.pairs(history_pairs.load([str(QUERIES / f) for f in inputs]), seed=0)
        committed = [json.loads(x) for x in (QUERIES / out).read_text(encoding="utf-8").splitlines() if x.strip()]
        assert rows == committed, out
