"""Tool registries: MCP tools/list JSON files (or directories of them), namespaced by server.

A registry file is `{"server"?: str, "tools": [{"name", "description"?, "inputSchema"?, ...}]}`; the server namespace is
the file's "server" field, else its file name without extension. A bare list of tools is accepted too. Problems with a
whole file (unreadable, not UTF-8, not JSON, wrong shape, duplicate names) are errors; problems with one tool's schema
are recorded on the tool (`Tool.problems`) so one odd schema never stops a 955-tool registry.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from .errors import FormatError

MAX_REGISTRY_BYTES = 64 * 1024 * 1024


@dataclass
class Tool:
    server: str
    name: str
    description: str
    input_schema: dict[str, Any]
    source: str = ""  # file it came from (or "mcp:<command>")
    problems: list[str] = field(default_factory=list)

    @property
    def key(self) -> str:
        """The namespaced identity used everywhere: server/name."""
        return f"{self.server}/{self.name}"

    def schema_json(self) -> str:
        """Canonical JSON of the tool (sorted keys, compact): what a content hash covers."""
        return json.dumps(
            {"server": self.server, "name": self.name, "description": self.description, "inputSchema": self.input_schema},
            sort_keys=True,
            separators=(",", ":"),
            ensure_ascii=False,
        )

    def content_hash(self) -> str:
        return hashlib.sha256(self.schema_json().encode("utf-8")).hexdigest()


def _server_name(data: Any, path: Path) -> str:
    if isinstance(data, dict) and isinstance(data.get("server"), str) and data["server"].strip():
        return data["server"].strip()
    return path.stem


def tools_from_listing(data: Any, server: str, source: str) -> list[Tool]:
    """Tools of one tools/list-shaped object (already parsed). Raises FormatError for a wrong shape."""
    if isinstance(data, dict):
        raw_tools = data.get("tools")
        if raw_tools is None:
            raise FormatError(f"{source}: no \"tools\" array (expected MCP tools/list shape)")
    elif isinstance(data, list):
        raw_tools = data
    else:
        raise FormatError(f"{source}: expected a JSON object with a \"tools\" array")
    if not isinstance(raw_tools, list):
        raise FormatError(f"{source}: \"tools\" is not an array")
    tools: list[Tool] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_tools):
        if not isinstance(raw, dict):
            raise FormatError(f"{source}: tool #{i} is not an object")
        name = raw.get("name")
        if not isinstance(name, str) or not name.strip():
            raise FormatError(f"{source}: tool #{i} has no name")
        name = name.strip()
        if name in seen:
            raise FormatError(f"{source}: duplicate tool name '{name}' in server '{server}'")
        seen.add(name)
        description = raw.get("description") or raw.get("title") or ""
        problems: list[str] = []
        if not isinstance(description, str):
            problems.append("description is not a string")
            description = str(description)
        schema = raw.get("inputSchema", raw.get("input_schema"))
        if schema is None:
            schema = {"type": "object", "properties": {}}
            problems.append("no inputSchema (treated as no arguments)")
        elif not isinstance(schema, dict):
            problems.append(f"inputSchema is a {type(schema).__name__}, not an object (treated as no arguments)")
            schema = {"type": "object", "properties": {}}
        tools.append(Tool(server=server, name=name, description=description, input_schema=schema, source=source,
                          problems=problems))
    return tools


def load_file(path: Path) -> list[Tool]:
    try:
        size = path.stat().st_size
    except OSError as e:
        raise FormatError(f"cannot read registry {path}: {e.strerror}") from None
    if size == 0:
        raise FormatError(f"registry {path} is empty")
    if size > MAX_REGISTRY_BYTES:
        raise FormatError(f"registry {path} is {size} bytes, over the {MAX_REGISTRY_BYTES} byte limit")
    try:
        raw = path.read_bytes()
    except OSError as e:
        raise FormatError(f"cannot read registry {path}: {e.strerror}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise FormatError(f"registry {path} is not UTF-8 (byte {e.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise FormatError(f"registry {path} is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}") from None
    except RecursionError:
        # the C decoder gives up on nesting deeper than the interpreter's recursion limit
        raise FormatError(f"registry {path} is not valid JSON: nested too deeply") from None
    return tools_from_listing(data, _server_name(data, path), str(path))


def registry_files(paths: Iterable[str | Path]) -> list[Path]:
    """Expand files and directories (recursively, *.json, sorted) into a list of registry files."""
    files: list[Path] = []
    for p in paths:
        path = Path(p).expanduser()
        if path.is_dir():
            found = sorted(q for q in path.rglob("*.json") if q.is_file())
            if not found:
                raise FormatError(f"no registry files (*.json) under {path}")
            files.extend(found)
        elif path.exists():
            files.append(path)
        else:
            raise FormatError(f"registry {path} does not exist")
    if not files:
        raise FormatError("no registry given")
    return files


def load_registries(paths: Iterable[str | Path]) -> list[Tool]:
    """All tools of the given files/directories. Two servers with the same name are merged; a tool name repeated
    within one server is an error."""
    tools: list[Tool] = []
    seen: dict[str, str] = {}
    for path in registry_files(paths):
        for tool in load_file(path):
            if tool.key in seen:
                raise FormatError(f"duplicate tool '{tool.key}' (in {seen[tool.key]} and {tool.source})")
            seen[tool.key] = tool.source
            tools.append(tool)
    if not tools:
        raise FormatError("the registry holds no tools")
    return tools


# Schema keywords that document a parameter without changing what it accepts from a request.
_DOC_KEYWORDS = frozenset({"description", "title", "$schema", "$comment", "examples", "default", "additionalProperties"})


def _parameters_only(schema: Any) -> Any:
    if isinstance(schema, dict):
        return {k: _parameters_only(v) for k, v in schema.items() if k not in _DOC_KEYWORDS}
    if isinstance(schema, list):
        return [_parameters_only(v) for v in schema]
    return schema


def _identity(tool) -> str:
    """What tells a tool apart for a request, its server aside: the name, the description (case and whitespace aside)
    and the parameters (names, types, required, enums, nesting; their own documentation aside)."""
    return json.dumps({"name": tool.name, "description": " ".join(str(tool.description or "").lower().split()),
                       "parameters": _parameters_only(tool.input_schema)}, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False, default=str)


def interchangeable_groups(tools: Sequence[Any]) -> list[list[int]]:
    """Groups (two or more tool indices, in registry order) of the same tool served by several servers: equal name,
    description and parameters (_identity). The shared registries hold 40 such groups (80 tools) (git and mcp-server-git, memory and
    Knowledge Graph Memory Server, ...). Nothing in a request can prefer one member over another short of naming the
    server, so the gate measures its margin against the best tool that is *not* interchangeable with the top one,
    and benchmarks report accuracy with and without counting an interchangeable pick as right.

    Works on anything with .name, .description and .input_schema (registry Tools, index entries)."""
    by_name: dict[str, list[int]] = {}
    for i, t in enumerate(tools):
        by_name.setdefault(t.name, []).append(i)
    by_identity: dict[str, list[int]] = {}
    for same_name in by_name.values():  # copies share their name, so only such tools need the full comparison
        if len(same_name) > 1:
            for i in same_name:
                by_identity.setdefault(_identity(tools[i]), []).append(i)
    groups = [g for g in by_identity.values() if len(g) > 1]
    return sorted(groups, key=lambda g: g[0])


def interchangeable_map(tools: Sequence[Any]) -> dict[int, tuple[int, ...]]:
    """Each tool that has copies → the indices of its copies (interchangeable_groups, per member)."""
    return copies_by_member(interchangeable_groups(tools))


def copies_by_member(groups: Iterable[Sequence[int]]) -> dict[int, tuple[int, ...]]:
    """Groups of interchangeable tools (interchangeable_groups, or an index manifest's) → each member's copies."""
    return {int(m): tuple(int(x) for x in g if x != m) for g in groups for m in g}


MAX_EXAMPLE_BYTES = 16 * 1024 * 1024


def load_example_requests(paths: Iterable[str | Path]) -> dict[str, list[str]]:
    """Example user requests per tool, from JSONL files of `{"server", "tool", "query"}` lines (blank lines skipped).

    Returns `{"server/tool": [query, ...]}` in file order, duplicates dropped. Which tools they name is not checked
    here: one examples file may cover more servers than the registry being indexed (build_index reports the ones it
    could not use). A malformed line is an error naming the file and line."""
    out: dict[str, list[str]] = {}
    for p in paths:
        path = Path(p).expanduser()
        try:
            size = path.stat().st_size
        except OSError as e:
            raise FormatError(f"cannot read example requests {path}: {e.strerror}") from None
        if path.is_dir():
            raise FormatError(f"example requests {path} is a directory, not a JSONL file")
        if size > MAX_EXAMPLE_BYTES:
            raise FormatError(f"example requests {path} is {size} bytes, over the {MAX_EXAMPLE_BYTES} byte limit")
        try:
            text = path.read_bytes().decode("utf-8")
        except OSError as e:
            raise FormatError(f"cannot read example requests {path}: {e.strerror}") from None
        except UnicodeDecodeError as e:
            raise FormatError(f"example requests {path} is not UTF-8 (byte {e.start})") from None
        n = 0
        for lineno, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except (json.JSONDecodeError, RecursionError):
                raise FormatError(f"example requests {path} line {lineno}: not valid JSON") from None
            if not isinstance(row, dict):
                raise FormatError(f"example requests {path} line {lineno}: expected an object")
            for k in ("server", "tool", "query"):
                if not isinstance(row.get(k), str) or not row[k].strip():
                    raise FormatError(f"example requests {path} line {lineno}: '{k}' must be a non-empty string")
            queries = out.setdefault(f"{row['server']}/{row['tool']}", [])
            q = " ".join(row["query"].split())
            if q not in queries:
                queries.append(q)
            n += 1
        if n == 0:
            raise FormatError(f"example requests {path} holds no requests")
    return out
