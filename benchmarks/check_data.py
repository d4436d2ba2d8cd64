#!/usr/bin/env python3
"""Validate the benchmark data: registry sets, routing queries, argument cases and the demo queries.

Usage:
    python benchmarks/check_data.py [--registries DIR] [--verbose]

Registries are read from --registries, else $NEXUS_REGISTRIES, else ../shared/registries next to the
repository (the default recorded in benchmarks/registry_sets.json). Only the standard library and
jsonschema are needed. Exit status 0 when everything holds, 1 otherwise.

What is checked:
  * every set file exists, the tool counts match the ones recorded, server namespaces are unique per set
    (namespace = the file's "server" field, else the file name without .json);
  * every query has the required keys, a unique id (across all files), a non-empty query and no
    duplicate query text (case/whitespace-insensitive, across all files; the history is part of the key);
  * the gold (server, tool) exists in the query's set; "acceptable" alternatives exist too and differ from gold;
  * every gold argument key is a property of the tool's inputSchema, and the arguments validate against
    the inputSchema with jsonschema, with the top-level "required" list removed (a user may leave a
    required field unspecified; such gaps are counted and reported in the summary, not failed);
    a schema that fails its declared meta-schema but passes draft-4 is validated as draft-4, and one that
    passes no meta-schema is reported and only the key check applies;
  * "all"-set queries have gold tools outside the core set (they exist only in livemcptool/ files);
  * the coverage targets of the query sets (counts, servers, history turns) still hold.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import sys
from collections import Counter, defaultdict
from pathlib import Path

import jsonschema
from jsonschema import validators

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
SETS_FILE = HERE / "registry_sets.json"
QUERY_FILES = {
    "routing": HERE / "queries" / "routing.jsonl",
    "args": HERE / "queries" / "args_cases.jsonl",
    "args_b": HERE / "queries" / "args_cases_b.jsonl",
    "args_c": HERE / "queries" / "args_cases_c.jsonl",
    "args_d": HERE / "queries" / "args_cases_d.jsonl",
    "args_e": HERE / "queries" / "args_cases_e.jsonl",
    "args_f": HERE / "queries" / "args_cases_f.jsonl",
    "args_g": HERE / "queries" / "args_cases_g.jsonl",
    "args_h": HERE / "queries" / "args_cases_h.jsonl",
    "args_i": HERE / "queries" / "args_cases_i.jsonl",
    "args_j": HERE / "queries" / "args_cases_j.jsonl",
    "demo": REPO / "tool_registries" / "demo_queries.jsonl",
}
ROLES = {"user", "assistant", "system", "tool"}  # tool: a tool result, as MCP clients keep it
REQUIRED_KEYS = ("id", "query", "server", "tool", "arguments", "set")
OPTIONAL_KEYS = {"history", "acceptable", "free_text_args", "note"}

# Coverage targets of the query sets (see benchmarks/README.md).
TARGETS = {
    "routing_total": 200,
    "routing_core": 160,
    "routing_core_servers": 15,
    "routing_all": 40,
    "routing_all_servers": 20,
    "routing_history": 30,
    "args_total": 40,
    "demo_total": 15,
}


class Problems:
    def __init__(self) -> None:
        self.items: list[str] = []

    def add(self, where: str, msg: str) -> None:
        self.items.append(f"{where}: {msg}")


def namespace(path: Path, data: dict) -> str:
    return data.get("server") or path.stem


def resolve_registries_dir(cli: str | None, recorded: dict) -> Path:
    if cli:
        return Path(cli)
    env = os.environ.get(recorded.get("env", "NEXUS_REGISTRIES"))
    if env:
        return Path(env)
    return (REPO / recorded.get("default", "../shared/registries")).resolve()


def load_set(base: Path, files: list[str], name: str, problems: Problems):
    """Return {namespace: {tool_name: tool}}, {namespace: file}, tool count."""
    tools: dict[str, dict[str, dict]] = {}
    origin: dict[str, str] = {}
    count = 0
    for rel in files:
        path = base / rel
        if not path.is_file():
            problems.add(f"set {name}", f"missing file {path}")
            continue
        data = json.loads(path.read_text(encoding="utf-8"))
        ns = namespace(path, data)
        if ns in tools:
            problems.add(f"set {name}", f"namespace {ns!r} used by both {origin[ns]} and {rel}")
            continue
        origin[ns] = rel
        tools[ns] = {}
        for t in data.get("tools", []):
            if t["name"] in tools[ns]:
                problems.add(f"set {name}", f"duplicate tool {t['name']!r} in {rel}")
            tools[ns][t["name"]] = t
            count += 1
    return tools, origin, count


def strip_required(schema: dict) -> dict:
    s = copy.deepcopy(schema)
    s.pop("required", None)
    return s


_schema_cls_cache: dict[int, tuple[type | None, str]] = {}


def schema_validator_class(schema: dict) -> tuple[type | None, str]:
    """The validator class for a schema: its declared draft (default draft-7). A schema that fails that
    meta-schema but passes draft-4 (e.g. boolean exclusiveMinimum, as one livemcptool server sends) is
    validated as draft-4. Returns (None, reason) when no meta-schema accepts it."""
    key = id(schema)
    if key not in _schema_cls_cache:
        declared = validators.validator_for(schema, default=jsonschema.Draft7Validator)
        result: tuple[type | None, str] = (None, "")
        for cls in (declared, jsonschema.Draft4Validator):
            try:
                cls.check_schema(schema)
                result = (cls, "" if cls is declared else f"accepted as {cls.__name__}")
                break
            except jsonschema.SchemaError as e:
                result = (None, result[1] or e.message[:120])
        _schema_cls_cache[key] = result
    return _schema_cls_cache[key]


def check_arguments(where: str, tool: dict, args: dict, problems: Problems, stats: dict) -> list[str]:
    """Validate args against tool's inputSchema; return the required keys the query leaves unspecified."""
    schema = tool.get("inputSchema") or {}
    props = schema.get("properties", {})
    for k in args:
        if k not in props:
            problems.add(where, f"argument {k!r} is not a property of {tool['name']} (has: {sorted(props)})")
    cls, why = schema_validator_class(schema)
    if cls is not None:
        if why:
            stats["schema_fallback"].add(f"{tool['name']} ({why})")
        validator = cls(strip_required(schema))
        for err in sorted(validator.iter_errors(args), key=lambda e: list(e.path)):
            path = "/".join(str(p) for p in err.path) or "(root)"
            problems.add(where, f"schema violation at {path}: {err.message[:200]}")
    else:
        stats["schema_invalid"].add(f"{tool['name']} ({why})")
    return [r for r in schema.get("required", []) if r not in args]


def norm_text(q: dict) -> str:
    hist = " || ".join(h.get("content", "") for h in q.get("history") or [])
    return re.sub(r"\s+", " ", (hist + " >> " + q["query"]).strip().lower())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--registries", help="shared registries directory (default: $NEXUS_REGISTRIES or ../shared/registries)")
    ap.add_argument("--verbose", "-v", action="store_true", help="list queries that leave required fields unspecified")
    ns = ap.parse_args()

    problems = Problems()
    spec = json.loads(SETS_FILE.read_text(encoding="utf-8"))
    base = resolve_registries_dir(ns.registries, spec.get("registries_dir", {}))
    if not base.is_dir():
        print(f"registries directory not found: {base}", file=sys.stderr)
        return 1

    sets: dict[str, dict] = {}
    for name, s in spec["sets"].items():
        tools, origin, count = load_set(base, s["files"], name, problems)
        sets[name] = {"tools": tools, "origin": origin, "count": count}
        if count != s.get("tool_count"):
            problems.add(f"set {name}", f"recorded tool_count {s.get('tool_count')} but files hold {count}")
        if len(s["files"]) != s.get("file_count", len(s["files"])):
            problems.add(f"set {name}", "file_count does not match the file list")
    for name, s in spec.get("local_sets", {}).items():
        tools, origin, count = load_set(REPO, s["files"], name, problems)
        sets[name] = {"tools": tools, "origin": origin, "count": count}
        if count != s.get("tool_count"):
            problems.add(f"local set {name}", f"recorded tool_count {s.get('tool_count')} but files hold {count}")
        for ns_name, ts in tools.items():
            for t in ts.values():
                cls, why = schema_validator_class(t.get("inputSchema") or {})
                if cls is None or why:
                    problems.add(f"local set {name}", f"{t['name']}: invalid inputSchema ({why})")

    core_pairs = {(s, t) for s, ts in sets.get("core", {"tools": {}})["tools"].items() for t in ts}

    stats = {"schema_invalid": set(), "schema_fallback": set()}
    seen_ids: dict[str, str] = {}
    seen_text: dict[str, str] = {}
    per_file: dict[str, list[dict]] = {}
    missing_required: dict[str, list[tuple[str, list[str]]]] = defaultdict(list)

    for label, path in QUERY_FILES.items():
        rows = []
        if not path.is_file():
            problems.add(label, f"missing file {path}")
            per_file[label] = rows
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            where = f"{path.name}:{lineno}"
            try:
                q = json.loads(line)
            except json.JSONDecodeError as e:
                problems.add(where, f"bad JSON: {e}")
                continue
            rows.append(q)
            missing = [k for k in REQUIRED_KEYS if k not in q]
            if missing:
                problems.add(where, f"missing keys {missing}")
                continue
            where = f"{path.name}:{lineno} ({q['id']})"
            extra = set(q) - set(REQUIRED_KEYS) - OPTIONAL_KEYS
            if extra:
                problems.add(where, f"unknown keys {sorted(extra)}")
            if q["id"] in seen_ids:
                problems.add(where, f"duplicate id (also in {seen_ids[q['id']]})")
            seen_ids[q["id"]] = where
            if not isinstance(q["query"], str) or not q["query"].strip():
                problems.add(where, "empty query")
                continue
            key = norm_text(q)
            if key in seen_text:
                problems.add(where, f"duplicate query text (also {seen_text[key]})")
            seen_text[key] = where
            hist = q.get("history")
            if hist is not None:
                if not isinstance(hist, list) or not hist:
                    problems.add(where, "history must be a non-empty list")
                else:
                    for h in hist:
                        if not isinstance(h, dict) or h.get("role") not in ROLES or not isinstance(h.get("content"), str):
                            problems.add(where, f"bad history turn {h!r}")
            if q["set"] not in sets:
                problems.add(where, f"unknown set {q['set']!r}")
                continue
            reg = sets[q["set"]]["tools"]
            tool = reg.get(q["server"], {}).get(q["tool"])
            if tool is None:
                problems.add(where, f"gold {q['server']}/{q['tool']} not in set {q['set']}")
                continue
            if not isinstance(q["arguments"], dict):
                problems.add(where, "arguments must be an object")
                continue
            gaps = check_arguments(where, tool, q["arguments"], problems, stats)
            if gaps:
                missing_required[label].append((q["id"], gaps))
            for alt in q.get("acceptable", []):
                if (alt.get("server"), alt.get("tool")) == (q["server"], q["tool"]):
                    problems.add(where, "acceptable alternative repeats the gold tool")
                if reg.get(alt.get("server"), {}).get(alt.get("tool")) is None:
                    problems.add(where, f"acceptable {alt} not in set {q['set']}")
            for k in q.get("free_text_args", []):
                if k not in q["arguments"]:
                    problems.add(where, f"free_text_args names {k!r}, which is not a gold argument")
            if q["set"] == "all" and (q["server"], q["tool"]) in core_pairs:
                problems.add(where, "set 'all' query whose gold tool is in core: mark it core")
            # the routing set's "all" slice measures the servers beyond core; argument cases may take any of the 955
            if (label == "routing" and q["set"] == "all"
                    and not sets["all"]["origin"].get(q["server"], "").startswith("livemcptool/")):
                problems.add(where, "set 'all' gold must come from a livemcptool/ file")
            if label == "demo" and q["set"] != "forge":
                problems.add(where, "demo queries run against the forge set")
        per_file[label] = rows

    # ---- summary ----
    routing = per_file.get("routing", [])
    by_set = Counter(q.get("set") for q in routing)
    core_servers = Counter(q["server"] for q in routing if q.get("set") == "core")
    all_servers = Counter(q["server"] for q in routing if q.get("set") == "all")
    hist_routing = sum(1 for q in routing if q.get("history"))
    gh = sum(n for s, n in core_servers.items() if s in ("github", "github-archived"))

    print(f"registries: {base}")
    for name, s in sets.items():
        print(f"  set {name:5s}: {len(s['origin'])} servers, {s['count']} tools")
    print(f"routing.jsonl: {len(routing)} queries ({dict(by_set)}), {hist_routing} with history, "
          f"{sum(1 for q in routing if q.get('acceptable'))} with acceptable alternatives")
    print(f"  core: {len(core_servers)} servers; github share {gh}/{by_set.get('core', 0)} "
          f"= {gh / max(1, by_set.get('core', 0)):.0%}")
    print("   ", ", ".join(f"{s} {n}" for s, n in core_servers.most_common()))
    print(f"  all:  {len(all_servers)} livemcptool servers")
    print("   ", ", ".join(f"{s} {n}" for s, n in all_servers.most_common()))
    for label in ("args", "args_b", "args_c", "args_d", "args_e", "args_f", "args_g", "args_h", "args_i", "args_j", "demo"):
        rows = per_file.get(label, [])
        print(f"{QUERY_FILES[label].name}: {len(rows)} cases, {sum(1 for q in rows if q.get('history'))} with history, "
              f"{len({q.get('tool') for q in rows})} distinct tools, {len({q.get('server') for q in rows})} servers")
    for label, gaps in missing_required.items():
        print(f"{QUERY_FILES[label].name}: {len(gaps)} queries leave a required field unspecified by the user")
        if ns.verbose:
            for qid, keys in gaps:
                print(f"    {qid}: {', '.join(keys)}")
    if stats["schema_fallback"]:
        print("schemas that fail their declared meta-schema but pass draft-4 (validated as draft-4):",
              "; ".join(sorted(stats["schema_fallback"])))
    if stats["schema_invalid"]:
        print("schemas invalid under their meta-schema (key check only):", "; ".join(sorted(stats["schema_invalid"])))

    checks = {
        "routing_total": len(routing),
        "routing_core": by_set.get("core", 0),
        "routing_core_servers": len(core_servers),
        "routing_all": by_set.get("all", 0),
        "routing_all_servers": len(all_servers),
        "routing_history": hist_routing,
        "args_total": len(per_file.get("args", [])),
        "demo_total": len(per_file.get("demo", [])),
    }
    for k, minimum in TARGETS.items():
        if checks[k] < minimum:
            problems.add("coverage", f"{k} = {checks[k]} < {minimum}")

    if problems.items:
        print(f"\nFAIL: {len(problems.items)} problem(s)")
        for p in problems.items:
            print("  -", p)
        return 1
    print("\nOK: all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
