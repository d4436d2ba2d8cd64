"""The index folder as the router reads it: the tools' entries, the SLB, BM25 and the manifest (docs/slb-format.md).

`load_index` checks the folder and loads what routing reads: each tool's head (tools.json: names, description,
signature) and the interchangeable groups (the manifest). Each tool's schemas, grammar and example requests
(tool_details.json) are read when first asked for (`Index.tools`), so a route without arguments never parses them;
each schema was normalized at build time and is never normalized again per request. A killed `nexus index` is
repaired here (`recover_index_dir`), and a finished build is swapped into place with `swap_into_place`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from .. import textgen
from ..errors import FormatError
from ..files import pid_alive
from ..registry import copies_by_member, interchangeable_map
from .lexical import BM25
from .slb import SLB, read_slb

if TYPE_CHECKING:
    from ..schema import ToolSpec

# 2: each tool's normalized schema is stored in tools.json. 3: tools.json keeps each tool's head (what a route without
# arguments reads) and tool_details.json the rest; the manifest holds the interchangeable groups
INDEX_FORMAT_VERSION = 4
READABLE_VERSIONS = (2, 3, 4)
HEAD_KEYS = ("server", "name", "description", "signature", "problems", "ok")  # tools.json (format 3)
DETAIL_KEYS = ("described_signature", "grammar", "input_schema", "schema", "examples")  # tool_details.json


@dataclass
class ToolEntry:
    server: str
    name: str
    description: str
    signature: str
    described_signature: str
    grammar: str | None
    input_schema: dict  # as the server sent it: what arguments are validated against
    schema: dict = field(default_factory=dict)  # normalized once at build time (schema.compile_tool)
    problems: list[str] = field(default_factory=list)
    ok: bool = True
    examples: list[str] = field(default_factory=list)  # example requests (nexus index --examples); the reranker reads them

    @property
    def key(self) -> str:
        return f"{self.server}/{self.name}"

    def spec(self) -> ToolSpec:
        """The arguments stage's view of this tool, from what the build stored (nothing is normalized again)."""
        from ..schema import ToolSpec  # here: a route without arguments never loads the schema compiler

        return ToolSpec(key=self.key, name=self.name, signature=self.signature, grammar=self.grammar,
                        schema=self.schema, input_schema=self.input_schema, description=self.description,
                        problems=list(self.problems), ok=bool(self.ok and self.grammar),
                        described_signature=self.described_signature)


@dataclass
class ToolHead:
    """What a route without arguments reads of a tool (tools.json): its names, description and signature."""
    server: str
    name: str
    description: str
    signature: str
    problems: list[str] = field(default_factory=list)
    ok: bool = True

    @property
    def key(self) -> str:
        return f"{self.server}/{self.name}"


@dataclass
class Index:
    path: Path
    manifest: dict
    slb: SLB
    heads: list[ToolHead]
    bm25: BM25 | None
    _tools: list[ToolEntry] | None = field(default=None, repr=False)
    _twins: dict[int, tuple[int, ...]] | None = field(default=None, repr=False)
    _group_ids: np.ndarray | None = field(default=None, repr=False, compare=False)
    _rankers: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def tools(self) -> list[ToolEntry]:
        """Every tool's full entry, its schemas, grammar and example requests read from tool_details.json on first
        use (the reranker's prompts, the arguments stage)."""
        if self._tools is None:
            self._tools = _full_entries(self.path, self.heads)
        return self._tools

    @property
    def group_ids(self) -> np.ndarray:
        """Each tool's group of interchangeable copies as an int32 id (the lowest member's index), -1 for a tool with
        none: what the native ranking reads (scoring.rank)."""
        if self._group_ids is None:
            ids = np.full(len(self.heads), -1, dtype=np.int32)
            for i, twins in self._twin_map().items():
                ids[i] = min(i, *twins)
            self._group_ids = ids
        return self._group_ids

    def ranker(self, k: int):
        """The native ranking of this index's tools, k at a time (kernels.ToolRanker), made once per k."""
        if k not in self._rankers:
            from .. import kernels

            self._rankers[k] = kernels.ToolRanker(self.group_ids, k)
        return self._rankers[k]

    def interchangeable(self, i: int) -> tuple[int, ...]:
        """The other tools that are the same tool on another server (registry.interchangeable_groups), or ()."""
        return self._twin_map().get(int(i), ())

    def _twin_map(self) -> dict[int, tuple[int, ...]]:
        if self._twins is None:
            groups = self.manifest.get("interchangeable")
            if groups is None:  # format 2: found from the entries
                self._twins = interchangeable_map(self.tools)
            else:
                self._twins = copies_by_member(groups)
        return self._twins

    @property
    def tau(self) -> float:
        return float(self.manifest["gate"]["tau"])

    @property
    def embedder(self) -> str:
        """What to load as the query embedder: the index's own fine-tuned model if it has one, else the named one."""
        local = self.manifest["embedder"].get("path")
        return str(self.path / local) if local else self.manifest["embedder"]["name"]

    def lex_weight(self) -> float:
        return float(self.manifest["retrieval"].get("lex_weight", 0.0)) if self.bm25 is not None else 0.0

    @property
    def value_masking(self) -> bool:
        """Score requests also with their values masked (indexes built before this existed: False)."""
        return bool(self.manifest["retrieval"].get("value_masking", False))


def load_index(path: str | Path) -> Index:
    p = Path(path).expanduser()
    if not p.exists():
        recover_index_dir(p.absolute())
    if not p.exists():
        raise FormatError(f"index {p} does not exist", hint="build one with `nexus index REGISTRY --out DIR`")
    if not p.is_dir():
        raise FormatError(f"index {p} is not a directory")
    mpath = p / "manifest.json"
    if not mpath.is_file():
        raise FormatError(f"{p} is not a Nexus index (no manifest.json)", hint="build one with `nexus index`")
    try:
        manifest = json.loads(mpath.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(f"{mpath} is unreadable: {e}") from None
    if manifest.get("format") != "nexus-index" or manifest.get("version") not in READABLE_VERSIONS:
        raise FormatError(f"{p}: index format {manifest.get('format')} v{manifest.get('version')} is not supported",
                          hint="rebuild it with `nexus index`")
    for fname, digest in manifest.get("files", {}).items():
        fp = p / fname
        if not fp.is_file():
            raise FormatError(f"index {p} is incomplete: {fname} is missing")
    slb = read_slb(p / "slb.bin")
    raw = _read_tool_list(p / "tools.json", slb.n_tools)
    tools = None
    if manifest["version"] == 2:  # one file holds every field
        tools = [_entry(t, p / "tools.json") for t in raw]
        heads = [ToolHead(**{k: getattr(t, k) for k in HEAD_KEYS}) for t in tools]
    else:
        try:
            heads = [ToolHead(**t) for t in raw]
        except TypeError as e:
            raise FormatError(f"{p / 'tools.json'}: an entry does not have the keys {', '.join(HEAD_KEYS)} "
                              f"({e})") from None
    if any(h.name != n for h, n in zip(heads, slb.names)):
        raise FormatError(f"index {p}: tools.json does not match slb.bin")
    bm25 = None
    lp = p / "lexical.json"
    if lp.is_file():
        bm25 = _read_lexical(lp, slb.n_tools)
    return Index(path=p, manifest=manifest, slb=slb, heads=heads, bm25=bm25, _tools=tools)


def _read_lexical(path: Path, n_tools: int) -> BM25:
    """lexical.json: each token's postings (format 4), or each tool's token list (formats 2 and 3)."""
    try:
        doc = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(f"{path} is unreadable: {e}") from None
    if isinstance(doc, dict) and isinstance(doc.get("postings"), dict) and isinstance(doc.get("doc_lengths"), list):
        if len(doc["doc_lengths"]) != n_tools:
            raise FormatError(f"index {path.parent}: lexical.json does not match slb.bin")
        return BM25.from_postings(doc["doc_lengths"], doc["postings"], _tokenizer_version(doc.get("tokenizer")))
    if isinstance(doc, dict) and isinstance(doc.get("docs"), list):
        return BM25(doc["docs"], tokenizer=1)  # formats 2 and 3 predate tokenizer 2
    raise FormatError(f"{path}: neither postings nor token lists")


def _tokenizer_version(name) -> int:
    """"textgen.lex_tokens/vN" → N (lexical.json's "tokenizer"); 1 when absent. A version this code does not know is
    refused: its requests would be tokenized unlike its tools."""
    m = re.fullmatch(r"textgen\.lex_tokens/v(\d+)", name) if isinstance(name, str) else None
    if name is None:
        return 1
    if m is None or not 1 <= int(m.group(1)) <= textgen.LEX_TOKENIZER:
        raise FormatError(f"lexical.json: tokenizer {name!r} is not one this nexus reads (rebuild with `nexus index`)")
    return int(m.group(1))


def _read_tool_list(path: Path, n_tools: int) -> list[dict]:
    """A JSON array of one object per tool (tools.json, tool_details.json), as many as the SLB has tools."""
    try:
        raw = json.loads(path.read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(f"{path} is unreadable: {e}") from None
    if not isinstance(raw, list) or len(raw) != n_tools or not all(isinstance(t, dict) for t in raw):
        raise FormatError(f"index {path.parent}: {path.name} does not match slb.bin")
    return raw


def _entry(fields: dict, path: Path) -> ToolEntry:
    try:
        return ToolEntry(**fields)
    except TypeError as e:
        raise FormatError(f"{path}: an entry has missing or unknown keys ({e})") from None


def _full_entries(path: Path, heads: list[ToolHead]) -> list[ToolEntry]:
    """Format 3: each head joined with its details (tool_details.json, same order)."""
    details = _read_tool_list(path / "tool_details.json", len(heads))
    return [_entry({**h.__dict__, **d}, path / "tool_details.json") for h, d in zip(heads, details)]


def split_entry(entry: ToolEntry) -> tuple[dict, dict]:
    """A tool's entry as written: (its tools.json head, its tool_details.json details)."""
    d = entry.__dict__
    return {k: d[k] for k in HEAD_KEYS}, {k: d[k] for k in DETAIL_KEYS}


def recover_index_dir(out: Path) -> None:
    """Repair what a killed `nexus index` can leave next to `out`: if it died between the two renames of the swap,
    `out` is missing and the previous index sits in `.NAME.old-PID`: move it back. Leftover temporary and old
    directories of dead processes are removed."""
    parent = out.parent
    if not parent.is_dir():
        return
    olds = sorted(parent.glob(f".{out.name}.old-*"), key=lambda q: q.stat().st_mtime, reverse=True)
    if not out.exists():
        for old in olds:
            if (old / "manifest.json").is_file():
                os.replace(old, out)
                break
    for stale in list(parent.glob(f".{out.name}.old-*")) + list(parent.glob(f".{out.name}.tmp-*")):
        pid_part = stale.name.rsplit("-", 1)[-1]
        if stale.name.startswith(f".{out.name}.old-") and pid_part.isdigit() and pid_alive(int(pid_part)):
            continue
        if stale.name.startswith(f".{out.name}.tmp-") and (stale / ".owner").is_file():
            owner = (stale / ".owner").read_text().strip()
            if owner.isdigit() and pid_alive(int(owner)):
                continue
        shutil.rmtree(stale, ignore_errors=True)


def swap_into_place(tmp: Path, out: Path) -> None:
    """Rename the finished temporary directory onto `out`; an existing index is moved aside first and removed after.
    A kill between the two renames is repaired by recover_index_dir() on the next load or build."""
    os.chmod(tmp, 0o755)
    (tmp / ".owner").unlink(missing_ok=True)
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            os.replace(old, out)
            raise
        shutil.rmtree(old, ignore_errors=True)
    else:
        os.replace(tmp, out)
