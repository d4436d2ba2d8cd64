"""What the splice-side measurement suites (deep-splice, dkl, gate) share: the schema under test, its compiled block,
contexts sized for a depth, the user queries, and timing helpers.

The block under test is compiled by the project's own compile stage (`splice/compile.py`) into a cache folder
(.nexus/bench-blocks/<model>/<fa|nofa>/, incremental: a second run only checks hashes) and read back with `atb`, so
the suites measure exactly what `nexus compile` produces and `nexus splice` splices.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Callable

from .. import atb
from ..adapters.llama import LlamaContext
from ..config import REPO_ROOT
from ..errors import NexusError, UsageError
from ..registry import load_registries
from ..splice.compile import compile_registries

# llama.cpp (and torch) run their threads with OpenMP. On a machine shared with other processes the default spinning
# barrier wait makes every decode several times slower (measured 3x on the 2-core dev box under load); the passive
# policy sleeps instead. It must be set before libgomp loads, i.e. before llama_cpp / torch are imported; it is
# recorded in every results document (environment.threads_env) and can be overridden from the environment.
USER_OMP_WAIT_POLICY = os.environ.get("OMP_WAIT_POLICY")  # as the user's shell set it (None: not set)
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

DEFAULT_REGISTRY_DIR = REPO_ROOT.parent / "shared" / "registries"
DEFAULT_TOOL = "github/create_pull_request"

# Ten user turns that follow the schema in the fidelity sweeps (Fig. 1: 10 queries per offset). They are about the
# schema's tool, as in the agent's steady state (a request the spliced tool should serve), and vary in length.
QUERIES = [
    "Open a pull request in acme/api from feature/login into main titled Add login page.",
    "Please create a PR for octo-org/website merging the branch fix-typo into master, title: Fix typo in footer.",
    "I finished the dark-mode branch in my repo nikola/notes. Make a draft pull request into develop.",
    "Create a pull request: owner torvalds, repo subsurface, head ci-cache, base main, body explains the CI cache fix.",
    "Could you propose my changes from release-2.4 to stable in the payments repo owned by fintech-co?",
    "New PR please. Repository: data-team/etl. Branch: add-retry. Target: main. Title: Retry failed loads.",
    "Merge request for the docs repo of openlab: from readme-refresh into main, and mark it as a draft.",
    "Submit a pull request that brings hotfix/timeout into production for the gateway repository of edge-inc.",
    "Open a PR titled 'Bump dependencies' from deps/update to main in the monorepo repository of bigcorp.",
    "Make a pull request in my fork alice/linter from feature/rules to main; maintainers may modify it.",
]


def registry_dir_default() -> Path:
    env = os.environ.get("NEXUS_REGISTRIES")
    return Path(env) if env else DEFAULT_REGISTRY_DIR


def find_tool(key: str, registry_dir: str | os.PathLike | None = None):
    """The Tool `server/name` from the registries folder (default ../shared/registries)."""
    if "/" not in key:
        raise UsageError(f"--tool must be server/name, not '{key}'")
    server, name = key.split("/", 1)
    folder = Path(registry_dir) if registry_dir else registry_dir_default()
    candidates = [folder / f"{server}.json"] if (folder / f"{server}.json").is_file() else [folder]
    for tool in load_registries([str(c) for c in candidates]):
        if tool.server == server and tool.name == name:
            return tool
    raise UsageError(f"tool '{key}' is not in {folder}")


def block_cache_dir(model_name: str, flash_attn: bool) -> Path:
    return REPO_ROOT / ".nexus" / "bench-blocks" / model_name / ("fa" if flash_attn else "nofa")


def compile_block(model_name: str, tool, flash_attn: bool = False):
    """Compile `tool` for `model_name` with the compile stage (incremental) and return the opened block."""
    out = block_cache_dir(model_name, flash_attn)
    out.mkdir(parents=True, exist_ok=True)
    reg = out / "registry" / f"{tool.server}.json"
    reg.parent.mkdir(parents=True, exist_ok=True)
    payload = {"server": tool.server, "tools": [{"name": tool.name, "description": tool.description,
                                                 "inputSchema": tool.input_schema}]}
    text = json.dumps(payload, sort_keys=True, ensure_ascii=False)
    if not reg.is_file() or reg.read_text(encoding="utf-8") != text:
        reg.write_text(text, encoding="utf-8")
    res = compile_registries([str(reg)], model_name, out, flash_attn=flash_attn)
    entry = next(e for e in res.entries if e["server"] == tool.server and e["name"] == tool.name)
    return open_block(out / entry["file"])


def open_block(path: Path):
    """Open a .atb block with the project's atb module (whatever its reader is called in this version)."""
    for name in ("read_block", "open_block", "load_block"):
        fn = getattr(atb, name, None)
        if callable(fn):
            return fn(path)
    cls = getattr(atb, "Block", None)
    if cls is not None:
        for name in ("open", "read", "load"):
            fn = getattr(cls, name, None)
            if callable(fn):
                return fn(path)
    raise NexusError("nexus_cli.atb has no block reader (read_block / Block.open)")


def context(model, n_needed: int, flash_attn: bool = False, n_batch: int = 512, n_seq_max: int = 2):
    """A LlamaContext with room for n_needed positions (rounded up to a multiple of 256)."""
    n_ctx = max(256, ((n_needed + 255) // 256) * 256)
    return LlamaContext(model, n_ctx=n_ctx, n_batch=n_batch, n_seq_max=n_seq_max, flash_attn=flash_attn)


def timed(fn: Callable, *args, **kwargs):
    """(result, milliseconds)"""
    t0 = time.perf_counter()
    out = fn(*args, **kwargs)
    return out, (time.perf_counter() - t0) * 1e3


class Progress:
    """A progress callback protocol: stages call `advance(desc)`; commands pass a rich progress bar adapter."""

    def __init__(self, total: int = 0, on_advance: Callable[[str], None] | None = None, on_total=None):
        self.total = total
        self._adv = on_advance
        self._tot = on_total

    def set_total(self, total: int) -> None:
        self.total = total
        if self._tot:
            self._tot(total)

    def advance(self, desc: str = "") -> None:
        if self._adv:
            self._adv(desc)


NULL_PROGRESS = Progress()
