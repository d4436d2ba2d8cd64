"""benchmarks/routing_errors.py: the kinds of a routing run's misses and the families of servers that share tools."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "benchmarks" / "routing_errors.py"


def _module():
    spec = importlib.util.spec_from_file_location("routing_errors", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _row(gold, choice, top3=False, interchangeable=False, escalated=True, follow_up=False):
    return {"gold": gold, "choice": choice, "top1": gold == choice, "top3": top3 or gold == choice,
            "top1_interchangeable": interchangeable or gold == choice, "escalated": escalated, "follow_up": follow_up}


def _doc(rows):
    return {"params": {"part": "dev", "reranker": "cascade", "embedder": "nexus-router"}, "samples": {"queries": rows}}


def test_kinds_families_and_the_share_outside_them():
    m = _module()
    tools = [SimpleNamespace(server=s, name=n) for s, n in
             [("git", "git_status"), ("git", "git_log"), ("mcp-git", "git_status"), ("mcp-git", "git_log"),
              ("maps", "search"), ("maps", "route"), ("chart", "pie")]]
    family = m.families(tools)
    assert family["git"] == family["mcp-git"] != family["maps"]
    rows = [_row("git/git_status", "mcp-git/git_status", top3=True, interchangeable=True),
            _row("mcp-git/git_log", "git/git_log", top3=True),            # same name on another server
            _row("git/git_log", "git/git_status"),                         # another tool of the server
            _row("maps/search", "chart/pie", escalated=False, follow_up=True),  # another server
            _row("maps/route", "maps/route"), _row("chart/pie", "chart/pie")]
    b = m.breakdown(_doc(rows), family)
    assert b["misses"] == 4 and b["misses_escalated"] == 3 and b["misses_gold_in_top3"] == 2
    assert {k: v["n"] for k, v in b["kinds"].items()} == {"interchangeable": 1, "same server": 1, "same name": 1,
                                                         "other server": 1}
    assert b["kinds"]["other server"] == {"n": 1, "escalated": 0, "gold_in_top3": 0, "follow_ups": 1}
    assert b["multi_server_families"] == [{"servers": ["git", "mcp-git"], "requests": 3, "misses": 3,
                                           "misses_picking_the_family": 3}]
    assert b["outside_multi_server_families"] == {"requests": 3, "top1": 2, "top3": 2}


def test_a_file_that_is_not_a_routing_run_is_refused_in_one_line(tmp_path):
    bad = tmp_path / "x.json"
    bad.write_text(json.dumps({"summary": {}}))
    out = subprocess.run([sys.executable, str(SCRIPT), str(bad)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.count("\n") == 1 and "not a routing-lso results file" in out.stderr
