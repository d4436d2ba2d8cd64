"""Draft tokens for the argument answer: what the JSON most likely says next, so that greedy decoding can verify
several tokens in one batch (LlamaContext.generate's `draft`) instead of decoding them one at a time.

Most of an argument object is predictable from outside the model:
- its frame: the grammar writes the properties in a fixed order (schema.ordered_properties: required ones first), so
  after a value closes the next key is, more often than not, the next property (`, "repo": "`);
- its values: they are copied from the request, so once a string value has begun, the request says how it goes on.

A draft only proposes; the greedy choice under the grammar decides every token, so a wrong draft costs one wasted
slot of a batch, never a different answer (up to the float order of batched kernels; see generate's doc)."""

from __future__ import annotations

from typing import Any, Sequence

from ..schema import ordered_properties, normalize_schema

LOOKUP_CHARS = 24  # how much of the request a string value's draft copies ahead


def _opener(schema: Any) -> str:
    """The first character of a value of this property when it is a string ('"'), else '' (not drafted)."""
    if not isinstance(schema, dict):
        return ""
    t = schema.get("type")
    if t == "string" or (isinstance(schema.get("enum"), list) and schema["enum"]
                         and all(isinstance(v, str) for v in schema["enum"])):
        return '"'
    return ""


def _scalar_ends(text: str, i: int) -> bool:
    """Whether the number or literal that text[i] belongs to ends at i with a delimiter after it."""
    return i + 1 < len(text) and text[i + 1] in ",}] \n\t"


class _Scan:
    """Where a partial JSON text stands: its open containers and, for the outermost object, the keys written."""

    def __init__(self, text: str):
        self.depth = 0
        self.in_string = False
        self.string_start = -1  # index just after the opening quote of the open string
        self.string_is_key = False
        self.keys: list[str] = []  # keys of the outermost object, in order
        self.after_value = -1  # index just after the last value that closed inside the outermost object
        self.after_open = -1  # index just after the outermost object's "{"
        self.key_end = -1  # index just after the last key of the outermost object
        self.value_key: str | None = None  # the key of the last value that closed there
        self.scalar = ""  # a number or literal the text ends inside (it may go on)
        self._expect_key = False
        stack: list[str] = []
        i, n = 0, len(text)
        while i < n:
            c = text[i]
            if self.in_string:
                if c == "\\":
                    i += 2
                    continue
                if c == '"':
                    self.in_string = False
                    value = text[self.string_start:i]
                    if self.string_is_key and len(stack) == 1:
                        self.keys.append(value)
                        self.key_end = i + 1
                    elif not self.string_is_key and len(stack) == 1:
                        self._closed(i + 1)
                i += 1
                continue
            if c == '"':
                self.in_string = True
                self.string_start = i + 1
                self.string_is_key = bool(stack) and stack[-1] == "{" and self._expect_key
                self._expect_key = False
            elif c in "{[":
                stack.append(c)
                if c == "{":
                    self._expect_key = True
                    if len(stack) == 1:
                        self.after_open = i + 1
            elif c in "}]":
                if stack:
                    stack.pop()
                if len(stack) == 1:
                    self._closed(i + 1)
            elif c == ",":
                self._expect_key = bool(stack) and stack[-1] == "{"
            elif c not in " \n\t:" and stack:
                if i + 1 == n:  # the text ends inside a number or literal
                    j = i
                    while j > 0 and text[j - 1] not in ",:[{ \n\t":
                        j -= 1
                    self.scalar = text[j:]
                elif len(stack) == 1 and _scalar_ends(text, i):
                    self._closed(i + 1)  # the last character of a number, true, false or null
            i += 1
        self.depth = len(stack)

    def _closed(self, end: int) -> None:
        self.after_value = end
        self.value_key = self.keys[-1] if self.keys else None


def _number_ahead(source: str, digits: str) -> str | None:
    """The rest of a number the source writes starting with `digits` (at a position no digit precedes): '' when
    it ends there, None when the source has no such number."""
    at = source.find(digits)
    while at >= 0:
        if at == 0 or not source[at - 1].isdigit():
            j = at + len(digits)
            k = j
            while k < len(source) and (source[k].isdigit() or (source[k] == "." and k + 1 < len(source)
                                                                 and source[k + 1].isdigit())):
                k += 1
            return source[j:k]
        at = source.find(digits, at + 1)
    return None


STRING_ENDS = (",", ";", "?", "!", ". ", "\n")  # where a value copied from a sentence most likely stops


class ArgumentDrafter:
    """`drafter(tokens)` -> the tokens the answer most likely continues with (possibly none), for one generation
    under the grammar of `schema` (the tool's normalized schema, or a variant of it: a second pass's or a retry's)
    with `source` the text values are copied from (the request and the history window)."""

    def __init__(self, model: Any, schema: Any, source: str):
        try:
            normalized, _ = normalize_schema(schema)
        except Exception:  # noqa: BLE001 - a schema without a grammar is never generated under; no draft then
            normalized = {}
        props = normalized.get("properties") if isinstance(normalized.get("properties"), dict) else {}
        self.props = [(k, _opener(v)) for k, v, _ in ordered_properties(normalized)]
        # the grammar holds an owner/repo pair to one path segment each (schema.py, "split_pair")
        self.segments = {"owner", "repo"} if all(_opener(props.get(k)) for k in ("owner", "repo")) else set()
        self.source = source
        self.model = model
        # the answer's spacing after "{", after "," and after ":", read from the answer once it shows it
        self.spaces = {"{": " ", ",": " ", ":": " "}

    def _learn_style(self, text: str) -> None:
        for mark, probe in (("{", "{"), (",", '",'), (":", '":')):
            at = text.find(probe)
            if at >= 0 and at + len(probe) < len(text):
                self.spaces[mark] = " " if text[at + len(probe)] == " " else ""

    def _frames_after(self, last_key: str | None) -> list[str]:
        """The texts that most likely follow a closed value (or the "{" when last_key is None), the learned spacing
        first: the next property's key and the opening of its value, or "}" when no property follows. [] when the
        last key is not one of the schema's."""
        names = [k for k, _ in self.props]
        if last_key is not None and last_key not in names:
            return []
        nxt = 0 if last_key is None else names.index(last_key) + 1
        if nxt >= len(names):
            return ["}"]
        key, opener = self.props[nxt]
        sep = "" if last_key is None else ","
        first = self.spaces["{" if last_key is None else ","]
        return [f'{sep}{a}"{key}":{b}{opener}' for a in (first, " " if not first else "")
                for b in self._colon_spaces()]

    def _colon_spaces(self) -> tuple[str, str]:
        return (self.spaces[":"], " " if not self.spaces[":"] else "")

    def _value_opening(self, key: str) -> list[str]:
        """What follows a key of the outermost object: the colon and the opening of its value."""
        opener = dict(self.props).get(key, "")
        return [f":{b}{opener}" for b in self._colon_spaces()]

    def _frame_after(self, last_key: str | None) -> str:
        frames = self._frames_after(last_key)
        return frames[0] if frames else ""

    def _find(self, value: str) -> int:
        """Where the request writes a value that has begun like this: the first occurrence that starts a word, or
        for four characters and more any occurrence; -1 for none."""
        at = self.source.find(value)
        while at > 0 and self.source[at - 1].isalnum():
            at = self.source.find(value, at + 1)
        if at < 0 and len(value) >= 4:
            at = self.source.find(value)
        return at

    def _string_ahead(self, scan: _Scan, value: str) -> str:
        """The rest of a string value that has begun as `value`, read from the request, and what follows it."""
        at = self._find(value)
        if at < 0:
            return ""
        ahead = self.source[at + len(value):at + len(value) + LOOKUP_CHARS]
        key = scan.keys[-1] if scan.keys and scan.depth == 1 else None
        after = self._frame_after(key) if scan.depth == 1 else ""
        stops = '/ "\\' if key in self.segments else None  # the segment cannot go on past these
        if stops is not None:
            cut = min((j for j, ch in enumerate(ahead) if ch in stops), default=len(ahead))
        else:
            cut = min((j for j in (ahead.find(e) for e in STRING_ENDS) if j >= 0), default=len(ahead))
        if cut < len(ahead) or len(ahead) < LOOKUP_CHARS:  # the value most likely ends there (or the request does)
            return ahead[:cut] + '"' + after
        return ahead

    def _scalar_ahead(self, scan: _Scan) -> str:
        """The rest of a number or literal the answer ends inside, and what follows it."""
        word = scan.scalar
        after = self._frame_after(scan.keys[-1] if scan.keys else None) if scan.depth == 1 else ""
        for literal in ("true", "false", "null"):
            if literal.startswith(word):
                return literal[len(word):] + after
        if word.lstrip("-").replace(".", "", 1).isdigit():
            rest = _number_ahead(self.source, word.lstrip("-"))
            if rest is not None:
                return rest + after
        return ""

    def text(self, text: str) -> str:
        """The predicted continuation of the answer's text so far ('' for none)."""
        if not text.strip():
            return "{" + self._frame_after(None) if self.props else ""
        self._learn_style(text)
        scan = _Scan(text)
        if scan.in_string and not scan.string_is_key:
            value = text[scan.string_start:]
            return self._string_ahead(scan, value) if value else ""
        if scan.scalar:
            return self._scalar_ahead(scan)
        if scan.depth != 1:
            return ""
        # inside the outermost object: the frame from the last key, closed value or "{" on
        if scan.key_end > max(scan.after_value, scan.after_open) and not scan.in_string:
            anchor, frames = scan.key_end, self._value_opening(scan.keys[-1])
        elif scan.after_value > 0:
            anchor, frames = scan.after_value, self._frames_after(scan.value_key)
        else:
            anchor, frames = scan.after_open, self._frames_after(None)
        tail = text[anchor:]
        for frame in frames:
            if frame.startswith(tail):
                return frame[len(tail):]
        return ""

    def __call__(self, tokens: Sequence[int]) -> list[int]:
        cont = self.text(self.model.detokenize(list(tokens), special=False))
        if not cont:
            return []
        return list(self.model.tokenize(cont, add_special=False, parse_special=False))
