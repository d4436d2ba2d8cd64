"""The index folder as the router reads it: the tools' entries, the SLB, BM25 and the manifest (docs/slb-format.md).

`load_index` checks the folder and loads it once: each tool's schema was normalized at build time and is read from
tools.json, never normalized again per request. A killed `nexus index` is repaired here (`recover_index_dir`), and
a finished build is swapped into place with `swap_into_place`.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import FormatError
from ..files import pid_alive
from ..registry import interchangeable_map
from ..schema import ToolSpec
from .lexical import BM25
from .slb import SLB, read_slb

INDEX_FORMAT_VERSION = 2  # 2: each tool's normalized schema is stored in tools.json


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
        return ToolSpec(key=self.key, name=self.name, signature=self.signature, grammar=self.grammar,
                        schema=self.schema, input_schema=self.input_schema, description=self.description,
                        problems=list(self.problems), ok=bool(self.ok and self.grammar),
                        described_signature=self.described_signature)


@dataclass
class Index:
    path: Path
    manifest: dict
    slb: SLB
    tools: list[ToolEntry]
    bm25: BM25 | None
    _twins: dict[int, tuple[int, ...]] | None = field(default=None, repr=False)

    def interchangeable(self, i: int) -> tuple[int, ...]:
        """The other tools that are the same tool on another server (registry.interchangeable_groups), or ()."""
        if self._twins is None:
            self._twins = interchangeable_map(self.tools)
        return self._twins.get(int(i), ())

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
    if manifest.get("format") != "nexus-index" or manifest.get("version") != INDEX_FORMAT_VERSION:
        raise FormatError(f"{p}: index format {manifest.get('format')} v{manifest.get('version')} is not supported",
                          hint="rebuild it with `nexus index`")
    for fname, digest in manifest.get("files", {}).items():
        fp = p / fname
        if not fp.is_file():
            raise FormatError(f"index {p} is incomplete: {fname} is missing")
    slb = read_slb(p / "slb.bin")
    try:
        raw_tools = json.loads((p / "tools.json").read_text("utf-8"))
    except (OSError, ValueError) as e:
        raise FormatError(f"{p / 'tools.json'} is unreadable: {e}") from None
    tools = [ToolEntry(**t) for t in raw_tools]
    if len(tools) != slb.n_tools or any(t.name != n for t, n in zip(tools, slb.names)):
        raise FormatError(f"index {p}: tools.json does not match slb.bin")
    bm25 = None
    lp = p / "lexical.json"
    if lp.is_file():
        docs = json.loads(lp.read_text("utf-8"))["docs"]
        bm25 = BM25(docs)
    return Index(path=p, manifest=manifest, slb=slb, tools=tools, bm25=bm25)


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
