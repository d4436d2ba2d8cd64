"""`nexus serve` over stdio, driven by the MCP Python SDK's own client: list tools, route, fetch a schema, and every
kind of bad input answered with an error result while the server keeps serving. Real MiniLM (and SmolLM2 for the
arguments run)."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest

from nexus_cli.serving import server as serve_stage

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"


@pytest.fixture(scope="module")
def forge_index(tmp_path_factory):
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.build import build_index

    out = tmp_path_factory.mktemp("serve-idx") / "forge"
    build_index(load_registries([FORGE]), out, embedder=Embedder("minilm"), sources=[str(FORGE)])
    return out


def _params(*args):
    from mcp.client.stdio import StdioServerParameters

    env = {**os.environ, "NEXUS_DEBUG": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return StdioServerParameters(command=sys.executable, args=["-m", "nexus_cli.cli", "serve", *args], env=env,
                                 cwd=str(REPO))


async def _session_calls(params, calls, errlog):
    """Run `calls` (list of (name, arguments)) in one client session; returns (tool names, [(is_error, payload)])."""
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    out = []
    with anyio.fail_after(600):
        async with stdio_client(params, errlog=errlog) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                listed = await session.list_tools()
                names = [t.name for t in listed.tools]
                for name, arguments in calls:
                    if name == "__ping__":  # the SDK's own ping request
                        await session.send_ping()
                        out.append((False, "pong"))
                        continue
                    res = await session.call_tool(name, arguments)
                    text = "".join(getattr(c, "text", "") for c in res.content)
                    out.append((bool(res.is_error), text))
    return names, out


def _run(params, calls, tmp_path):
    log = tmp_path / "server-stderr.log"
    with open(log, "w+") as errlog:
        try:
            return anyio.run(_session_calls, params, calls, errlog)
        except BaseException as e:  # show what the server said on stderr
            errlog.flush()
            raise AssertionError(f"MCP session failed ({type(e).__name__}); server stderr:\n{log.read_text()[-3000:]}") from e


def test_serve_routes_fetches_schemas_and_survives_bad_inputs(forge_index, tmp_path):
    calls = [
        ("route_request", {"request": "open an issue in acme/api titled Login crash"}),
        ("get_tool_schema", {"tool": "create_issue", "server": "forge"}),
        ("get_tool_schema", {"tool": "forge/list_pull_requests"}),
        # bad inputs, each answered with an error result
        ("no_such_tool", {"x": 1}),
        ("route_request", {}),
        ("route_request", {"request": 42}),
        ("route_request", {"request": "   "}),
        ("route_request", {"request": "x" * (serve_stage.MAX_REQUEST_CHARS + 1)}),
        ("route_request", {"request": "list pulls", "history": "not a list"}),
        ("route_request", {"request": "list pulls", "history": [{"role": "user"}]}),
        ("route_request", {"request": "list pulls", "surprise": True}),
        ("get_tool_schema", {"tool": "create_isue", "server": "forge"}),
        ("get_tool_schema", {"tool": "create_issue", "server": "nope"}),
        # and the server still serves
        ("route_request", {"request": "list the open pull requests of octo/widgets",
                           "history": [{"role": "user", "content": "hello"}]}),
        ("__ping__", None),
    ]
    names, out = _run(_params("--index", str(forge_index), "--registry", str(FORGE), "--no-args"), calls, tmp_path)
    assert sorted(names) == ["get_tool_schema", "route_request"]

    err, text = out[0]
    assert not err
    r = json.loads(text)
    assert r["server"] == "forge" and r["tool"] == "create_issue"
    assert r["arguments"] is None and len(r["candidates"]) == 5 and {"margin", "tau", "escalated"} <= set(r["gate"])

    full = json.loads(FORGE.read_text())["tools"]
    want = next(t for t in full if t["name"] == "create_issue")
    err, text = out[1]
    assert not err
    s = json.loads(text)
    assert s["name"] == "create_issue" and s["server"] == "forge" and s["inputSchema"] == want["inputSchema"]
    err, text = out[2]
    assert not err and json.loads(text)["name"] == "list_pull_requests"

    bad = out[3:13]
    assert all(e for e, _ in bad), bad
    for _, text in bad:
        assert "\n" not in text.strip() and len(text) < 400
    assert "unknown tool 'no_such_tool'" in bad[0][1]
    assert "request" in bad[1][1]
    assert "over the" in bad[4][1]
    assert "did you mean forge/create_issue" in bad[8][1]
    assert "unknown tool 'nope/create_issue'" in bad[9][1]

    err, text = out[13]
    assert not err and json.loads(text)["tool"] == "list_pull_requests"
    assert out[14] == (False, "pong")


def test_serve_with_arguments(forge_index, tmp_path):
    calls = [("route_request", {"request": "close issue 12 in acme/api"})]
    _names, out = _run(_params("--index", str(forge_index), "--registry", str(FORGE), "--model", "smollm2-135m"),
                       calls, tmp_path)
    err, text = out[0]
    assert not err, text
    r = json.loads(text)
    assert r["tool"] == "close_issue"
    assert "arguments_valid" in r
    required = next(t for t in json.loads(FORGE.read_text())["tools"] if t["name"] == "close_issue")["inputSchema"]["required"]
    if r["arguments_valid"]:  # validated against the tool's own schema (the values are the 135M model's best effort)
        assert isinstance(r["arguments"], dict) and set(required) <= set(r["arguments"])
        # the required values the request does not give are named (a list, possibly empty), in the answer's order
        assert isinstance(r["guessed"], list) and set(r["guessed"]) <= set(required)
    else:  # a failure is null with its reasons, never an invalid object
        assert r["arguments"] is None and r["arguments_errors"] and "guessed" not in r


def test_serve_refuses_a_missing_index(tmp_path):
    import subprocess

    p = subprocess.run([sys.executable, "-m", "nexus_cli.cli", "serve", "--index", str(tmp_path / "none")],
                       capture_output=True, text=True, cwd=REPO, timeout=120, stdin=subprocess.DEVNULL)
    assert p.returncode == 1
    lines = [ln for ln in p.stderr.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "does not exist" in lines[0] and p.stdout == ""


def test_service_validation_unit():
    with pytest.raises(serve_stage.ClientError, match="must be a string"):
        serve_stage.validate_route_args({"request": ["a"]})
    with pytest.raises(serve_stage.ClientError, match="history\\[0\\].role"):
        serve_stage.validate_route_args({"request": "a", "history": [{"role": "robot", "content": "x"}]})
    with pytest.raises(serve_stage.ClientError, match="over the"):
        serve_stage.validate_route_args({"request": "a", "history": [{"role": "user", "content": "x" * 9000}]})
    assert serve_stage.validate_route_args({"request": "a"}) == ("a", None)
    assert serve_stage.validate_schema_args({"tool": " t ", "server": "s"}) == ("t", "s")
    assert "internal error: ValueError" in serve_stage.error_line(ValueError("boom\nsecond line"))


def test_sdk_client_cancels_a_call_and_the_session_goes_on(forge_index, tmp_path):
    """The SDK client abandons a route_request (it sends notifications/cancelled); the server drops it and keeps
    serving the same session: the next call and a ping are answered."""
    from mcp import ClientSession
    from mcp.client.stdio import stdio_client

    async def session_run(errlog):
        params = _params("--index", str(forge_index), "--registry", str(FORGE), "--no-args")
        with anyio.fail_after(600):
            async with stdio_client(params, errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    with anyio.move_on_after(0.001) as scope:
                        await session.call_tool("route_request", {"request": "list the open issues of acme/api"})
                    res = await session.call_tool("route_request", {"request": "close issue 12 in acme/api"})
                    await session.send_ping()
                    return scope.cancelled_caught, res

    log = tmp_path / "server-stderr.log"
    with open(log, "w+") as errlog:
        cancelled, res = anyio.run(session_run, errlog)
    assert cancelled
    assert not res.is_error and json.loads(res.content[0].text)["tool"] == "close_issue"
    assert "Traceback" not in log.read_text()
