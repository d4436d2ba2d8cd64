"""Repairs of a generated answer, each one measured on the development sets (docs/arguments.md).

An optional field whose value the request does not back is dropped (the model's habit of inventing them); numbers
are clamped onto their schema's bounds; path prefixes, spacing, ids and repository splits are restored from the
request; units are converted to the field's own; enum members the request names are taken. Required fields are
never dropped. `post_process_arguments` applies them in order; `stated_optional_keys` and `one_item_lists` find
what the pipeline's second passes ask the model again for.
"""

from __future__ import annotations

import math
import re
from typing import Any, Callable, Sequence

from ..schema import ToolSpec
from ..textgen import name_words
from .prompt import source_text


def norm_text(text: str) -> str:
    return " ".join(text.lower().split())


def field_words(name: str) -> list[str]:
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
    words = [w for w in field_words(text) if not any(_related(w, t) for t in topic)]
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
        return any(w in context for w in field_words(name)) or _words_backed(name, context, topic)
    if isinstance(value, (int, float)):
        num = str(int(value)) if isinstance(value, float) and value.is_integer() else str(value)
        if re.search(rf"(?<![0-9.]){re.escape(num)}(?![0-9])", context) is not None:
            return True
        # "go two levels deep" backs depth 2 ("one" is left out: "this one", "the top one" back no number)
        word = _NUMBER_WORDS.get(value) if float(value).is_integer() else None
        return word is not None and re.search(rf"(?<![a-z]){word}(?![a-z])", context) is not None
    if isinstance(value, str):
        v = norm_text(value)
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
change changes update updates create creates delete deletes remove removes modify modifies open opens opened
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


_ONE_THING = re.compile(r"(?<![a-z])(?<!this )(?<!that )(?<!the )(?<!which )(?<!each )(?<!every )(?<!any )(?<!no )"
                        r"one\s+(?!of\b|more\b|by\b|at\b|and\b|or\b|to\b|is\b|was\b)[a-z]")
_MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
           "november", "december")
_ISO_DATE = re.compile(r"(\d{4})-(\d{2})-(\d{2})(?:[T ][0-9:.]+(?:Z|[+-]\d{2}:?\d{2})?)?")
# a number and a unit word of a period code ("2y", "1wk", "6mo", "30d"): the code's letters and the words they stand for
_PERIOD_CODE = re.compile(r"(\d+)\s*([a-z]{1,3})")
_PERIOD_UNITS = {"d": ("day",), "w": ("week",), "wk": ("week",), "mo": ("month",), "m": ("month", "minute"),
                 "mth": ("month",), "y": ("year",), "yr": ("year",), "h": ("hour",), "hr": ("hour",),
                 "min": ("minute",), "s": ("second",), "sec": ("second",)}


def date_backed(value: str, context: str) -> bool:
    """An ISO date (YYYY-MM-DD, a time after it or not) the request writes in words or another order: "July 14,
    2025", "14 Jul 2025", "07/14/2025", "14.07.2025". The day and month must be written together; a year the
    request writes must be the value's. `context` is lower-case."""
    m = _ISO_DATE.fullmatch(value.strip())
    if not m:
        return False
    year, month, day = int(m.group(1)), int(m.group(2)), int(m.group(3))
    if not 1 <= month <= 12 or not 1 <= day <= 31:
        return False
    years = {int(y) for y in re.findall(r"(?<![0-9])((?:19|20)\d{2})(?![0-9])", context)}
    if years and year not in years:
        return False
    name = _MONTHS[month - 1]
    month_word = rf"(?:{name}|{name[:3]}\.?)"
    d = rf"0?{day}(?:st|nd|rd|th)?"
    spoken = rf"(?<![a-z]){month_word}\s+{d}(?![0-9])|(?<![0-9]){d}(?:\s+of)?\s+{month_word}(?![a-z])"
    numeric = rf"(?<![0-9])(?:0?{month}/0?{day}|0?{day}[./]0?{month})(?:[./](?:{year}|{year % 100:02d}))?(?![0-9])"
    return re.search(spoken, context) is not None or re.search(numeric, context) is not None


def period_backed(value: str, context: str) -> bool:
    """A period code ("2y", "1wk", "6mo") the request writes as a number and a unit word ("the last 2 years",
    "weekly" is not a count and backs nothing). `context` is lower-case."""
    m = _PERIOD_CODE.fullmatch(value.strip().lower())
    if not m or m.group(2) not in _PERIOD_UNITS:
        return False
    n, words = m.group(1), _PERIOD_UNITS[m.group(2)]
    spelled = _NUMBER_WORDS.get(int(n)) if n.isdigit() else None
    count = rf"(?:{re.escape(n)}{'|' + spelled if spelled else ''})"
    return any(re.search(rf"(?<![0-9a-z.]){count}[\s-]*{w}s?(?![a-z])", context) for w in words)


def member_described(value: str, schema: Any, context: str, tool_description: str = "") -> bool:
    """A short enum code ("P", "C", "1") the field's description, or the tool's, explains with a word the request
    writes ("'P' for puts", "Type: C=calls, P=puts" backed by "put options"): the words right after the code,
    quoted or standalone, as the request writes them or their plural."""
    desc = str(schema.get("description", "")).lower() if isinstance(schema, dict) else ""
    desc = f"{desc} {tool_description.lower()}".strip()
    code = value.strip().lower()
    if not desc or not code or len(code) > 4:
        return False
    ctx_words = set(re.findall(r"[a-z]+", context))
    for m in re.finditer(rf"(?<![a-z0-9])['\"`]?{re.escape(code)}['\"`]?(?![a-z0-9])", desc):
        after = re.findall(r"[a-z]+", desc[m.end():m.end() + 40])
        words = [w for w in after if w not in ("for", "is", "means", "or", "and", "the", "a", "an", "to")][:2]
        if any(w in ctx_words or w.rstrip("s") in ctx_words or w + "s" in ctx_words or
               any(_related(w, c) for c in ctx_words if len(c) >= 4 and len(w) >= 4) for w in words):
            return True
    return False


def normalized_backed(value: Any, schema: Any, context: str, enum: Sequence[Any] | None = None,
                      tool_description: str = "") -> bool:
    """A value the request states in another form than the one the schema wants: a date in words, a period code, an
    enum code a description explains. `context` is lower-case (norm_text)."""
    if isinstance(value, list):
        return bool(value) and all(isinstance(x, str) and normalized_backed(x, schema, context, enum, tool_description)
                                   for x in value)
    if _is_num(value) and value == 1:
        # "one kid", "one result": `supported` leaves "one" out for "this one", "the top one", "one of them"
        return _ONE_THING.search(context) is not None
    if not isinstance(value, str):
        return False
    if date_backed(value, context) or period_backed(value, context):
        return True
    return bool(enum) and value in enum and member_described(value, schema, context, tool_description)


def _prune(args: dict, schema: Any, ctx: str, prefix: str, dropped: list[str], topic: Sequence[str] = (),
           tool_description: str = "") -> dict:
    schema = schema if isinstance(schema, dict) else {}
    req = schema.get("required", [])
    req = set(req) if isinstance(req, list) else set()
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    out = {}
    for k, v in args.items():
        sub = props.get(k)
        if isinstance(v, dict) and isinstance(sub, dict) and isinstance(sub.get("properties"), dict):
            v = _prune(v, sub, ctx, f"{prefix}{k}.", dropped, topic, tool_description)  # its optional keys too
            if not v and k not in req:
                dropped.append(prefix + k)
                continue
        enum = _members(sub, v)
        if k in req or supported(v, ctx, k, enum, topic) or unit_backed(v, k, sub, ctx) or \
                normalized_backed(v, sub, ctx, enum, tool_description) or (
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
    out = _prune(args, spec.schema, norm_text(context), "", dropped, field_words(spec.name), spec.description or "")
    return out, dropped


def unbacked_beginning(schema: Any, written: str, ctx: str) -> bool:
    """Is an optional top-level string field certain to be removed by drop_unsupported (_prune), whatever the rest of
    its value, once the value's beginning `written` (decoded, without its opening quote) is written? `ctx` as _prune
    reads it (norm_text). `supported` needs the whole value, normalized, to be a word-bounded part of the context, so
    a beginning that starts no word there cannot become one. Only string fields without an enum, and only ASCII
    beginnings (their lower case and spacing are those of any longer value that starts with them)."""
    if not isinstance(schema, dict) or schema.get("type") != "string" or _members(schema, written) is not None:
        return False
    if not written.isascii() or written[:1].isdigit():
        return False  # a value starting with a digit may be a date or period the request writes in words
    v = norm_text(written)
    return bool(v) and re.search(rf"(?<![a-z0-9]){re.escape(v)}", ctx) is None


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


def one_item_lists(args: dict, schema: Any) -> list[str]:
    """Top-level fields whose answer is a list of one item although their schema (a plain array, no maxItems below
    two) allows more: a small model often closes a list after its first item ("Python 85, SQL 70, Docker 60" → one
    data point)."""
    props = schema.get("properties") if isinstance(schema, dict) else None
    if not isinstance(props, dict):
        return []
    return [k for k, v in args.items() if isinstance(v, list) and len(v) == 1 and isinstance(props.get(k), dict)
            and props[k].get("type") == "array" and int(props[k].get("maxItems", 2) or 0) >= 2]


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
    taken = {w for k in args for w in field_words(k)}
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
        words = [w for w in field_words(key) if w not in _GENERIC_NAME_WORDS and not any(_related(w, t) for t in topic)]
        if words and not set(words) <= taken and all(
                w in ctx_words if len(w) == 3 else any(_related(w, c) for c in ctx_words if len(c) >= 4)
                for w in words):
            out.append(key)
    # of two stated fields the more specific one: "per page" names perPage, not page as well
    return [k for k in out if not any(set(field_words(k)) < set(field_words(o)) for o in out)]


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
