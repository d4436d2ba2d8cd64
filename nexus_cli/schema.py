"""MCP tool JSON Schemas → normalized schema, compressed signature and GBNF grammar.

Real servers send `$defs`/`$ref` (also recursive ones), `anyOf`/`oneOf`/`allOf`, enums and consts, nested objects,
arrays, type lists, missing `type`, and the odd schema that a meta-schema check rejects. Everything here is total over
JSON: any input either compiles or yields a one-line reason (`SchemaError` from `grammar()`, `ToolSpec.problems` from
`compile_tool()`); no other exception escapes.

* `normalize_schema(schema)` inlines local `$ref`s (a recursive reference is cut at its second visit and recorded),
  merges `allOf`, turns `oneOf` into `anyOf`, infers a missing `type` from the keywords present and filters enums by type.
* `signature(tool)` renders the compact IR the model reads: `create_issue(owner: string, repo: string, title: string,
  body?: string, labels?: string[])` — required parameters first (schema order), then optional ones (`?`), enums as
  literal unions (`state?: "open"|"closed"`), nested objects one level deep; `descriptions=True` appends truncated
  inline descriptions, `budget_chars` drops descriptions (optional first) until the text fits.
* `grammar(tool)` is Nexus's own GBNF generator (llama.cpp syntax). It works on the original schema so a recursive
  `$ref` becomes a recursive rule. Objects are closed: required keys in signature order, then each optional key at most
  once in the same order (so the model may omit any of them); strings are bounded; unknown schemas accept any JSON value.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from typing import Any

from .audit import sanitize_text
from .errors import SchemaError

MAX_DEPTH = 48  # nesting of a schema we are willing to walk
MAX_RULES = 4000  # grammar size guard (rules)
MAX_GRAMMAR_CHARS = 400_000
MAX_EXPANSION_STEPS = 20_000  # $ref/allOf expansion work per schema (see _Budget)
STRING_MAX_CHARS = 512  # a string value may hold at most this many characters (runaway guard)
INT_MAX_DIGITS = 16
FRAC_MAX_DIGITS = 12
DESC_MAX_CHARS = 60  # inline description truncation in the signature
ENUM_MAX_SHOWN = 8  # enum literals shown in a signature before "|…"
_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


@dataclass
class ToolSpec:
    """A tool compiled for argument generation."""

    key: str
    name: str
    signature: str
    grammar: str | None
    schema: dict[str, Any]  # normalized
    input_schema: dict[str, Any]  # original, as the server sent it (what arguments are validated against)
    description: str = ""
    problems: list[str] = field(default_factory=list)
    ok: bool = True
    described_signature: str = ""  # multi-line signature with inline descriptions (what the prompt carries)


# ----------------------------------------------------------------------------------------------------- helpers

def _tool_parts(tool: Any) -> tuple[str, str, str, Any]:
    """(key, name, description, schema) of a registry Tool, or of a plain MCP tool dict."""
    if isinstance(tool, dict):
        name = str(tool.get("name", "tool"))
        schema = tool.get("inputSchema", tool.get("input_schema", {}))
        desc = tool.get("description") or ""
        return name, name, desc if isinstance(desc, str) else str(desc), schema
    name = str(getattr(tool, "name", "tool"))
    key = getattr(tool, "key", name)
    desc = getattr(tool, "description", "") or ""
    return str(key), name, str(desc), getattr(tool, "input_schema", {})


def _canon(x: Any) -> str:
    try:
        return json.dumps(x, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=True)
    except (TypeError, ValueError):
        return repr(x)


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and not (isinstance(x, float) and not math.isfinite(x))


def _type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value.is_integer() else "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def _declared_types(s: dict) -> list[str] | None:
    """The `type` keyword as a list of known type names; None when absent or unusable."""
    t = s.get("type")
    if isinstance(t, str):
        t = [t]
    if not isinstance(t, list):
        return None
    out = [x for x in t if isinstance(x, str) and x in _TYPES]
    return out or None


def _infer_types(s: dict) -> list[str] | None:
    """Types implied by the keywords when `type` is missing; None = anything."""
    if any(k in s for k in ("properties", "required", "additionalProperties", "patternProperties", "minProperties",
                            "maxProperties", "propertyNames", "dependentRequired")):
        return ["object"]
    if any(k in s for k in ("items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains")):
        return ["array"]
    if any(k in s for k in ("minLength", "maxLength", "pattern", "format")):
        return ["string"]
    if any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")):
        return ["number"]
    return None


def _accepts_type(value: Any, types: list[str]) -> bool:
    t = _type_of(value)
    return t in types or (t == "integer" and "number" in types)


class _Refs:
    """Local `$ref` lookup ("#", "#/$defs/x", "#/properties/a/items", JSON-pointer escapes)."""

    def __init__(self, root: Any):
        self.root = root

    def lookup(self, ref: Any) -> Any:
        if not isinstance(ref, str):
            raise SchemaError(f"$ref is a {type(ref).__name__}, not a string")
        if not ref.startswith("#"):
            raise SchemaError(f"unresolvable $ref '{_short(ref)}' (only local '#/...' references are supported)")
        node = self.root
        pointer = ref[1:]
        if pointer == "":
            return node
        if not pointer.startswith("/"):
            raise SchemaError(f"unresolvable $ref '{_short(ref)}' (anchors are not supported)")
        for raw in pointer[1:].split("/"):
            part = raw.replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise SchemaError(f"unresolvable $ref '{_short(ref)}'")
        if not isinstance(node, (dict, bool)):
            raise SchemaError(f"$ref '{_short(ref)}' points at a {type(node).__name__}, not a schema")
        return node


def _short(text: str, n: int = 60) -> str:
    text = str(text)
    return text if len(text) <= n else text[: n - 1] + "…"


def _is_plain_string(s: Any) -> bool:
    """A string schema with no enum/const/anyOf/$ref (what an identifier-like field looks like)."""
    return (isinstance(s, dict) and s.get("type") == "string" and not any(
        k in s for k in ("enum", "const", "anyOf", "oneOf", "allOf", "$ref", "pattern", "maxLength")))


def _merge_into(base: dict, other: dict, problems: list[str]) -> dict:
    """allOf: merge `other` into a copy of `base` (properties union, required union, types/enums intersected)."""
    out = dict(base)
    for k, v in other.items():
        if k not in out:
            out[k] = v
            continue
        if k == "properties" and isinstance(v, dict) and isinstance(out[k], dict):
            props = dict(out[k])
            for pk, pv in v.items():
                props[pk] = {"allOf": [props[pk], pv]} if pk in props else pv
            out[k] = props
        elif k == "required" and isinstance(v, list) and isinstance(out[k], list):
            # only string names count (found by the schema fuzzer: a dict inside "required" is unhashable)
            out[k] = list(dict.fromkeys(x for x in [*out[k], *v] if isinstance(x, str)))
        elif k == "type":
            a = _declared_types({"type": out[k]}) or list(_TYPES)
            b = _declared_types({"type": v}) or list(_TYPES)
            both = [t for t in a if t in b or (t == "integer" and "number" in b)]
            both += [t for t in b if t == "integer" and "number" in a and t not in both]
            if not both:
                raise SchemaError("allOf combines incompatible types")
            out[k] = both
        elif k == "enum" and isinstance(v, list) and isinstance(out[k], list):
            keep = {_canon(x) for x in v}
            out[k] = [x for x in out[k] if _canon(x) in keep]
        elif k in ("anyOf", "oneOf") and isinstance(v, list) and isinstance(out[k], list):
            out["allOf"] = [*(out.get("allOf") or []), {k: v}] if isinstance(out.get("allOf", []), list) else [{k: v}]
        elif k in ("description", "title", "default", "examples", "$schema", "$id", "$comment"):
            pass
        elif k in ("minimum", "minLength", "minItems", "exclusiveMinimum") and _is_number(v) and _is_number(out[k]):
            out[k] = max(out[k], v)
        elif k in ("maximum", "maxLength", "maxItems", "exclusiveMaximum") and _is_number(v) and _is_number(out[k]):
            out[k] = min(out[k], v)
        elif _canon(out[k]) != _canon(v):
            problems.append(f"allOf: conflicting '{k}' kept from the first branch")
    return out


# ------------------------------------------------------------------------------------------- normalization

class _Budget:
    """Work left for $ref/allOf expansion, shared by every normalizer of one compilation.

    Found by the schema fuzzer (R10): allOf branches that each $ref the root merge into nested allOf lists that
    double at every expansion; the schema is a few hundred bytes and the work exponential. A step is one pass of the
    expansion loop plus one unit per property a merge copies (merges of wide objects cost in proportion: R11, the
    same shape with a thousand properties, took 12 s inside 20,000 plain steps). Real registries need at most a few
    hundred units (see tests/test_schema.py)."""

    def __init__(self, steps: int):
        self.left = steps

    def spend(self, units: int = 1) -> None:
        self.left -= units
        if self.left < 0:
            raise SchemaError(f"schema too complex: $ref/allOf expansion needs over {MAX_EXPANSION_STEPS} steps")


def _width(s: dict) -> int:
    """What merging `s` copies: its keys and its properties."""
    props = s.get("properties")
    return len(s) + (len(props) if isinstance(props, dict) else 0)


class _Normalizer:
    def __init__(self, root: Any, budget: _Budget | None = None):
        self.refs = _Refs(root)
        self.problems: list[str] = []
        self.budget = budget or _Budget(MAX_EXPANSION_STEPS)

    def norm(self, s: Any, depth: int = 0, active: tuple = ()) -> Any:
        if depth > MAX_DEPTH:
            raise SchemaError(f"schema nested deeper than {MAX_DEPTH} levels")
        if isinstance(s, bool):
            return {} if s else {"not": {}}
        if not isinstance(s, dict):
            self._problem(f"a subschema is a {type(s).__name__}, not an object (treated as any value)")
            return {}
        s, active = self._flatten2(s, depth, active)
        if "$ref" in s:  # recursive reference, cut here
            return s
        if "not" in s and s["not"] in ({}, True):
            return {"not": {}}
        out: dict[str, Any] = {}
        for k in ("description", "title", "default", "format", "pattern", "minLength", "maxLength", "minimum",
                  "maximum", "exclusiveMinimum", "exclusiveMaximum", "minItems", "maxItems", "multipleOf",
                  "uniqueItems", "examples"):
            if k in s:
                out[k] = s[k]
        types = _declared_types(s) or _infer_types(s)
        if "const" in s:
            out["const"] = s["const"]
            types = types or [_type_of(s["const"])]
        if isinstance(s.get("enum"), list):
            vals = [v for v in s["enum"] if types is None or _accepts_type(v, types)]
            if len(vals) < len(s["enum"]):
                self._problem("enum values that do not match the declared type dropped")
            out["enum"] = vals
            types = types or sorted({_type_of(v) for v in vals}, key=_TYPES.index)
        elif "enum" in s:
            self._problem("enum is not an array (ignored)")
        if types:
            out["type"] = types[0] if len(types) == 1 else types
        if types is None or "object" in types:
            props = s.get("properties")
            if isinstance(props, dict):
                out["properties"] = {str(k): self.norm(v, depth + 1, active) for k, v in props.items()}
            elif props is not None:
                self._problem("properties is not an object (ignored)")
            req = s.get("required")
            if isinstance(req, list):
                out["required"] = list(dict.fromkeys(r for r in req if isinstance(r, str)))
            elif req is not None and not isinstance(req, bool):
                self._problem("required is not an array (ignored)")
            ap = s.get("additionalProperties")
            if isinstance(ap, (dict, bool)):
                out["additionalProperties"] = ap if isinstance(ap, bool) else self.norm(ap, depth + 1, active)
        if types is None or "array" in types:
            items = s.get("items")
            if isinstance(items, (dict, bool)):
                out["items"] = self.norm(items, depth + 1, active)
            elif isinstance(items, list):  # draft-4 tuple form: treat as any of the listed item schemas
                out["items"] = {"anyOf": [self.norm(x, depth + 1, active) for x in items]} if items else {}
        if isinstance(s.get("anyOf"), list):
            branches = [self.norm(b, depth + 1, active) for b in s["anyOf"]]
            branches = [b for b in branches if not _is_never(b)]
            out["anyOf"] = branches
        return out

    def _flatten(self, s: dict, depth: int, active: tuple) -> dict:
        return self._flatten2(s, depth, active)[0]

    def _flatten2(self, s: dict, depth: int, active: tuple) -> tuple[dict, tuple]:
        """Resolve $ref (merging siblings), merge allOf, fold oneOf into anyOf (merged with siblings); also returns
        the chain of $refs being expanded (for cycle detection below this node)."""
        seen_chain: list[str] = []
        guard = 0
        while True:
            self.budget.spend()
            guard += 1
            if guard > MAX_DEPTH:
                raise SchemaError("schema nested deeper than allowed while resolving $ref/allOf")
            if "$ref" in s:
                ref = s["$ref"]
                if isinstance(ref, str) and (ref in active or ref in seen_chain):
                    if ref in seen_chain:
                        raise SchemaError(f"$ref cycle through '{_short(ref)}' with no content")
                    self._problem(f"recursive $ref '{_short(ref)}' (recursive grammar rule; normalized view cut)")
                    return {"$ref": ref}, active
                target = self.refs.lookup(ref)
                if isinstance(ref, str):
                    seen_chain.append(ref)
                    active = (*active, ref)
                siblings = {k: v for k, v in s.items() if k != "$ref"}
                target = target if isinstance(target, dict) else ({} if target else {"not": {}})
                if siblings:
                    self.budget.spend(_width(target) + _width(siblings))
                s = _merge_into(target, siblings, self.problems) if siblings else target
                continue
            if isinstance(s.get("allOf"), list) and s["allOf"]:
                parts = s["allOf"]
                base = {k: v for k, v in s.items() if k != "allOf"}
                for p in parts:
                    if isinstance(p, bool):
                        p = {} if p else {"not": {}}
                    if not isinstance(p, dict):
                        self._problem("allOf item is not an object (ignored)")
                        continue
                    p = self._flatten(p, depth + 1, active)
                    if "$ref" in p:
                        self._problem("recursive $ref inside allOf (ignored)")
                        continue
                    self.budget.spend(_width(base) + _width(p))
                    base = _merge_into(base, p, self.problems)
                s = base
                continue
            if isinstance(s.get("oneOf"), list):
                merged = list(s["oneOf"]) if not isinstance(s.get("anyOf"), list) else None
                if merged is None:  # both present: a value must match one of each; keep anyOf, note it
                    self._problem("oneOf together with anyOf: oneOf ignored")
                    s = {k: v for k, v in s.items() if k != "oneOf"}
                else:
                    s = {**{k: v for k, v in s.items() if k != "oneOf"}, "anyOf": merged}
                continue
            if isinstance(s.get("anyOf"), list):
                rest = {k: v for k, v in s.items() if k not in ("anyOf", "description", "title", "default", "examples")}
                if rest:  # push the siblings into every branch
                    branches = []
                    for b in s["anyOf"]:
                        if isinstance(b, bool):
                            b = {} if b else {"not": {}}
                        if not isinstance(b, dict):
                            continue
                        b = self._flatten(b, depth + 1, active)
                        if "$ref" in b:
                            branches.append(b)
                            continue
                        try:
                            branches.append(_merge_into(rest, b, self.problems))
                        except SchemaError:
                            continue  # branch incompatible with the siblings: it can never match
                    keep = {k: v for k, v in s.items() if k in ("description", "title", "default", "examples")}
                    return {**keep, "anyOf": branches}, active
            return s, active

    @staticmethod
    def _has_content(s: dict) -> bool:
        return any(k != "$ref" for k in s)

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)


def _is_never(s: Any) -> bool:
    return isinstance(s, dict) and "not" in s and s["not"] == {} and len(s) == 1


def normalize_schema(schema: Any) -> tuple[dict, list[str]]:
    """(normalized schema, problems). Raises SchemaError (one line) when the schema is unusable."""
    n = _Normalizer(schema)
    try:
        out = n.norm(schema)
    except RecursionError:
        raise SchemaError("schema nested too deeply") from None
    return out, n.problems


# ---------------------------------------------------------------------------------------------- signature

def _first_sentence(desc: Any, limit: int = DESC_MAX_CHARS) -> str:
    if not isinstance(desc, str):
        return ""
    text = " ".join(desc.split())
    for m in re.finditer(r"[.!?。](\s|$)", text):  # first sentence end that is not an abbreviation (e.g., i.e.)
        head = text[: m.start()]
        if re.search(r"(\b[a-zA-Z]\.[a-zA-Z]|\betc|\bvs|\b[A-Z])$", head) or not head:
            continue
        text = head if m.group(0)[0] in ".。" else head + m.group(0)[0]
        break
    if len(text) > limit:
        cut = text[:limit].rsplit(" ", 1)[0] if " " in text[:limit] else text[:limit]
        text = cut.rstrip(",;:") + "…"
    return text


def ordered_properties(s: dict) -> list[tuple[str, Any, bool]]:
    """(name, schema, required) with required properties first (schema order), then optional ones."""
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    req = [r for r in s.get("required", []) if isinstance(r, str)] if isinstance(s.get("required"), list) else []
    out = [(k, props.get(k, {}), True) for k in props if k in req]
    out += [(k, {}, True) for k in req if k not in props]
    out += [(k, v, False) for k, v in props.items() if k not in req and not _is_never(v)]
    return out


def _literal(v: Any) -> str:
    return json.dumps(v, ensure_ascii=False)


def type_text(s: Any, depth: int = 0) -> str:
    """Compact type of a normalized subschema: string, integer, "a"|"b", string[], {a: string, b?: integer}, any."""
    if not isinstance(s, dict) or depth > 6:
        return "any"
    if "$ref" in s:
        return "object"
    if "const" in s:
        return _literal(s["const"])
    if isinstance(s.get("enum"), list) and s["enum"]:
        vals = [_literal(v) for v in s["enum"][:ENUM_MAX_SHOWN]]
        return "|".join(vals) + ("|…" if len(s["enum"]) > ENUM_MAX_SHOWN else "")
    if isinstance(s.get("anyOf"), list) and s["anyOf"]:
        parts = list(dict.fromkeys(type_text(b, depth + 1) for b in s["anyOf"]))
        non_null = [p for p in parts if p != "null"]
        return "|".join(non_null or parts)
    t = s.get("type")
    types = [t] if isinstance(t, str) else (t if isinstance(t, list) else [])
    if len(types) > 1:
        non_null = [x for x in types if x != "null"] or types
        return "|".join(type_text({**s, "type": x}, depth + 1) for x in non_null)
    t = types[0] if types else None
    if t == "array":
        inner = type_text(s.get("items", {}), depth + 1)
        return f"({inner})[]" if "|" in inner else f"{inner}[]"
    if t == "object":
        props = ordered_properties(s)
        if props and depth < 1:
            return "{" + ", ".join(f"{k}{'' if r else '?'}: {type_text(v, depth + 1)}" for k, v, r in props) + "}"
        return "object"
    return t or "any"


def _render(name: str, s: dict, descriptions: bool, multiline: bool, drop_desc: set[str] | None = None) -> str:
    parts = []
    for k, v, req in ordered_properties(s):
        item = f"{k}{'' if req else '?'}: {type_text(v)}"
        # sanitized here too: a registry read at run time (--registry) reaches the argument prompt through this line
        desc = _first_sentence(sanitize_text(v.get("description"))) if descriptions and isinstance(v, dict) else ""
        if desc and not (drop_desc and k in drop_desc):
            item += f"  // {desc}" if multiline else f" /* {desc} */"
        parts.append(item)
    if multiline and parts:
        body = "".join(f"  {p.split('  //')[0]},{('  //' + p.split('  //', 1)[1]) if '  //' in p else ''}\n" for p in parts)
        return f"{name}(\n{body})"
    return f"{name}({', '.join(parts)})"


def signature_of(name: str, normalized: dict, descriptions: bool = False, budget_chars: int | None = None,
                 multiline: bool = False) -> str:
    """The signature of an already-normalized schema; see signature()."""
    if not descriptions or budget_chars is None:
        return _render(name, normalized, descriptions, multiline)
    order = [k for k, _, r in reversed(ordered_properties(normalized)) if not r]
    order += [k for k, _, r in reversed(ordered_properties(normalized)) if r]
    dropped: set[str] = set()
    text = _render(name, normalized, True, multiline)
    for k in order:
        if len(text) <= budget_chars:
            break
        dropped.add(k)
        text = _render(name, normalized, True, multiline, dropped)
    return text


def signature(tool: Any, descriptions: bool = False, budget_chars: int | None = None, multiline: bool = False) -> str:
    """Compressed signature of a tool, e.g. `create_repository(name: string, private?: boolean)`.

    Raises SchemaError when the schema cannot be normalized."""
    _key, name, _desc, schema = _tool_parts(tool)
    normalized, _ = normalize_schema(schema)
    return signature_of(name, normalized, descriptions, budget_chars, multiline)


# ------------------------------------------------------------------------------------------------ grammar

def gbnf_literal(text: str) -> str:
    """A GBNF string literal for `text` (llama.cpp escapes)."""
    out = ['"']
    for ch in text:
        o = ord(ch)
        if ch == '"':
            out.append('\\"')
        elif ch == "\\":
            out.append("\\\\")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\x{o:02X}")
        elif o in (0x85, 0x2028, 0x2029):  # Unicode line breaks: escaped so a grammar stays one rule per line
            out.append(f"\\u{o:04X}")
        elif 0xD800 <= o <= 0xDFFF:  # lone surrogate (only reachable from malformed input): escape as JSON would
            out.append(f"\\\\u{o:04x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


_BASE_RULES = {
    "ws": '" "?',
    "char": r'[^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F] [0-9a-fA-F])',
    "boolean": '"true" | "false"',
    "null": '"null"',
    "integer": f'"-"? ("0" | [1-9] [0-9]{{0,{INT_MAX_DIGITS - 1}}})',
    "uinteger": f'"0" | [1-9] [0-9]{{0,{INT_MAX_DIGITS - 1}}}',
    "number": f'integer ("." [0-9]{{1,{FRAC_MAX_DIGITS}}})?',
    "unumber": f'uinteger ("." [0-9]{{1,{FRAC_MAX_DIGITS}}})?',
    "string": f'"\\"" char{{0,{STRING_MAX_CHARS}}} "\\""',
    "value": "object | array | scalar",
    # free-form objects and arrays are bounded in width (ARRAY_MAX_ITEMS) and in depth (three levels): a small
    # model must not loop forever, neither sideways nor by nesting {"a": {"a": {"a": ...
    "object": '"{" ws ( string ":" ws inner ( "," ws string ":" ws inner ){0,9} )? "}"',
    "array": '"[" ws ( inner ( "," ws inner ){0,9} )? "]"',
    "inner": "flatobject | flatarray | scalar",
    "flatobject": '"{" ws ( string ":" ws scalar ( "," ws string ":" ws scalar ){0,9} )? "}"',
    "flatarray": '"[" ws ( scalar ( "," ws scalar ){0,9} )? "]"',
    "scalar": "string | number | boolean | null",
}
_BASE_DEPS = {
    "number": ["integer"], "unumber": ["uinteger"], "string": ["char"],
    "value": ["object", "array", "scalar"],
    "object": ["ws", "string", "inner"], "array": ["ws", "inner"],
    "inner": ["flatobject", "flatarray", "scalar"],
    "flatobject": ["ws", "string", "scalar"], "flatarray": ["ws", "scalar"],
    "scalar": ["string", "number", "boolean", "null"],
}


# ------------------------------------------------------------------------------------------------ pattern

PATTERN_REPEAT_MAX = 64  # what * and + on a character become in a pattern's grammar (bounded, like every string)
PATTERN_GROUP_REPEAT_MAX = 4  # the same on a group: nested repetition multiplies, and a small model loops there
_ONE_CHARACTER = re.compile(r'\[(?:\\.|[^\]\\])*\]|"(?:\\.|[^"\\])"')  # a class or a one-character literal
_SAFE_CLASS = "\\x22\\x5C\\x00-\\x1F"  # never generated from a pattern: '"', '\\' and controls would need JSON escapes


class _PatternUnsupported(Exception):
    pass


def _class_char(c: str) -> str:
    return c if c.isalnum() else f"\\x{ord(c):02X}" if ord(c) < 256 else f"\\u{ord(c):04X}"


class _PatternToGbnf:
    """A JSON Schema `pattern` (ECMA-262 regex) as a GBNF expression for the string's content, for the subset real
    schemas use: anchored ^...$, literals, escapes \\d \\w \\s, classes with ranges and negation, '.', groups,
    alternation, quantifiers ? * + {n} {n,} {n,m}. Anything else (lookarounds, backreferences, an unanchored
    pattern) raises _PatternUnsupported and the string stays plain (validation still reports a mismatch)."""

    def __init__(self, pattern: str, tight: bool = False):
        if not (pattern.startswith("^") and pattern.endswith("$") and not pattern.endswith("\\$")):
            raise _PatternUnsupported("not anchored")
        self.src, self.i = pattern[1:-1], 0
        self.repeat_max = PATTERN_REPEAT_MAX // 2 if tight else PATTERN_REPEAT_MAX
        self.group_repeat_max = 1 if tight else PATTERN_GROUP_REPEAT_MAX

    def convert(self) -> str:
        out = self.alternation()
        if self.i != len(self.src):
            raise _PatternUnsupported(f"unexpected {self.src[self.i]!r}")
        return out

    def alternation(self) -> str:
        alts = [self.sequence()]
        while self.i < len(self.src) and self.src[self.i] == "|":
            self.i += 1
            alts.append(self.sequence())
        return alts[0] if len(alts) == 1 else "( " + " | ".join(a or '""' for a in alts) + " )"

    def sequence(self) -> str:
        parts = []
        while self.i < len(self.src) and self.src[self.i] not in "|)":
            group = self.src[self.i] == "("
            atom = self.atom()
            # a group around one character (`([a-z=,])+`, kubernetes' label selectors) repeats like that character:
            # the group bound would cut every such value at four characters
            one_char = group and _ONE_CHARACTER.fullmatch(atom[2:-2]) is not None
            parts.append(atom + self.quantifier(self.group_repeat_max if group and not one_char else self.repeat_max))
        return " ".join(parts)

    def quantifier(self, repeat_max: int) -> str:
        if self.i >= len(self.src):
            return ""
        c = self.src[self.i]
        q = ""
        if c in "?*+":
            self.i += 1
            q = {"?": "?", "*": f"{{0,{repeat_max}}}", "+": f"{{1,{repeat_max}}}"}[c]
        elif c == "{":
            end = self.src.find("}", self.i)
            body = self.src[self.i + 1 : end] if end > 0 else ""
            m = re.fullmatch(r"(\d+)(,(\d*))?", body)
            if not m:
                raise _PatternUnsupported("bad repetition")
            lo = int(m.group(1))
            hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else lo + repeat_max)
            if hi < lo or hi > 256:
                raise _PatternUnsupported("repetition too large")
            self.i = end + 1
            q = f"{{{lo},{hi}}}"
        if self.i < len(self.src) and self.src[self.i] == "?" and q:
            self.i += 1  # lazy: same language
        return q

    def atom(self) -> str:
        c = self.src[self.i]
        if c == "(":
            self.i += 1
            if self.src.startswith("?:", self.i):
                self.i += 2
            elif self.src.startswith("?", self.i):
                raise _PatternUnsupported("lookaround or named group")
            inner = self.alternation()
            if self.i >= len(self.src) or self.src[self.i] != ")":
                raise _PatternUnsupported("unclosed group")
            self.i += 1
            return f"( {inner} )"
        if c == "[":
            return self.char_class()
        if c == ".":
            self.i += 1
            return f"[^{_SAFE_CLASS}]"
        if c == "\\":
            return self.escape(in_class=False)
        if c in "*+?{}^$":
            raise _PatternUnsupported(f"unexpected {c!r}")
        self.i += 1
        if c in '"\\' or ord(c) < 0x20:
            raise _PatternUnsupported("a character that needs a JSON escape")
        return gbnf_literal(c)

    def escape(self, in_class: bool) -> str:
        n = self.src[self.i + 1] if self.i + 1 < len(self.src) else ""
        self.i += 2
        classes = {"d": "0-9", "w": "a-zA-Z0-9_", "s": " "}
        if n in classes:
            return classes[n] if in_class else f"[{classes[n]}]"
        if n and not n.isalnum() and n not in '"\\':
            return _class_char(n) if in_class else gbnf_literal(n)
        raise _PatternUnsupported(f"escape \\{n}")

    def char_class(self) -> str:
        self.i += 1
        negate = self.src.startswith("^", self.i)
        if negate:
            self.i += 1
        items = []
        first = True
        while self.i < len(self.src) and (self.src[self.i] != "]" or first):
            first = False
            c = self.src[self.i]
            if c == "\\":
                items.append(self.escape(in_class=True))
                continue
            if c in '"' or ord(c) < 0x20:
                raise _PatternUnsupported("a character that needs a JSON escape")
            if self.i + 2 < len(self.src) and self.src[self.i + 1] == "-" and self.src[self.i + 2] != "]":
                hi = self.src[self.i + 2]
                if hi == "\\" or hi < c:
                    raise _PatternUnsupported("range")
                items.append(f"{_class_char(c)}-{_class_char(hi)}")
                self.i += 3
                continue
            items.append(_class_char(c))
            self.i += 1
        if self.i >= len(self.src):
            raise _PatternUnsupported("unclosed class")
        self.i += 1
        body = "".join(items)
        return f"[^{body}{_SAFE_CLASS}]" if negate else f"[{body}]"


def pattern_gbnf(pattern: Any, tight: bool = False) -> str | None:
    """The GBNF expression of a string with this pattern (quotes included), or None when unsupported. tight: the
    retry grammar's shorter repetitions (a repeated group at most once)."""
    if not isinstance(pattern, str) or len(pattern) > 500:
        return None
    try:
        body = _PatternToGbnf(pattern, tight).convert()
    except (_PatternUnsupported, IndexError):
        return None
    return f'"\\"" {body} "\\""' if body else '"\\"" "\\""'


class _GrammarBuilder:
    def __init__(self, root: Any, name: str, tight: bool = False):
        self.tight = tight  # the fallback grammar: short arrays, no free-form content, recursion cut
        self.budget = _Budget(MAX_EXPANSION_STEPS)
        self.refs = _Refs(root)
        self.rules: dict[str, str] = {}
        self.memo: dict[str, str] = {}
        self.ref_rules: dict[str, str] = {}
        self.prefix = re.sub(r"[^a-zA-Z0-9]+", "-", name).strip("-").lower()[:24] or "tool"
        self.counter = 0
        self.problems: list[str] = []
        self.building: set[str] = set()  # ref rules whose body is being built

    # rules -----------------------------------------------------------------------------------------------
    def base(self, name: str) -> str:
        if name not in self.rules:
            self.rules[name] = _BASE_RULES[name]
            for dep in _BASE_DEPS.get(name, []):
                self.base(dep)
        return name

    def new_rule(self, hint: str) -> str:
        self.counter += 1
        if self.counter > MAX_RULES:
            raise SchemaError(f"schema needs more than {MAX_RULES} grammar rules")
        clean = re.sub(r"[^a-zA-Z0-9]+", "-", hint).strip("-").lower()[:32] or "r"
        return f"{clean}-{self.counter}"

    def add(self, hint: str, body: str) -> str:
        key = "body:" + body
        if key in self.memo:
            return self.memo[key]
        name = self.new_rule(hint)
        self.rules[name] = body
        self.memo[key] = name
        return name

    # schema -> expression ----------------------------------------------------------------------------------
    def expr(self, s: Any, hint: str, depth: int = 0) -> str:
        """A GBNF expression (a rule name or a small inline expression) for subschema `s`; "" = nothing matches."""
        if depth > MAX_DEPTH:
            raise SchemaError(f"schema nested deeper than {MAX_DEPTH} levels")
        if s is True or s == {}:
            return self.base("value")
        if s is False:
            return ""
        if not isinstance(s, dict):
            self._problem(f"a subschema is a {type(s).__name__}, not an object (treated as any value)")
            return self.base("value")
        if "$ref" in s:
            return self.ref_expr(s, hint, depth)
        if isinstance(s.get("allOf"), list) and s["allOf"]:
            norm = _Normalizer(self.refs.root, self.budget)
            flat = norm._flatten(s, depth, ())
            self.problems.extend(p for p in norm.problems if p not in self.problems)
            if "$ref" in flat:
                return self.ref_expr(flat, hint, depth)
            return self.expr(flat, hint, depth + 1)
        key = _canon(s)
        if key in self.memo:
            return self.memo[key]
        out = self._expr(s, hint, depth)
        self.memo[key] = out
        return out

    def ref_expr(self, s: dict, hint: str, depth: int) -> str:
        ref = s["$ref"]
        if not isinstance(ref, str):  # found by the schema fuzzer: "$ref": {...} or [...]
            self._problem(f"a $ref is a {type(ref).__name__}, not a string (treated as any value)")
            return self.base("value")
        siblings = {k: v for k, v in s.items() if k not in ("$ref", "description", "title", "default", "examples",
                                                              "$comment")}
        if siblings:  # merge the siblings into the target (no recursion through the merged form)
            target = self.refs.lookup(ref)
            target = target if isinstance(target, dict) else ({} if target else False)
            if target is False:
                return ""
            return self.expr(_merge_into(target, siblings, self.problems), hint, depth + 1)
        if ref in self.ref_rules:
            return self.ref_rules[ref]
        target = self.refs.lookup(ref)
        name = self.new_rule("ref-" + ref.rsplit("/", 1)[-1])
        self.ref_rules[ref] = name
        self.rules[name] = '""'  # placeholder while the body is built (recursion resolves to the name)
        self.building.add(name)
        body = self.expr(target, hint, depth + 1)
        self.building.discard(name)
        if body in self.building or body == name:  # a chain of bare $refs that leads back to itself
            raise SchemaError(f"$ref cycle through '{_short(ref)}' with no content")
        if body == "":
            if self._uses(name):
                raise SchemaError(f"$ref '{_short(ref)}' can never be satisfied")
            self.rules.pop(name)
            self.ref_rules.pop(ref)
            return ""
        if body == name:
            raise SchemaError(f"$ref cycle through '{_short(ref)}' with no content")
        self.rules[name] = body
        return name

    def _uses(self, name: str) -> bool:
        pat = re.compile(rf"(?<![a-zA-Z0-9-]){re.escape(name)}(?![a-zA-Z0-9-])")
        return any(pat.search(b) for n, b in self.rules.items() if n != name)

    def _expr(self, s: dict, hint: str, depth: int) -> str:
        if "not" in s and s["not"] in ({}, True):
            return ""
        alts: list[str] = []
        branches = None
        if isinstance(s.get("anyOf"), list) or isinstance(s.get("oneOf"), list):
            norm = _Normalizer(self.refs.root, self.budget)
            flat = norm._flatten({k: v for k, v in s.items()}, depth, ())
            self.problems.extend(p for p in norm.problems if p not in self.problems)
            branches = flat.get("anyOf") if isinstance(flat.get("anyOf"), list) else None
            if branches is None:
                return self.expr(flat, hint, depth + 1)
        if branches is not None:
            for i, b in enumerate(branches):
                e = self.expr(b, f"{hint}-{i}", depth + 1)
                if e and e not in alts:
                    alts.append(e)
            if not alts:
                return ""
            return alts[0] if len(alts) == 1 else self.add(hint + "-alt", " | ".join(alts))
        types = _declared_types(s) or _infer_types(s)
        if "const" in s:
            if types is not None and not _accepts_type(s["const"], types):
                return ""
            return self.literal_rule(hint, [s["const"]])
        if "enum" in s:
            vals = s["enum"] if isinstance(s["enum"], list) else None
            if vals is None:
                self._problem("enum is not an array (ignored)")
            else:
                vals = [v for v in vals if types is None or _accepts_type(v, types)]
                if not vals:
                    return ""
                return self.literal_rule(hint, vals)
        if types is None:
            return self.base("value")
        parts = [e for e in (self.typed(t, s, hint, depth) for t in types) if e]
        parts = list(dict.fromkeys(parts))
        if not parts:
            return ""
        return parts[0] if len(parts) == 1 else self.add(hint + "-t", " | ".join(parts))

    def literal_rule(self, hint: str, vals: list) -> str:
        lits = []
        for v in vals:
            try:
                lits.append(gbnf_literal(json.dumps(v, ensure_ascii=False, separators=(",", ":"), allow_nan=False)))
            except (TypeError, ValueError):
                self._problem("an enum/const value is not JSON (dropped)")
        lits = list(dict.fromkeys(lits))
        if not lits:
            return ""
        return self.add(hint + "-lit", " | ".join(lits))

    def typed(self, t: str, s: dict, hint: str, depth: int) -> str:
        if t == "null":
            return self.base("null")
        if t == "boolean":
            return self.base("boolean")
        if t in ("integer", "number"):
            lo = s.get("minimum")
            xlo = s.get("exclusiveMinimum")
            nonneg = (_is_number(lo) and lo >= 0) or (_is_number(xlo) and xlo >= 0)
            if t == "integer":
                return self.base("uinteger" if nonneg else "integer")
            return self.base("unumber" if nonneg else "number")
        if t == "string":
            if "pattern" in s:
                pat = pattern_gbnf(s["pattern"], self.tight)
                if pat is not None and not any(k in s for k in ("minLength", "maxLength", "format")):
                    return self.add(hint + "-pat", pat)
                self._problem("a string pattern the grammar does not enforce (validated after generation)")
            lo = s.get("minLength") if isinstance(s.get("minLength"), int) and not isinstance(s.get("minLength"), bool) else 0
            hi = s.get("maxLength") if isinstance(s.get("maxLength"), int) and not isinstance(s.get("maxLength"), bool) else None
            lo = max(0, min(lo, STRING_MAX_CHARS))
            hi = STRING_MAX_CHARS if hi is None else max(0, min(hi, STRING_MAX_CHARS))
            if hi < lo:
                return ""
            if lo == 0 and hi == STRING_MAX_CHARS:
                return self.base("string")
            self.base("char")
            return self.add("string", f'"\\"" char{{{lo},{hi}}} "\\""')
        if t == "array":
            return self.array(s, hint, depth)
        if t == "object":
            return self.object(s, hint, depth)
        return self.base("value")

    def _recursing(self, s: Any) -> bool:
        """s is a $ref to a rule whose body is being built (a recursive schema)."""
        return (isinstance(s, dict) and isinstance(s.get("$ref"), str)
                and self.ref_rules.get(s["$ref"]) in self.building)

    def array(self, s: dict, hint: str, depth: int) -> str:
        items = s.get("items", {})
        if isinstance(items, list):  # draft-4 tuple form
            items = {"anyOf": items} if items else {}
        lo = s.get("minItems") if isinstance(s.get("minItems"), int) and not isinstance(s.get("minItems"), bool) else 0
        if self.tight and lo <= 0 and self._recursing(items):
            return self.add(hint + "-arr", '"[" "]"')  # the tight grammar cuts recursion (trees of children)
        item = self.expr(items, hint + "-item", depth + 1)
        self.base("ws")
        hi = s.get("maxItems") if isinstance(s.get("maxItems"), int) and not isinstance(s.get("maxItems"), bool) else None
        lo = max(0, lo)
        if hi is not None and hi < lo:
            return ""
        if not item:
            return "" if lo > 0 else self.add(hint + "-arr", '"[" "]"')
        if lo > 64 or (hi is not None and hi > 64):  # keep the grammar small: plain repetition
            hi = None
            lo = min(lo, 1)
        if hi is None and lo <= ARRAY_MAX_ITEMS:
            # An unbounded array lets a small model loop until max_tokens and never close the JSON; a request
            # rarely names more items than this, and the bound keeps every output finite and valid.
            hi = ARRAY_MAX_ITEMS
        if self.tight and hi is not None and hi > max(lo, TIGHT_ARRAY_MAX_ITEMS):
            hi = max(lo, TIGHT_ARRAY_MAX_ITEMS)
        if hi == 0:
            return self.add(hint + "-arr", '"[" "]"')
        more = '( "," ws ' + item + " )"
        if lo == 0:
            rep = "*" if hi is None else f"{{0,{hi - 1}}}"
            body = f'"[" ws ( {item} {more}{rep} )? "]"'
        else:
            rep = f"{{{lo - 1},}}" if hi is None else f"{{{lo - 1},{hi - 1}}}"
            body = f'"[" ws {item} {more}{rep} "]"'
        return self.add(hint + "-arr", body)

    def object(self, s: dict, hint: str, depth: int) -> str:
        self.base("ws")
        props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
        if s.get("properties") is not None and not isinstance(s.get("properties"), dict):
            self._problem("properties is not an object (ignored)")
        if not props and not isinstance(s.get("required"), list):
            ap = s.get("additionalProperties", True)
            if isinstance(s.get("properties"), dict) and "additionalProperties" not in s:
                # "properties": {} declares the parameters, and there are none: the MCP idiom for a tool that
                # takes no arguments. Only {} is worth generating (any key would be invented).
                return self.add(hint + "-obj", '"{" "}"')
            if self.tight and not (isinstance(ap, dict) and ap):
                return self.add(hint + "-obj", '"{" "}"')
            if ap is False:
                return self.add(hint + "-obj", '"{" "}"')
            if isinstance(ap, dict) and ap:
                val = self.expr(ap, hint + "-val", depth + 1)
                if not val:
                    return self.add(hint + "-obj", '"{" "}"')
                self.base("string")
                return self.add(hint + "-map", f'"{{" ws ( string ":" ws {val} ( "," ws string ":" ws {val} ){{0,{ARRAY_MAX_ITEMS - 1}}} )? "}}"')
            return self.base("object")
        ordered = ordered_properties(s)
        req_kv: list[str] = []
        opt_kv: list[str] = []
        split_pair = _is_plain_string(props.get("owner")) and _is_plain_string(props.get("repo"))
        for k, v, req in ordered:
            if self.tight and not req and self._recursing(v):
                continue
            if split_pair and k in ("owner", "repo"):
                # value constraint: an owner/repo pair holds two path segments, never "owner/name" in one field
                self.base("char")
                val = self.add("segment", '"\\"" [^"\\\\/ \\x00-\\x1F]{1,100} "\\""')
            else:
                val = self.expr(v, f"{hint}-{k}", depth + 1)
            if not val:
                if req:
                    raise SchemaError(f"required property '{_short(k, 40)}' can never be satisfied")
                continue
            kv = f"{gbnf_literal(json.dumps(k, ensure_ascii=False))} \":\" ws {val}"
            (req_kv if req else opt_kv).append(kv)
        if not req_kv and not opt_kv:
            return self.add(hint + "-obj", '"{" "}"')
        if req_kv:
            body = ' "," ws '.join(req_kv)
            if opt_kv:
                body += " " + " ".join(f'( "," ws {kv} )?' for kv in opt_kv)
            return self.add(hint + "-obj", f'"{{" ws {body} "}}"')
        # only optional keys: any subset, in order, with correct commas (linear in the number of keys)
        n = len(opt_kv)
        rest_names = [self.new_rule(f"{hint}-rest") for _ in range(n)]
        for i in range(n):
            tail = f" {rest_names[i + 1]}" if i + 1 < n else ""
            self.rules[rest_names[i]] = f'( "," ws {opt_kv[i]} )?{tail}'
        starts = [f"{opt_kv[i]}{(' ' + rest_names[i + 1]) if i + 1 < n else ''}" for i in range(n)]
        first = self.add(hint + "-first", " | ".join(f"( {x} )" for x in starts))
        return self.add(hint + "-obj", f'"{{" ws {first}? "}}"')

    def _problem(self, text: str) -> None:
        if text not in self.problems:
            self.problems.append(text)

    def text(self, root_expr: str) -> str:
        lines = [f"root ::= {root_expr}"]
        lines += [f"{name} ::= {body}" for name, body in self.rules.items()]
        out = "\n".join(lines) + "\n"
        if len(out) > MAX_GRAMMAR_CHARS:
            raise SchemaError(f"grammar is {len(out)} characters, over the {MAX_GRAMMAR_CHARS} limit")
        return out


def grammar_of(name: str, schema: Any, tight: bool = False) -> tuple[str, list[str]]:
    """(GBNF text, problems) for a tool's input schema. Raises SchemaError with a one-line reason.

    tight=True gives the fallback grammar that arguments generation retries with when a first answer ran out of
    tokens: arrays of at most TIGHT_ARRAY_MAX_ITEMS items (or minItems), free-form objects empty, a recursive
    $ref reached again inside an array (or an optional key) cut to [] (or left out); the other keys stay (forbidding a
    key the model wants makes a small model fill the current value with junk instead)."""
    if isinstance(schema, bool):
        schema = {"type": "object"} if schema else {"not": {}}
    if not isinstance(schema, dict):
        raise SchemaError(f"input schema is a {type(schema).__name__}, not an object")
    b = _GrammarBuilder(schema, name, tight=tight)
    try:
        flat = _Normalizer(schema, b.budget)._flatten(schema, 0, ())
        if "$ref" in flat:
            flat = {"$ref": flat["$ref"]}
        types = _declared_types(flat) or _infer_types(flat)
        branches = flat.get("anyOf") if isinstance(flat.get("anyOf"), list) else None
        if types is not None and "object" not in types and branches is None:
            raise SchemaError(f"root schema is a {'/'.join(types)}, not an object (MCP arguments are an object)")
        if types is None and branches is None and "$ref" not in flat and "const" not in flat and "enum" not in flat:
            flat = {**flat, "type": "object"}  # {} at the root: any object
        elif types is not None and len(types) > 1:
            flat = {**flat, "type": "object"}
        root = b.expr(flat, "root")
        if not root:
            raise SchemaError("the schema accepts no object at all")
        text = b.text(root)
    except RecursionError:
        raise SchemaError("schema nested too deeply") from None
    return text, b.problems


ARRAY_MAX_ITEMS = 10  # default bound on generated arrays without maxItems (see Grammar.array)
TIGHT_ARRAY_MAX_ITEMS = 2  # the same in the fallback grammar (grammar_of(tight=True))


def with_string_limit(gbnf: str, max_chars: int) -> str:
    """The grammar with its default string bound (STRING_MAX_CHARS) lowered to `max_chars` (explicit maxLength
    rules keep theirs). The arguments stage bounds strings by the length of the text they can be copied from."""
    n = max(1, min(int(max_chars), STRING_MAX_CHARS))
    return gbnf.replace(f'string ::= "\\"" char{{0,{STRING_MAX_CHARS}}} "\\""',
                        f'string ::= "\\"" char{{0,{n}}} "\\""', 1)


def grammar(tool: Any) -> str:
    """GBNF grammar (root rule `root`) for the arguments object of a tool. Raises SchemaError (one line)."""
    _key, name, _desc, schema = _tool_parts(tool)
    return grammar_of(name, schema)[0]


# -------------------------------------------------------------------------------------------------- compile

_DOC_SECTION = re.compile(r"^[ \t]*(?:Args|Arguments|Parameters|Params)[ \t]*:[ \t]*$", re.M | re.I)
_DOC_SECTION_END = re.compile(r"^[ \t]*(?:Returns?|Raises|Yields?|Examples?|Notes?|Output)[ \t]*:", re.I)
_DOC_PARAM = re.compile(r"^([ \t]*)([A-Za-z_][A-Za-z0-9_]*)[ \t]*(?:\([^)]*\))?[ \t]*:[ \t]*(.*)$")


def docstring_parameters(description: Any) -> dict[str, str]:
    """Parameter descriptions written in the tool's description as a docstring section ("Args:" then
    "    radius: Search radius in meters (defaults to 500m)"), as servers built from Python docstrings send them
    while their schema's properties carry only a title. Continuation lines are joined; the section ends at the
    next section header ("Returns:") or at a line indented less than its first parameter."""
    if not isinstance(description, str):
        return {}
    m = _DOC_SECTION.search(description)
    if not m:
        return {}
    out: dict[str, str] = {}
    current, indent = None, None
    for line in description[m.end():].splitlines():
        if not line.strip():
            continue
        if _DOC_SECTION_END.match(line):
            break
        lead = len(line) - len(line.lstrip())
        p = _DOC_PARAM.match(line)
        if p and (indent is None or lead == indent):
            indent, current = lead, p.group(2)
            out[current] = p.group(3).strip()
        elif current is not None and indent is not None and lead > indent:
            out[current] = f"{out[current]} {line.strip()}".strip()
        else:
            break
    return {k: v for k, v in out.items() if v}


def with_docstring_descriptions(normalized: dict, description: Any) -> dict:
    """The normalized schema with each top-level property that has no description of its own described by the
    tool's docstring section (docstring_parameters): the prompt's signature then says "radius: Search radius in
    meters", and the post-processing reads the unit. Properties that have a description keep it."""
    params = docstring_parameters(description)
    props = normalized.get("properties") if isinstance(normalized, dict) else None
    if not params or not isinstance(props, dict):
        return normalized
    filled = {k: ({**v, "description": params[k]} if isinstance(v, dict) and not v.get("description") and k in params
                  else v) for k, v in props.items()}
    return {**normalized, "properties": filled}


def compile_tool(tool: Any) -> ToolSpec:
    """Normalize, sign and compile a tool. Never raises: a schema we cannot handle gives ok=False and a reason."""
    key, name, desc, schema = _tool_parts(tool)
    problems = list(getattr(tool, "problems", []) or [])
    original = schema if isinstance(schema, dict) else {}
    normalized: dict = {}
    sig = f"{name}()"
    described = sig
    gram: str | None = None
    ok = True
    try:
        if not isinstance(schema, dict):
            raise SchemaError(f"input schema is a {type(schema).__name__}, not an object")
        normalized, more = normalize_schema(schema)
        normalized = with_docstring_descriptions(normalized, desc)
        problems += [p for p in more if p not in problems]
        sig = signature_of(name, normalized)
        described = signature_of(name, normalized, descriptions=True, multiline=True)
    except SchemaError as e:
        problems.append(f"signature: {e.message}")
        ok = False
    except RecursionError:  # R12: a const/default/enum value nested deeper than the interpreter's stack renders
        problems.append("signature: schema nested too deeply")
        ok = False
    except Exception as e:  # a bug must not take the whole registry down; report it as a reason
        problems.append(f"signature: internal error {type(e).__name__}: {_short(e, 80)}")
        ok = False
    try:
        gram, more = grammar_of(name, schema)
        problems += [p for p in more if p not in problems]
    except SchemaError as e:
        problems.append(f"grammar: {e.message}")
        gram, ok = None, False
    except RecursionError:
        problems.append("grammar: schema nested too deeply")
        gram, ok = None, False
    except Exception as e:
        problems.append(f"grammar: internal error {type(e).__name__}: {_short(e, 80)}")
        gram, ok = None, False
    return ToolSpec(key=key, name=name, signature=sig, grammar=gram, schema=normalized, input_schema=original,
                    description=desc, problems=problems, ok=ok, described_signature=described)


# ------------------------------------------------------------------------------------------------ validation

def schema_validator(schema: Any):
    """A jsonschema validator for the original schema (declared draft if its meta-schema check passes, else the
    first of draft 2020-12/7/4 that accepts it, else the declared one), plus a problem line or None."""
    import jsonschema
    from jsonschema import validators

    if not isinstance(schema, dict):
        return None, "input schema is not an object"
    try:
        declared = validators.validator_for(schema, default=jsonschema.Draft7Validator)
    except Exception:  # found by the schema fuzzer: a "$schema" that is not a string
        declared = jsonschema.Draft7Validator
    for cls in (declared, jsonschema.Draft202012Validator, jsonschema.Draft7Validator, jsonschema.Draft4Validator):
        try:
            cls.check_schema(schema)
        except Exception:
            continue
        note = None if cls is declared else f"schema fails its declared meta-schema; validated as {cls.__name__}"
        return cls(schema), note
    return declared(schema), "schema fails every meta-schema check; validated best-effort"


def validate_arguments(schema: Any, args: Any) -> list[str]:
    """One line per way `args` fails the original schema (empty list = valid)."""
    validator, _note = schema_validator(schema)
    if validator is None:
        return ["input schema is not an object"]
    try:
        errors = sorted(validator.iter_errors(args), key=lambda e: list(e.absolute_path))
    except Exception as e:  # an unusable schema (bad $ref, bad keyword type) must be reported, not crash
        return [f"schema cannot be checked: {type(e).__name__}: {_short(e, 100)}"]
    out = []
    for e in errors[:10]:
        where = "/".join(str(p) for p in e.absolute_path) or "(root)"
        out.append(f"{where}: {_short(e.message, 120)}")
    return out
