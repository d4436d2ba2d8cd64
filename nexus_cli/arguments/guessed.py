"""Required values the request does not give: the model's guesses, reported beside the arguments.

A grammar makes the model fill every required field, so a request that leaves one out ("open a PR": no repository,
no branches) still gets a full object, with placeholders (`your_username`) or plausible inventions (`main`) in it.
The repairs never drop a required field, and an agent that calls the tool with such a value acts on something the
user never said. `guessed_values` names those fields so the caller can ask instead of calling.

A value is a guess when the request and the history window the prompt showed hold no trace of it: no word of a
string (its stop words aside) is written there, or begins or extends one written there, or shares a stem with one;
no number written there equals a number (nor a number word, an ordinal, another unit of the field, a date in words).
A string of stop words alone ("it", "there"), an empty one, or one with a placeholder's word the request does not write
(`your-repo-path`, `https://example.com`) is a guess too.
Flags and enum members are choices among the schema's own values, and a value equal to the field's declared default
is the schema's; neither is reported. A value can be traced and still wrong (the wrong branch of two the request
names): this flags invention, not every error. Measured in docs/arguments.md, "Guessed values".
"""

from __future__ import annotations

import re
from typing import Any

from ..schema import ToolSpec
from .repairs import _NUMBER_WORDS, _members, _related, norm_text, normalized_backed, unit_backed

# words that trace nothing: a value "the main branch" is not traced by "the"; and the words that point at a thing
# named elsewhere ("close issue 3 there": an owner "there" names no owner)
_STOP = frozenset("""a an the of to for in on at by and or my your our their me us you it this that with from here there
these those them they""".split())

# words a model writes where it has no value (`your_username`, `https://example.com`, `<placeholder>`): a value with
# one of them is a guess whatever else it holds ("your-repo-path" has the request's "repo" in it), unless the request
# writes that word itself
_PLACEHOLDER = frozenset("your example placeholder dummy changeme xxx".split())

_ORDINALS = {n: w for n, w in enumerate("""zeroth first second third fourth fifth sixth seventh eighth ninth
tenth""".split()) if n >= 1}

_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")
_WORD = re.compile(r"[^\W_]+")  # letters and digits of any script


class _Context:
    """The request + window as the tests below read it: its words and the numbers written in it."""

    def __init__(self, text: str):
        self.text = norm_text(text)
        self.words = set(_WORD.findall(self.text))
        self._content = self.words - _STOP  # a stop word traces no value by its start ("the" and "there")
        self.numbers = {abs(float(m)) for m in _NUMBER.findall(self.text)}

    def traces_word(self, w: str) -> bool:
        """A word of a value is written here, begins or extends a word written here (three letters or more on both
        sides: "eur" and "euros", "doge" and "dogecoin"), or shares a stem with one (`_related`)."""
        if w in self.words:
            return True
        if not w.isascii():
            return w in self.text  # scripts written without spaces (杭州东 inside 杭州东和南京南): as written
        if w.isdigit():
            return False  # a number is traced by its value (traces_number), not by the digits of another
        for c in self._content:
            if min(len(c), len(w)) >= 3 and (c.startswith(w) or w.startswith(c)):
                return True
            if len(w) >= 4 and len(c) >= 4 and _related(w, c):
                return True
        return False

    def traces_number(self, v: float) -> bool:
        if abs(float(v)) in self.numbers:  # "52.5200" traces 52.52; "-74.0060" traces -74.006
            return True
        if float(v).is_integer():
            for words in (_NUMBER_WORDS, _ORDINALS):
                w = words.get(int(v))
                if w and re.search(rf"(?<![a-z]){w}(?![a-z])", self.text):
                    return True
        return False


def _traced(value: Any, schema: Any, ctx: _Context, name: str) -> bool:
    """name: the field's, whose last word may be a unit (`timeout_ms`), as the drop reads it."""
    if value is None or isinstance(value, bool) or isinstance(value, dict):
        return True  # flags are choices; an object's own required fields are looked at one by one
    if _members(schema, value) is not None:
        return True  # an enum member: a choice among the schema's values
    if isinstance(schema, dict) and "default" in schema and schema["default"] == value:
        return True
    if isinstance(value, list):
        items = schema.get("items") if isinstance(schema, dict) else None
        return all(_traced(x, items, ctx, name) for x in value)
    if isinstance(value, (int, float)):
        return ctx.traces_number(value) or unit_backed(value, name, schema, ctx.text) or \
            normalized_backed(value, schema, ctx.text)
    if isinstance(value, str):
        tokens = _WORD.findall(norm_text(value))
        if any(t in _PLACEHOLDER and t not in ctx.words for t in tokens):
            return False
        words = [w for w in tokens if w not in _STOP]
        if not words:
            return False  # no value at all: an empty string, punctuation, "it"
        return any(ctx.traces_word(w) for w in words) or normalized_backed(value, schema, ctx.text)
    return True


def _guessed(args: dict, schema: Any, ctx: _Context, prefix: str) -> list[str]:
    schema = schema if isinstance(schema, dict) else {}
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    required = schema.get("required") if isinstance(schema.get("required"), list) else []
    out: list[str] = []
    for key, value in args.items():
        if key not in required:
            continue  # an optional value the request does not back is dropped already (repairs.drop_unsupported)
        sub = props.get(key)
        if isinstance(value, dict) and isinstance(sub, dict):
            out += _guessed(value, sub, ctx, f"{prefix}{key}.")
        elif not _traced(value, sub, ctx, key):
            out.append(prefix + key)
    return out


def guessed_values(args: dict | None, spec: ToolSpec, context: str) -> list[str]:
    """The paths ("owner", "query.filter") of the answer's required values of which `context` (the request and the
    history window) holds no trace, in the answer's order; [] for no answer."""
    if not isinstance(args, dict):
        return []
    return _guessed(args, spec.schema, _Context(context), "")
