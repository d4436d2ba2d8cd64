"""atheris target: registry listing / tool schema -> signature + GBNF grammar (nexus_cli.registry, nexus_cli.schema).

An input is either
  * JSON text (it starts with '{', '[' or whitespace): written to a file and read through registry.load_file (the
    real path: size, UTF-8, JSON, tools/list shape), then every tool compiled; or
  * anything else: a driver for structured mutations (atheris.FuzzedDataProvider) of a schema picked from a pool
    (the seed corpus plus every tool of ../shared/registries when present): swap in random JSON, unknown or listed
    types, $ref to real, missing, remote and self-referencing pointers (cycles), allOf/anyOf/oneOf wrappers, deep
    nesting, huge descriptions, odd property names, odd `required`, odd numeric bounds; the result is compiled.

Allowed outcomes: a NexusError subclass from the registry layer (FormatError for a bad file), or a ToolSpec.
Crashes (atheris reports them, with the input saved): any other exception; compile_tool raising at all (it is
documented never to raise); a ToolSpec whose problems contain "internal error" (an exception compile_tool caught);
a ToolSpec with no grammar and no stated reason; a grammar the reference GBNF parser (tests/gbnf_match.py) rejects or
that is over the size limit; validate_arguments raising.

Run: ../.venv/bin/python schema_fuzz.py corpus-work/schema corpus/schema -runs=100000 (see the Makefile).
"""

from __future__ import annotations

import copy
import json
import os
import sys
import tempfile
import zlib
from pathlib import Path

import atheris

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

with atheris.instrument_imports(include=["nexus_cli"]):
    from nexus_cli import registry, schema
    from nexus_cli.errors import NexusError

from gbnf_match import Grammar  # noqa: E402  (the tests' reference parser; not instrumented)

_TMP = Path(tempfile.mkdtemp(prefix="nexus-schema-fuzz-", dir="/dev/shm" if os.path.isdir("/dev/shm") else None))
_FILE = _TMP / "registry.json"


# ---------------------------------------------------------------- the pool of real shapes

def _load_pool() -> list:
    pool: list = []
    dirs = [HERE / "corpus" / "schema"]
    shared = ROOT.parent / "shared" / "registries"
    if shared.is_dir() and os.environ.get("NEXUS_FUZZ_NO_SHARED") != "1":
        dirs.append(shared)
    for d in dirs:
        for f in sorted(d.rglob("*.json")):
            try:
                data = json.loads(f.read_text(encoding="utf-8"))
            except (OSError, ValueError):
                continue
            tools = data.get("tools") if isinstance(data, dict) else data
            for t in tools if isinstance(tools, list) else []:
                if isinstance(t, dict) and isinstance(t.get("inputSchema"), dict):
                    pool.append(t["inputSchema"])
    return pool or [{"type": "object", "properties": {}}]


# Small and medium real schemas only: the mutations make them large enough, and a 5 KB root costs 10x per run.
POOL = [s for s in _load_pool() if len(json.dumps(s)) <= 2500]

TYPES = ["object", "array", "string", "integer", "number", "boolean", "null", "widget", "", "Object", "any",
         "tuple", "int", "float"]
REFS = ["#", "#/", "#/$defs/a", "#/$defs/missing", "#/definitions/node", "#/properties", "#/properties/x",
        "#/properties/x/items", "#/anyOf/0", "#/allOf/5", "#/$defs/a~1b", "#/$defs/a~0b", "#anchor",
        "https://example.com/schema.json", "other.json#/x", "#/$defs/%25", "#/items/0", "#/type", ""]
KEYWORDS = ["type", "properties", "required", "items", "prefixItems", "additionalProperties", "anyOf", "oneOf",
            "allOf", "not", "enum", "const", "$ref", "$defs", "definitions", "description", "title", "default",
            "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength",
            "pattern", "format", "minItems", "maxItems", "uniqueItems", "minProperties", "maxProperties",
            "patternProperties", "propertyNames", "if", "then", "else", "dependentRequired", "examples"]
NAMES = ["x", "a", "b", "owner", "repo", "", " ", "a\"b", "back\\slash", "new\nline", "tab\there", "ünï", "日本",
         "$ref", "type", "root", "root-x", "-", "1", "a" * 200, "\u0000", "\ud7ff", "emoji\U0001F600"]


def _scalar(fdp):
    k = fdp.ConsumeIntInRange(0, 9)
    if k == 0:
        return None
    if k == 1:
        return fdp.ConsumeBool()
    if k == 2:
        return fdp.ConsumeInt(8)
    if k == 3:
        return fdp.ConsumeRegularFloat()
    if k == 4:
        return fdp.PickValueInList([float("nan"), float("inf"), -float("inf"), 1e308, -0.0, 2**63, -(2**70)])
    if k == 5:
        return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 24))
    if k == 6:
        return fdp.PickValueInList(TYPES)
    if k == 7:
        return fdp.PickValueInList(NAMES)
    if k == 8:
        return fdp.PickValueInList(REFS)
    return fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 4))


def _value(fdp, depth=0):
    k = fdp.ConsumeIntInRange(0, 5 if depth < 4 else 1)
    if k <= 1:
        return _scalar(fdp)
    if k == 2:
        return [_value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))]
    if k == 3:
        return copy.deepcopy(fdp.PickValueInList(POOL))
    return {fdp.PickValueInList(KEYWORDS + NAMES): _value(fdp, depth + 1) for _ in range(fdp.ConsumeIntInRange(0, 4))}


def _nodes(root):
    """Every dict in the tree with a path to it (the root first)."""
    out, stack = [], [root]
    while stack and len(out) < 4000:
        x = stack.pop()
        if isinstance(x, dict):
            out.append(x)
            stack.extend(x.values())
        elif isinstance(x, list):
            stack.extend(x)
    return out


def _props(node: dict) -> list:
    p = node.get("properties")
    return list(p) if isinstance(p, dict) else []


def _mutate(fdp, root: dict) -> dict:
    nodes = _nodes(root)
    for step in range(fdp.ConsumeIntInRange(1, 8)):
        if step:
            nodes = _nodes(root) if len(nodes) < 64 else nodes + _nodes(node)
        node = fdp.PickValueInList(nodes)
        op = fdp.ConsumeIntInRange(0, 17)
        if op == 0:  # a random keyword gets a random value
            node[fdp.PickValueInList(KEYWORDS)] = _value(fdp)
        elif op == 1:  # type: known, unknown, a list, a non-string
            node["type"] = fdp.PickValueInList([fdp.PickValueInList(TYPES), [fdp.PickValueInList(TYPES),
                                                                            fdp.PickValueInList(TYPES)], 3, None, []])
        elif op == 2:  # a $ref anywhere, possibly to itself (a cycle)
            node["$ref"] = fdp.PickValueInList(REFS)
        elif op == 3:  # definitions that refer to each other
            defs = node.setdefault("$defs", {}) if isinstance(node.get("$defs", {}), dict) else {}
            defs["a"] = {"$ref": "#/$defs/b"} if fdp.ConsumeBool() else {"type": "object", "properties": {
                "next": {"$ref": "#/$defs/a"}}}
            defs["b"] = {"anyOf": [{"$ref": "#/$defs/a"}, {"type": "string"}]}
            node["$ref"] = "#/$defs/" + fdp.PickValueInList(["a", "b"])
        elif op == 4:  # combinators around the node or another real schema
            kw = fdp.PickValueInList(["allOf", "anyOf", "oneOf"])
            node[kw] = [copy.deepcopy(fdp.PickValueInList(POOL)) if fdp.ConsumeBool() else _value(fdp)
                        for _ in range(fdp.ConsumeIntInRange(0, 3))]
        elif op == 5:  # deep nesting: beyond MAX_DEPTH and near the recursion limit
            inner: object = dict(node)
            # past MAX_DEPTH (48) is what matters; near the recursion limit now and then (costly, so rarely)
            depth = 600 if fdp.ConsumeIntInRange(0, 15) == 0 else fdp.ConsumeIntInRange(1, 64)
            for _ in range(depth):
                inner = {"type": "object", "properties": {"n": inner}, "required": ["n"]}
            node.clear()
            node.update(inner)
        elif op == 6:  # enormous descriptions and titles
            n = fdp.ConsumeIntInRange(0, 50_000)
            node["description"] = ("lorem ipsum " * (n // 12 + 1))[:n]
            if fdp.ConsumeBool():
                node["title"] = "T" * fdp.ConsumeIntInRange(0, 5000)
        elif op == 7:  # odd property names
            props = node.get("properties")
            if not isinstance(props, dict):
                props = node["properties"] = {}
            props[fdp.PickValueInList(NAMES)] = _value(fdp)
        elif op == 8:  # odd required lists
            node["required"] = fdp.PickValueInList([[fdp.PickValueInList(NAMES)], ["x", "x"], [1, None], "x", {},
                                                    [*_props(node), *_props(node)]])
        elif op == 9:  # odd numeric / length bounds
            node[fdp.PickValueInList(["minimum", "maximum", "minLength", "maxLength", "minItems", "maxItems",
                                      "multipleOf", "exclusiveMinimum", "exclusiveMaximum", "minProperties"])] = \
                fdp.PickValueInList([-1, 0, 10**30, 1e308, float("nan"), float("inf"), "3", True, 0.5, -(10**20)])
        elif op == 10:  # enums and consts of mixed types
            vals = [_value(fdp) for _ in range(fdp.ConsumeIntInRange(0, 40))]
            if fdp.ConsumeBool():
                node["enum"] = vals
            else:
                node["const"] = vals[0] if vals else None
        elif op == 11:  # a keyword deleted
            if node:
                node.pop(fdp.PickValueInList(list(node)), None)
        elif op == 12:  # items forms: schema, list (tuple), bool, garbage
            node["items"] = fdp.PickValueInList([True, False, [], [{"type": "string"}, {"type": "integer"}], "x",
                                                 copy.deepcopy(fdp.PickValueInList(POOL))])
        elif op == 13:  # patterns that are not regexes, or expensive ones
            node["pattern"] = fdp.PickValueInList(["(", "[a-", "^(a+)+$", "\\", "(?P<x>", "^[A-Z]{3}$", "*"])
        elif op == 14:  # boolean schemas where an object is expected
            node[fdp.PickValueInList(["additionalProperties", "not", "items", "if"])] = fdp.ConsumeBool()
        elif op == 15:  # a node replaced by a random value (the root stays a dict)
            key = fdp.PickValueInList(list(node)) if node else "x"
            node[key] = _value(fdp)
        elif op == 16:  # many properties (grammar size guard)
            props = node.setdefault("properties", {}) if isinstance(node.get("properties", {}), dict) else {}
            many = 3000 if fdp.ConsumeIntInRange(0, 15) == 0 else fdp.ConsumeIntInRange(0, 200)
            for i in range(many):
                props[f"p{i}"] = {"type": fdp.PickValueInList(TYPES[:7])}
        else:  # string of random unicode as a description (escaping in signature/grammar)
            node["description"] = fdp.ConsumeUnicodeNoSurrogates(fdp.ConsumeIntInRange(0, 200))
    return root


# ---------------------------------------------------------------- the oracle

# Open bugs already reported (.nexus/bugs-reliability.md): with NEXUS_FUZZ_ALLOW_KNOWN=1 (the Makefile's `run`
# default) an input that hits one is counted in out/known-<id>.count instead of stopping the run, so the fuzzer can
# look past it. Remove an entry when its fix lands (its reproducers then move to regressions/schema/).
KNOWN: dict[str, str] = {}  # R6 and R7 are fixed; their reproducers live in regressions/schema/
ALLOW_KNOWN = os.environ.get("NEXUS_FUZZ_ALLOW_KNOWN") == "1"
KNOWN_HITS: dict[str, int] = {}


def _known(problem: str) -> bool:
    for bug, text in KNOWN.items():
        if ALLOW_KNOWN and text in problem:
            KNOWN_HITS[bug] = KNOWN_HITS.get(bug, 0) + 1
            if KNOWN_HITS[bug] in (1, 10, 100, 1000, 10000):
                (HERE / "out").mkdir(exist_ok=True)
                (HERE / "out" / f"known-{bug}.count").write_text(f"{KNOWN_HITS[bug]}+\n")
            return True
    return False


class FuzzFinding(Exception):
    """An outcome the contract forbids (raised so that atheris records the input as a crash)."""


def _small(x, limit: int = 4000) -> bool:
    try:
        return len(json.dumps(x, allow_nan=True)) < limit
    except (RecursionError, ValueError, TypeError):
        return False


def _check_tool(tool, validate: bool) -> None:
    spec = schema.compile_tool(tool)  # documented never to raise: anything escaping is a crash by itself
    if not isinstance(spec.signature, str) or not isinstance(spec.described_signature, str):
        raise FuzzFinding(f"signature is not a string: {spec.signature!r}")
    internal = [p for p in spec.problems if "internal error" in p and not _known(p)]
    if internal:
        raise FuzzFinding(f"compile_tool caught an internal error: {internal[0]}")
    if spec.grammar is None:
        if not spec.problems or spec.ok:
            raise FuzzFinding("no grammar and no stated reason")
    else:
        if not isinstance(spec.grammar, str) or len(spec.grammar) > schema.MAX_GRAMMAR_CHARS:
            raise FuzzFinding("grammar is not a string or is over the size limit")
        if len(spec.grammar) <= 50_000:
            Grammar(spec.grammar)  # GbnfSyntaxError (a ValueError) is a crash: the grammar would not load
    if validate and _small(tool.input_schema):  # jsonschema's meta-schema checks cost ~100x a compile: a sample of the inputs
        try:
            res = schema.validate_arguments(tool.input_schema, {})
        except TypeError:
            meta = tool.input_schema.get("$schema", "") if isinstance(tool.input_schema, dict) else ""
            if not isinstance(meta, str) and _known("$schema is not a string"):
                return
            raise
        if not isinstance(res, list):
            raise FuzzFinding("validate_arguments did not return a list")


def _run_listing(data: bytes) -> None:
    _FILE.write_bytes(data)
    try:
        tools = registry.load_file(_FILE)
    except NexusError:
        return
    for i, t in enumerate(tools[:64]):
        _check_tool(t, validate=i == 0 and zlib.crc32(data) % 16 == 0)


def _run_structured(data: bytes) -> None:
    fdp = atheris.FuzzedDataProvider(data)
    root = copy.deepcopy(fdp.PickValueInList(POOL))
    if not isinstance(root, dict):
        root = {}
    root = _mutate(fdp, root)
    # through the registry shape check as well (a tool whose inputSchema is not a dict is recorded, not fatal)
    try:
        tools = registry.tools_from_listing({"tools": [{"name": "fuzzed", "description": "d", "inputSchema": root}]},
                                            "fuzz", "fuzz")
    except NexusError:
        return
    _check_tool(tools[0], validate=zlib.crc32(data) % 16 == 0)


def TestOneInput(data: bytes) -> None:
    if data[:1] in (b"{", b"[", b" ", b"\n", b"\t", b"\r"):
        _run_listing(data)
    else:
        _run_structured(data)


def main() -> None:
    atheris.Setup(sys.argv, TestOneInput)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
