"""One argument pipeline: `nexus route`, `nexus route --session` and `nexus serve` give the same arguments for the same
request and history, each run as a user runs it (its own process). Real MiniLM + SmolLM2 (whose values are a 135M
model's best effort: what is asserted is that the three paths agree)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"
NEXUS = [sys.executable, "-m", "nexus_cli.cli"]
REQUEST = "now close issue 12 there"
HISTORY = [
    {"role": "user", "content": "I am working on the acme/api repository today"},
    {"role": "assistant", "content": "Sure, what should I do in acme/api?"},
]
COMMON = ["--model", "smollm2-135m", "--reranker", "none"]


@pytest.fixture(scope="module")
def forge_index(tmp_path_factory):
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.build import build_index

    out = tmp_path_factory.mktemp("pipeline-idx") / "forge"
    build_index(load_registries([FORGE]), out, embedder=Embedder("minilm"), sources=[str(FORGE)])
    return out


def _nexus(*args):
    p = subprocess.run([*NEXUS, *args], capture_output=True, text=True, cwd=REPO, timeout=600,
                       env={**os.environ, "NEXUS_DEBUG": "0", "NEXUS_PREFIX_CACHE": "off"}, stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


async def _serve_route(index: Path) -> dict:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=sys.executable, cwd=str(REPO),
                                   args=["-m", "nexus_cli.cli", "serve", "--index", str(index), *COMMON],
                                   env={**os.environ, "NEXUS_DEBUG": "0", "NEXUS_PREFIX_CACHE": "off"})
    with anyio.fail_after(600):
        async with stdio_client(params, errlog=sys.stderr) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                res = await session.call_tool("route_request", {"request": REQUEST, "history": HISTORY})
                assert not res.is_error, res.content
                return json.loads("".join(getattr(c, "text", "") for c in res.content))


def test_route_session_and_serve_give_the_same_arguments(forge_index, tmp_path):
    history_file = tmp_path / "history.json"
    history_file.write_text(json.dumps(HISTORY))
    routed = _nexus("route", REQUEST, "--index", str(forge_index), "--history", str(history_file), "--json", *COMMON)

    # a session folder whose conversation so far is HISTORY (no KV state yet), as an earlier turn would leave it
    session = tmp_path / "chat"
    session.mkdir()
    (session / "session.json").write_text(json.dumps({
        "format": "nexus-session", "version": 1, "id": "pipeline", "turns": 1, "model": None,
        "index": str(forge_index), "messages": HISTORY, "kv": None}))
    in_session = _nexus("route", REQUEST, "--index", str(forge_index), "--session", str(session), "--json", *COMMON)

    served = anyio.run(_serve_route, forge_index)

    assert routed["tool"] == in_session["tool"] == served["tool"] == "close_issue"
    assert isinstance(routed["arguments"], dict) and routed["arguments"], routed
    assert in_session["arguments"] == routed["arguments"]
    assert served["arguments"] == routed["arguments"]
