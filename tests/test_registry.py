"""Registry loading: shapes real servers send, namespacing, and one clear error per bad file."""

from __future__ import annotations

import json

import pytest

from nexus_cli.errors import FormatError
from nexus_cli.registry import interchangeable_groups, load_registries


def write(tmp_path, name, content: bytes | str):
    p = tmp_path / name
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return p


def test_all_real_registries_load(shared_registries):
    tools = load_registries([shared_registries])
    assert len(tools) == 955
    assert len({t.key for t in tools}) == 955
    servers = {t.server for t in tools}
    assert len(servers) == 95


def test_server_namespace_from_field_else_file_name(tmp_path):
    a = write(tmp_path, "alpha.json", json.dumps({"server": "srv", "tools": [{"name": "t", "description": "d"}]}))
    b = write(tmp_path, "beta.json", json.dumps({"tools": [{"name": "t", "description": "d"}]}))
    tools = load_registries([a, b])
    assert [t.key for t in tools] == ["srv/t", "beta/t"]


def test_missing_schema_is_a_recorded_problem_not_an_error(tmp_path):
    p = write(tmp_path, "s.json", json.dumps({"tools": [{"name": "t"}, {"name": "u", "inputSchema": "nope"}]}))
    tools = load_registries([p])
    assert tools[0].input_schema == {"type": "object", "properties": {}}
    assert tools[0].problems and tools[1].problems


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is empty"),
        (b"{not json", "not valid JSON"),
        (b"\xff\xfe{}", "not UTF-8"),
        (b'{"tools": 3}', '"tools" is not an array'),
        (b'{"server": "x"}', 'no "tools" array'),
        (b'{"tools": [{"name": "a"}, {"name": "a"}]}', "duplicate tool name 'a'"),
        (b'{"tools": [{"description": "no name"}]}', "has no name"),
        (b"42", "expected a JSON object"),
    ],
)
def test_bad_registry_files_are_refused_with_the_reason(tmp_path, content, message):
    p = write(tmp_path, "bad.json", content)
    with pytest.raises(FormatError, match=message):
        load_registries([p])


def test_missing_path_and_empty_directory(tmp_path):
    with pytest.raises(FormatError, match="does not exist"):
        load_registries([tmp_path / "nope.json"])
    (tmp_path / "empty").mkdir()
    with pytest.raises(FormatError, match="no registry files"):
        load_registries([tmp_path / "empty"])


def test_duplicate_across_files_of_the_same_server(tmp_path):
    a = write(tmp_path, "a.json", json.dumps({"server": "s", "tools": [{"name": "t"}]}))
    b = write(tmp_path, "b.json", json.dumps({"server": "s", "tools": [{"name": "t"}]}))
    with pytest.raises(FormatError, match="duplicate tool 's/t'"):
        load_registries([a, b])


def test_interchangeable_groups_are_the_same_tool_on_several_servers(tmp_path):
    schema = {"type": "object", "properties": {"path": {"type": "string", "description": "Where"}},
              "required": ["path"]}
    documented_otherwise = {"$schema": "http://json-schema.org/draft-07/schema#", "type": "object",
                            "additionalProperties": False,
                            "properties": {"path": {"type": "string", "description": "The file's path"}},
                            "required": ["path"]}
    files = {
        "a.json": [{"name": "read", "description": "Read a file.", "inputSchema": schema},
                   {"name": "stat", "description": "File info.", "inputSchema": schema}],
        # the same tools: parameter docs, $schema and additionalProperties differ, whitespace and case too
        "b.json": [{"name": "read", "description": "read a   file.", "inputSchema": documented_otherwise},
                   {"name": "stat", "description": "File info, sizes included.", "inputSchema": schema}],
        # same name and description, but a parameter of another type: a request can tell them apart
        "c.json": [{"name": "read", "description": "Read a file.",
                    "inputSchema": {"type": "object", "properties": {"path": {"type": "array"}}, "required": ["path"]}}],
    }
    paths = [write(tmp_path, n, json.dumps({"tools": t})) for n, t in files.items()]
    tools = load_registries(paths)
    groups = interchangeable_groups(tools)
    assert [[tools[i].key for i in g] for g in groups] == [["a/read", "b/read"]]


def test_the_shared_registries_hold_interchangeable_generations(shared_registries):
    tools = load_registries([shared_registries])
    keys = [{tools[i].key for i in g} for g in interchangeable_groups(tools)]
    assert {"git/git_status", "mcp-server-git: A git MCP server/git_status"} in keys
    assert {"memory/create_entities", "Knowledge Graph Memory Server/create_entities"} in keys
    # Desktop Commander's read_multiple_files has the name and parameters of the reference server's, not its text
    assert not any("filesystem/read_multiple_files" in g for g in keys)
    assert len(keys) == 40
