"""results_all: argument handling (no suite is run here)."""

import subprocess
import sys
from pathlib import Path

import pytest

from nexus_cli.errors import UsageError
from nexus_cli.lab import results_all

REPO = Path(__file__).resolve().parent.parent


def test_unknown_suite_is_a_usage_error(tmp_path):
    with pytest.raises(UsageError, match="unknown suite"):
        results_all.run_all(only=["nope"], out=tmp_path)
    p = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "results", "all", "--skip", "nope", "--out", str(tmp_path)],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "unknown suite(s) nope" in p.stderr and not list(tmp_path.iterdir())


def test_order_covers_every_suite():
    from nexus_cli.commands.bench import app

    assert results_all.ORDER == ["slb", "latency", "l0", "deep-splice", "dkl", "gate", "routing", "routing-lso", "args",
                                 "drafts", "card-splice", "serve", "poisoning",
                                 "deep-splice:smollm2-135m", "dkl:smollm2-135m", "gate:smollm2-135m",
                                 "gate:qwen2.5-1.5b", "dkl:qwen2.5-1.5b", "deep-splice:qwen2.5-1.5b",
                                 "card-splice:qwen2.5-1.5b"]
    from nexus_cli.lab import summary as results_summary

    base = {s.partition(":")[0] for s in results_all.ORDER}
    assert {s for s, _ in results_summary.SECTIONS} >= base
    assert {c.name for c in app.registered_commands} >= base - {"dkl", "gate"}


def test_summary_of_an_empty_tree(tmp_path):
    from nexus_cli.lab import summary as results_summary

    text = results_summary.render(tmp_path)
    assert text.startswith("# Latest results")
    assert text.count("_not run yet_") == len(results_summary.SECTIONS)


def test_readme_block_is_replaced_between_its_markers():
    import pytest

    from nexus_cli.lab import summary as rs

    readme = f"# Nexus\n\nintro\n\n{rs.README_BEGIN}\nold table\n{rs.README_END}\n\n## Layout\n"
    out = rs.with_tables(readme, "# Latest results\n\n### Deep splice\n\n| a |\n")
    assert "old table" not in out and "#### Deep splice" in out and "# Latest results" not in out
    assert out.startswith("# Nexus\n\nintro\n\n") and out.endswith(f"{rs.README_END}\n\n## Layout\n")
    assert rs.with_tables(out, "### X\n") .count(rs.README_BEGIN) == 1
    with pytest.raises(ValueError):
        rs.with_tables("# no markers\n", "### X\n")


def test_a_stopped_run_goes_on_with_the_suites_it_had_not_finished(tmp_path, monkeypatch):
    """After each suite the finished ones are kept; the same commit of a clean tree runs only the rest (a failed
    suite again), the report lists both segments and sums them; the record goes once every suite has finished.
    Another commit, a dirty tree or fresh=True starts over."""
    ran: list[str] = []
    state = {"stop_at": "dkl", "fail": {"gate"}}

    def fake_suite(suite, out, quick):
        if suite == state["stop_at"]:
            raise KeyboardInterrupt  # the run is stopped here: nothing after it runs
        ran.append(suite)
        if suite in state["fail"]:
            raise RuntimeError("broken")
        return {"ok": True}

    git = {"sha": "a" * 40, "short": "aaaaaaaa", "dirty": False}
    monkeypatch.setattr(results_all, "run_suite", fake_suite)
    monkeypatch.setattr(results_all, "git_info", lambda: dict(git))
    monkeypatch.setattr(results_all, "environment", lambda: {})
    quick_suites = results_all._mode_suites(True)
    partial = tmp_path / ".partial-results_all-quick.json"

    with pytest.raises(KeyboardInterrupt):
        results_all.run_all(quick=True, out=tmp_path)
    first = quick_suites[:quick_suites.index("dkl")]
    assert ran == first and partial.is_file()

    ran.clear()
    state["stop_at"] = None
    report = results_all.run_all(quick=True, out=tmp_path)
    assert ran == quick_suites[len(first):] and report["failed"] == 1
    assert all(report["suites"][s].get("earlier_segment") for s in first)
    assert [seg["suites"] for seg in report["segments"]] == [first, ran]
    assert report["total_seconds"] == pytest.approx(sum(seg["wall_s"] for seg in report["segments"]), abs=0.2)
    assert partial.is_file()  # gate failed: kept, so that it runs again

    ran.clear()
    state["fail"] = set()
    report = results_all.run_all(quick=True, out=tmp_path)
    assert ran == ["gate"] and report["failed"] == 0 and len(report["segments"]) == 3 and not partial.exists()

    ran.clear()
    results_all.run_all(quick=True, out=tmp_path, only=["slb", "l0"])  # a part of the suites: its record stays
    assert ran == ["slb", "l0"] and partial.is_file()
    ran.clear()
    results_all.run_all(quick=True, out=tmp_path, only=["slb", "l0"])
    assert ran == []
    for change in ({"sha": "b" * 40}, {"dirty": True}):  # another commit, or a dirty tree: everything runs
        ran.clear()
        monkeypatch.setattr(results_all, "git_info", lambda c=change: {**git, **c})
        results_all.run_all(quick=True, out=tmp_path, only=["slb", "l0"])
        assert ran == ["slb", "l0"]
    monkeypatch.setattr(results_all, "git_info", lambda: dict(git))
    ran.clear()
    results_all.run_all(quick=True, out=tmp_path, only=["slb", "l0"], fresh=True)
    assert ran == ["slb", "l0"]


def test_a_full_run_starts_each_suite_once_the_load_has_settled(tmp_path, monkeypatch, capsys):
    """Before each suite of a full run, the 1-minute load average is polled until it is under half the cores; the
    load the suite starts at is in the report. A load that stays high is waited for at most SETTLE_MAX_S."""
    import os

    loads = iter([2.0, 1.9, 1.5, 0.8, 0.4])  # the first is the segment's start
    slept: list[float] = []
    monkeypatch.setattr(os, "cpu_count", lambda: 2)
    monkeypatch.setattr(results_all, "_load", lambda: next(loads, 0.3))
    monkeypatch.setattr(results_all.time, "sleep", lambda s: slept.append(s))
    monkeypatch.setattr(results_all, "run_suite", lambda suite, out, quick: {"ok": True})
    monkeypatch.setattr(results_all, "git_info", lambda: {"sha": "c" * 40, "short": "cccccccc", "dirty": True})
    monkeypatch.setattr(results_all, "environment", lambda: {})
    report = results_all.run_all(out=tmp_path, only=["slb", "l0"])
    assert slept == [results_all.SETTLE_POLL_S] * 2  # 1.9, 1.5: waited; 0.8 < 1.0: slb starts; 0.4: l0 at once
    assert [report["suites"][s]["loadavg_1m_start"] for s in ("slb", "l0")] == [0.8, 0.4]
    assert "waiting for the load average (1.90)" in capsys.readouterr().err

    slept.clear()
    monkeypatch.setattr(results_all, "_load", lambda: 1.7)  # never settles: the suite starts after the longest wait
    assert results_all._settle("slb") == 1.7
    assert sum(slept) == results_all.SETTLE_MAX_S and "starts anyway" in capsys.readouterr().err


def test_a_suite_on_another_model_runs_that_suite_with_the_model(tmp_path, monkeypatch):
    """`card-splice:qwen2.5-1.5b` is the card-splice suite on the 1.5B as docs/arguments.md publishes it (one test
    conversation per file and depth, the repair not written); `dkl:smollm2-135m` the sweep on SmolLM2."""
    calls = []

    def fake(name):
        def run(**kw):
            calls.append((name, kw))
            return {}
        return run

    monkeypatch.setattr(results_all.bench_cards, "run", fake("card-splice"))
    monkeypatch.setattr(results_all.sweep_dkl, "run", fake("dkl"))
    results_all.run_suite("card-splice:qwen2.5-1.5b", tmp_path, quick=False)
    results_all.run_suite("dkl:smollm2-135m", tmp_path, quick=False)
    (n1, kw1), (n2, kw2) = calls
    assert n1 == "card-splice" and kw1["model"] == "qwen2.5-1.5b" and kw1["test_cases"] == 1
    assert not kw1.get("write_repair")
    assert n2 == "dkl" and kw2["model"] == "smollm2-135m"
