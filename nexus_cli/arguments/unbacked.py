"""Optional string values closed early: the decode steps of a value the repairs would throw away.

A small model fills optional fields the request never mentions (a pull request's `body` made up in prose), and the
drop of unsupported fields (repairs.drop_unsupported) removes them afterwards. Their tokens are the slowest part of
an answer: a made-up text is not in the request, so no draft of it is right (arguments/drafts.py) and each token is a
decode step of its own. `UnbackedStringWatch` follows the answer as it is written and says "close it" as soon as the
top-level optional string being written is certain to be dropped (repairs.unbacked_beginning); the next token is then
one that begins with the closing quote (LlamaContext.generate's `close_string`), chosen by the model under the grammar.

Nothing is cut back: the model writes its own closing token (`",` or `"}`), as it would after any value, and goes on.
What the answer keeps can differ from one written out only in the fields after a closed one, which the model writes
having read the short value instead of the long one.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..schema import ToolSpec
from .drafts import _Scan
from .repairs import norm_text, unbacked_beginning


def closable_fields(spec: ToolSpec) -> dict[str, dict]:
    """{name: normalized schema} of the tool's top-level optional string fields without an enum."""
    norm = spec.schema if isinstance(spec.schema, dict) else {}
    raw = spec.input_schema if isinstance(spec.input_schema, dict) else {}
    props = norm.get("properties") if isinstance(norm.get("properties"), dict) else {}
    required = set(norm.get("required") or []) | set(raw.get("required") or [])
    return {k: v for k, v in props.items()
            if k not in required and isinstance(v, dict) and v.get("type") == "string" and "enum" not in v}


def _whole_string(raw: str) -> str | None:
    """The decoded text of a JSON string's beginning (without its opening quote), or None while it ends inside an
    escape: closing it there would not close it (`\\"` is a quote inside the string)."""
    try:
        return json.loads('"' + raw + '"')
    except ValueError:
        return None


class UnbackedStringWatch:
    """Called with an answer's tokens so far (LlamaContext.generate's `close_string`): True when the answer is inside
    the value of a top-level optional string field that the drop of unsupported fields is certain to remove."""

    def __init__(self, model: Any, spec: ToolSpec, source: str):
        self.model = model
        self.fields = closable_fields(spec)
        self.ctx = norm_text(source)
        self._tokens: list[int] = []  # the answer read so far, and its pieces
        self._pieces: list[bytes] = []
        self.closed: list[str] = []  # the fields closed early, in order

    def __bool__(self) -> bool:
        return bool(self.fields)

    def __call__(self, tokens: Sequence[int]) -> bool:
        if list(tokens[:len(self._tokens)]) != self._tokens:  # not the answer read so far, grown: read afresh
            self._tokens, self._pieces = [], []
        self._pieces += [self.model.token_to_piece(t, special=False) for t in tokens[len(self._tokens):]]
        self._tokens = list(tokens)
        text = b"".join(self._pieces).decode("utf-8", errors="replace")
        scan = _Scan(text)
        if scan.depth != 1 or not scan.in_string or scan.string_is_key or not scan.keys:
            return False
        key = scan.keys[-1]
        schema = self.fields.get(key)
        if schema is None:
            return False
        written = _whole_string(text[scan.string_start:])
        if written is None or not unbacked_beginning(schema, written, self.ctx):
            return False
        if key not in self.closed:  # asked again while the grammar allows no closing quote yet
            self.closed.append(key)
        return True
