"""The shipped example requests given by default to the tools of a user's registry that are tools Nexus ships them
for: matched by server and name on the corpus's own servers, by name and description anywhere else; `--examples`
first; `--no-shipped-examples` off. The fingerprint file is checked against ../shared/registries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from nexus_cli.registry import Tool, load_registries
from nexus_cli.routing.shipped_examples import fingerprint, shipped_examples, with_shipped

REPO = Path(__file__).resolve().parent.parent
NEXUS = [sys.executable, "-m", "nexus_cli.cli"]


def tool(server, name, description="", schema=None):
    return Tool(server=server, name=name, description=description,
                input_schema=schema or {"type": "object", "properties": {}})


@pytest.fixture()
def corpus(tmp_path):
    """A corpus of two tools of server `files` and its tool index, as benchmarks/shipped_examples_index.py writes
    them."""
    ex = tmp_path / "examples.jsonl"
    rows = [("files", "read_file", "show me notes.txt"), ("files", "read_file", "open the readme"),
            ("files", "move_file", "rename a.txt to b.txt")]
    ex.write_text("".join(json.dumps({"server": s, "tool": t, "query": q}) + "\n" for s, t, q in rows))
    fp = tmp_path / "tools.jsonl"
    tools = [("files", "read_file", "Read a file from disk."), ("files", "move_file", "Move or rename a file."),
             ("archive", "move_file", "Move or rename a file.")]  # a copy on a server the corpus has no requests for
    fp.write_text("".join(json.dumps({"server": s, "tool": t, "fingerprint": fingerprint(t, d)}) + "\n"
                          for s, t, d in tools))
    return ex, fp


def test_tools_are_matched_by_name_on_the_corpus_servers_and_by_name_and_description_elsewhere(corpus):
    ex, fp = corpus
    tools = [
        tool("files", "read_file", "a newer wording"),  # a corpus server: its name is enough
        tool("archive", "move_file", "Move or rename a file."),  # a corpus server without requests for it: none
        tool("fs", "move_file", "Move  or rename\na file. "),  # another server, the same tool (whitespace aside)
        tool("disk", "read_file", "Read bytes from a block device."),  # another server, another tool of that name
        tool("fs", "delete_file", "Delete a file."),
    ]
    got = shipped_examples(tools, examples=ex, fingerprints=fp)
    assert got == {"files/read_file": ["show me notes.txt", "open the readme"],
                   "fs/move_file": ["rename a.txt to b.txt"]}


def test_given_examples_come_first_and_the_count_is_of_the_tools_that_took_shipped_ones(corpus):
    ex, fp = corpus
    tools = [tool("files", "read_file"), tool("files", "move_file")]
    merged, n = with_shipped(tools, {"files/read_file": ["my own request"], "elsewhere/x": ["kept for the report"]},
                             ex, fp)
    assert merged == {"files/read_file": ["my own request"], "elsewhere/x": ["kept for the report"],
                      "files/move_file": ["rename a.txt to b.txt"]}
    assert n == 1
    assert with_shipped([tool("fs", "delete_file", "Delete a file.")], None, ex, fp) == (None, 0)


def test_a_damaged_fingerprint_file_is_one_clear_error(corpus, tmp_path):
    from nexus_cli.errors import FormatError

    ex, _ = corpus
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"server": "files", "tool": "read_file"}\n')  # no fingerprint
    with pytest.raises(FormatError, match="shipped examples' tool index"):
        shipped_examples([tool("files", "read_file")], examples=ex, fingerprints=bad)


def test_the_fingerprint_file_matches_the_registries(shared_registries):
    r = subprocess.run([sys.executable, "benchmarks/shipped_examples_index.py", "--registry-dir",
                        str(shared_registries), "--check"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr


@pytest.mark.slow
def test_nexus_index_gives_a_renamed_copy_of_a_shipped_tool_its_requests_unless_told_not_to(shared_registries,
                                                                                              tmp_path):
    real = next(t for t in load_registries([shared_registries / "everart.json"]) if t.name == "generate_image")
    reg = tmp_path / "mine.json"
    reg.write_text(json.dumps({"server": "my-images", "tools": [
        {"name": real.name, "description": real.description, "inputSchema": real.input_schema},
        {"name": "resize_image", "description": "Resize an image to the given width and height.",
         "inputSchema": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}]}))
    env = {**os.environ, "NEXUS_DEBUG": "0"}

    def index(*flags):
        r = subprocess.run([*NEXUS, "index", str(reg), "--out", str(tmp_path / "idx"), "--json", *flags],
                           cwd=REPO, capture_output=True, text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-2000:]
        return json.loads(r.stdout)

    on = index()
    assert on["examples"]["n_tools_with"] == on["examples"]["n_tools_shipped"] == 1
    assert on["n_vectors"] > index("--no-shipped-examples")["n_vectors"]
    assert index("--no-shipped-examples")["examples"] is None
    plain = subprocess.run([*NEXUS, "index", str(reg), "--out", str(tmp_path / "idx")], cwd=REPO,
                           capture_output=True, text=True, timeout=300, env=env)
    assert "the shipped ones for 1" in plain.stdout
