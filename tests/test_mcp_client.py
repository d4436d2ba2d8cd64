"""Live MCP over stdio: a tiny server written with the MCP Python SDK (tests/data/mcp_tiny_server.py), listed through
nexus_cli.serving.mcp_client.list_tools; clear one-line errors for a missing command, a crashing server and a silent one.

The documented real-world example is `nexus ... --mcp "npx -y @modelcontextprotocol/server-filesystem /tmp"`; it needs
the npm registry, so the suite uses the local server instead."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from nexus_cli.errors import NexusError
from nexus_cli.schema import compile_tool
from nexus_cli.serving.mcp_client import list_tools

DATA = Path(__file__).resolve().parent / "data"
PY = shlex.quote(sys.executable)


def test_lists_tools_of_a_live_stdio_server():
    tools = list_tools(f"{PY} {shlex.quote(str(DATA / 'mcp_tiny_server.py'))}", timeout=60)
    by_name = {t.name: t for t in tools}
    assert set(by_name) == {"create_repository", "list_issues"}
    t = by_name["list_issues"]
    assert t.server == "nexus-tiny" and t.key == "nexus-tiny/list_issues"  # namespace = the server's reported name
    assert t.description == "List issues of a repository."
    assert t.source.startswith("mcp:")
    spec = compile_tool(t)
    assert spec.ok
    assert spec.signature == 'list_issues(owner: string, repo: string, state?: "open"|"closed"|"all", per_page?: integer)'
    assert compile_tool(by_name["create_repository"]).signature == \
        "create_repository(name: string, private?: boolean, description?: string)"


def test_command_not_found_is_one_line():
    with pytest.raises(NexusError, match="command not found: no-such-mcp-server-xyz"):
        list_tools("no-such-mcp-server-xyz --stdio")


def test_crashing_server_is_reported(tmp_path):
    script = tmp_path / "crash.py"
    script.write_text("import sys\nsys.stderr.write('boom: missing API key\\n')\nsys.exit(3)\n")
    with pytest.raises(NexusError) as e:
        list_tools(f"{PY} {shlex.quote(str(script))}", timeout=30)
    assert "failed" in e.value.message and "\n" not in e.value.message


def test_silent_server_times_out(tmp_path):
    script = tmp_path / "silent.py"
    script.write_text("import time\ntime.sleep(60)\n")
    with pytest.raises(NexusError, match="did not answer within 2 s"):
        list_tools(f"{PY} {shlex.quote(str(script))}", timeout=2)


def test_unparsable_command_is_a_usage_error():
    with pytest.raises(NexusError, match="cannot parse"):
        list_tools('npx "unterminated')
