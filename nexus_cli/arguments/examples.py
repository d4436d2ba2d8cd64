"""Worked example calls for a tool's card: a few of the tool's example requests, each with the arguments the model
itself gives it, shown in the argument prompt after the signature ("Examples:" / "Request: ..." / "Call: {...}").

The requests are those the index already holds for the tool (`nexus index --examples`, or the ones it wrote for
itself with `--synthesize`). Their arguments are produced once per model and tool with the plain prompt (no
examples), through the one argument pipeline, and an example is kept only when its arguments are valid against
the tool's schema, not empty, and every string and number in them is written in its request: a call the model got
wrong in a way the request can show is never shown as a model answer. At most WORKED_EXAMPLES are kept, from the
first MAX_TRIED requests.

Cache: one file per (model, tool, requests) under `<cache>/worked/<model fingerprint>/<hash>.json`, written by
temporary file + rename; the hash covers EXAMPLES_REVISION, the tool's key, description and input schema, and the
requests tried, so a changed tool or a new example looks for another file. A damaged file is derived again.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ..config import DEFAULT_WORKED_EXAMPLES, models_dir
from ..files import atomic_write_json

EXAMPLES_REVISION = 1  # bump when the derivation or the kept-example rule changes
WORKED_EXAMPLES = DEFAULT_WORKED_EXAMPLES
MAX_TRIED = 4
DERIVE_TIME_LIMIT_S = 10.0  # one example's generation (a tool's derivation is bounded by MAX_TRIED of these)
EXAMPLE_VALUE_CHARS = 80  # a longer string value is cut in the card (the call still shows its shape)


@dataclass(frozen=True)
class WorkedExample:
    request: str
    arguments: dict


def examples_text(examples: Sequence[WorkedExample]) -> str:
    """The card's "Examples:" section (empty when there are none)."""
    if not examples:
        return ""
    lines = ["Examples:"]
    for ex in examples:
        lines.append(f"Request: {' '.join(ex.request.split())}")
        lines.append("Call: " + json.dumps(_cut(ex.arguments), ensure_ascii=False, separators=(", ", ": ")))
    return "\n".join(lines)


def _cut(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _cut(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_cut(v) for v in value]
    if isinstance(value, str) and len(value) > EXAMPLE_VALUE_CHARS:
        return value[: EXAMPLE_VALUE_CHARS - 1] + "…"
    return value


def _backed(value: Any, context: str) -> bool:
    """Every string and number inside `value` is written in `context` (normalized); flags and nulls are free."""
    from .repairs import supported  # repairs reads the prompt module, which renders these examples
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, (int, float, str)):
        return supported(value, context)
    if isinstance(value, list):
        return all(_backed(v, context) for v in value)
    if isinstance(value, dict):
        return all(_backed(v, context) for v in value.values())
    return False


def keep_example(request: str, arguments: dict | None, valid: bool) -> bool:
    """The rule an example passes to be shown: valid, not empty, every value backed by its request."""
    from .repairs import norm_text
    return bool(valid and isinstance(arguments, dict) and arguments and _backed(arguments, norm_text(request)))


def cache_root() -> Path:
    """$NEXUS_WORKED_CACHE, else `worked` next to the models cache (~/.cache/nexus/worked by default)."""
    env = os.environ.get("NEXUS_WORKED_CACHE")
    return Path(env).expanduser() if env else models_dir().parent / "worked"


def examples_hash(spec: Any, requests: Sequence[str]) -> str:
    doc = [EXAMPLES_REVISION, WORKED_EXAMPLES, spec.key, spec.description or "", spec.input_schema, list(requests)]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:24]


def _read(path: Path, key: str) -> list[WorkedExample] | None:
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
        if doc.get("tool") != key:
            return None
        return [WorkedExample(str(e["request"]), dict(e["arguments"])) for e in doc["examples"]]
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class WorkedExamples:
    """Derives (and caches) a tool's worked examples for one model. `for_tool(ctx, spec, requests)` is what the
    argument callers use; `derived`, `cached` count what happened."""

    def __init__(self, root: str | os.PathLike | None = None, n: int = WORKED_EXAMPLES, tried: int = MAX_TRIED):
        self.root = Path(root).expanduser() if root is not None else cache_root()
        self.n, self.tried = int(n), int(tried)
        self.derived = self.cached = 0
        self._memory: dict[str, list[WorkedExample]] = {}

    def for_tool(self, ctx: Any, spec: Any, requests: Sequence[str], seq_id: int = 0) -> list[WorkedExample]:
        """The tool's worked examples: from memory, the cache folder, or derived now on `seq_id` of `ctx` (a sequence
        the caller lends; it is left holding the last derivation's prompt)."""
        requests = [str(r) for r in requests if str(r).strip()][: self.tried]
        if not requests or self.n <= 0:
            return []
        digest = examples_hash(spec, requests)
        hit = self._memory.get(digest)
        if hit is not None:
            return hit
        path = self.root / ctx.identity.fingerprint / f"{digest}.json"  # a LlamaModel or a LlamaContext
        examples = _read(path, spec.key) if path.is_file() else None
        if examples is None:
            examples = derive_examples(ctx, spec, requests, self.n, seq_id)
            try:
                path.parent.mkdir(parents=True, exist_ok=True)
                atomic_write_json(path, {"tool": spec.key, "revision": EXAMPLES_REVISION,
                                         "examples": [{"request": e.request, "arguments": e.arguments}
                                                      for e in examples]})
            except OSError:
                pass  # an unwritable cache derives again next time; the examples are still used now
            self.derived += 1
        else:
            self.cached += 1
        self._memory[digest] = examples
        return examples


def derive_examples(ctx: Any, spec: Any, requests: Sequence[str], n: int = WORKED_EXAMPLES,
                    seq_id: int = 0) -> list[WorkedExample]:
    """The first `n` of `requests` whose arguments (the plain prompt, no examples) pass `keep_example`."""
    from .pipeline import generate_arguments  # the pipeline imports this module for the prompt

    kept: list[WorkedExample] = []
    for request in requests:
        if len(kept) >= n:
            break
        res = generate_arguments(ctx, spec, request, seq_id=seq_id, time_limit_s=DERIVE_TIME_LIMIT_S)
        if keep_example(request, res.arguments, res.valid):
            kept.append(WorkedExample(request, dict(res.arguments)))
    return kept
