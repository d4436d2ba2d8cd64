"""Load: 4 concurrent MCP clients x 100 requests against one `nexus serve` (routing only), plus a few with arguments
(SmolLM2-135M), with no failed request and bounded memory (the server's VmRSS from /proc before and after).

`nexus serve` speaks MCP over stdio, which is one connection per server process; the 4 clients are 4 concurrent
request streams on that connection (each keeps one request in flight, so the server always has up to 4 requests
outstanding, interleaved). Each client sends route_request with registry-derived requests and get_tool_schema for
the tools it was routed to (and a bad call now and then, which must come back as an error result and change
nothing). No timing is asserted; the figures go to stderr (pytest -s) for docs/reliability.md.
"""

from __future__ import annotations

import json
import os
import random
import sys
from pathlib import Path

import anyio
import pytest

REPO = Path(__file__).resolve().parent.parent
REGISTRY = REPO / "tool_registries"
CLIENTS = 4
REQUESTS = 100

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def index_dir(tmp_path_factory):
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.build import build_index

    out = tmp_path_factory.mktemp("load-idx") / "index"
    build_index(load_registries([REGISTRY]), out, embedder=Embedder("minilm"), sources=[str(REGISTRY)])
    return out


def _params(*args):
    from mcp.client.stdio import StdioServerParameters

    env = {**os.environ, "NEXUS_DEBUG": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return StdioServerParameters(command=sys.executable, args=["-m", "nexus_cli.cli", "serve", *args], env=env,
                                 cwd=str(REPO))


def _server_pid() -> int:
    """The `nexus serve` child of this process (the MCP SDK does not expose the pid)."""
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            status = (d / "status").read_text()
            cmd = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))
        if ppid == me and b"serve" in cmd:
            return int(d.name)
    raise AssertionError("nexus serve process not found")


def _rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _requests(seed: int, n: int) -> list[str]:
    from nexus_cli import textgen
    from nexus_cli.registry import load_registries

    rng = random.Random(seed)
    tools = load_registries([REGISTRY])
    out = []
    while len(out) < n:
        t = rng.choice(tools)
        out.append(rng.choice(textgen.training_queries(t, rng, n=4)))
    return out


async def _load(params, n_clients: int, n_requests: int, errlog, seed: int = 0) -> dict:
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    stats = {"ok": 0, "failed": [], "expected_errors": 0, "by_tool": {}}
    async with stdio_client(params, errlog=errlog) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            await session.list_tools()
            pid = _server_pid()
            await session.call_tool("route_request", {"request": "warm up: list open issues"})
            rss_before = _rss_kb(pid)

            async def client(c: int):
                rng = random.Random(seed * 100 + c)
                reqs = _requests(seed * 100 + c, n_requests)
                last_tool = None
                for i in range(n_requests):
                    kind = rng.random()
                    if kind < 0.05:  # a bad call: must be an error result, not a dead server
                        res = await session.call_tool("route_request", {"request": ""})
                        if res.is_error:
                            stats["expected_errors"] += 1
                        else:
                            stats["failed"].append((c, i, "empty request was accepted"))
                        continue
                    if kind < 0.30 and last_tool:
                        name, args = "get_tool_schema", {"tool": last_tool[1], "server": last_tool[0]}
                    else:
                        name, args = "route_request", {"request": reqs[i]}
                    res = await session.call_tool(name, args)
                    text = "".join(getattr(x, "text", "") for x in res.content)
                    if res.is_error:
                        stats["failed"].append((c, i, name, text[:200]))
                        continue
                    try:
                        payload = json.loads(text)
                    except ValueError:
                        stats["failed"].append((c, i, name, "not JSON: " + text[:200]))
                        continue
                    if name == "route_request" and payload.get("tool"):
                        last_tool = (payload.get("server"), payload["tool"])
                    stats["ok"] += 1
                    stats["by_tool"][name] = stats["by_tool"].get(name, 0) + 1

            with anyio.fail_after(3600):
                async with anyio.create_task_group() as tg:
                    for c in range(n_clients):
                        tg.start_soon(client, c)
            rss_after = _rss_kb(pid)
            # the server still answers after the load
            res = await session.call_tool("route_request", {"request": "close an issue"})
            assert not res.is_error
    stats.update(rss_before_kb=rss_before, rss_after_kb=rss_after)
    return stats


def _run(params, n_clients, n_requests, tmp_path, seed=0):
    log = tmp_path / "server-stderr.log"
    with open(log, "w+") as errlog:
        try:
            return anyio.run(_load, params, n_clients, n_requests, errlog, seed)
        except BaseException as e:
            errlog.flush()
            raise AssertionError(f"load run failed ({type(e).__name__}: {e}); server stderr:\n"
                                 f"{log.read_text()[-3000:]}") from e


def test_four_clients_hundred_requests_routing(index_dir, tmp_path):
    s = _run(_params("--index", str(index_dir), "--registry", str(REGISTRY), "--no-args"), CLIENTS, REQUESTS, tmp_path)
    served = s["ok"] + s["expected_errors"]
    growth = s["rss_after_kb"] - s["rss_before_kb"]
    print(f"\n[load] routing: {CLIENTS} clients x {REQUESTS} = {served} requests served ({s['by_tool']}, "
          f"{s['expected_errors']} bad calls answered with an error), {len(s['failed'])} failures; server RSS "
          f"{s['rss_before_kb'] / 1024:.1f} MB -> {s['rss_after_kb'] / 1024:.1f} MB ({growth / 1024:+.1f} MB)",
          file=sys.stderr)
    assert s["failed"] == [], s["failed"][:5]
    assert served == CLIENTS * REQUESTS
    assert growth < 0.25 * s["rss_before_kb"] + 64 * 1024, "server memory grew under load"


def test_four_clients_with_arguments(index_dir, tmp_path):
    s = _run(_params("--index", str(index_dir), "--registry", str(REGISTRY), "--model", "smollm2-135m"), CLIENTS, 3,
             tmp_path, seed=1)
    print(f"\n[load] arguments: {CLIENTS} clients x 3 = {s['ok'] + s['expected_errors']} requests served, "
          f"{len(s['failed'])} failures; server RSS {s['rss_before_kb'] / 1024:.1f} MB -> "
          f"{s['rss_after_kb'] / 1024:.1f} MB", file=sys.stderr)
    assert s["failed"] == [], s["failed"][:5]
