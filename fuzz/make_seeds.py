"""Regenerate the seed corpora (run from fuzz/: ../.venv/bin/python make_seeds.py). The outputs are committed.

corpus/atb/: the two golden blocks, small valid variants written by the native writer (other geometry, NORM RoPE,
one token, transposed V, odd alignments, trailing bytes, extreme anchor) and a few near-misses (empty, short header,
bad magic, truncated payload), all a few hundred bytes to a few KB.

corpus/schema/: tools/list listings, one or a few tools each: small schemas written for this corpus, plus a few
shapes picked from ../shared/registries (recursive $defs, anyOf/oneOf unions, deep nesting, enums) when present.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))

from nexus_cli import atb  # noqa: E402

ATB = HERE / "corpus" / "atb"
SCHEMA = HERE / "corpus" / "schema"


def _block(name: str, *, n_layer=2, n_tokens=3, n_head_kv=2, head_dim=4, n_rot=None, rope=atb.ROPE_NEOX,
           v_layout=atb.V_LAYOUT_ROWS, align=64, anchor=5, arch="llama", seed=0) -> Path:
    rng = np.random.default_rng(seed)
    row = n_head_kv * head_dim
    h = atb.BlockHeader(fingerprint=bytes(rng.integers(0, 256, 16, dtype=np.uint8)), arch=arch, rope_type=rope,
                        v_layout=v_layout, n_rot=head_dim if n_rot is None else n_rot, n_layer=n_layer,
                        n_head_kv=n_head_kv, head_dim=head_dim, freq_base=10000.0, freq_scale=1.0,
                        n_ctx_orig=8192, anchor_pos=anchor, n_tokens=n_tokens, payload_align=align)
    tokens = rng.integers(0, 50000, n_tokens).astype(np.int32)
    k = rng.standard_normal((n_layer, n_tokens, row)).astype(np.float16)
    v = rng.standard_normal((n_layer, n_tokens, row)).astype(np.float16)
    if v_layout == atb.V_LAYOUT_TRANSPOSED:
        v = np.ascontiguousarray(v.transpose(0, 2, 1))
    path = ATB / name
    atb.write_block(path, h, tokens, k, v)
    return path


def atb_seeds() -> None:
    ATB.mkdir(parents=True, exist_ok=True)
    for f in ATB.iterdir():
        f.unlink()
    for g in sorted((ROOT / "tests" / "golden").glob("*.atb")):
        shutil.copy(g, ATB / ("golden-" + g.name))
    _block("neox-rows.atb")
    _block("neox-transposed.atb", v_layout=atb.V_LAYOUT_TRANSPOSED, seed=1)
    _block("norm-rows.atb", rope=atb.ROPE_NORM, seed=2)
    _block("norm-transposed-partial-rot.atb", rope=atb.ROPE_NORM, v_layout=atb.V_LAYOUT_TRANSPOSED, head_dim=8,
           n_rot=4, seed=3)
    _block("one-token.atb", n_tokens=1, n_layer=1, n_head_kv=1, head_dim=2, seed=4)
    _block("no-rot.atb", n_rot=0, seed=5)
    _block("align128-anchor0.atb", align=128, anchor=0, seed=6)
    _block("anchor-max.atb", anchor=2**31 - 1, seed=7)
    _block("long-arch.atb", arch="abcdefghijk", n_layer=3, n_tokens=5, seed=8)
    _block("gqa-4x16.atb", n_layer=2, n_tokens=4, n_head_kv=4, head_dim=16, n_rot=16, seed=9, align=256)
    trailing = _block("trailing-bytes.atb", seed=10)
    trailing.write_bytes(trailing.read_bytes() + b"\xde\xad\xbe\xef" * 9)
    good = (ATB / "neox-rows.atb").read_bytes()
    (ATB / "empty.atb").write_bytes(b"")
    (ATB / "short-header.atb").write_bytes(good[:100])
    (ATB / "header-only.atb").write_bytes(good[:128])
    (ATB / "bad-magic.atb").write_bytes(b"NXATC" + good[5:])
    (ATB / "truncated-v.atb").write_bytes(good[:-7])
    print(f"{len(list(ATB.iterdir()))} atb seeds")


# ---------------------------------------------------------------- schema seeds (written for this corpus)

def _tool(name, schema, description="does a thing"):
    return {"name": name, "description": description, "inputSchema": schema}


OWN = {
    "empty-object": [_tool("ping", {"type": "object", "properties": {}})],
    "no-schema": [{"name": "noop", "description": "no input schema at all"}],
    "flat-required": [_tool("send_note", {
        "type": "object",
        "properties": {"to": {"type": "string", "description": "who gets it"},
                       "body": {"type": "string"}, "urgent": {"type": "boolean", "default": False}},
        "required": ["to", "body"]})],
    "numbers": [_tool("resize", {
        "type": "object",
        "properties": {"width": {"type": "integer", "minimum": 1, "maximum": 8192},
                       "scale": {"type": "number", "exclusiveMinimum": 0, "multipleOf": 0.25}},
        "required": ["width"]})],
    "enum-const": [_tool("set_mode", {
        "type": "object",
        "properties": {"mode": {"type": "string", "enum": ["fast", "safe", "off"]},
                       "kind": {"const": "v2"}, "level": {"enum": [1, 2, "max", None, True]}},
        "required": ["mode"]})],
    "array-of-objects": [_tool("bulk_tag", {
        "type": "object",
        "properties": {"items": {"type": "array", "minItems": 1, "maxItems": 5,
                                 "items": {"type": "object", "properties": {"id": {"type": "integer"},
                                                                            "tags": {"type": "array",
                                                                                     "items": {"type": "string"}}},
                                           "required": ["id"]}}},
        "required": ["items"]})],
    "tuple-items": [_tool("move_to", {
        "type": "object", "properties": {"point": {"type": "array", "prefixItems": [{"type": "number"},
                                                                                      {"type": "number"}],
                                                   "items": False}}})],
    "type-list-nullable": [_tool("maybe", {
        "type": "object", "properties": {"limit": {"type": ["integer", "null"]}, "note": {"type": ["string"]}}})],
    "anyof-union": [_tool("lookup", {
        "type": "object",
        "properties": {"key": {"anyOf": [{"type": "string", "minLength": 1}, {"type": "integer"}]},
                       "opts": {"oneOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                                          {"type": "null"}]}},
        "required": ["key"]})],
    "allof-merge": [_tool("merge_me", {
        "allOf": [{"type": "object", "properties": {"a": {"type": "string"}}, "required": ["a"]},
                  {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]})],
    "defs-ref": [_tool("make_shape", {
        "type": "object", "$defs": {"pt": {"type": "object", "properties": {"x": {"type": "number"},
                                                                            "y": {"type": "number"}},
                                           "required": ["x", "y"]}},
        "properties": {"from": {"$ref": "#/$defs/pt"}, "to": {"$ref": "#/$defs/pt"}}, "required": ["from"]})],
    "recursive-ref": [_tool("tree", {
        "type": "object", "definitions": {"node": {"type": "object", "properties": {
            "label": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}}}}},
        "properties": {"root": {"$ref": "#/definitions/node"}}, "required": ["root"]})],
    "ref-cycle": [_tool("loop", {
        "type": "object", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
        "properties": {"x": {"$ref": "#/$defs/a"}}})],
    "ref-root": [_tool("self_ref", {"type": "object", "properties": {"me": {"$ref": "#"}}})],
    "ref-missing": [_tool("dangling", {"type": "object", "properties": {"q": {"$ref": "#/$defs/nope"}}})],
    "ref-remote": [_tool("remote", {"type": "object", "properties": {"q": {"$ref": "https://example.com/s.json"}}})],
    "non-object-root": [_tool("stringy", {"type": "string"})],
    "unknown-type": [_tool("odd", {"type": "object", "properties": {"w": {"type": "widget"}, "v": {"type": 7}}})],
    "no-type-inferred": [_tool("infer", {"properties": {"s": {"maxLength": 3}, "n": {"minimum": 2},
                                                        "arr": {"items": {"type": "string"}}}})],
    "additional-props": [_tool("env", {
        "type": "object", "properties": {"vars": {"type": "object", "additionalProperties": {"type": "string"}}},
        "additionalProperties": False})],
    "weird-names": [_tool("quoting", {
        "type": "object", "properties": {"a\"b": {"type": "string"}, "back\\slash": {"type": "integer"},
                                         "": {"type": "boolean"}, "héllo wörld": {"type": "string"},
                                         "new\nline": {"type": "null"}}, "required": ["a\"b"]})],
    "required-unknown": [_tool("req", {"type": "object", "properties": {"a": {"type": "string"}},
                                       "required": ["a", "zzz", 3]})],
    "long-description": [_tool("verbose", {"type": "object", "properties": {
        "x": {"type": "string", "description": "word " * 400}}}, description="long " * 300)],
    "bool-schemas": [_tool("bools", {"type": "object", "properties": {"any": True, "never": False}})],
    "pattern-format": [_tool("fmt", {"type": "object", "properties": {
        "email": {"type": "string", "format": "email"}, "code": {"type": "string", "pattern": "^[A-Z]{3}$"},
        "when": {"type": "string", "format": "date-time"}}})],
    "two-tools-bare-list": [_tool("one", {"type": "object"}), _tool("two", {})],
    "not-keyword": [_tool("neg", {"type": "object", "properties": {"x": {"not": {"type": "string"}}}})],
}


def _pick_real() -> dict[str, list[dict]]:
    """A few real shapes from ../shared/registries (if present): recursive $defs, unions, the deepest schema."""
    reg = ROOT.parent / "shared" / "registries"
    if not reg.is_dir():
        return {}
    tools = []
    for f in sorted(reg.rglob("*.json")):
        try:
            data = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        for t in data.get("tools", []) if isinstance(data, dict) else []:
            tools.append((f.stem, t))

    def depth(x, d=0):
        if isinstance(x, dict):
            return max([depth(v, d + 1) for v in x.values()] + [d])
        if isinstance(x, list):
            return max([depth(v, d + 1) for v in x] + [d])
        return d

    def first(pred):
        for server, t in tools:
            if pred(json.dumps(t.get("inputSchema"))):
                return server, t
        return None

    picks = {}
    smallest_ref = min((t for t in tools if "$ref" in json.dumps(t[1].get("inputSchema"))),
                       key=lambda t: len(json.dumps(t[1])), default=None)
    for label, hit in (("real-ref", smallest_ref),
                       ("real-anyof", first(lambda s: '"anyOf"' in s and len(s) < 1500)),
                       ("real-oneof", first(lambda s: '"oneOf"' in s and len(s) < 2500)),
                       ("real-enum", first(lambda s: '"enum"' in s and len(s) < 800)),
                       ("real-deepest", max(tools, key=lambda t: (depth(t[1].get("inputSchema")),
                                                                  -len(json.dumps(t[1])))) if tools else None)):
        if hit:
            server, t = hit
            t = {k: t[k] for k in ("name", "description", "inputSchema") if k in t}
            picks[f"{label}-{server}"] = [t]
    return picks


def schema_seeds() -> None:
    SCHEMA.mkdir(parents=True, exist_ok=True)
    for f in SCHEMA.iterdir():
        f.unlink()
    items = {**OWN, **_pick_real()}
    for label, tools in items.items():
        doc = tools if label == "two-tools-bare-list" else {"server": "seed", "tools": tools}
        (SCHEMA / f"{label}.json").write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n")
    print(f"{len(items)} schema seeds")


if __name__ == "__main__":
    atb_seeds()
    schema_seeds()
