"""Optional fields cut while they are written: the decode steps of a value the repairs would throw away.

A small model fills optional fields the request never mentions (a pull request's `body` made up in prose, a `draft`
flag), and the drop of unsupported fields (repairs.drop_unsupported) removes them afterwards. Their tokens are the
slowest part of an answer: a made-up text is not in the request, so no draft of it is right (arguments/drafts.py) and
each token is a decode step of its own. `UnbackedFieldWatch` follows the answer as it is written and says stop at the
first token after which the drop is certain (repairs.doomed_while_written); the pipeline then cuts the answer back to
before that field and lets the model go on under the tool's grammar without it (pipeline._first_answer).

What the answer keeps can differ from an uncut one only in the fields after a cut one, which the model now writes
without having read the cut value; results/args/unbacked-optionals/ measures that.
"""

from __future__ import annotations

import json
from typing import Any, Sequence

from ..schema import ToolSpec
from .drafts import _Scan
from .repairs import doomed_while_written, field_words, norm_text


def cuttable_fields(spec: ToolSpec) -> dict[str, dict]:
    """{name: normalized schema} of the tool's top-level optional fields an answer may be cut before: optional in the
    normalized schema and written as they are in the original's top-level `properties` (so that a grammar over the
    original without them is the same grammar less those fields)."""
    norm = spec.schema if isinstance(spec.schema, dict) else {}
    raw = spec.input_schema if isinstance(spec.input_schema, dict) else {}
    props = norm.get("properties") if isinstance(norm.get("properties"), dict) else {}
    raw_props = raw.get("properties") if isinstance(raw.get("properties"), dict) else {}
    required = set(norm.get("required") or []) | set(raw.get("required") or [])
    return {k: v for k, v in props.items() if k in raw_props and k not in required and isinstance(v, dict)}


def without_fields(schema: dict, names: Sequence[str]) -> dict:
    """The original schema with those top-level properties left out."""
    props = schema.get("properties") if isinstance(schema.get("properties"), dict) else {}
    return {**schema, "properties": {k: v for k, v in props.items() if k not in names}}


def _string_so_far(raw: str) -> str | None:
    """The decoded text of a JSON string's beginning (without its opening quote); None when it cannot be read. An
    escape cut in half (at most 5 characters: a backslash, "u" and three hex digits) is left out: a shorter
    beginning is still a beginning of the value."""
    for end in range(len(raw), max(len(raw) - 6, -1), -1):
        try:
            return json.loads('"' + raw[:end] + '"')
        except ValueError:
            continue
    return None


class UnbackedFieldWatch:
    """Called with an answer's tokens so far (LlamaContext.generate's `stop_when`, through the pipeline): True once the
    top-level field being written is certain to be dropped. Then `found` is (its name, how many of the answer's
    tokens lie wholly before it, the text between them and the field's start). The field starts at the comma that
    opens it, or after the object's "{" when it is the first."""

    def __init__(self, model: Any, spec: ToolSpec, source: str):
        self.model = model
        self.fields = cuttable_fields(spec)
        self.ctx = norm_text(source)
        self.topic = field_words(spec.name)
        self.found: tuple[str, int] | None = None

    def __bool__(self) -> bool:
        return bool(self.fields)

    def __call__(self, tokens: Sequence[int]) -> bool:
        pieces = [self.model.token_to_piece(t, special=False) for t in tokens]
        text = b"".join(pieces).decode("utf-8", errors="replace")
        scan = _Scan(text)
        if scan.depth != 1 or not scan.keys:
            return False
        key = scan.keys[-1]
        schema = self.fields.get(key)
        if schema is None:
            return False
        if scan.in_string and not scan.string_is_key:
            written = _string_so_far(text[scan.string_start:])
            if written is None:
                return False
        elif scan.in_string or scan.key_end <= max(scan.after_value, scan.after_open):
            return False  # a key being written, or a value of another kind under way
        elif text[scan.key_end:].strip(" \n\t:"):
            return False  # a value other than a string has begun
        else:
            written = None
        if not doomed_while_written(key, schema, written, self.ctx, self.topic):
            return False
        # the field starts at the comma after the previous value (or right after "{" when it is the first)
        start = scan.after_value if len(scan.keys) > 1 else scan.after_open
        head = text[:start].encode("utf-8")
        kept, size = 0, 0
        for p in pieces:
            if size + len(p) > len(head):
                break
            size += len(p)
            kept += 1
        # the characters up to the cut that share a token with what is cut (`",` holds the last value's closing
        # quote and the comma): written again on their own, or the model would go on with the last value
        self.found = (key, kept, head[size:].decode("utf-8", errors="replace"))
        return True
