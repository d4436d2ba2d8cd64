"""The one argument pipeline: a tool's arguments from the local LLM, compressed signature in, grammar-constrained JSON
out, repaired and validated. `nexus route`, `nexus route --session` and `nexus serve` all call `generate_arguments`.

Prompt (chat template of the model; arguments/prompt.py): a short system instruction (copy values exactly, fill
required parameters, add an optional one only when asked, split "owner/name" repository references), then one user
turn with the pruned history window (recent turns verbatim, tool payloads as digests), the tool's signature with
short inline descriptions, and the request.

Decoding is greedy and constrained by the tool's GBNF grammar (nexus_cli.schema), so the output always parses.
An optional string the drop of unsupported fields is certain to remove is closed as soon as that is certain
(arguments/unbacked.py): the model writes its closing quote and goes on, and the rest of the value is never decoded.
String values are bounded by the length of the request + history window (a value longer than its only possible
source cannot be copied from it; this stops a small model's runaway strings). An answer that runs out of tokens
before its JSON closes, or that fails validation, is retried over tighter grammars (RETRY_GRAMMARS): first the
tool's tight grammar (arrays of at most two items, free-form objects empty, recursion cut after one level, strings
of at most 64 characters), then the required-first one (the same, over the required fields and only the optional
ones the request states). A call is bounded: each generation by max_tokens, the whole call (retries and second
passes included) by time_limit_s, of which the first answer may use FIRST_ANSWER_SHARE. A final failure comes back
with arguments None and the reasons (never an empty or partial object passed off as arguments). Optional fields the request states and the
answer left out get a second pass whose grammar requires them (stated_optional_keys), and a list closed after one
item one whose grammar asks for more (one_item_lists; new items kept only while the request writes them). The
repairs (arguments/repairs.py) then drop unsupported optional fields, clamp numbers and restore values from the
request; the result is validated with jsonschema against the ORIGINAL schema the server sent, and every violation
is reported in `ArgsResult.errors` (valid=False). The required values the request gives no trace of (the model had to
write something: a placeholder owner, an invented branch) are named in `ArgsResult.guessed` (arguments/guessed.py).

The prompt's cells: what the sequence still holds from the previous call (the longest common token prefix), and,
with an ArgumentPrefixes, the part every call of the tool shares (the system prompt, and the tool's block when
there is no history window), restored from a kept KV state instead of decoded, also in a new process (PromptCache).
"""

from __future__ import annotations

import json
import time
import weakref
from dataclasses import dataclass, field
from typing import Any, Sequence

from ..adapters.llama import LlamaContext
from ..config import DEFAULT_ARGS_TIME_LIMIT_S
from ..errors import NexusError, SchemaError
from ..schema import ToolSpec, grammar_of, validate_arguments, with_string_limit
from .cards import CardSpan, card_span
from .drafts import ArgumentDrafter
from .guessed import guessed_values
from .prefixes import ArgumentPrefixes, common_prefix, tool_prefix_tokens
from .prompt import build_messages, source_text, tool_block
from .repairs import (
    drop_unsupported,
    field_words,
    norm_text,
    one_item_lists,
    post_process_arguments,
    stated_optional_keys,
    supported,
)
from .unbacked import UnbackedStringWatch

DEFAULT_MAX_TOKENS = 256
LONGER_LISTS_PASS = True  # a second pass for a list the answer closed after one item
STATED_KEYS_PASS = True  # a second pass for optional fields the request states and the answer left out
STRING_MIN_BOUND = 48  # the smallest string bound the grammar gets (chars)
TIGHT_STRING_MAX = 64  # the string bound of the retries over the tighter grammars (chars)
FIRST_ANSWER_SHARE = 2 / 3  # of the time limit the first answer may use; the rest is kept for the retries
DRAFTING = True  # greedy decoding verifies drafted tokens in batches (arguments/drafts.py); False: one at a time
RETRY_GRAMMARS = ("tight", "required-first")  # tried in this order after a first answer that failed
# an optional string the drop is certain to remove is closed as soon as that is certain (arguments/unbacked.py);
# False writes every value to its end
CLOSE_UNBACKED = True


@dataclass
class ArgsResult:
    arguments: dict[str, Any] | None  # None when the output is not a JSON object (errors says why)
    raw: str
    valid: bool
    errors: list[str] = field(default_factory=list)
    timings_ms: dict[str, float] = field(default_factory=dict)  # first_token, total
    prompt_tokens: int = 0
    dropped: list[str] = field(default_factory=list)  # post-processing: optional fields removed, numbers clamped,
    #                                                   path prefixes restored
    prompt: str = ""
    retries: list[str] = field(default_factory=list)  # the RETRY_GRAMMARS generated after the first answer failed
    drafted: int = 0  # draft tokens verified over the call's generations (arguments/drafts.py)
    accepted: int = 0  # of those, the ones greedy decoding kept: decode steps saved
    closed: list[str] = field(default_factory=list)  # optional strings closed early (also among `dropped`)
    guessed: list[str] = field(default_factory=list)  # required values the request gives no trace of (guessed.py)


_CONTEXTS: "weakref.WeakKeyDictionary[Any, Any]" = weakref.WeakKeyDictionary()


def _context_for(llm: Any):
    """A LlamaContext for `llm` (a LlamaContext is used as is; a LlamaModel gets one 2048-cell context, kept)."""
    if hasattr(llm, "generate") and hasattr(llm, "model"):
        return llm
    if hasattr(llm, "chat_tokens"):
        ctx = _CONTEXTS.get(llm)
        if ctx is None:
            ctx = LlamaContext(llm, n_ctx=2048, n_batch=512, n_seq_max=1)
            _CONTEXTS[llm] = ctx
        return ctx
    raise NexusError(f"generate_arguments needs a LlamaContext or LlamaModel, got {type(llm).__name__}")


class PromptCache:
    """Where the cells of a call's prompt come from before it is decoded. This one: what the sequence still holds
    from the previous call on it (the longest common token prefix), and each tool's shared prefix kept by an
    ArgumentPrefixes. The serving engine brings its own (the L0 arena's slots, serving.engine). `start` makes the
    sequence hold tokens[:n] and returns n; `kept` is told that the sequence holds the prompt and the first answer's
    tokens (`generated`), or the prompt and a second pass's answer (`generated` None)."""

    _WARM: "weakref.WeakKeyDictionary[Any, tuple[list[int], int]]" = weakref.WeakKeyDictionary()

    def __init__(self, prefixes: ArgumentPrefixes | None = None):
        self.prefixes = prefixes

    cards = None  # no compiled cards here (a CardSplicer): the one-shot path keeps its exact prefix states

    def start(self, ctx: Any, tokens: Sequence[int], n_tool_prefix: int, seq_id: int,
              card: CardSpan | None = None) -> int:
        start = 0
        warm = self._WARM.get(ctx) if seq_id == 0 else None  # the Router's sequence for arguments
        if warm is not None and warm[1] == ctx.seq_pos_max(seq_id):
            start = common_prefix(warm[0], tokens[:-1])  # at least one token is decoded, for the logits
        if self.prefixes is not None and start < n_tool_prefix:
            start = self.prefixes.prepare(ctx, tokens, n_tool_prefix, seq_id, warm=start)
        return start

    def kept(self, ctx: Any, tokens: Sequence[int], generated: Sequence[int] | None, seq_id: int) -> None:
        if seq_id == 0:
            self._WARM[ctx] = (list(tokens), ctx.seq_pos_max(seq_id))


class _Generations:
    """The greedy generations of one call on one sequence, each drafted (ArgumentDrafter over the grammar's schema
    and the text values come from) when drafting is on, and with the optional strings the drop is certain to remove
    closed early (UnbackedStringWatch) when `close_spec` is the tool; counts the draft tokens verified and kept and
    the fields closed."""

    def __init__(self, ctx: Any, seq_id: int, source: str, drafting: bool, close_spec: ToolSpec | None = None):
        self.ctx, self.seq_id, self.source, self.drafting = ctx, seq_id, source, drafting
        self.close_spec = close_spec
        self.drafted = self.accepted = 0
        self.closed: list[str] = []

    def __call__(self, tokens: Sequence[int], start_pos: int, grammar: str, schema: Any, max_tokens: int,
                 deadline: float | None = None):
        draft = ArgumentDrafter(self.ctx.model, schema, self.source) if self.drafting else None
        watch = UnbackedStringWatch(self.ctx.model, self.close_spec, self.source) \
            if self.close_spec is not None else None
        res = self.ctx.generate(tokens, max_tokens=max_tokens, grammar=grammar, temperature=0.0, seq_id=self.seq_id,
                                start_pos=start_pos, deadline=deadline, draft=draft, close_string=watch or None)
        self.drafted += res.drafted
        self.accepted += res.accepted
        if watch:
            self.closed += [k for k in watch.closed if k not in self.closed]
        return res


def _forced_answer(gen: _Generations, spec: ToolSpec, schema: dict, tokens: Sequence[int], source_chars: int,
                   max_tokens: int) -> tuple[dict | None, float]:
    """A second greedy answer over the same prompt under the grammar of `schema` (a variant of the tool's own):
    (the answer, or None when the grammar cannot be built or the output is not an object; milliseconds spent).
    The prompt's cells are still in the cache, so only its last token is decoded again."""
    try:
        gbnf, _ = grammar_of(spec.name, schema)
    except NexusError:
        return None, 0.0
    res = gen(tokens[-1:], len(tokens) - 1, with_string_limit(gbnf, max(STRING_MIN_BOUND, source_chars + 16)),
              schema, max_tokens)
    try:
        answer = json.loads(res.text)
    except ValueError:
        return None, res.t_total_ms
    return (answer if isinstance(answer, dict) else None), res.t_total_ms


def _stated_keys_pass(gen: _Generations, spec: ToolSpec, args: dict, tokens: Sequence[int], source: str,
                      source_chars: int, max_tokens: int) -> dict:
    """The values of the optional fields the first answer left out although the request states them
    (stated_optional_keys), from a second pass whose grammar makes them required; the first answer's other values
    are kept. {} when there is none; else {key: value, ..., "_ms": time}. The values still go through the drop of
    unsupported fields like any other."""
    keys = stated_optional_keys(args, spec.schema, source, field_words(spec.name))
    schema = spec.input_schema
    if not keys or not isinstance(schema, dict):
        return {}
    forced = {**schema, "required": list(schema.get("required") or []) + keys}
    second, ms = _forced_answer(gen, spec, forced, tokens, source_chars, max_tokens)
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


def _longer_lists_pass(gen: _Generations, spec: ToolSpec, args: dict, tokens: Sequence[int], source: str,
                       source_chars: int, max_tokens: int) -> dict:
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
    second, ms = _forced_answer(gen, spec, {**schema, "properties": props}, tokens, source_chars, max_tokens)
    out: dict = {"_ms": ms}
    context = norm_text(source)
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


def required_first_schema(spec: ToolSpec, source: str) -> dict | None:
    """The schema of the last retry: the tool's required fields, then only the optional ones the request states
    (stated_optional_keys); None when the tool has no properties to narrow or none would be left out."""
    schema = spec.input_schema
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict) or not props:
        return None
    required = [k for k in (schema.get("required") or []) if k in props]
    stated = stated_optional_keys({}, schema, source, field_words(spec.name))
    keep = required + [k for k in stated if k not in required]
    if len(keep) == len(props):
        return None  # nothing to leave out: the tight grammar already was this one
    return {**schema, "properties": {k: props[k] for k in keep}}


def _retry_grammar(spec: ToolSpec, kind: str, source: str) -> tuple[str, dict] | None:
    """(the GBNF, its schema) of one of RETRY_GRAMMARS for this tool and request, or None when there is none."""
    schema = spec.input_schema if kind == "tight" else required_first_schema(spec, source)
    if schema is None:
        return None
    try:
        text, _ = grammar_of(spec.name, schema, tight=True)
    except NexusError:
        return None
    return text, schema


def _parsed(res: Any) -> tuple[dict | None, list[str]]:
    """(the answer as an object, []) or (None, [why not])."""
    try:
        args = json.loads(res.text)
    except ValueError as e:
        if res.stop == "max_tokens":
            return None, ["output hit max_tokens before the JSON closed"]
        if res.stop == "deadline":
            return None, ["output ran past the time limit before the JSON closed"]
        return None, [f"output is not JSON: {e}"]
    if not isinstance(args, dict):
        return None, ["output is not a JSON object"]
    return args, []


def generate_arguments(llm: Any, spec: ToolSpec, query: str, history: Sequence[Any] | None = None,
                       max_tokens: int = DEFAULT_MAX_TOKENS, descriptions: bool = True, post_process: bool = True,
                       seq_id: int = 0, prefixes: ArgumentPrefixes | None = None,
                       cache: PromptCache | None = None,
                       time_limit_s: float | None = DEFAULT_ARGS_TIME_LIMIT_S,
                       window_size: tuple[int, int] | None = None, drafting: bool | None = None,
                       close_unbacked: bool | None = None) -> ArgsResult:
    """Arguments for `spec` from `query` (+ history) with grammar-constrained greedy decoding; see the module doc.
    The one argument pipeline: `nexus route`, `nexus route --session` and `nexus serve` all call it.

    prefixes: restore the tool's prompt prefix (system prompt + tool block) from there instead of decoding it, and
    keep it there when it has to be decoded (ArgumentPrefixes). cache: where the prompt's cells come from
    (PromptCache, the default, uses `prefixes`; the serving engine passes its arena's). time_limit_s: the bound on
    the whole call (None: only max_tokens bounds it). window_size: (messages, characters) of the history window
    (prompt.build_messages; the default is the product's). drafting: verify drafted tokens in batches
    (arguments/drafts.py; False decodes one token at a time, the baseline of `nexus bench drafts`; None: DRAFTING).
    close_unbacked: close optional strings the drop would remove as soon as that is certain (arguments/unbacked.py;
    False writes them out; None: CLOSE_UNBACKED; never without post_process, which is what removes them).

    Raises SchemaError when the tool has no grammar (its schema could not be compiled: the reason is given)."""
    if not spec.ok or not spec.grammar:
        why = "; ".join(spec.problems) or "no grammar"
        raise SchemaError(f"tool '{spec.key}' cannot be called: {why}")
    t_start = time.perf_counter()
    deadline = t_start + time_limit_s if time_limit_s else None
    first_deadline = t_start + time_limit_s * FIRST_ANSWER_SHARE if time_limit_s else None
    ctx = _context_for(llm)
    cache = cache or PromptCache(prefixes)
    messages, window = build_messages(spec, query, history, descriptions=descriptions, window_size=window_size)
    block = tool_block(spec, descriptions)
    tokens = ctx.model.chat_tokens(messages)
    if len(tokens) + max_tokens > ctx.n_ctx:
        raise NexusError(f"argument prompt needs {len(tokens) + max_tokens} cells, the context has {ctx.n_ctx}",
                         hint="shorten the history window or use a larger context")
    n_tool_prefix = tool_prefix_tokens(ctx.model, messages, block, tokens) \
        if getattr(cache, "prefixes", None) is not None else 0
    # with compiled cards (the serving engine's cache has a CardSplicer) the tool block is spliced, not decoded
    card = card_span(ctx.model, messages, block, tokens) \
        if getattr(cache, "cards", None) is not None else None
    start = cache.start(ctx, tokens, n_tool_prefix, seq_id, card=card)
    # runaway guard: a string value can be at most as long as the text it could be copied from (+ slack)
    source_chars = len(str(query)) + sum(len(m["content"]) for m in window)
    gbnf = with_string_limit(spec.grammar, max(STRING_MIN_BOUND, source_chars + 16))
    source = source_text(query, window)
    closing = (CLOSE_UNBACKED if close_unbacked is None else close_unbacked) and post_process
    gen = _Generations(ctx, seq_id, source, DRAFTING if drafting is None else drafting,
                       close_spec=spec if closing else None)
    res = gen(tokens[start:], start, gbnf, spec.schema, max_tokens, deadline=first_deadline)
    cache.kept(ctx, tokens, res.tokens, seq_id)
    t_first, t_total = res.t_first_token_ms, res.t_total_ms
    raw = res.text
    dropped: list[str] = []
    args, errors = _parsed(res)
    if args is not None:
        in_time = deadline is None or time.perf_counter() < deadline  # the second passes only improve an answer
        added = _stated_keys_pass(gen, spec, args, tokens, source, source_chars, max_tokens) \
            if post_process and STATED_KEYS_PASS and in_time else {}
        longer = _longer_lists_pass(gen, spec, args, tokens, source, source_chars, max_tokens) \
            if post_process and LONGER_LISTS_PASS and in_time else {}
        if added or longer:
            t_total += added.pop("_ms", 0.0) + longer.pop("_ms", 0.0)
            args = {**args, **added, **longer}
            cache.kept(ctx, tokens, None, seq_id)  # the second passes replaced what follows the prompt
        if post_process:
            args, dropped = post_process_arguments(args, spec, query, window)
            dropped += [f"added {k} (stated in the request)" for k in added if k in args]
            dropped += [f"extended {k} to {len(v)} items" for k, v in longer.items() if k in args]
        errors = validate_arguments(spec.input_schema, args)
    retries: list[str] = []
    if errors:
        # The model looped (a long array, nested free-form objects) and ran out of tokens or time, or its answer
        # broke a rule the grammar cannot hold: retry over tighter grammars, while the time limit allows.
        # A shorter answer beats no answer.
        string_bound = max(STRING_MIN_BOUND, min(source_chars + 16, TIGHT_STRING_MAX))
        for kind in RETRY_GRAMMARS:
            if deadline is not None and time.perf_counter() >= deadline:
                errors = errors + [f"argument generation stopped at its {time_limit_s:g} s time limit"]
                break
            retry = _retry_grammar(spec, kind, source)
            if retry is None:
                continue
            tight, tight_schema = retry
            again = gen(tokens[-1:], len(tokens) - 1, with_string_limit(tight, string_bound), tight_schema,
                        max_tokens, deadline=deadline)
            cache.kept(ctx, tokens, None, seq_id)  # like a second pass: a kept slot holds the first answer
            t_total += again.t_total_ms
            retries.append(kind)
            answer, why = _parsed(again)
            if answer is None:
                continue
            kept_out: list[str] = []
            if post_process:
                answer, kept_out = post_process_arguments(answer, spec, query, window)
            if not validate_arguments(spec.input_schema, answer):
                args, errors, raw, dropped = answer, [], again.text, kept_out
                break
        else:
            if retries:
                errors = errors + [f"the retries over the {' and '.join(retries)} grammars did not give valid "
                                   "arguments either"]
    timings = {"first_token": round(t_first, 2), "total": round(t_total, 2)}
    return ArgsResult(args, raw, not errors, errors, timings, len(tokens), dropped,
                      messages[-1]["content"] if args is not None else "", retries, gen.drafted, gen.accepted,
                      gen.closed, guessed_values(args, spec, source) if not errors else [])
