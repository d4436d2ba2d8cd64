"""`nexus bench latency`'s measurement of `make demo`'s request (lab/bench_latency.measure_demo): the request is the
Makefile's, and one round runs the demo end to end with the real models, as `make demo` does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nexus_cli.lab import bench_latency

REPO = Path(__file__).resolve().parent.parent


def test_the_demo_request_is_the_makefiles():
    demo = (REPO / "Makefile").read_text().split("\ndemo:", 1)[1].split("\n\n", 1)[0]
    assert f'route "{bench_latency.DEMO_REQUEST}"' in demo
    assert f"index {bench_latency.DEMO_REGISTRY.relative_to(REPO)}" in demo


@pytest.mark.slow
def test_one_demo_round_routes_and_fills_the_arguments(tmp_path, monkeypatch):
    from nexus_cli.lab.common import NULL_PROGRESS

    monkeypatch.setattr(bench_latency, "WORKTREES", tmp_path)
    out = bench_latency.measure_demo(1, None, NULL_PROGRESS)
    p = out["product"]
    assert out["rounds"] == 1 and "baseline" not in out and "speedup" not in out
    assert p["wall"]["n"] == 1 and p["wall"]["median_ms"] > p["total"]["median_ms"] > p["args"]["median_ms"] > 0
    (answer,) = p["answers"]
    server, tool, arguments = json.loads(answer)
    assert (server, tool) == ("forge", "create_pull_request")
    assert arguments["owner"] == "acme" and arguments["repo"] == "api" and arguments["base"] == "main"


def test_an_index_build_round_indexes_every_tool_of_the_registry_files(tmp_path, monkeypatch):
    """measure_index_build runs `nexus index` over the registry files in a fresh process and keeps its wall time and
    step times; its output folder does not stay; a missing file is a usage error."""
    from nexus_cli.errors import UsageError
    from nexus_cli.lab.common import NULL_PROGRESS

    registry = json.loads((REPO / "tool_registries" / "github_like.json").read_text())
    reg_dir = tmp_path / "registries"
    reg_dir.mkdir()
    for k, name in enumerate(bench_latency.INDEX_REGISTRY_FILES):  # five servers of the same few tools
        (reg_dir / name).write_text(json.dumps({**registry, "server": f"{registry.get('server', 'forge')}{k}"}))
    n = len(registry["tools"])
    monkeypatch.setattr(bench_latency, "WORKTREES", tmp_path / "work")
    files = [reg_dir / name for name in bench_latency.INDEX_REGISTRY_FILES]
    out = bench_latency.measure_index_build(files, 1, None, NULL_PROGRESS)
    assert out["tools"] == 5 * n and out["rounds"] == 1 and out["wall"]["n"] == 1 and "baseline" not in out
    assert out["wall"]["median_ms"] > out["steps_ms"]["total"]["median_ms"] > out["steps_ms"]["embed"]["median_ms"] > 0
    assert not (tmp_path / "work" / "index-build").exists()
    (reg_dir / bench_latency.INDEX_REGISTRY_FILES[0]).unlink()
    with pytest.raises(UsageError, match="missing"):
        bench_latency.measure_index_build(files, 1, None, NULL_PROGRESS)
