"""Schema → normalized schema / signature / GBNF grammar, on tricky hand-written schemas and on all 955 real tools."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest
from gbnf_match import Grammar

from nexus_cli.errors import SchemaError
from nexus_cli.registry import Tool, load_registries
from nexus_cli.schema import (
    STRING_MAX_CHARS,
    compile_tool,
    gbnf_literal,
    grammar,
    normalize_schema,
    signature,
    validate_arguments,
)

ROOT = Path(__file__).resolve().parent.parent
REGISTRIES = ROOT.parent / "shared" / "registries"


def tool(schema, name="t", description="") -> Tool:
    return Tool(server="s", name=name, description=description, input_schema=schema)


def dumps(obj) -> str:
    """The JSON text shape the grammar admits: `{"a": 1, "b": [1, 2]}` (one optional space after ':' and ',')."""
    return json.dumps(obj, ensure_ascii=False, separators=(", ", ": "))


def accepts(schema, obj) -> bool:
    return Grammar(grammar(tool(schema))).accepts(dumps(obj))


# ------------------------------------------------------------------------------------------------ signatures

def test_signature_required_first_and_optional_marked():
    s = {"type": "object", "properties": {"private": {"type": "boolean"}, "name": {"type": "string"}},
         "required": ["name"]}
    assert signature(tool(s, "create_repository")) == "create_repository(name: string, private?: boolean)"


def test_signature_enums_arrays_nested():
    s = {"type": "object", "properties": {
        "state": {"type": "string", "enum": ["open", "closed", "all"]},
        "labels": {"type": "array", "items": {"type": "string"}},
        "head": {"type": "object", "properties": {"ref": {"type": "string"}, "sha": {"type": "string"}},
                 "required": ["ref"]},
        "n": {"type": ["integer", "null"]},
    }}
    assert signature(tool(s, "f")) == 'f(state?: "open"|"closed"|"all", labels?: string[], head?: {ref: string, sha?: string}, n?: integer)'


def test_signature_descriptions_truncated_and_budget():
    long = "The owner of the repository. " + "word " * 200
    s = {"type": "object", "properties": {"owner": {"type": "string", "description": long},
                                          "x": {"type": "string", "description": "Another thing entirely here."}},
         "required": ["owner"]}
    full = signature(tool(s, "f"), descriptions=True)
    assert "/* The owner of the repository */" in full and len(full) < 120
    short = signature(tool(s, "f"), descriptions=True, budget_chars=60)
    assert "Another" not in short and "owner" in short  # optional descriptions dropped first
    multi = signature(tool(s, "f"), descriptions=True, multiline=True)
    assert multi.splitlines()[1] == "  owner: string,  // The owner of the repository"


def test_huge_description_is_truncated_not_copied():
    s = {"type": "object", "properties": {"q": {"type": "string", "description": "x" * 100_000}}}
    spec = compile_tool(tool(s))
    assert spec.ok and len(spec.described_signature) < 200


# ------------------------------------------------------------------------------------------------ normalization

def test_refs_resolved_and_cycles_reported():
    s = {"type": "object", "$defs": {"node": {"type": "object", "properties": {
        "name": {"type": "string"}, "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
        "required": ["name"]}},
        "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}
    norm, problems = normalize_schema(s)
    assert norm["properties"]["root"]["properties"]["name"] == {"type": "string"}
    assert any("recursive $ref" in p for p in problems)
    spec = compile_tool(tool(s))
    assert spec.ok, spec.problems  # a recursive schema is a recursive grammar rule, not a failure
    g = Grammar(spec.grammar)
    tree = {"root": {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}}
    assert g.accepts(dumps(tree))
    assert not g.accepts(dumps({"root": {"children": []}}))  # name is required at every level


def test_pure_ref_cycle_is_a_stated_reason():
    s = {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}},
         "$defs": {"x": {"$ref": "#/$defs/y"}, "y": {"$ref": "#/$defs/x"}}}
    spec = compile_tool(tool(s))
    assert not spec.ok and spec.grammar is None
    assert any("cycle" in p for p in spec.problems)
    with pytest.raises(SchemaError, match="cycle"):
        grammar(tool(s))


def test_dangling_and_remote_refs_are_reasons():
    for ref in ("#/$defs/missing", "https://example.com/schema.json", "#anchor"):
        spec = compile_tool(tool({"type": "object", "properties": {"a": {"$ref": ref}}}))
        assert not spec.ok and any("$ref" in p for p in spec.problems), (ref, spec.problems)


def test_missing_type_inferred():
    s = {"properties": {"a": {"properties": {"b": {"enum": [1, 2]}}}, "c": {"items": {"type": "string"}},
                        "d": {"minimum": 0}, "e": {"pattern": "^x"}}}
    norm, _ = normalize_schema(s)
    assert norm["type"] == "object"
    assert norm["properties"]["a"]["type"] == "object"
    assert norm["properties"]["a"]["properties"]["b"]["type"] == "integer"
    assert norm["properties"]["c"]["type"] == "array"
    assert norm["properties"]["d"]["type"] == "number"
    assert norm["properties"]["e"]["type"] == "string"
    assert accepts(s, {"a": {"b": 2}, "c": ["x"], "d": 3, "e": "xy"})
    assert not accepts(s, {"a": {"b": 3}})


def test_allof_merged():
    s = {"type": "object", "allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                                     {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    assert signature(tool(s, "f")) == "f(a: string, b: integer)"
    assert accepts(s, {"a": "x", "b": 1})
    assert not accepts(s, {"a": "x"})


def test_anyof_oneof_alternatives_and_nullable():
    s = {"type": "object", "properties": {
        "key": {"oneOf": [{"type": "string"}, {"type": "array", "items": {"type": "string"}}]},
        "n": {"anyOf": [{"type": "number"}, {"not": {}}, {"type": "null"}]},
        "t": {"type": ["string", "null"]}}, "required": ["key"]}
    assert signature(tool(s, "f")) == "f(key: string|string[], n?: number, t?: string)"
    for ok in ({"key": "a"}, {"key": ["a", "b"]}, {"key": "a", "n": None}, {"key": "a", "n": -1.5, "t": None}):
        assert accepts(s, ok), ok
    assert not accepts(s, {"key": 1})
    assert not accepts(s, {"n": 1})


def test_enum_const_and_escaping():
    s = {"type": "object", "properties": {"q": {"enum": ['say "hi"', "back\\slash", "line\nbreak", "中文", 3, None]},
                                          "k": {"const": "fixed"}}, "required": ["k"]}
    for v in ['say "hi"', "back\\slash", "line\nbreak", "中文", 3, None]:
        assert accepts(s, {"k": "fixed", "q": v}), v
    assert not accepts(s, {"k": "other"})
    assert not accepts(s, {"k": "fixed", "q": "say hi"})
    assert gbnf_literal('a"b\\c\n') == '"a\\"b\\\\c\\n"'


def test_optional_keys_any_subset_in_order_closed_object():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}, "c": {"type": "string"}},
         "additionalProperties": True}
    g = Grammar(grammar(tool(s)))
    for obj in ({}, {"a": 1}, {"b": True}, {"c": "x"}, {"a": 1, "c": "x"}, {"b": False, "c": ""}, {"a": 0, "b": True, "c": "z"}):
        assert g.accepts(dumps(obj)), obj
    assert not g.accepts(dumps({"c": "x", "a": 1}))  # schema order only
    assert not g.accepts(dumps({"a": 1, "zz": 2}))  # closed: additionalProperties ignored
    assert not g.accepts('{"a": 1,}')
    assert not g.accepts('{, "a": 1}')


def test_strings_bounded_numbers_signed():
    s = {"type": "object", "properties": {"s": {"type": "string"}, "short": {"type": "string", "maxLength": 3},
                                          "u": {"type": "integer", "minimum": 0}, "i": {"type": "integer"},
                                          "x": {"type": "number"}}}
    g = Grammar(grammar(tool(s)))
    assert g.accepts(dumps({"s": "y" * STRING_MAX_CHARS}))
    assert not g.accepts(dumps({"s": "y" * (STRING_MAX_CHARS + 1)}))
    assert g.accepts(dumps({"short": "abc"})) and not g.accepts(dumps({"short": "abcd"}))
    assert g.accepts(dumps({"u": 12})) and not g.accepts(dumps({"u": -1}))
    assert g.accepts(dumps({"i": -12, "x": -0.25}))
    assert not g.accepts(dumps({"i": 1.5}))
    assert g.accepts(dumps({"s": 'quote " and \\ and \n'}))


def test_map_objects_and_empty_schemas():
    s = {"type": "object", "properties": {"data": {"type": "object", "additionalProperties": {"type": "string"}},
                                          "anything": {}, "closed": {"type": "object", "additionalProperties": False}}}
    g = Grammar(grammar(tool(s)))
    assert g.accepts(dumps({"data": {"text/plain": "hi", "x": "y"}, "anything": [1, {"a": None}], "closed": {}}))
    assert not g.accepts(dumps({"data": {"a": 1}}))
    assert Grammar(grammar(tool({}))).accepts(dumps({"free": [1, "x"]}))


def test_declared_empty_properties_admit_only_the_empty_object():
    # the MCP idiom for "no arguments": anything the model wrote would be invented (SmolLM2 nested {"env": {"env":
    # ... until max_tokens on such tools before this rule)
    g = Grammar(grammar(tool({"type": "object", "properties": {}})))
    assert g.accepts("{}")
    assert not g.accepts(dumps({"env": 1}))
    # an explicit additionalProperties keeps the map open
    assert accepts({"type": "object", "properties": {}, "additionalProperties": {"type": "integer"}}, {"a": 1})


def test_free_form_values_are_bounded_in_depth_and_width():
    g = Grammar(grammar(tool({"type": "object", "properties": {"x": {}}})))
    assert g.accepts(dumps({"x": {"a": {"b": 1}, "c": [1, "2", None]}}))  # three levels
    assert not g.accepts(dumps({"x": {"a": {"b": {"c": 1}}}}))  # a fourth level
    assert g.accepts(dumps({"x": list(range(10))}))
    assert not g.accepts(dumps({"x": list(range(11))}))


def test_tight_grammar_has_short_arrays_and_empty_free_form_objects():
    from nexus_cli.schema import TIGHT_ARRAY_MAX_ITEMS, grammar_of

    s = {"type": "object", "properties": {"path": {"type": "string"}, "dry": {"type": "boolean"},
                                          "edits": {"type": "array", "items": {"type": "string"}},
                                          "meta": {"type": "object"}},
         "required": ["path", "edits"]}
    text, _ = grammar_of("t", s, tight=True)
    g = Grammar(text)
    assert g.accepts(dumps({"path": "a", "edits": ["x"] * TIGHT_ARRAY_MAX_ITEMS}))
    assert not g.accepts(dumps({"path": "a", "edits": ["x"] * (TIGHT_ARRAY_MAX_ITEMS + 1)}))
    assert g.accepts(dumps({"path": "a", "edits": [], "dry": True, "meta": {}}))  # optional keys stay
    assert not g.accepts(dumps({"path": "a", "edits": [], "meta": {"k": 1}}))  # free-form objects are empty
    assert Grammar(grammar(tool(s))).accepts(dumps({"path": "a", "edits": [], "meta": {"k": 1}}))


def test_tight_grammar_cuts_recursion():
    from nexus_cli.schema import grammar_of

    node = {"type": "object", "properties": {"name": {"type": "string"},
                                            "children": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
            "required": ["name"]}
    s = {"type": "object", "$defs": {"node": node}, "properties": {"root": {"$ref": "#/$defs/node"}}, "required": ["root"]}
    deep = {"root": {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}}
    assert Grammar(grammar(tool(s))).accepts(dumps(deep))
    g = Grammar(grammar_of("t", s, tight=True)[0])
    assert g.accepts(dumps({"root": {"name": "a", "children": []}}))
    assert not g.accepts(dumps({"root": {"name": "a", "children": [{"name": "b"}]}}))


def test_non_object_root_and_invalid_schemas_are_reasons_never_crashes():
    bad_inputs = [
        {"type": "string"}, {"type": "array", "items": {}}, [], "x", 3, None, False,
        {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"], "allOf": [{"properties": {"a": {"type": "string"}}}]},
        {"type": "object", "properties": {"a": False}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"enum": []}}, "required": ["a"]},
        {"type": "object", "properties": {"a": {"type": "string", "minLength": 5, "maxLength": 2}}, "required": ["a"]},
    ]
    for schema in bad_inputs:
        t = Tool(server="s", name="t", description="", input_schema=schema)  # type: ignore[arg-type]
        spec = compile_tool(t)
        assert not spec.ok and spec.problems and spec.grammar is None, (schema, spec.problems)
        assert all("internal error" not in p for p in spec.problems), spec.problems


def test_odd_but_usable_schemas_compile():
    odd = [
        {"type": "object", "properties": {"a": {"type": 5}, "b": {"enum": "x"}, "c": [1], "d": {"type": ["bogus"]}},
         "required": "a"},
        {"type": "object", "properties": {"p": {"type": "array", "items": [{"type": "string"}, {"type": "integer"}]}}},
        {"type": "object", "properties": {"n": {"type": "number", "exclusiveMinimum": True, "minimum": 0}}},
        {"type": ["object", "null"], "properties": {"a": {"type": "string"}}},
        {"$ref": "#/$defs/args", "$defs": {"args": {"type": "object", "properties": {"z": {"type": "boolean"}}}}},
        {"type": "object", "properties": {"weird key \" \\ é": {"type": "string"}}},
    ]
    for schema in odd:
        spec = compile_tool(tool(schema))
        assert spec.ok and spec.grammar, (schema, spec.problems)
        Grammar(spec.grammar)  # parses
    g = Grammar(compile_tool(tool(odd[-1])).grammar)
    assert g.accepts(dumps({"weird key \" \\ é": "v"}))


def test_deep_and_fuzzy_inputs_never_crash():
    deep: dict = {"type": "object"}
    cur = deep
    for _ in range(5000):
        nxt: dict = {"type": "object"}
        cur["properties"] = {"x": nxt}
        cur = nxt
    junk = [deep, {"properties": {"a": {"anyOf": "x", "oneOf": [None, 3], "allOf": [True, False]}}},
            {"$ref": 3}, {"$ref": "#/properties/a", "properties": {"a": {"$ref": "#"}}},
            {"properties": {"a": {"items": {"items": {"$ref": "#/properties/a"}}}}},
            {"type": "object", "properties": {"n": {"type": "number", "minimum": float("inf")}}},
            {"type": "object", "properties": {"e": {"enum": [float("nan"), {"a": [1]}, [1, 2]]}}}]
    for schema in junk:
        spec = compile_tool(tool(schema))
        assert isinstance(spec.ok, bool)
        assert all("internal error" not in p for p in spec.problems), spec.problems


def test_validate_arguments_reports_errors():
    s = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert validate_arguments(s, {"n": 1}) == []
    errs = validate_arguments(s, {"n": "x"})
    assert errs and errs[0].startswith("n: ")
    assert validate_arguments(s, {}) and "required" in validate_arguments(s, {})[0]
    # a schema that fails its meta-schema (draft-4 exclusiveMinimum: true inside items) is still checked
    s4 = {"type": "object", "properties": {"pages": {"type": "array", "items": {"type": "integer", "minimum": 1,
                                                                                "exclusiveMinimum": True}}}}
    assert validate_arguments(s4, {"pages": [2]}) == []


# ------------------------------------------------------------------------------------------------ all real tools

def _real_tools():
    if not REGISTRIES.is_dir():
        pytest.skip(f"registries not found at {REGISTRIES}")
    return load_registries([REGISTRIES])


_FORMATS = {"uri": "https://example.com/x", "url": "https://example.com/x", "date-time": "2024-01-02T03:04:05Z",
            "date": "2024-01-02", "email": "a@example.com", "uuid": "123e4567-e89b-12d3-a456-426614174000",
            "time": "03:04:05Z", "uri-reference": "/x"}


def example(s, full: bool, depth: int = 0):
    """A plausible instance of a normalized schema (required keys only, or every key when full)."""
    if not isinstance(s, dict) or depth > 6 or "$ref" in s:
        return {} if isinstance(s, dict) and "$ref" in s else "x"
    if "const" in s:
        return s["const"]
    if isinstance(s.get("enum"), list) and s["enum"]:
        return s["enum"][-1 if full else 0]
    if isinstance(s.get("anyOf"), list) and s["anyOf"]:
        non_null = [b for b in s["anyOf"] if not (isinstance(b, dict) and b.get("type") == "null")] or s["anyOf"]
        return example(non_null[-1 if full else 0], full, depth + 1)
    t = s.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), t[0] if t else None)
    if t == "object" or (t is None and "properties" in s):
        props = s.get("properties", {})
        req = s.get("required", [])
        keys = [k for k in props if k in req] + [k for k in req if k not in props]  # grammar order: required first
        keys += [k for k in props if full and k not in req]
        return {k: example(props.get(k, {}), full, depth + 1) for k in keys}
    if t == "array":
        n = max(s.get("minItems", 0) if isinstance(s.get("minItems"), int) else 0, 1 if full else 0)
        return [example(s.get("items", {}), full, depth + 1) for _ in range(min(n, 3))]
    if t == "string":
        if s.get("format") in _FORMATS:
            return _FORMATS[s["format"]]
        n = max(s.get("minLength", 0) if isinstance(s.get("minLength"), int) else 0, 3)
        return ("abc" * n)[:n]
    if t in ("integer", "number"):
        lo = s.get("minimum")
        hi = s.get("maximum")
        v = lo if isinstance(lo, (int, float)) and not isinstance(lo, bool) else 1
        if isinstance(s.get("exclusiveMinimum"), (int, float)) and not isinstance(s.get("exclusiveMinimum"), bool):
            v = max(v, s["exclusiveMinimum"] + 1)
        if isinstance(hi, (int, float)) and not isinstance(hi, bool) and v > hi:
            v = hi
        return int(v) if t == "integer" else (v + 0.5 if (not isinstance(hi, (int, float)) or v + 0.5 <= hi) else v)
    if t == "boolean":
        return True
    if t == "null":
        return None
    return "x"


def test_all_real_tools_yield_signature_and_grammar_or_reason():
    tools = _real_tools()
    assert len(tools) == 955
    specs = [compile_tool(t) for t in tools]
    failed = [(s.key, s.problems) for s in specs if not s.ok]
    for s in specs:
        assert s.signature.startswith(s.name + "(")
        if not s.ok:
            assert s.problems  # a stated reason
    assert not failed, failed[:5]  # every real schema compiles today
    lengths = sorted(len(s.signature) for s in specs)
    print(f"\nsignature chars: median {statistics.median(lengths)}, p99 {lengths[int(0.99 * len(lengths))]}")


def test_real_grammars_parse_and_accept_valid_examples():
    tools = _real_tools()
    checked = accepted = 0
    rejected = []
    for t in tools:
        spec = compile_tool(t)
        g = Grammar(spec.grammar)  # syntax (llama.cpp's own parser: tests/test_arguments.py)
        for full in (False, True):
            obj = example(spec.schema, full)
            if validate_arguments(t.input_schema, obj):
                continue  # our toy example generator cannot satisfy this schema (pattern etc.): not a grammar test
            checked += 1
            if g.accepts(dumps(obj)):
                accepted += 1
            else:
                rejected.append((spec.key, dumps(obj)[:200]))
    print(f"\nexamples valid against the schema: {checked}, accepted by the grammar: {accepted}")
    assert checked >= 1700
    assert not rejected, rejected[:5]


def test_regression_r8_required_list_holding_a_dict_is_not_an_internal_error():
    """Found by fuzz/schema_fuzz.py (fuzz/regressions/schema/schema-R8-*): allOf merging of `required` lists that
    hold a non-string must not raise TypeError inside the normalizer."""
    from nexus_cli.schema import compile_tool

    schema = {"type": "object", "properties": {"a": {"type": "string"}},
              "allOf": [{"required": ["a", {"x": 1}]}, {"required": [{"y": 2}, "a"]}]}
    spec = compile_tool({"name": "t", "inputSchema": schema})
    assert not any("internal error" in p for p in spec.problems), spec.problems


def test_regression_r9_unicode_line_separator_is_escaped_in_grammar_literals():
    """Found by fuzz/schema_fuzz.py (fuzz/regressions/schema/schema-R9-*): U+2028 inside an enum/const literal must be
    escaped, so every grammar rule stays on one line."""
    from nexus_cli.schema import compile_tool, gbnf_literal

    assert gbnf_literal("a\u2028b\x85c") == '"a\\u2028b\\u0085c"'
    spec = compile_tool({"name": "t", "inputSchema": {"type": "object", "properties": {
        "k": {"const": "x\u2028y"}}, "required": ["k"]}})
    assert spec.ok and "\u2028" not in spec.grammar


def test_regression_r10_self_referencing_allof_expansion_is_bounded():
    """Found by fuzz/schema_fuzz.py (fuzz/regressions/schema/schema-R10-*, a libFuzzer timeout): allOf branches that
    each $ref the root doubled their merged allOf lists at every expansion (a 400-byte schema, exponential work).
    The expansion now has a budget; the tool is refused with the reason. The alarm turns a regression into a
    failure instead of a hung suite."""
    import signal

    from nexus_cli.schema import MAX_EXPANSION_STEPS, compile_tool

    me = {"type": "object", "properties": {"me": {"$ref": "#"}}}
    schema = {"type": "object", "properties": {}, "additionalProperties": False,
              "allOf": [me, me, {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}]}
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("expansion not bounded")))
    signal.alarm(60)
    try:
        spec = compile_tool({"name": "t", "inputSchema": schema})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not spec.ok and spec.grammar is None
    assert any(f"needs over {MAX_EXPANSION_STEPS} steps" in p for p in spec.problems), spec.problems


def test_regression_r11_wide_merges_are_charged_by_their_width():
    """Found by fuzz/schema_fuzz.py (fuzz/regressions/schema/schema-R11-*, a timeout): R10's shape with a thousand
    properties under the self-reference made each merge copy a thousand keys, so 20,000 plain expansion steps took
    12 s. Merges now charge the budget by the number of keys they copy; the tool is refused with the reason."""
    import signal

    from nexus_cli.schema import compile_tool

    wide = {f"p{i}": {"type": "object"} for i in range(1000)}
    schema = {"type": "object", "allOf": [{"type": "object", "properties": {"me": {"$ref": "#"}}},
                                          {"type": "object", "properties": {"me": {"$ref": "#", "properties": wide}}}]}
    old = signal.signal(signal.SIGALRM, lambda *a: (_ for _ in ()).throw(TimeoutError("expansion not bounded")))
    signal.alarm(60)
    try:
        spec = compile_tool({"name": "t", "inputSchema": schema})
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    assert not spec.ok and any("schema too complex" in p for p in spec.problems), spec.problems


def test_expansion_budget_counts_the_keys_a_merge_copies(monkeypatch):
    from nexus_cli import schema as schema_mod

    monkeypatch.setattr(schema_mod, "MAX_EXPANSION_STEPS", 500)

    def merged(n):
        props = {f"p{i}": {"type": "string"} for i in range(n)}
        return {"name": "t", "inputSchema": {"type": "object", "allOf": [{"properties": props}, {"required": ["p0"]}]}}

    assert schema_mod.compile_tool(merged(100)).ok  # ~100 steps (one per property) + ~200 keys copied
    wide = schema_mod.compile_tool(merged(300))  # ~300 steps: within 500, but 600 more for the keys copied
    assert not wide.ok and any("schema too complex" in p for p in wide.problems), wide.problems


def test_regression_r12_deeply_nested_value_is_a_reason_not_an_internal_error():
    """Found by fuzz/schema_fuzz.py (fuzz/regressions/schema/schema-R12-*): a const nested thousands deep passed the
    normalizer (values are copied, not walked) and blew the stack when the signature rendered it."""
    from nexus_cli.schema import compile_tool

    deep: object = "x"
    for _ in range(5000):
        deep = [deep]
    spec = compile_tool({"name": "t", "inputSchema": {"type": "object", "properties": {"k": {"const": deep}}}})
    assert not any("internal error" in p for p in spec.problems), spec.problems
    assert not spec.ok and any("nested too deeply" in p for p in spec.problems), spec.problems


def test_string_patterns_are_enforced_by_the_grammar():
    """The subset real schemas use (the 955 tools hold 4 distinct patterns): a whois ASN, label selectors, a set of
    flag letters. The 955-tool argument run found SmolLM2 writing "1234567890" for ^AS\\d+$ before this."""
    import re

    from nexus_cli.schema import pattern_gbnf

    cases = {r"^AS\d+$": (["AS1", "AS65000"], ["1234", "AS", "as1"]),
             r"^[GDZTKOFS]*$": (["", "GDZ"], ["X"]),
             r"^[.\-A-Za-z0-9]+([=!,]{1,2}[./\-A-Za-z0-9]+)+$": (["app=web", "a!=b,c=d"], ["app", "=x"]),
             # a group around one class repeats as the class does (it was cut at four characters: "app=")
             r"^([/_.\-A-Za-z0-9=, ()!])+$": (["app=cart-svc", "app.kubernetes.io/name=cart-svc,tier in (web)"],
                                              ["", "app:x"]),
             r"^(?:yes|no)-[^ ]?$": (["yes-", "no-x"], ["maybe-", "yes- "])}
    for pat, (good, bad) in cases.items():
        g = Grammar(grammar(tool({"type": "object", "properties": {"v": {"type": "string", "pattern": pat}},
                                  "required": ["v"]})))
        for x in good:
            assert re.search(pat, x) and g.accepts(dumps({"v": x})), (pat, x)
        for x in bad:
            assert not g.accepts(dumps({"v": x})), (pat, x)
    # unsupported (unanchored, lookahead, backreference): the string stays plain and the tool says so
    for pat in ("AS\\d+", "^(?=a)a$", "^(a)\\1$"):
        assert pattern_gbnf(pat) is None
        spec = compile_tool(tool({"type": "object", "properties": {"v": {"type": "string", "pattern": pat}}}))
        assert spec.ok and any("pattern" in p for p in spec.problems)


def test_parameters_documented_in_the_tool_description_describe_bare_properties():
    from nexus_cli.schema import compile_tool as compile_one
    from nexus_cli.schema import docstring_parameters

    desc = """Find schools near a point.

    Args:
        latitude: Center point latitude (decimal degrees)
        radius (float): Search radius in meters
            (defaults to 2000m)
        levels: Levels to keep

    Returns:
        A list of schools
    """
    assert docstring_parameters(desc) == {"latitude": "Center point latitude (decimal degrees)",
                                          "radius": "Search radius in meters (defaults to 2000m)",
                                          "levels": "Levels to keep"}
    assert docstring_parameters("No sections here. radius: 5") == {}
    tool = Tool(server="osm", name="find_schools", description=desc, input_schema={"type": "object", "properties": {
        "latitude": {"type": "number", "title": "Latitude"}, "radius": {"type": "number"},
        "levels": {"type": "array", "items": {"type": "string"}, "description": "Which levels"}}})
    spec = compile_one(tool)
    props = spec.schema["properties"]
    # bare properties take the docstring's text; one with its own description keeps it
    assert props["radius"]["description"].startswith("Search radius in meters")
    assert props["levels"]["description"] == "Which levels"
    assert "radius?: number,  // Search radius in meters" in spec.described_signature
    assert "description" not in spec.input_schema["properties"]["radius"]  # the server's schema is not touched
