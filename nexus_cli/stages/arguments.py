"""Generate a tool's arguments with the local LLM: compressed signature in, grammar-constrained JSON out, validated.

Prompt (chat template of the model):
  system:    a short instruction (copy values exactly, fill required parameters, add an optional one only when asked,
             split "owner/name" repository references);
  few-shot:  optional (off by default): one synthetic micro example with a made-up tool. On the dev set
             (tool_registries/demo_queries.jsonl) it lowered specified-argument accuracy from 88 % to 81 %: the
             model copied the example's values ("octo-org") whenever the request did not state them;
  user:      the pruned history window (recent turns verbatim, bulky tool payloads as one-line surrogates), the
             tool's signature with short inline descriptions, and the request.
Decoding is greedy and constrained by the tool's GBNF grammar (nexus_cli.schema), so the output always parses.
String values are bounded by the length of the request + history window (a value longer than its only
possible source cannot be copied from it; this stops a small model's runaway strings). An answer that runs out
of tokens before its JSON closes is retried once over the tool's tight grammar (arrays of at most two items,
free-form objects empty, recursion cut after one level, strings of at most 64 characters). Numbers outside their
schema's minimum/maximum (which a grammar cannot express) are clamped onto the bound. Post-processing drops optional fields whose values are not supported by the request or the history window (the
model's habit of inventing them); required fields are never touched. Optional fields the request states and the
answer left out get a second pass whose grammar requires them (stated_optional_keys), and a list closed after
one item one whose grammar asks for more (one_item_lists; new items kept only while the request writes them). The result is then validated with jsonschema
against the ORIGINAL schema the server sent; every violation is reported in `ArgsResult.errors` (valid=False).

A copy bias (copy_bias: a logit bias toward the conversation's own tokens) is implemented and off (COPY_BIAS = 0):
on the six non-blind argument sets it fixed 6 values and broke 5 (docs/arguments.md).

When the same context is reused, the longest common token prefix with the previous call (system prompt + few-shot)
stays in the KV cache and is not decoded again. With an ArgumentPrefixes (the Router keeps one, on disk below the
prefix store), the part every call of the tool shares (the system prompt, and the tool's block when there is no
history window) is restored from a kept KV state instead of decoded, also in a new process.
"""

from __future__ import annotations

import json
import math
import re
import weakref
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from ..errors import NexusError, SchemaError
from ..schema import ToolSpec, grammar_of, signature_of, validate_arguments, with_string_limit
from .textgen import name_words

DEFAULT_MAX_TOKENS = 256
HISTORY_TURNS = 6  # most recent messages kept
HISTORY_BUDGET_CHARS = 1200  # whole window
TURN_MAX_CHARS = 400  # one verbatim turn
PAYLOAD_MIN_CHARS = 160  # a tool message / JSON blob longer than this becomes a surrogate
TOOL_RESULT_CHARS = 400  # a tool result in the arguments' window: compact JSON, shrunk to this (tool_digest)
SIGNATURE_BUDGET_CHARS = 900
LONGER_LISTS_PASS = True  # a second pass for a list the answer closed after one item
STATED_KEYS_PASS = True  # a second pass for optional fields the request states and the answer left out
COPY_BIAS = 0.0  # logit bias toward the conversation's own tokens (copy_bias); 0 turns it off
STRING_MIN_BOUND = 48  # the smallest string bound the grammar gets (chars)
TIGHT_STRING_MAX = 64  # the string bound of the retry over the tight grammar (chars)
PREFIX_SUBDIR = "arguments"  # the tools' prompt prefixes, below the prefix store's directory (ArgumentPrefixes)

SYSTEM = (
    "You fill in the arguments of a tool call as JSON. Copy values exactly as the user wrote them. "
    "Fill every required parameter. Add an optional parameter only when the request asks for it. "
    'A repository written "owner/name" means owner is the part before "/" and repo the part after it. '
    "Words like \"there\" or \"it\" refer to the conversation."
)

# One micro example with a made-up tool (off by default, see the module doc; measured in docs/arguments.md).
FEW_SHOT = [
    ("Tool:\nstar_project(\n  owner: string,  // Account that owns the project\n  repo: string,  // Project name\n"
     "  notify?: boolean,  // Send a notification\n  note?: string,\n)\n\nRequest: star the project octo-org/widgets",
     '{"owner": "octo-org", "repo": "widgets"}'),
]


@dataclass
class ArgsResult:
    arguments: dict[str, Any]
    raw: str
    valid: bool
    errors: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)  # first_token, total
    prompt_tokens: int = 0
    dropped: list[str] = field(default_factory=list)  # post-processing: optional fields removed, numbers clamped,
    #                                                   path prefixes restored
    prompt: str = ""
    retried_tight: bool = False  # the first answer ran out of tokens; this one came from the tight grammar


# ------------------------------------------------------------------------------------------------ history window

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


# ------------------------------------------------------------------------------------------------ prompt

def tool_block(spec: ToolSpec, descriptions: bool = True) -> str:
    """The prompt's `Tool:` block: the multi-line signature with short descriptions (or the bare one-line form)."""
    if descriptions:
        sig = signature_of(spec.name, spec.schema, descriptions=True, budget_chars=SIGNATURE_BUDGET_CHARS,
                           multiline=True)
    else:
        sig = spec.signature
    return f"Tool:\n{sig}"


def build_messages(spec: ToolSpec, query: str, history: Sequence[Any] | None = None, few_shot: bool = False,
                   descriptions: bool = True) -> tuple[list[dict[str, str]], list[dict[str, str]]]:
    """(chat messages, pruned history window). The user turn is the window, the tool's block, then the request.
    (The tool's block first would make the prompt up to its end the same for every call of the tool, history or
    not; on the development sets it lost 3 values in 70 cases, so the order stays: tool_prefix_tokens.)"""
    window = prune_history(history)
    parts = []
    if window:
        parts.append("Conversation so far:\n" + "\n".join(f"{m['role']}: {m['content']}" for m in window))
    parts.append(tool_block(spec, descriptions))
    parts.append(f"Request: {' '.join(str(query).split())}")
    messages = [{"role": "system", "content": SYSTEM}]
    if few_shot:
        for user, assistant in FEW_SHOT:
            messages += [{"role": "user", "content": user}, {"role": "assistant", "content": assistant}]
    messages.append({"role": "user", "content": "\n\n".join(parts)})
    return messages, window


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens two token lists share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def tool_prefix_tokens(model: Any, messages: Sequence[dict], block: str, tokens: Sequence[int]) -> int:
    """How many of the prompt's `tokens` every call of this tool shares, so that ArgumentPrefixes can keep them: the
    chat template up to the end of the tool's block when the last user turn starts with it (no history window), else
    up to the start of that turn (the system prompt, shared by every tool). Found as the common prefix of the prompt
    and that text tokenized alone, so a token that spans the boundary (`)` and the newlines after it) is left to the
    rest."""
    rendered = model.apply_chat_template(messages)
    user = messages[-1]["content"]
    at = rendered.rfind(user)
    if at < 0:
        return 0
    end = at + len(block) if user.startswith(block) else at
    head = model.tokenize(rendered[:end], add_special=True, parse_special=True)
    return common_prefix(head, tokens)


class ArgumentPrefixes:
    """The prompt prefix a call shares with every call of its tool (tool_prefix_tokens: the system prompt and, for a
    call without history, the tool's block) kept as a llama.cpp sequence state: the last `memory_items` in memory
    and, with a `PrefixStore`, on disk, so that a call decodes only the rest. A restored state is a byte copy of a
    decode of the same tokens at the same positions, so the answer is the one decoding them gives. One object per
    LlamaContext user (the Router keeps one); states are keyed by the model, the V-cache layout and the prefix's
    token ids."""

    def __init__(self, store: Any = None, memory_items: int = 16):
        from collections import OrderedDict

        self.store = store
        self.memory_items = int(memory_items)
        self._memory: "OrderedDict[str, bytes]" = OrderedDict()  # key -> state, least recently used first
        self.memory_hits = self.disk_hits = self.decoded = 0

    def _remember(self, key: str, blob: bytes) -> None:
        self._memory[key] = blob
        self._memory.move_to_end(key)
        while len(self._memory) > self.memory_items:
            self._memory.popitem(last=False)

    def prepare(self, ctx: Any, tokens: Sequence[int], n_prefix: int, seq_id: int = 0, warm: int = 0) -> int:
        """Make `seq_id` hold tokens[:n_prefix] at positions 0.. (restored, or decoded from position `warm`, which the
        sequence already holds, and then kept). Returns n_prefix, the position generation starts from."""
        from ..prefix_store import PrefixStore

        key = PrefixStore.key(ctx, "arguments\x00" + ",".join(map(str, tokens[:n_prefix])))
        blob, from_disk = self._memory.get(key), False
        if blob is None and self.store is not None:
            stored = self.store.get(key)
            blob, from_disk = (stored[0] if stored is not None else None), True
        if blob is not None:
            if ctx.try_state_seq_set(blob, seq_id) and ctx.seq_pos_max(seq_id) == n_prefix - 1:
                if from_disk:
                    self.disk_hits += 1
                else:
                    self.memory_hits += 1
                self._remember(key, blob)
                return n_prefix
            self._memory.pop(key, None)  # refused: decoded again below
            if self.store is not None:
                self.store.discard(key)
            warm = 0  # the attempt emptied the sequence
        start = min(warm, n_prefix)
        ctx.seq_rm(seq_id, start, -1)
        if start < n_prefix:
            ctx.decode(tokens[start:n_prefix], start, seq_id)
        blob = ctx.state_seq_get(seq_id)
        self.decoded += 1
        self._remember(key, blob)
        if self.store is not None:
            import numpy as np

            self.store.put(key, (blob, np.zeros(0, dtype=np.float16), n_prefix))
        return n_prefix


# ------------------------------------------------------------------------------------------------ post-processing

def _norm_text(text: str) -> str:
    return " ".join(text.lower().split())


def _words(name: str) -> list[str]:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return [w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if len(w) >= 3]


# abbreviations APIs use for words requests write out (enum members `DESC`, `prev`, fields `min_date`, `dir`)
_ABBREVIATIONS = {
    "asc": ("ascending",), "desc": ("descending",), "prev": ("previous",), "min": ("minimum",), "max": ("maximum",),
    "dir": ("directory",), "repo": ("repository",), "env": ("environment",), "config": ("configuration",),
    "info": ("information",), "auth": ("authentication", "authorization"), "msg": ("message",),
}


_SUFFIXES = frozenset({"s", "es", "d", "ed", "ing", "ly", "er", "ers"})


def _related(a: str, b: str) -> bool:
    """Two lower-case words share a stem: equal, one contains the other (both ≥ 5 letters), a common first five
    letters ("updated"/"update", "cycling"/"bicycling", "participating"/"participants"), a word of four letters
    and its inflection ("week"/"weekly"), or a common abbreviation and its word ("desc"/"descending",
    _ABBREVIATIONS)."""
    if a == b:
        return True
    if b in _ABBREVIATIONS.get(a, ()) or a in _ABBREVIATIONS.get(b, ()):
        return True
    short, long_ = sorted((a, b), key=len)
    if len(short) >= 4 and long_.startswith(short) and long_[len(short):] in _SUFFIXES:
        return True  # an inflection of a short word: "week"/"weekly", "open"/"opened"
    if len(a) < 5 or len(b) < 5:
        return False
    return a in b or b in a or a[:5] == b[:5]


def _words_backed(text: str, context: str, topic: Sequence[str] = ()) -> bool:
    """Is one of the words of `text` (split at _, -, camelCase) written in `context` (three letters) or sharing a
    stem with a word of it (four or more, `_related`)? Words of the tool's own name (`topic`) back nothing."""
    ctx_words = set(re.findall(r"[a-z0-9]+", context))
    words = [w for w in _words(text) if not any(_related(w, t) for t in topic)]
    # three-letter words ("vix" of market_volatility_vix) only as written, longer ones by stem
    return any(w in ctx_words for w in words if len(w) == 3) or any(
        _related(w, c) for w in words if len(w) >= 4 or w in _ABBREVIATIONS for c in ctx_words if len(c) >= 4)


def enum_supported(value: str, context: str, topic: Sequence[str] = ()) -> bool:
    """An enum member the model chose is backed by the request when one of its words is (`_words_backed`):
    "cycling" backs "bicycling", "directly participating" backs "only_participating". The members are the schema's
    own words, so a stem match is evidence the request asked for it; an exact-string check would drop every
    paraphrased choice. Words of the tool's own name (`topic`) back nothing: "notifications" in a request to
    list_notifications says nothing about "include_read_notifications"."""
    return _words_backed(value, context, topic)


_NUMBER_WORDS = {n: w for n, w in enumerate("""zero one two three four five six seven eight nine ten eleven twelve
thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty""".split()) if n >= 2}


def supported(value: Any, context: str, name: str = "", enum: Sequence[Any] | None = None,
              topic: Sequence[str] = ()) -> bool:
    """Is an optional field's value backed by the request/history text (`context`, already normalized)? `enum`: the
    field's allowed values, when the schema lists them (a member is then also backed by a stem match, `topic`: the
    tool name's words, which back no member)."""
    if value is None:
        return False
    if enum and isinstance(value, str) and value in enum and enum_supported(value, context, topic):
        return True
    if isinstance(value, bool):
        # a word of the field's name, or a word sharing its stem ("autostart" / "start it automatically")
        return any(w in context for w in _words(name)) or _words_backed(name, context, topic)
    if isinstance(value, (int, float)):
        num = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        if re.search(rf"(?<![0-9.]){re.escape(num)}(?![0-9])", context) is not None:
            return True
        # "go two levels deep" backs depth 2 ("one" is left out: "this one", "the top one" back no number)
        word = _NUMBER_WORDS.get(value) if float(value).is_integer() else None
        return word is not None and re.search(rf"(?<![a-z]){word}(?![a-z])", context) is not None
    if isinstance(value, str):
        v = _norm_text(value)
        # whole-word match: "it" must not count as backed by "titled"
        return bool(v) and re.search(rf"(?<![a-z0-9]){re.escape(v)}(?![a-z0-9])", context) is not None
    if isinstance(value, list):  # every element, members of the items' enum as members
        return bool(value) and all(supported(x, context, name, enum, topic) for x in value)
    if isinstance(value, dict):
        return any(supported(v, context, str(k)) for k, v in value.items())
    return False


# words too common in parameter descriptions to say what a flag is about (and the operations every request names)
_DESCRIPTION_STOPWORDS = frozenset("""whether should default defaults which value values specified specify optional
return returns returned include included including instead using given other these those there their about after
before where while false true enable enabled disable disabled option options parameter field results result
change changes update updates create creates delete deletes remove removes modify modifies
from with that this into than then when each only will your have been also more most over such them they what
true none some make used uses like just""".split())


def described(description: Any, context: str, topic: Sequence[str] = ()) -> bool:
    """Does the request use a word of the flag's own description (first sentence; four-letter words as written,
    longer ones by a stem shared as in `_related`; the tool name's words and common description words aside)?
    "just show me the diff" backs `dryRun` ("Preview changes using git-style diff format"): a flag is often asked
    for by what it does, not by its name. Used for a flag set away from its declared default only (the default changes nothing)."""
    if not isinstance(description, str) or not description.strip():
        return False
    first = re.split(r"(?<=[.!?])\s", description.strip(), maxsplit=1)[0].lower()
    words = {w for w in re.findall(r"[a-z]+", first) if len(w) >= 4 and w not in _DESCRIPTION_STOPWORDS
             and not any(_related(w, t) for t in topic)}
    # words of the prose only: a URL or path ("whatsnew/3.13.html") says nothing about a flag
    prose = " ".join(t for t in context.split() if not re.search(r"[/\\]|\.\w", t))
    ctx_words = {c for c in re.findall(r"[a-z]+", prose) if len(c) >= 4}
    # four-letter words only as written ("diff"), longer ones by stem
    return any(w == c or (len(w) >= 5 and len(c) >= 5 and _related(w, c)) for w in words for c in ctx_words)


def _members(schema: Any, value: Any) -> list | None:
    """The enum a value's members come from: the field's own, its items' for an array, or that of the `anyOf` branch
    of the value's kind (`anyOf: [{type: array, items: {enum}}, {type: null}]` as Pydantic writes optional lists)."""
    if not isinstance(schema, dict):
        return None
    if isinstance(schema.get("enum"), list):
        return schema["enum"]
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, dict) and isinstance(items.get("enum"), list):
        return items["enum"]
    for branch in schema.get("anyOf") or []:
        found = _members(branch, value) if isinstance(branch, dict) else None
        if found is not None:
            return found
    return None


def _prune(args: dict, schema: Any, ctx: str, prefix: str, dropped: list[str], topic: Sequence[str] = ()) -> dict:
    schema = schema if isinstance(schema, dict) else {}
    req = schema.get("required", [])
    req = set(req) if isinstance(req, list) else set()
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    out = {}
    for k, v in args.items():
        sub = props.get(k)
        if isinstance(v, dict) and isinstance(sub, dict) and isinstance(sub.get("properties"), dict):
            v = _prune(v, sub, ctx, f"{prefix}{k}.", dropped, topic)  # nested object: its optional keys too
            if not v and k not in req:
                dropped.append(prefix + k)
                continue
        enum = _members(sub, v)
        if k in req or supported(v, ctx, k, enum, topic) or unit_backed(v, k, sub, ctx) or (
                isinstance(v, bool) and isinstance(sub, dict) and v is not sub.get("default")
                and described(sub.get("description"), ctx, topic)):
            out[k] = v
        else:
            dropped.append(prefix + k)
    return out


def drop_unsupported(args: dict, spec: ToolSpec, context: str) -> tuple[dict, list[str]]:
    """Remove optional fields (also inside nested objects) whose value the context does not support.
    Required fields are always kept. Returns (args, dropped field paths)."""
    dropped: list[str] = []
    out = _prune(args, spec.schema, _norm_text(context), "", dropped, _words(spec.name))
    return out, dropped


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def clamp_numbers(value: Any, schema: Any, path: str = "", clamped: list[str] | None = None) -> Any:
    """Numbers outside their schema's minimum/maximum moved onto the bound (integers past an exclusive bound to the
    nearest integer inside). The grammar fixes a number's type but cannot express ranges; a small model writes
    "percent": 100 for a 0..1 field. Walks object properties and array items of the normalized schema."""
    clamped = [] if clamped is None else clamped
    if not isinstance(schema, dict):
        return value
    if isinstance(value, dict) and isinstance(schema.get("properties"), dict):
        props = schema["properties"]
        return {k: clamp_numbers(v, props.get(k), f"{path}{k}.", clamped) if k in props else v for k, v in value.items()}
    if isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [clamp_numbers(v, schema["items"], f"{path.rstrip('.')}[].", clamped) for v in value]
    if not _is_num(value):
        return value
    integer = schema.get("type") == "integer" or (isinstance(schema.get("type"), list) and "number" not in schema["type"])
    new = value
    hi, lo = schema.get("maximum"), schema.get("minimum")
    xhi, xlo = schema.get("exclusiveMaximum"), schema.get("exclusiveMinimum")
    if _is_num(hi) and new > hi:
        new = hi
    if _is_num(xhi) and new >= xhi and integer:
        new = math.ceil(xhi) - 1
    if _is_num(lo) and new < lo:
        new = lo
    if _is_num(xlo) and new <= xlo and integer:
        new = math.floor(xlo) + 1
    if integer and isinstance(new, float) and new.is_integer():
        new = int(new)
    if new != value:
        clamped.append(f"{path.rstrip('.')}: {value} -> {new}")
    return new


_PATH_CHARS = r"\w./~-"


def _strings(value: Any) -> set[str]:
    if isinstance(value, dict):
        return set().union(*(_strings(v) for v in value.values())) if value else set()
    if isinstance(value, list):
        return set().union(*(_strings(v) for v in value)) if value else set()
    return {value} if isinstance(value, str) else set()


def _fix_strings(value: Any, fix: Callable[[str, dict, str], str], schema: Any = None, path: str = "") -> Any:
    """`value` with every string leaf replaced by fix(string, its schema, its path "a.b[].c"), walking objects by
    `properties` and arrays by `items` of the schema alongside."""
    schema = schema if isinstance(schema, dict) else {}
    if isinstance(value, dict):
        props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
        return {k: _fix_strings(v, fix, props.get(k), f"{path}{k}.") for k, v in value.items()}
    if isinstance(value, list):
        return [_fix_strings(v, fix, schema.get("items"), f"{path.rstrip('.')}[].") for v in value]
    return fix(value, schema, path.rstrip(".")) if isinstance(value, str) else value


def restore_path_prefixes(value: Any, context: str, path: str = "", restored: list[str] | None = None) -> Any:
    """Strings copied from a path in the request but cut short get the rest back, when the request holds exactly
    one such path (as a whole token) and not the string on its own. Qwen2.5-0.5B drops a leading "/", "~/" or "./"
    ("home/ana/blog" for "/home/ana/blog") and, in multi-segment paths, leading directories ("ledger/x.go" for
    "src/ledger/x.go"). A single segment only gets "/", "~/" or "./" back (the name of a file or repository in a
    longer path is often meant alone), and a cut is kept when the part cut off is another argument's value
    (`repo_path` "/srv/blog" with `file` "posts/a.md" from "/srv/blog/posts/a.md"). A host is never a prefix
    ("github.com/acme/api" does not make "acme/api" a URL)."""
    restored = [] if restored is None else restored
    others = {s.rstrip("/") for s in _strings(value)}

    def fix(text: str, _schema: dict, where: str) -> str:
        if len(text) < 2 or text[0] in "/~.":
            return text
        body = re.escape(text) + rf"(?![{_PATH_CHARS}])"
        if re.search(rf"(?<![{_PATH_CHARS}]){body}", context):
            return text  # the request has it as written
        # a root ("/", "~/", "./") and/or leading directories; directories only in front of a multi-segment path
        dirs = r"(?:[\w-][\w.-]*/)*" if "/" in text else ""
        prefixes = {m.group(1) for m in re.finditer(rf"(?<![:{_PATH_CHARS}])((?:~/|\./|/)?{dirs}){body}", context)
                    if m.group(1)}
        prefixes = {pre for pre in prefixes if "." not in pre.lstrip("~./").split("/")[0]}  # no host as a directory
        if len(prefixes) != 1:
            return text
        prefix = prefixes.pop()
        if prefix.rstrip("/") in others or prefix.rstrip("/").lstrip("~./") in others:
            return text  # the head is an argument of its own: the cut is the point
        restored.append(f"{where}: {text!r} -> {prefix + text!r}")
        return prefix + text

    return _fix_strings(value, fix, None, path)


def restore_spacing(value: Any, context: str, schema: Any = None, path: str = "",
                    restored: list[str] | None = None) -> Any:
    """A string that is in the request but for its spacing takes the request's spacing: Qwen2.5-0.5B wrote
    `fill="#e63946" />` for `fill="#e63946"/>` when copying markup (its tokens carry their own spaces). Only strings of
    8 characters or more, outside enums, when the request holds exactly one such stretch with no more whitespace."""
    restored = [] if restored is None else restored
    kept = [i for i, ch in enumerate(context) if not ch.isspace()]  # the request without its whitespace, mapped back
    squeezed = "".join(context[i] for i in kept)

    def fix(text: str, field_schema: dict, where: str) -> str:
        if len(text) < 8 or text in context or _members(field_schema, text) is not None:
            return text
        bare = "".join(text.split())
        if len(bare) < 6:
            return text
        found = set()
        start = squeezed.find(bare)
        while start >= 0:
            found.add(context[kept[start]:kept[start + len(bare) - 1] + 1])
            start = squeezed.find(bare, start + 1)
        if len(found) != 1:
            return text
        new = found.pop()
        if sum(ch.isspace() for ch in new) > sum(ch.isspace() for ch in text):
            return text  # only spaces the model added go: a joined "iframe#id" may be the selector it meant
        restored.append(f"{where}: spacing as in the request")
        return new

    return _fix_strings(value, fix, schema, path)


_CLAUSE_BREAKS = (" -- ", " — ", " - ", "; ", ". ", ", ")


def _value_text(v: Any) -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, (int, float)):
        return str(int(v)) if float(v).is_integer() else str(v)
    return v if isinstance(v, str) and len(v) >= 2 else None


def cut_swallowed_values(args: dict, schema: Any, query: str, fixed: list[str] | None = None) -> dict:
    """A top-level string copied from the request that runs on to the request's end and takes in the words another
    argument was filled from ("best hiking trails near Asheville - just 5 results, and put safesearch on strict"
    beside count 5 and safeSearch strict) is cut at the last clause break before them: Qwen2.5-0.5B keeps copying
    past the end of a value. Only when such a break exists and what is left has three characters or more."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    q = " ".join(str(query).split())
    q_low = q.lower().rstrip(" .!?")
    out = dict(args)
    for k, v in args.items():
        if not isinstance(v, str) or len(v) < 20 or _members(props.get(k), v) is not None:
            continue
        v_low = " ".join(v.split()).lower().rstrip(" .!?")
        if not q_low.endswith(v_low):
            continue  # not a copy running to the request's end
        others = [t.lower() for o, w in args.items() if o != k for t in [_value_text(w)] if t]
        hits = [m.start() for t in others
                for m in re.finditer(rf"(?<![a-z0-9]){re.escape(t)}(?![a-z0-9])", v.lower())]
        if not hits:
            continue
        first = min(hits)
        cut = max((v.rfind(b, 0, first) for b in _CLAUSE_BREAKS), default=-1)
        head = v[:cut].strip() if cut > 0 else ""
        if len(head) >= 3:
            out[k] = head
            if fixed is not None:
                fixed.append(f"{k}: cut before the words of another argument")
    return out


def complete_ids(value: Any, context: str, path: str = "", restored: list[str] | None = None) -> Any:
    """An id-like string (letters and digits, 5+ characters) that is not a word of the request but ends exactly one
    word of it gets that word back: Qwen2.5-0.5B wrote `7QX2M4LP` for the knowledge base `KB7QX2M4LP`."""
    restored = [] if restored is None else restored
    words = set(re.findall(r"[\w-]+", context))

    def fix(text: str, _schema: dict, where: str) -> str:
        if (len(text) < 5 or text in words or not re.fullmatch(r"[\w-]+", text)
                or not re.search(r"\d", text) or not re.search(r"[A-Za-z]", text)):
            return text
        longer = {w for w in words if w.endswith(text) and len(w) > len(text)}
        if len(longer) != 1:
            return text
        new = longer.pop()
        restored.append(f"{where}: {text!r} -> {new!r}")
        return new

    return _fix_strings(value, fix, None, path)


_REF_CHARS = r"A-Za-z0-9_.-"


def repository_refs(context: str) -> list[tuple[str, str]]:
    """Every `owner/name` written in the text, as (owner, name): "acme/api", "github.com/acme/api" (the host is not
    an owner), "acme/api#58" and ".../acme/api/pull/512" (the first two path segments after the host)."""
    refs = []
    context = re.sub(r"\b[a-z][a-z0-9+.-]*://", " ", context)  # a URL's scheme: its host starts a reference
    for m in re.finditer(rf"(?<![{_REF_CHARS}/])([{_REF_CHARS}]+(?:/[{_REF_CHARS}]+)+)", context):
        parts = m.group(1).split("/")
        if "." in parts[0] and len(parts) >= 3:  # a host: github.com/acme/api/...
            parts = parts[1:]
        owner, name = parts[0].strip(".-"), parts[1].strip(".-")
        if owner and name and not owner.isdigit():
            refs.append((owner, name))
    return refs


def split_repository(args: dict, schema: Any, context: str, fixed: list[str] | None = None) -> dict:
    """A tool with both `owner` and `repo` parameters, a request naming the repository as `owner/name`: Qwen2.5-0.5B
    often repeats the owner as the repo ("kestrel-labs/kestrel" -> repo "kestrel-labs"), takes a neighbouring path
    ("facebook/react ... packages/react-dom" -> repo "react-dom"), or puts "owner/name" whole into owner. When the
    request names exactly one repository of the chosen owner, repo is set to it (and a whole "owner/name" in owner is
    split). When the owner is a URL's host (or the repo is the one reference's owner) and the request names exactly
    one repository, both are set from it. Several repositories of that owner in the request leave the answer alone."""
    fixed = [] if fixed is None else fixed
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or "owner" not in props or "repo" not in props:
        return args
    owner, repo = args.get("owner"), args.get("repo")
    if not isinstance(owner, str) or not owner:
        return args
    refs = repository_refs(context)
    if "/" in owner:
        head, _, tail = owner.partition("/")
        if (head, tail) in refs and (repo is None or repo in (owner, head)):
            fixed.append(f"owner/repo: {owner!r} -> {head!r} / {tail!r}")
            return {**args, "owner": head, "repo": tail}
        return args
    names = {name for o, name in refs if o.lower() == owner.lower()}
    if not names and len(set(refs)) == 1 and ("." in owner or repo == refs[0][0]):
        # a URL's host taken for the owner ("github.com/grafana/loki" -> owner "github.com", repo "grafana")
        head, tail = refs[0]
        if owner.lower() in context.lower():
            fixed.append(f"owner/repo: {owner!r} / {repo!r} -> {head!r} / {tail!r} (the request's {head}/{tail})")
            return {**args, "owner": head, "repo": tail}
    if len(names) != 1 or not isinstance(repo, (str, type(None))):
        return args
    name = names.pop()
    if repo == name:
        return args
    fixed.append(f"repo: {repo!r} -> {name!r} (the request's {owner}/{name})")
    return {**args, "repo": name}


# Units a number may be written in, per dimension, with their size in the dimension's base unit.
_UNITS = {
    "time": {"ms": 0.001, "millis": 0.001, "millisecond": 0.001, "milliseconds": 0.001, "s": 1, "sec": 1, "secs": 1, "second": 1,
             "seconds": 1, "min": 60, "mins": 60, "minute": 60, "minutes": 60, "h": 3600, "hr": 3600, "hrs": 3600,
             "hour": 3600, "hours": 3600, "d": 86400, "day": 86400, "days": 86400, "week": 604800,
             "weeks": 604800},
    "length": {"m": 1, "meter": 1, "meters": 1, "metre": 1, "metres": 1, "km": 1000, "kilometer": 1000,
               "kilometers": 1000, "kilometre": 1000, "kilometres": 1000, "mi": 1609.344, "mile": 1609.344,
               "miles": 1609.344},
}
# How a field states its unit: the last word of its name (lookbackSeconds, timeout_ms, radius_km; not "min", which
# in a name means minimum, nor single letters) or its description ("in meters", "(seconds)").
_FIELD_UNIT_SUFFIXES = {"milliseconds", "millis", "ms", "seconds", "secs", "sec", "minutes", "mins", "hours", "days",
                        "meters", "metres", "km"}


_DESC_UNIT = re.compile(r"\bin\s+(milliseconds|seconds|minutes|hours|days|meters|metres|kilometers|kilometres|miles)\b"
                        r"|\((milliseconds|seconds|minutes|hours|days|meters|metres|ms|km)\)")


def field_unit(name: str, schema: Any) -> tuple[str, float] | None:
    """(dimension, size in base units) a numeric field is expressed in, when its name or description says so."""
    words = name_words(name)
    if words and words[-1] in _FIELD_UNIT_SUFFIXES:
        return _unit(words[-1])
    desc = str(schema.get("description", "")).lower() if isinstance(schema, dict) else ""
    found = {_unit(m.group(1) or m.group(2)) for m in _DESC_UNIT.finditer(desc)}
    found.discard(None)
    return found.pop() if len(found) == 1 else None


def _unit(word: str | None) -> tuple[str, float] | None:
    if not word:
        return None
    for dim, table in _UNITS.items():
        if word in table:
            return dim, table[word]
    return None


def unit_backed(value: Any, name: str, schema: Any, context: str) -> bool:
    """A number the request writes in another unit of the field's dimension: radius 1000 (the field in meters) is
    backed by "within 1 km", timeout 120 (seconds) by "two minutes" only through its digits ("2 minutes")."""
    if not _is_num(value):
        return False
    unit = field_unit(name, schema)
    if unit is None:
        return False
    for number, word in _quantities(context):
        written = _unit(word)
        if written is not None and written[0] == unit[0] and written[1] != unit[1]:
            if abs(float(number) * written[1] / unit[1] - float(value)) <= 1e-9 * max(1.0, abs(float(value))):
                return True
    return False


# a number of the request (not part of a longer one, such as a version "1.2.3") and the word right after it
_QUANTITY = re.compile(r"(?<![0-9.])([0-9]+(?:\.[0-9]+)?)(?!\.?[0-9])\s*([a-z]+)?")


def _quantities(context: str) -> list[tuple[str, str | None]]:
    """(number as written, the word after it or None) for every number of the text, lower-cased."""
    return [(m.group(1), m.group(2)) for m in _QUANTITY.finditer(context.lower())]


def convert_units(args: dict, schema: Any, context: str, converted: list[str] | None = None) -> dict:
    """A number copied from the request with its unit left behind: "over the last 10 minutes" -> lookbackSeconds 10,
    "within 1.5 km" -> radius (in meters) 1.5. When the field states its unit (name suffix or description), the value
    equals a number the request writes with another unit of the same dimension, and the request writes that number
    only once, the value is converted (10 minutes -> 600 seconds). Top-level numeric fields only."""
    converted = [] if converted is None else converted
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return args
    out = dict(args)
    for k, v in args.items():
        if not _is_num(v) or k not in props:
            continue
        unit = field_unit(k, props[k])
        if unit is None:
            continue
        num = str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)
        hits = [word for number, word in _quantities(context) if number == num]
        if len(hits) != 1:
            continue
        written = _unit(hits[0])
        if written is None or written[0] != unit[0] or written[1] == unit[1]:
            continue
        new = v * written[1] / unit[1]
        sub = props[k] if isinstance(props[k], dict) else {}
        if abs(new - round(new)) <= 1e-9:
            new = int(round(new))
        elif sub.get("type") == "integer" or isinstance(v, int):
            continue
        out[k] = new
        converted.append(f"{k}: {v} {hits[0]} -> {new}")
    return out


# ------------------------------------------------------------------------------------------------ generation

_CONTEXTS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()
_WARM: "weakref.WeakKeyDictionary[Any, tuple[list[int], int]]" = weakref.WeakKeyDictionary()


def _context_for(llm: Any):
    """A LlamaContext for `llm` (a LlamaContext is used as is; a LlamaModel gets one 2048-cell context, kept)."""
    if hasattr(llm, "generate") and hasattr(llm, "model"):
        return llm
    if hasattr(llm, "chat_tokens"):
        ctx = _CONTEXTS.get(llm)
        if ctx is None:
            from ..adapters.llama import LlamaContext

            ctx = LlamaContext(llm, n_ctx=2048, n_batch=512, n_seq_max=1)
            _CONTEXTS[llm] = ctx
        return ctx
    raise NexusError(f"generate_arguments needs a LlamaContext or LlamaModel, got {type(llm).__name__}")


_NEUTRAL_TOKENS: "weakref.WeakKeyDictionary[Any, frozenset[int]]" = weakref.WeakKeyDictionary()


def _neutral_tokens(model: Any) -> frozenset[int]:
    """Token ids whose text holds no letter (JSON punctuation, quotes, digits, spaces, control tokens): the copy bias
    lifts them with the request's own tokens, so closing a string, a number or an object is not made less likely."""
    got = _NEUTRAL_TOKENS.get(model)
    if got is None:
        ids = set()
        for t in range(int(model.n_vocab)):
            piece = model.token_to_piece(t).decode("utf-8", errors="ignore")
            if model.is_eog(t) or (piece and not any(ch.isalpha() for ch in piece)):
                ids.add(t)
        got = _NEUTRAL_TOKENS[model] = frozenset(ids)
    return got


def _property_names(schema: Any) -> set[str]:
    """Every property name of a (normalized) schema, nested ones and those of array items and anyOf branches too."""
    names: set[str] = set()
    stack = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                names.update(str(k) for k in props)
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return names


def copy_bias(model: Any, context: str, bias: float = COPY_BIAS, keys: Sequence[str] = ()) -> dict[int, float]:
    """Logit bias toward the text the arguments come from: +bias on every token of the request + history window
    (each word also tokenized alone and after a space, the forms it takes at the start or inside a JSON string)
    and on the neutral tokens; every other word piece is left as is, so a word written nowhere in the conversation
    costs `bias` nats against one that is. A 0.5B model otherwise fills a value from its priors or the schema's
    examples ("\u5317\u4eac" for the quarter "Q1" of a chart, "fireworks" for "wildfire")."""
    if not bias:
        return {}
    ids = set(model.tokenize(context, parse_special=False))
    words = set(re.findall(r"\S+", context)) | set(re.findall(r"[^\W_]+", context))
    # a value may differ from the request in case only ("hit enter" -> key "Enter", "euros" -> "EUR")
    words |= {w.lower() for w in words} | {w.upper() for w in words} | {w.capitalize() for w in words}
    for word in words:
        ids.update(model.tokenize(word, parse_special=False))
        ids.update(model.tokenize(" " + word, parse_special=False))
    # the tool's own keys and JSON's literals are lifted too: writing a field the request asks for, or a flag, must
    # not lose against closing the object
    for word in [*keys, "true", "false", "null"]:
        for form in (word, f'"{word}"', f' "{word}"', f'"{word}":'):
            ids.update(model.tokenize(form, parse_special=False))
    ids |= _neutral_tokens(model)
    return {t: float(bias) for t in ids}


def _forced_answer(ctx: Any, spec: ToolSpec, schema: dict, tokens: Sequence[int], source_chars: int,
                   max_tokens: int, seq_id: int, lift: dict) -> tuple[dict | None, float]:
    """A second greedy answer over the same prompt under the grammar of `schema` (a variant of the tool's own):
    (the answer, or None when the grammar cannot be built or the output is not an object; milliseconds spent).
    The prompt's cells are still in the cache, so only its last token is decoded again."""
    try:
        gbnf, _ = grammar_of(spec.name, schema)
    except NexusError:
        return None, 0.0
    res = ctx.generate(tokens[-1:], max_tokens=max_tokens, seq_id=seq_id, start_pos=len(tokens) - 1,
                       grammar=with_string_limit(gbnf, max(STRING_MIN_BOUND, source_chars + 16)), temperature=0.0,
                       logit_bias=lift)
    try:
        answer = json.loads(res.text)
    except ValueError:
        return None, res.t_total_ms
    return (answer if isinstance(answer, dict) else None), res.t_total_ms


def _stated_keys_pass(ctx: Any, spec: ToolSpec, args: dict, tokens: Sequence[int], source: str, source_chars: int,
                      max_tokens: int, seq_id: int, lift: dict) -> dict:
    """The values of the optional fields the first answer left out although the request states them
    (stated_optional_keys), from a second pass whose grammar makes them required; the first answer's other values
    are kept. {} when there is none; else {key: value, ..., "_ms": time}. The values still go through the drop of
    unsupported fields like any other."""
    keys = stated_optional_keys(args, spec.schema, source, _words(spec.name))
    schema = spec.input_schema
    if not keys or not isinstance(schema, dict):
        return {}
    forced = {**schema, "required": list(schema.get("required") or []) + keys}
    second, ms = _forced_answer(ctx, spec, forced, tokens, source_chars, max_tokens, seq_id, lift)
    return {**{k: second[k] for k in keys if k in (second or {})}, "_ms": ms}


def _item_backed(item: Any, context: str) -> bool:
    """Every string and number inside a list item is written in the (normalized) context; flags and nulls are free."""
    if item is None or isinstance(item, bool):
        return True
    if isinstance(item, (int, float, str)):
        return supported(item, context)
    if isinstance(item, list):
        return all(_item_backed(x, context) for x in item)
    if isinstance(item, dict):
        return bool(item) and all(_item_backed(v, context) for v in item.values())
    return False


def _leaves(item: Any) -> set[str]:
    """The strings and numbers inside a value, as JSON text (flags and nulls left out)."""
    if isinstance(item, dict):
        return set().union(*(_leaves(v) for v in item.values())) if item else set()
    if isinstance(item, list):
        return set().union(*(_leaves(v) for v in item)) if item else set()
    if item is None or isinstance(item, bool):
        return set()
    return {json.dumps(item)}


def one_item_lists(args: dict, schema: Any) -> list[str]:
    """Top-level fields whose answer is a list of one item although their schema (a plain array, no maxItems below
    two) allows more: a small model often closes a list after its first item ("Python 85, SQL 70, Docker 60" → one
    data point)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    return [k for k, v in args.items() if isinstance(v, list) and len(v) == 1 and isinstance(props.get(k), dict)
            and props[k].get("type") == "array" and int(props[k].get("maxItems", 2) or 0) >= 2]


def _longer_lists_pass(ctx: Any, spec: ToolSpec, args: dict, tokens: Sequence[int], source: str, source_chars: int,
                       max_tokens: int, seq_id: int, lift: dict) -> dict:
    """For each one-item list of the answer (one_item_lists), a second pass whose grammar asks for at least two
    items; its list replaces the answer's when it starts with the same item, and is kept up to the first item
    that brings no value of its own or is not written in the request + window (every string and number of it), so
    a list that really has one item stays as it was. {} when there is none; else {key: longer list, ..., "_ms":
    time}."""
    # only the lists the drop keeps (every required one): an optional list whose one item the request does not back
    # is dropped afterwards however long it grows (every item must be backed, and a longer list starts with that
    # item), so it costs no second pass ({"reviewers": ["it"]} beside a pull request's required fields did)
    kept, _ = drop_unsupported({k: args[k] for k in one_item_lists(args, spec.input_schema)}, spec, source)
    keys = list(kept)
    schema = spec.input_schema
    if not keys:
        return {}
    props = dict(schema["properties"])
    for k in keys:
        props[k] = {**props[k], "minItems": max(2, int(props[k].get("minItems", 0) or 0))}
    second, ms = _forced_answer(ctx, spec, {**schema, "properties": props}, tokens, source_chars, max_tokens, seq_id,
                                lift)
    out: dict = {"_ms": ms}
    context = _norm_text(source)
    for k in keys:
        longer = (second or {}).get(k)
        if not isinstance(longer, list) or not longer or longer[0] != args[k][0]:
            continue
        kept = [longer[0]]
        seen = _leaves(longer[0])
        for item in longer[1:]:
            # an item counts when it brings a value no earlier item has (not a no-op copy of the first one)
            leaves = _leaves(item)
            if not (leaves - seen) or not _item_backed(item, context):
                break
            kept.append(item)
            seen |= leaves
        if len(kept) > 1:
            out[k] = kept
    return out


def _parses(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


def _tight_grammar(spec: ToolSpec) -> str | None:
    """The fallback grammar of a tool (schema.grammar_of(tight=True)), or None when it cannot be built."""
    try:
        text, _ = grammar_of(spec.name, spec.input_schema, tight=True)
    except NexusError:
        return None
    return text


def _word_text(context: str) -> str:
    """The context as lower-case words separated by single spaces (punctuation dropped), for whole-word matching."""
    return " ".join(re.sub(r"[^a-z0-9]+", " ", context.lower()).split())


def _phrase(value: str) -> str:
    """An enum member as the words a request would write: LEE_SIN → "lee sin", pullRequest → "pull request"."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", value)
    return " ".join(w.lower() for w in re.split(r"[^A-Za-z0-9]+", spaced) if w)


def _names(phrase: str, context: str) -> bool:
    # whole words, a plural allowed ("pull requests" names pullRequest)
    return bool(phrase) and re.search(rf"(?<![a-z0-9]){re.escape(phrase)}(?:e?s)?(?![a-z0-9])", context) is not None


def named_enum_members(args: dict, schema: Any, context: str, fixed: list[str] | None = None) -> dict:
    """A top-level string enum field whose chosen member the request does not name, while it names exactly one
    other member (as words: "Lee Sin" names LEE_SIN, "jungle" names JUNGLE, "all of them" names `all`), gets that
    member. A small model under an enum grammar often takes the first or a familiar member instead of the one the
    user wrote. Nothing changes when the chosen member is named, or when none or several others are."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return args
    ctx = _word_text(context)
    out = dict(args)
    for k, v in args.items():
        sub = props.get(k)
        enum = sub.get("enum") if isinstance(sub, dict) else None
        if not isinstance(v, str) or not isinstance(enum, list) or v not in enum:
            continue
        if _names(_phrase(v), ctx):
            continue
        named = [m for m in enum if isinstance(m, str) and m != v and _names(_phrase(m), ctx)]
        if len(named) == 1:
            out[k] = named[0]
            if fixed is not None:
                fixed.append(f"{k}: {v} -> {named[0]} (named in the request)")
    return out


def stated_optional_keys(args: dict, schema: Any, context: str, topic: Sequence[str] = ()) -> list[str]:
    """Top-level optional fields the answer left out although the request names them: a string enum with exactly
    one member written in the request as words ("list closed PRs": `state`), or a non-boolean field every
    distinctive word of whose name the request writes ("assignee ids 17 and 42": `assignee_ids`, "since 2024-06-01":
    `since`). Words of the tool's own name and generic ones (name, id, type, ...) do not count. A small model
    leaves stated optional filters out (docs/arguments.md); these are the ones worth a second, forced pass."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    required = set(schema.get("required") or [])
    ctx = _word_text(context)
    ctx_words = set(ctx.split())
    # words a field of the answer already stands for ("50 per page" is perPage's, not page's)
    taken = {w for k in args for w in _words(k)}
    out = []
    for key, sub in props.items():
        if key in args or key in required or not isinstance(sub, dict):
            continue
        enum = sub.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(m, str) for m in enum):
            if sum(1 for m in enum if _names(_phrase(m), ctx)) == 1:
                out.append(key)
            continue
        if sub.get("type") == "boolean" or enum:
            continue
        words = [w for w in _words(key) if w not in _GENERIC_NAME_WORDS and not any(_related(w, t) for t in topic)]
        if words and not set(words) <= taken and all(
                w in ctx_words if len(w) == 3 else any(_related(w, c) for c in ctx_words if len(c) >= 4)
                for w in words):
            out.append(key)
    # of two stated fields the more specific one: "per page" names perPage, not page as well
    return [k for k in out if not any(set(_words(k)) < set(_words(o)) for o in out)]


# fields whose value is prose: a word of the field's name inside it is part of what the user wrote
_PROSE_FIELDS = frozenset("""query q text body message content description title prompt comment note notes summary
search keyword keywords term terms question instructions""".split())
# words of a field name that do not name what the value is ("project_name": the value is a project)
_GENERIC_NAME_WORDS = frozenset({"name", "id", "ids", "key", "value", "type", "string", "str", "ref"})


def strip_field_word(args: dict, schema: Any, context: str, fixed: list[str] | None = None) -> dict:
    """A short top-level string value that took in the word naming its own field, as the request wrote it ("search
    the work project" -> project "work project", "the staging namespace" -> namespace "staging namespace"), loses
    that word: the user named the field, not a value with that word in it. Only when the request writes the rest
    followed by that word, the value has two to four words, and the field is not prose (query, title, message)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    props = props if isinstance(props, dict) else {}
    ctx = " ".join(context.lower().split())
    out = dict(args)
    for k, v in args.items():
        field_words = name_words(k)
        words = [w for w in field_words if w not in _GENERIC_NAME_WORDS]
        if not isinstance(v, str) or not words or any(w in _PROSE_FIELDS for w in field_words):
            continue
        if _members(props.get(k), v) is not None:
            continue
        parts = v.split()
        last = parts[-1].lower() if parts else ""
        if not 2 <= len(parts) <= 4 or not any(last in (w, w + "s") for w in words):
            continue
        head = " ".join(parts[:-1])
        if re.search(rf"(?<![a-z0-9]){re.escape(head.lower())}\s+{re.escape(last)}(?![a-z0-9])", ctx):
            out[k] = head
            if fixed is not None:
                fixed.append(f"{k}: {v!r} -> {head!r} (the field's own word cut)")
    return out


def source_text(query: str, window: Sequence[dict]) -> str:
    """The text argument values may come from: the request and the history window the prompt shows."""
    return " ".join([str(query)] + [m["content"] for m in window])


def post_process_arguments(args: dict, spec: ToolSpec, query: str, window: Sequence[dict]) -> tuple[dict, list[str]]:
    """The drop of unsupported optional fields, then the repairs, against the request + history window the prompt
    showed. Returns (args, notes): each dropped field path, then each change as "clamped/restored/repaired <what>"."""
    context = source_text(query, window)
    fixed: list[str] = []
    # an enum member the request does not name, beside exactly one it does, is replaced before the drop of
    # unsupported fields would remove it ("triggered by pushes": event check_run -> push)
    args = named_enum_members(args, spec.schema, context, fixed)
    args, notes = drop_unsupported(args, spec, context)
    clamped: list[str] = []
    args = clamp_numbers(args, spec.schema, "", clamped)
    notes += [f"clamped {c}" for c in clamped]
    restored: list[str] = []
    args = restore_path_prefixes(args, context, "", restored)
    args = restore_spacing(args, context, spec.schema, "", restored)
    args = complete_ids(args, context, "", restored)
    notes += [f"restored {r}" for r in restored]
    args = cut_swallowed_values(args, spec.schema, query, fixed)
    args = strip_field_word(args, spec.schema, context, fixed)
    args = split_repository(args, spec.schema, context, fixed)
    args = convert_units(args, spec.schema, context, fixed)
    notes += [f"repaired {r}" for r in fixed]
    return args, notes


def generate_arguments(llm: Any, spec: ToolSpec, query: str, history: Sequence[Any] | None = None,
                       max_tokens: int = DEFAULT_MAX_TOKENS, few_shot: bool = False, descriptions: bool = True,
                       post_process: bool = True, seq_id: int = 0, bias: float | None = None,
                       prefixes: ArgumentPrefixes | None = None) -> ArgsResult:
    """Arguments for `spec` from `query` (+ history) with grammar-constrained greedy decoding; see the module doc.

    prefixes: restore the tool's prompt prefix (system prompt + tool block) from there instead of decoding it, and
    keep it there when it has to be decoded (ArgumentPrefixes).

    Raises SchemaError when the tool has no grammar (its schema could not be compiled: the reason is given)."""
    if not spec.ok or not spec.grammar:
        why = "; ".join(spec.problems) or "no grammar"
        raise SchemaError(f"tool '{spec.key}' cannot be called: {why}")
    ctx = _context_for(llm)
    messages, window = build_messages(spec, query, history, few_shot=few_shot, descriptions=descriptions)
    tokens = ctx.model.chat_tokens(messages)
    if len(tokens) + max_tokens > ctx.n_ctx:
        raise NexusError(f"argument prompt needs {len(tokens) + max_tokens} cells, the context has {ctx.n_ctx}",
                         hint="shorten the history window or use a larger context")
    start = 0
    warm = _WARM.get(ctx)
    if warm is not None and warm[1] == ctx.seq_pos_max(seq_id) and seq_id == 0:
        start = common_prefix(warm[0], tokens[:-1])  # at least one token is decoded, for the logits
    if prefixes is not None:
        n_prefix = tool_prefix_tokens(ctx.model, messages, tool_block(spec, descriptions), tokens)
        if start < n_prefix:
            start = prefixes.prepare(ctx, tokens, n_prefix, seq_id, warm=start)
    # runaway guard: a string value can be at most as long as the text it could be copied from (+ slack)
    source_chars = len(str(query)) + sum(len(m["content"]) for m in window)
    gbnf = with_string_limit(spec.grammar, max(STRING_MIN_BOUND, source_chars + 16))
    source = source_text(query, window)
    bias = COPY_BIAS if bias is None else bias
    lift = copy_bias(ctx.model, source, bias, sorted(_property_names(spec.schema))) if bias else {}
    res = ctx.generate(tokens[start:], max_tokens=max_tokens, grammar=gbnf, temperature=0.0,
                       seq_id=seq_id, start_pos=start, logit_bias=lift)
    t_first, t_total = res.t_first_token_ms, res.t_total_ms
    retried = False
    if res.stop == "max_tokens" and not _parses(res.text):
        # The model looped (a long array, nested free-form objects) and ran out of tokens. Retry once over the
        # tight grammar (arrays of at most two items, free-form objects empty): a shorter answer beats no answer.
        tight = _tight_grammar(spec)
        if tight is not None:
            res = ctx.generate(tokens, max_tokens=max_tokens,
                               grammar=with_string_limit(tight, max(STRING_MIN_BOUND,
                                                                    min(source_chars + 16, TIGHT_STRING_MAX))),
                               temperature=0.0, seq_id=seq_id, start_pos=0, logit_bias=lift)
            t_total += res.t_total_ms
            retried = True
    if seq_id == 0:
        _WARM[ctx] = (list(tokens), ctx.seq_pos_max(seq_id))
    raw = res.text
    timings = {"first_token": round(t_first, 2), "total": round(t_total, 2)}
    errors: list[str] = []
    try:
        args = json.loads(raw)
    except ValueError as e:
        why = "output hit max_tokens before the JSON closed" if res.stop == "max_tokens" else f"output is not JSON: {e}"
        return ArgsResult({}, raw, False, [why], timings, len(tokens), [], "", retried)
    if not isinstance(args, dict):
        return ArgsResult({}, raw, False, ["output is not a JSON object"], timings, len(tokens), [], "", retried)
    dropped: list[str] = []
    added = _stated_keys_pass(ctx, spec, args, tokens, source, source_chars, max_tokens, seq_id, lift) \
        if post_process and STATED_KEYS_PASS else {}
    longer = _longer_lists_pass(ctx, spec, args, tokens, source, source_chars, max_tokens, seq_id, lift) \
        if post_process and LONGER_LISTS_PASS else {}
    if added or longer:
        t_total += added.pop("_ms", 0.0) + longer.pop("_ms", 0.0)
        timings["total"] = round(t_total, 2)
        args = {**args, **added, **longer}
        if seq_id == 0:
            _WARM[ctx] = (list(tokens), ctx.seq_pos_max(seq_id))
    if post_process:
        args, dropped = post_process_arguments(args, spec, query, window)
        dropped += [f"added {k} (stated in the request)" for k in added if k in args]
        dropped += [f"extended {k} to {len(v)} items" for k, v in longer.items() if k in args]
    errors = validate_arguments(spec.input_schema, args)
    return ArgsResult(args, raw, not errors, errors, timings, len(tokens), dropped,
                      messages[-1]["content"], retried)
