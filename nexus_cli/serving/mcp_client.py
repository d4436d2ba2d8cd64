"""List the tools of a live MCP server over stdio, with the MCP Python SDK.

`list_tools("npx -y @modelcontextprotocol/server-filesystem /tmp")` starts the command, runs the MCP handshake
(`initialize`), pages through `tools/list`, and returns registry `Tool`s namespaced by the server's own reported
name (`serverInfo.name`, else the command's program name). Every failure is one NexusError line: command not
found, the server exited or crashed during the handshake, or no answer within `timeout` seconds.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from pathlib import Path

from ..errors import NexusError, UsageError
from ..registry import Tool, tools_from_listing

MAX_PAGES = 100


def _server_namespace(name: str | None, program: str) -> str:
    text = (name or "").strip() or Path(program).name
    text = re.sub(r"\s+", "-", text)
    return text.replace("/", "-") or "mcp"


def _stderr_tail(path: str, n: int = 300) -> str:
    try:
        text = Path(path).read_text(errors="replace").strip()
    except OSError:
        return ""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:n]


def list_tools(command: str, timeout: float = 30.0, env: dict[str, str] | None = None) -> list[Tool]:
    """The tools of the MCP stdio server started by `command` (a shell-like command line)."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise UsageError(f"cannot parse MCP command {command!r}: {e}") from None
    if not argv:
        raise UsageError("empty MCP server command")
    program = argv[0]
    if shutil.which(program) is None and not (os.sep in program and os.access(program, os.X_OK)):
        raise NexusError(f"MCP server command not found: {program}", hint="check the --mcp command line and PATH")

    import anyio
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    params = StdioServerParameters(command=program, args=argv[1:],
                                   env={**os.environ, **(env or {})} if env is not None else None)

    async def run() -> tuple[str | None, list[dict]]:
        with tempfile.NamedTemporaryFile("w+", prefix="nexus-mcp-", suffix=".log", delete=False) as errlog:
            log_path = errlog.name
            try:
                with anyio.fail_after(timeout):
                    async with stdio_client(params, errlog=errlog) as (read, write):
                        async with ClientSession(read, write) as session:
                            await session.initialize()
                            info = session.server_info
                            raw: list[dict] = []
                            cursor = None
                            for _ in range(MAX_PAGES):
                                from mcp import types

                                res = await session.list_tools(
                                    params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
                                raw += [t.model_dump(by_alias=True, mode="json", exclude_none=True) for t in res.tools]
                                cursor = res.next_cursor
                                if not cursor:
                                    break
                            return (info.name if info is not None else None), raw
            finally:
                errlog.flush()
                run.stderr = _stderr_tail(log_path)  # type: ignore[attr-defined]
                try:
                    os.unlink(log_path)
                except OSError:
                    pass

    run.stderr = ""  # type: ignore[attr-defined]
    try:
        server_name, raw_tools = anyio.run(run)
    except TimeoutError:
        raise NexusError(f"MCP server '{command}' did not answer within {timeout:g} s",
                         hint="a first `npx -y` run downloads the package; retry with a longer --timeout") from None
    except FileNotFoundError:
        raise NexusError(f"MCP server command not found: {program}") from None
    except NexusError:
        raise
    except BaseException as e:  # the SDK raises ExceptionGroups / McpError / anyio errors when the server dies
        if isinstance(e, (KeyboardInterrupt, SystemExit)):
            raise
        tail = getattr(run, "stderr", "")
        leaf = e
        while isinstance(leaf, BaseExceptionGroup) and leaf.exceptions:
            leaf = leaf.exceptions[0]
        why = str(leaf).strip().splitlines()[0] if str(leaf).strip() else type(leaf).__name__
        msg = f"MCP server '{command}' failed: {why[:200]}"
        if tail:
            msg += f" (server stderr: {tail})"
        raise NexusError(msg) from None
    namespace = _server_namespace(server_name, program)
    return tools_from_listing({"tools": raw_tools}, namespace, f"mcp:{command}")
