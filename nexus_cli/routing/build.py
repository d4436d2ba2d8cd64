"""`nexus index`: embed a tool registry into an INT8 semantic lookaside buffer (SLB), calibrate the margin gate, and
store every tool's compressed signature, argument grammar and normalized schema. Spec of the files: docs/slb-format.md.

An index directory holds
  manifest.json   format version, embedder, text recipe, fusion weights, gate (tau, fire rates), file digests
  slb.bin         the SLB: 128-byte header, servers, names, vector→tool owners, scales, INT8 vectors (little-endian)
  tools.json      per tool, what a route without arguments reads: server, name, description, signature, problems
  tool_details.json  per tool: described signature, GBNF grammar, input and normalized schemas, example requests
  lexical.json    each token's BM25 postings and each tool's length (the lexical half of the hybrid retriever)
  embedder/       optional: the router embedder fine-tuned at build time (--finetune)

It is written atomically: everything goes into a temporary sibling directory, which is renamed into place at the end
(an existing index is swapped out only after the new one is complete).
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from .. import __version__, audit, kernels, schema, textgen
from ..adapters.embedder import Embedder, index_embedder
from ..config import DEFAULT_EMBEDDER, DEFAULT_LEX_WEIGHT, DEFAULT_RECIPE
from ..errors import FormatError, NexusError
from ..files import atomic_write_json, sha256_file
from ..models import canonical_name
from ..registry import Tool, interchangeable_groups, interchangeable_map
from .finetune import finetune_embedder, finetune_record
from .index import INDEX_FORMAT_VERSION, ToolEntry, recover_index_dir, split_entry, swap_into_place
from .lexical import BM25, postings_of
from .scoring import gate_margin, request_scores, request_texts
from .slb import SLB, write_slb

GATE_PERCENTILE = 20.0
CALIBRATION_SEED = 1234
# Pairs at least this close are the same tool text (one tool in two server generations): nothing can separate them,
# so they say nothing about where a reranker helps, and their ~0 margins would drag τ down (all 955: 0.005 → 0.083).
DUPLICATE_COSINE = 0.99
# A request is scored as itself and as itself with its literal values masked (textgen.mask_values), the two fused
# score vectors averaged (docs/routing.md, "Request values"). Recorded in the manifest; older indexes score the
# request alone.
DEFAULT_VALUE_MASKING = True
# Bumped whenever the same tools would give a different index (caches of built indexes key on it). 2: τ leaves out
# exact duplicates. 3: requests (and the gate's probes) are also scored with their values masked. 4: example requests
# join their tool's BM25 document. 5: twelve examples per tool. 6: the gate's margin leaves out interchangeable tools
# (the same tool on another server, registry.interchangeable_groups). 7: tools.json stores the normalized schema.
# 8: index format 3 (tools.json and tool_details.json; the interchangeable groups in the manifest). 9: index format 4.
# 10: lexical tokenizer 2 (CJK text as character pairs).
BUILD_REVISION = 10
# Example requests (`nexus index --examples FILE.jsonl`) become extra vectors and BM25 words of their tool, at most
# this many per tool: what was written per tool (docs/routing.md, "Example requests").
EXAMPLES_PER_TOOL = 12


@dataclass
class BuildReport:
    out: Path
    n_tools: int
    n_vectors: int
    n_servers: int
    dim: int
    tau: float
    fire_rate: float
    seconds: dict
    problems: dict  # tool key -> reasons
    finetuned: dict | None = None
    examples: dict | None = None
    interchangeable: list[list[str]] = field(default_factory=list)  # groups of the same tool on several servers
    suspicious: dict = field(default_factory=dict)  # tool key -> audit finding lines (audit.audit_tools)
    quarantined: list[str] = field(default_factory=list)  # tool keys left out (--quarantine)

    def as_json(self) -> dict:
        return {
            "out": str(self.out), "n_tools": self.n_tools, "n_vectors": self.n_vectors, "n_servers": self.n_servers,
            "dim": self.dim, "gate": {"tau": self.tau, "fire_rate": self.fire_rate},
            "seconds": self.seconds, "schema_problems": self.problems,
            "finetuned": self.finetuned, "examples": self.examples, "interchangeable": self.interchangeable,
            "suspicious": self.suspicious, "quarantined": self.quarantined,
        }


def compile_specs(tools: Sequence[Tool]) -> list[ToolEntry]:
    """Signature and grammar of every tool via nexus_cli.schema; a schema that fails records its reason."""
    out = []
    for t in tools:
        problems = list(t.problems)
        sig, described, gram, ok = f"{t.name}()", f"{t.name}()", None, True
        normalized: dict = {}
        try:
            spec = schema.compile_tool(t)
            sig, described, gram, ok = spec.signature, spec.described_signature or spec.signature, spec.grammar, spec.ok
            normalized = spec.schema
            problems += [p for p in spec.problems if p not in problems]
        except Exception as e:  # noqa: BLE001 - one schema must never stop the registry
            problems.append(f"schema: {type(e).__name__}: {e}")
            ok = False
        out.append(ToolEntry(server=t.server, name=t.name, description=t.description, signature=sig,
                             described_signature=described, grammar=gram, input_schema=t.input_schema,
                             schema=normalized, problems=problems, ok=ok))
    return out


def tool_texts(tool, recipe: str) -> list[str]:
    """The texts embedded for a tool from its own name and description, main text first."""
    if recipe == "doc":
        return [textgen.doc_text(tool)]
    if recipe == "multi":
        return [textgen.doc_text(tool)] + textgen.extra_texts(tool)
    raise NexusError(f"unknown text recipe '{recipe}' (doc, multi)")


def match_examples(tools: Sequence[Tool], examples: dict[str, list[str]] | None) -> tuple[list[list[str]], dict | None]:
    """Each tool's example requests (at most EXAMPLES_PER_TOOL) and the record for the manifest: how many were used,
    and the example keys that name no tool of this registry (an examples file may cover more servers)."""
    if not examples:
        return [[] for _ in tools], None
    keys = {t.key for t in tools}
    per_tool = [list(examples.get(t.key, []))[:EXAMPLES_PER_TOOL] for t in tools]
    unmatched = sorted(k for k in examples if k not in keys)
    return per_tool, {"per_tool_max": EXAMPLES_PER_TOOL, "n_requests": sum(len(x) for x in per_tool),
                      "n_tools_with": sum(1 for x in per_tool if x), "n_unmatched_tools": len(unmatched),
                      "unmatched_sample": unmatched[:5]}


def adversarial_pairs(doc_vecs: np.ndarray, closer_fraction: float = 0.5,
                      duplicate_cosine: float = DUPLICATE_COSINE) -> list[tuple[int, int]]:
    """Near-neighbour tool pairs: each tool with its nearest neighbour (cosine of the main vectors), kept when that
    cosine is in the closer `closer_fraction` of all nearest-neighbour cosines (every tool has *a* nearest neighbour;
    the adversarial ones are the near-duplicates: list/search/get, per-field updates beside a general write) and
    below `duplicate_cosine` (exact duplicates, the same tool in two server generations, are left out).
    Deduplicated as unordered pairs."""
    n = doc_vecs.shape[0]
    if n < 2:
        return []
    sims = doc_vecs @ doc_vecs.T
    np.fill_diagonal(sims, -np.inf)
    nn = np.argmax(sims, axis=1)
    nn_cos = sims[np.arange(n), nn]
    cut = np.quantile(nn_cos, 1.0 - closer_fraction) if closer_fraction < 1.0 else -np.inf
    pairs = sorted({(min(i, int(j)), max(i, int(j))) for i, j in enumerate(nn)
                    if cut <= nn_cos[i] < duplicate_cosine})
    return pairs


def calibrate_gate(tools: Sequence[Tool], doc_vecs: np.ndarray, slb: SLB, bm25: BM25 | None, lex_weight: float,
                   encode: Callable[[list[str]], np.ndarray], percentile: float = GATE_PERCENTILE,
                   seed: int = CALIBRATION_SEED, probes_per_tool: int = 2,
                   value_masking: bool = DEFAULT_VALUE_MASKING) -> dict:
    """τ = P20 of top-1/top-2 margins of probe queries of the tools in adversarial (nearest-neighbour) pairs.

    Probe queries come from each paired tool's own name/description (textgen.probe_queries, seeded), never from
    evaluation data. Fire rate = share of those probes whose margin is below τ (≈ the percentile by construction),
    plus the fire rate over probes of every tool (what a registry-wide mix of requests would see)."""
    rng = random.Random(seed)
    pairs = adversarial_pairs(doc_vecs)
    twins = interchangeable_map(tools)
    in_pair = sorted({i for p in pairs for i in p})
    probe_tool, probes = [], []
    for i in range(len(tools)):
        for q in textgen.probe_queries(tools[i], rng, probes_per_tool):
            probe_tool.append(i)
            probes.append(q)
    if not probes:
        return {"tau": 0.0, "fire_rate": 0.0, "n_pairs": 0, "n_probes": 0}
    texts = [request_texts(q, value_masking) for q in probes]
    flat = list(dict.fromkeys(t for ts in texts for t in ts))
    row = {t: i for i, t in enumerate(flat)}
    qv = encode(flat)
    margins = np.zeros(len(probes))
    hits = np.zeros(len(probes), dtype=bool)
    for j in range(len(probes)):
        s, _ = request_scores(slb, bm25, lex_weight, texts[j], [qv[row[t]] for t in texts[j]])
        top = int(np.argmax(s))
        margins[j] = gate_margin(s, top, twins.get(top, ()))  # as the router measures it
        hits[j] = top == probe_tool[j] or top in twins.get(probe_tool[j], ())
    pt = np.asarray(probe_tool)
    adv = np.isin(pt, in_pair)
    adv_m = margins[adv] if adv.any() else margins
    finite_m = adv_m[np.isfinite(adv_m)]  # inf: a probe whose tool has no rival but its own twins
    tau = float(np.percentile(finite_m, percentile)) if len(finite_m) else 0.0
    return {
        "tau": tau,
        "percentile": percentile,
        "fire_rate": float(np.mean(adv_m < tau)) if len(adv_m) else 0.0,
        "fire_rate_all_probes": float(np.mean(margins < tau)),
        "n_pairs": len(pairs),
        "n_probes": int(adv.sum()),
        "n_probes_all": len(probes),
        "probe_top1_all": float(hits.mean()),
        "probe_top1_below_tau": float(hits[margins < tau].mean()) if np.any(margins < tau) else None,
        "probe_top1_above_tau": float(hits[margins >= tau].mean()) if np.any(margins >= tau) else None,
        "seed": seed,
        "probes_per_tool": probes_per_tool,
        "duplicate_cosine": DUPLICATE_COSINE,
        "value_masking": value_masking,
    }


def embedder_name_of(embedder) -> str:
    """The name (or folder) that reloads `embedder`; the default embedder's name when none is given."""
    if embedder is None:
        return DEFAULT_EMBEDDER
    name = getattr(embedder, "name", None)
    if name and canonical_name(str(name)):
        return str(name)
    path = getattr(embedder, "path", None)
    return str(path) if path is not None else str(name or DEFAULT_EMBEDDER)


def build_index(tools: Sequence[Tool], out: str | Path, embedder=None, embedder_name: str | None = None,
                recipe: str = DEFAULT_RECIPE, lexical: bool = True, lex_weight: float = DEFAULT_LEX_WEIGHT,
                finetune: bool = False, finetune_options: dict | None = None,
                value_masking: bool = DEFAULT_VALUE_MASKING, examples: dict[str, list[str]] | None = None,
                synthesize=None, quarantine: bool = False, sanitize: bool = True,
                progress: Callable[[str, int, int], None] | None = None, sources: Sequence[str] = (),
                n_shipped: int = 0) -> BuildReport:
    """Build an index for `tools` into directory `out` atomically. `progress(stage, done, total)` is optional.
    `examples` ({"server/tool": [request, ...]}, registry.load_example_requests) adds requests as extra vectors.
    `synthesize` (a synthesize.RequestWriter) writes example requests for the tools `examples` does not cover.
    `n_shipped`: how many tools' requests in `examples` are the shipped ones (routing.shipped_examples), recorded.
    `embedder_name` is what the manifest records and `nexus route` loads to embed requests; left out, it is the given
    embedder's own model (so an index is never read with another model than the one that embedded it).
    Every tool is audited (audit.audit_tools): `quarantine` leaves out the tools with a quarantine finding; the index
    holds sanitized descriptions (audit.sanitize_tool) unless `sanitize` is off (measurement only)."""
    if embedder_name is None:
        embedder_name = embedder_name_of(embedder)
    if not tools:
        raise FormatError("the registry holds no tools")
    findings = audit.audit_tools(tools)
    left_out = sorted(audit.quarantined(findings)) if quarantine else []
    if left_out:
        tools = [t for t in tools if t.key not in set(left_out)]
        if not tools:
            raise FormatError(f"--quarantine left no tools: all {len(left_out)} were suspicious")
    if sanitize:
        tools = [audit.sanitize_tool(t) for t in tools]
    out = Path(out).expanduser().resolve()
    recover_index_dir(out)
    if out.exists() and not out.is_dir():
        raise NexusError(f"--out {out} exists and is not a directory")
    if out.exists() and any(out.iterdir()) and not (out / "manifest.json").is_file():
        raise NexusError(f"--out {out} is a non-empty directory that is not a Nexus index; refusing to replace it")
    report_progress = progress or (lambda *_: None)
    secs: dict[str, float] = {}
    t_all = time.perf_counter()

    if embedder is None:
        t0 = time.perf_counter()
        # fine-tuning trains the sentence-transformers model; anything else embeds as `nexus route` does, no torch
        embedder = Embedder(embedder_name) if finetune else index_embedder(embedder_name)
        secs["load_embedder"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    entries = compile_specs(tools)
    secs["schemas"] = time.perf_counter() - t0

    synth_info = None
    if synthesize is not None:
        t0 = time.perf_counter()
        uncovered = [t for t in tools if not (examples or {}).get(t.key)]
        written, synth_info = synthesize.write(uncovered, progress=report_progress)
        examples = {**(examples or {}), **{k: v for k, v in written.items() if v}}
        secs["synthesize"] = time.perf_counter() - t0
    tool_examples, examples_info = match_examples(tools, examples)
    if examples_info is not None:
        examples_info["synthesized"] = synth_info
        examples_info["n_tools_shipped"] = n_shipped
    for entry, own in zip(entries, tool_examples):
        entry.examples = list(own)
    ft_info = None
    ft_dir = None
    if finetune:
        # Fine-tune the bi-encoder on the example requests when there are any, else on registry-derived requests
        # (hard negatives from the base model's confusions); save it into the index and embed everything with it.
        t0 = time.perf_counter()
        ft_dir = Path(tempfile.mkdtemp(prefix=".finetune-", dir=Path(out).parent if Path(out).parent.exists() else None))
        try:
            ft_info = finetune_embedder(tools, embedder, ft_dir, progress=report_progress,
                                               examples=tool_examples if examples_info else None,
                                               **(finetune_options or {}))
        except BaseException:
            shutil.rmtree(ft_dir, ignore_errors=True)
            raise
        embedder = Embedder(str(ft_dir))
        secs["finetune"] = time.perf_counter() - t0

    # texts and owners (vectors grouped by tool, main vector first)
    texts, owners, is_request = [], [], []
    for i, t in enumerate(tools):
        for flag, group in ((False, tool_texts(t, recipe)), (True, tool_examples[i])):
            texts.extend(group)
            owners.extend([i] * len(group))
            is_request.extend([flag] * len(group))
    t0 = time.perf_counter()
    done = [0]

    def _cb(n):
        done[0] += n
        report_progress("embedding", done[0], len(texts))

    report_progress("embedding", 0, len(texts))
    # Tool texts are documents; example requests are embedded as queries, like the requests they stand for (the same
    # thing for MiniLM; models with query/document prompts differ). Each group is sorted by length so batches pad
    # little (long descriptions together), then the order is restored.
    vecs = None
    for role, flag in (("document", False), ("query", True)):
        rows = np.asarray([j for j, r in enumerate(is_request) if r == flag], dtype=np.int64)
        if not len(rows):
            continue
        order = rows[np.argsort([len(texts[j]) for j in rows], kind="stable")]
        part = embedder.encode([texts[j] for j in order], batch_size=32, callback=_cb, role=role)
        if vecs is None:
            vecs = np.empty((len(texts), part.shape[1]), dtype=part.dtype)
        vecs[order] = part
    secs["embed"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    q, scales = kernels.quantize_i8(np.ascontiguousarray(vecs, dtype=np.float32))
    secs["quantize"] = time.perf_counter() - t0

    servers = textgen.unique(t.server for t in tools)
    sidx = {s: i for i, s in enumerate(servers)}
    if len(servers) > 65535:
        raise NexusError("more than 65535 servers in one index")
    slb = SLB(dim=int(vecs.shape[1]), servers=servers, tool_server=np.asarray([sidx[t.server] for t in tools]),
              names=[t.name for t in tools], owners=np.asarray(owners, dtype=np.int64), scales=np.asarray(scales),
              vectors=np.asarray(q))
    lex_docs = [textgen.lexical_doc(t, examples=own) for t, own in zip(tools, tool_examples)] if lexical else None
    bm25 = BM25(lex_docs) if lex_docs is not None else None

    t0 = time.perf_counter()
    main_rows = np.asarray([owners.index(i) for i in range(len(tools))])
    report_progress("calibrating", 0, 1)
    gate = calibrate_gate(tools, vecs[main_rows], slb, bm25, lex_weight if lexical else 0.0,
                          lambda qs: embedder.encode(qs, batch_size=64, role="query"),
                          value_masking=value_masking)
    report_progress("calibrating", 1, 1)
    secs["calibrate"] = time.perf_counter() - t0
    # fine-tuned on example requests, in this build or before (an --embedder folder a fine-tuning wrote): the
    # router's `auto` reranker then stays off (docs/routing.md, "Example requests")
    examples_finetuned = bool((finetune_record(getattr(embedder, "path", None)) or {}).get("on_examples"))

    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))
        (tmp / ".owner").write_text(str(os.getpid()))
    except OSError as e:
        raise NexusError(f"cannot write the index next to {out}: {e.strerror or e}") from None
    try:
        write_slb(tmp / "slb.bin", servers, [sidx[t.server] for t in tools], [t.name for t in tools],
                  slb.owners, slb.scales, slb.vectors)
        # the same tool on several servers: in the manifest (a route then reads no schema for them) and the report
        groups = interchangeable_groups(entries)
        heads, details = zip(*[split_entry(e) for e in entries]) if entries else ((), ())
        atomic_write_json(tmp / "tools.json", list(heads), compact=True)
        atomic_write_json(tmp / "tool_details.json", list(details), compact=True)
        if lex_docs is not None:
            atomic_write_json(tmp / "lexical.json", {"tokenizer": f"textgen.lex_tokens/v{textgen.LEX_TOKENIZER}",
                                                     "doc_lengths": [len(d) for d in lex_docs],
                                                     "postings": postings_of(lex_docs)}, compact=True)
        if ft_dir is not None:
            shutil.move(str(ft_dir), str(tmp / "embedder"))
            ft_dir = None
        files = {p.name: sha256_file(p) for p in sorted(tmp.iterdir()) if p.is_file() and p.name != ".owner"}
        manifest = {
            "format": "nexus-index",
            "version": INDEX_FORMAT_VERSION,
            "nexus_version": __version__,
            "created_unix": int(time.time()),
            "sources": list(sources),
            "n_tools": len(tools),
            "n_vectors": int(len(texts)),
            "n_servers": len(servers),
            "embedder": {"name": embedder_name, "dim": int(vecs.shape[1]), "normalized": True,
                         "finetuned": ft_info, "path": "embedder" if ft_info else None,
                         "examples_finetuned": examples_finetuned,
                         "prompts": dict(getattr(embedder, "prompts", None) or {})},
            "recipe": {
                "name": recipe,
                "doc": "readable name (abbreviations expanded) + raw name + first 48 words of the description",
                "extra": "multi: + readable name, first/second description sentence (boilerplate stripped), "
                         "name + required parameters; tool score = max over its vectors" if recipe == "multi" else None,
                "examples": examples_info,
            },
            "quantization": {"kind": "int8-symmetric-per-vector", "kernel": "nexus_quantize_i8"},
            "retrieval": {"lexical": bool(lexical), "lex_weight": float(lex_weight if lexical else 0.0),
                          "fusion": "dense_max + lex_weight * bm25 / max(bm25)",
                          "value_masking": bool(value_masking),
                          "request": "mean of the fused scores of the request and of the request with its values "
                                     "masked (textgen.mask_values)" if value_masking else "the request as written"},
            "gate": gate,
            "audit": {"sanitized": bool(sanitize), "quarantine": bool(quarantine), "n_suspicious": len(findings),
                      "quarantined": left_out,
                      "findings": {k: [f.as_json() for f in fs] for k, fs in findings.items()}},
            "schema_failures": sum(1 for e in entries if not e.ok),
            "interchangeable": groups,
            "files": files,
        }
        atomic_write_json(tmp / "manifest.json", manifest, compact=True)
        swap_into_place(tmp, out)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if ft_dir is not None:
            shutil.rmtree(ft_dir, ignore_errors=True)
        if isinstance(e, OSError):  # full disk, read-only folder, ...: one line, nothing left behind
            raise NexusError(f"cannot write the index to {out}: {e.strerror or e}") from None
        raise
    secs["total"] = time.perf_counter() - t_all
    return BuildReport(out=out, n_tools=len(tools), n_vectors=len(texts), n_servers=len(servers),
                       dim=int(vecs.shape[1]), tau=gate["tau"], fire_rate=gate["fire_rate"],
                       seconds={k: round(v, 3) for k, v in secs.items()},
                       problems={e.key: e.problems for e in entries if e.problems},
                       finetuned=ft_info, examples=examples_info,
                       interchangeable=[[entries[i].key for i in g] for g in groups],
                       suspicious={k: [f.line() for f in fs] for k, fs in findings.items()}, quarantined=left_out)
