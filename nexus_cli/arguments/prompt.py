"""The argument prompt: the system instruction, the pruned history window, the tool's block and the request.

The window keeps the last turns verbatim (long ones cut) and turns tool payloads into digests of the values
arguments are copied from (`tool_digest`); the tool's block is its multi-line signature with short descriptions.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..schema import ToolSpec, signature_of

HISTORY_TURNS = 6  # most recent messages kept
HISTORY_BUDGET_CHARS = 1200  # whole window
TURN_MAX_CHARS = 400  # one verbatim turn
PAYLOAD_MIN_CHARS = 160  # a tool message / JSON blob longer than this becomes a surrogate
TOOL_RESULT_CHARS = 400  # a tool result in the arguments' window: compact JSON, shrunk to this (tool_digest)
SIGNATURE_BUDGET_CHARS = 900


SYSTEM = (
    "You fill in the arguments of a tool call as JSON. Copy values exactly as the user wrote them. "
    "Fill every required parameter. Add an optional parameter only when the request asks for it. "
    'A repository written "owner/name" means owner is the part before "/" and repo the part after it. '
    "Words like \"there\" or \"it\" refer to the conversation."
)


_PRIORITY_KEYS = ("full_name", "name", "title", "number", "id", "path", "url", "html_url", "owner", "repo", "state",
                  "login", "ref", "branch", "sha", "key")


def _scalar(v: Any) -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, str) and 0 < len(v) <= 60 and "\n" not in v:
        return v
    return None


def _facts(obj: dict, limit: int = 5) -> list[str]:
    keys = [k for k in _PRIORITY_KEYS if k in obj] + [k for k in obj if k not in _PRIORITY_KEYS]
    out = []
    for k in keys:
        s = _scalar(obj[k])
        if s is None and isinstance(obj[k], dict):  # e.g. owner: {login: ...}
            inner = obj[k]
            s = next((x for x in (_scalar(inner.get(q)) for q in ("login", "name", "id")) if x), None)
        if s is not None:
            out.append(f"{k}={s}")
        if len(out) >= limit:
            break
    return out


def surrogate(content: str) -> str:
    """A one-line stand-in for a bulky tool payload that keeps the salient short values (names, numbers, urls)."""
    try:
        data = json.loads(content)
    except (ValueError, TypeError):
        data = None
    if isinstance(data, list):
        keys: list[str] = []
        for item in data[:20]:
            if isinstance(item, dict):
                keys += [k for k in item if k not in keys]
        text = f"[tool result: {len(data)} items"
        if keys:
            text += f", keys: {','.join(keys[:6])}"
        if data and isinstance(data[0], dict):
            facts = _facts(data[0], 3)
            if facts:
                text += f"; first: {', '.join(facts)}"
        return text + "]"
    if isinstance(data, dict):
        facts = _facts(data)
        more = len(data) - len(facts)
        return f"[tool result: {', '.join(facts) or 'object'}{f' (+{more} more fields)' if more > 0 else ''}]"
    words = " ".join(str(content).split())
    return f"[tool result: {len(words)} chars: {words[:80]}…]"


# (items kept per list, characters per string, nesting depth) tried in turn until a digest fits its budget
_DIGEST_STEPS = ((8, 60, 4), (6, 40, 3), (4, 30, 3), (3, 20, 2), (2, 16, 2))


def _shrink(data: Any, items: int, chars: int, depth: int) -> Any:
    if isinstance(data, dict):
        if depth <= 0:
            return "{…}"
        return {k: _shrink(v, items, chars, depth - 1) for k, v in data.items()}
    if isinstance(data, list):
        if depth <= 0:
            return f"[{len(data)} items]"
        out = [_shrink(v, items, chars, depth - 1) for v in data[:items]]
        return out + [f"+{len(data) - items} more"] if len(data) > items else out
    if isinstance(data, str) and len(data) > chars:
        return data[: chars - 1] + "…"
    return data


def tool_digest(content: str, budget: int = TOOL_RESULT_CHARS) -> str:
    """A tool result for the arguments' window: the JSON itself, compact, when it fits `budget`; else the same JSON
    with lists, strings and nesting cut in steps until it fits (every key and every short id stays readable:
    follow-ups take their values from here, "open the second one", "rename that task"); a one-line `surrogate`
    when even that is too long or the result is not JSON."""
    try:
        data = json.loads(content)
    except (ValueError, TypeError):
        data = None
    if not isinstance(data, (dict, list)):
        text = " ".join(str(content).split())
        return text if len(text) <= budget else surrogate(content)
    compact = json.dumps(data, ensure_ascii=False, separators=(", ", ": "))
    if len(compact) <= budget:
        return compact
    for items, chars, depth in _DIGEST_STEPS:
        text = json.dumps(_shrink(data, items, chars, depth), ensure_ascii=False, separators=(", ", ": "))
        if len(text) <= budget:
            return text
    return surrogate(content)


def _as_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    try:
        return json.dumps(content, ensure_ascii=False)
    except (TypeError, ValueError):
        return str(content)


def prune_history(history: Sequence[Any] | None, max_turns: int = HISTORY_TURNS,
                  budget_chars: int = HISTORY_BUDGET_CHARS, digest: bool = True) -> list[dict[str, str]]:
    """The window the prompt carries: the last `max_turns` messages, tool payloads (role "tool", or JSON longer than
    PAYLOAD_MIN_CHARS) as digests (`tool_digest`: the values arguments are copied from) or, with digest=False, as
    one-line surrogates (routing needs the topic only), long turns cut, oldest dropped first to fit `budget_chars`."""
    if not history:
        return []
    msgs: list[dict[str, str]] = []
    for m in list(history)[-max_turns:]:
        if isinstance(m, dict):
            role = str(m.get("role") or "user")
            content = _as_text(m.get("content", ""))
        else:
            role, content = "user", _as_text(m)
        stripped = content.strip()
        bulky = role == "tool" or (stripped[:1] in "[{" and len(stripped) > PAYLOAD_MIN_CHARS)
        if bulky and (len(stripped) > PAYLOAD_MIN_CHARS or role == "tool"):
            if digest:
                content = tool_digest(stripped)
            else:
                content = surrogate(stripped) if len(stripped) > PAYLOAD_MIN_CHARS or stripped[:1] in "[{" else stripped
        elif len(content) > TURN_MAX_CHARS:
            content = content[:TURN_MAX_CHARS].rstrip() + "…"
        msgs.append({"role": role, "content": " ".join(content.split())})
    while msgs and sum(len(m["content"]) + 12 for m in msgs) > budget_chars:
        msgs.pop(0)
    return msgs


def tool_block(spec: ToolSpec, descriptions: bool = True) -> str:
    """The prompt's `Tool:` block: the multi-line signature with short descriptions (or the bare one-line form)."""
    if descriptions:
        sig = signature_of(spec.name, spec.schema, descriptions=True, budget_chars=SIGNATURE_BUDGET_CHARS,
                           multiline=True)
    else:
        sig = spec.signature
    return f"Tool:\n{sig}"


def build_messages(spec: ToolSpec, query: str, history: Sequence[Any] | None = None, descriptions: bool = True,
                   window_size: tuple[int, int] | None = None) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(chat messages, pruned history window). The user turn is the window, the tool's block, then the request.
    (The tool's block first would make the prompt up to its end the same for every call of the tool, history or
    not; on the development sets it lost 3 values in 70 cases, so the order stays: tool_prefix_tokens.)
    window_size: (messages, characters) of the window instead of (HISTORY_TURNS, HISTORY_BUDGET_CHARS)."""
    window = prune_history(history, *window_size) if window_size else prune_history(history)
    parts = []
    if window:
        parts.append("Conversation so far:\n" + "\n".join(f"{m['role']}: {m['content']}" for m in window))
    parts.append(tool_block(spec, descriptions))
    parts.append(f"Request: {' '.join(str(query).split())}")
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "\n\n".join(parts)}]
    return messages, window


def source_text(query: str, window: Sequence[dict]) -> str:
    """The text argument values may come from: the request and the history window the prompt shows."""
    return " ".join([str(query)] + [m["content"] for m in window])
