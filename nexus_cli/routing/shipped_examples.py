"""The example requests the project ships, given by default to the tools of any registry that are tools it covers.

`tool_registries/examples/shared_registries.jsonl` holds twelve requests for almost every tool of the 95 public MCP
servers in ../shared/registries (docs/routing.md, "The shipped examples"). `nexus index` gives them to the tools of
the registry being indexed that are those tools, unless `--no-shipped-examples`:

- a tool of a server the corpus names (the same server name) is matched by its name: `github/create_issue`;
- a tool of any other server is matched by its name and description together (the fingerprint below), so the same
  tool served under another server name (`gh` for `github`) gets the same requests, and a tool that only shares a
  name (`read_file` of another filesystem server, its own description) gets none.

The fingerprints come from `tool_registries/examples/shared_registries.tools.jsonl` (one line per tool of
../shared/registries: server, tool, fingerprint), written by `python benchmarks/shipped_examples_index.py`: hashes,
not the registries' text. (JSONL, not JSON: every *.json under tool_registries/ is read as a registry.)
Requests given with `--examples` come first: a tool they cover keeps them and gets none of these.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Sequence

from ..config import REPO_ROOT
from ..errors import FormatError
from ..registry import Tool, load_example_requests

SHIPPED_EXAMPLES = REPO_ROOT / "tool_registries" / "examples" / "shared_registries.jsonl"
SHIPPED_FINGERPRINTS = REPO_ROOT / "tool_registries" / "examples" / "shared_registries.tools.jsonl"


def fingerprint(name: str, description: str) -> str:
    """A tool's name and description, whitespace collapsed, hashed: what makes two servers' tools the same tool for
    the shipped requests (the parameters may gain a field between versions; the requests still apply)."""
    text = name.strip() + "\n" + " ".join(description.split())
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:20]


@functools.lru_cache(maxsize=4)
def _load(examples: Path, fingerprints: Path) -> tuple[dict[str, list[str]], set[str], dict[str, str]]:
    """The corpus, its servers, and {fingerprint: the first tool with that fingerprint that has requests}; read once
    per process (a benchmark asks for every registry it builds). Callers only read what it returns."""
    corpus = load_example_requests([examples])
    servers: set[str] = set()
    by_print: dict[str, str] = {}
    try:
        for line in fingerprints.read_text(encoding="utf-8").splitlines():
            if line.strip():
                row = json.loads(line)
                key = f"{row['server']}/{row['tool']}"
                servers.add(row["server"])
                if corpus.get(key):
                    by_print.setdefault(row["fingerprint"], key)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise FormatError(f"cannot read the shipped examples' tool index {fingerprints}: {e}",
                          hint="pass --no-shipped-examples, or restore the file from the repository") from None
    return corpus, servers, by_print


def shipped_examples(tools: Sequence[Tool], examples: Path = SHIPPED_EXAMPLES,
                     fingerprints: Path = SHIPPED_FINGERPRINTS) -> dict[str, list[str]]:
    """{tool key in this registry: the shipped requests for it} for the tools the corpus covers (see above)."""
    corpus, servers, by_print = _load(Path(examples), Path(fingerprints))
    out: dict[str, list[str]] = {}
    for t in tools:
        source = t.key if t.server in servers else by_print.get(fingerprint(t.name, t.description))
        requests = corpus.get(source) if source else None
        if requests:
            out[t.key] = list(requests)
    return out


def with_shipped(tools: Sequence[Tool], given: dict[str, list[str]] | None, examples: Path = SHIPPED_EXAMPLES,
                 fingerprints: Path = SHIPPED_FINGERPRINTS) -> tuple[dict[str, list[str]] | None, int]:
    """The requests to index with: those given (`--examples`) and, for the tools they leave without any, the shipped
    ones. Also how many tools took shipped requests."""
    given = dict(given or {})
    extra = {k: v for k, v in shipped_examples(tools, examples, fingerprints).items() if not given.get(k)}
    merged = {**given, **extra}
    return (merged or None), len(extra)
