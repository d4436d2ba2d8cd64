"""The router embedder Nexus ships: trained on the example requests of the train servers of a leave-servers-out split
(benchmarks/server_splits.json), so the dev and test servers are tools it has never seen.

    python benchmarks/router_embedder.py train  [--out .nexus/router-train] [--epochs 1] [--rounds 1]
        [--example-positives] [--budget 1500]
    python benchmarks/router_embedder.py export .nexus/router-train/embedder models/router-embedder \
        [--figures results/routing-lso/FILE.json ...]

`train` builds an index of the train servers' tools with their example requests and `--finetune` (the recipe below),
which leaves the fine-tuned model in OUT/embedder. `export` writes it as float16 safetensors with its tokenizer and
config, a model card (README.md, with the leave-servers-out figures of the `nexus bench routing-lso` results files
given) and the weights' sha256 into the destination folder, atomically. Exporting the same model again gives the same
bytes, so the card can be rewritten once figures exist without changing the pinned digest.

Recipe (chosen for the 2-core budget; figures in models/router-embedder/README.md): MiniLM-L6-v2 base, one epoch of
MNRL with one mined hard negative per request, no second positives, one round, a 1,500 s cap.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from nexus_cli.files import atomic_write_json, sha256_file  # noqa: E402
from nexus_cli.registry import load_example_requests, load_registries  # noqa: E402

SPLITS = ROOT / "benchmarks" / "server_splits.json"
EXAMPLES = ROOT / "tool_registries" / "examples" / "shared_registries.jsonl"
REGISTRIES = ROOT.parent / "shared" / "registries"
BASE = "minilm"  # all-MiniLM-L6-v2
RECIPE = {"epochs": 1, "rounds": 1, "example_positives": False, "time_budget_s": 1500.0}


def split_tools(part: str, registries: Path = REGISTRIES):
    servers = set(json.loads(SPLITS.read_text())[part])
    return [t for t in load_registries([registries]) if t.server in servers]


def train(out: Path, epochs: int, budget: float, rounds: int = RECIPE["rounds"],
          example_positives: bool = RECIPE["example_positives"]) -> dict:
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.routing.build import build_index

    tools = split_tools("train")
    examples = load_example_requests([EXAMPLES])
    recipe = {**RECIPE, "epochs": epochs, "rounds": rounds, "example_positives": example_positives,
              "time_budget_s": budget}
    t0 = time.time()
    last = [0.0]

    def progress(stage: str, done: int, total: int) -> None:
        if time.time() - last[0] > 30 or done == total:
            last[0] = time.time()
            print(f"[{time.time() - t0:7.0f} s] {stage}: {done}/{total}", file=sys.stderr, flush=True)

    # from the stock model, not the default embedder (which is this script's own earlier output)
    report = build_index(tools, out, embedder=Embedder(BASE), embedder_name=BASE, examples=examples, finetune=True,
                         finetune_options=recipe, progress=progress, sources=[f"{SPLITS.name}:train"])
    info = {"tools": len(tools), "servers": len({t.server for t in tools}), "recipe": recipe,
            "finetuned": report.finetuned, "seconds": round(time.time() - t0, 1)}
    atomic_write_json(out / "train-report.json", info)
    return info


CARD = """# Nexus router embedder

A sentence embedder for routing requests to MCP tools: all-MiniLM-L6-v2 fine-tuned by `benchmarks/router_embedder.py`
on the example requests (`tool_registries/examples/shared_registries.jsonl`) of the **train** servers of the
leave-servers-out split in `benchmarks/server_splits.json` ({n_train_servers} servers, {n_train_tools} tools). The dev
and test servers' requests were never trained on.

- Architecture: BERT, 6 layers, 384 dimensions, mean pooling, unit-norm output (as all-MiniLM-L6-v2); weights in
  float16 (`model.safetensors`, sha256 `{sha256}`); loaded as float32.
- Training: {recipe}; {n_items} (request, tool text, hard negative) items; {steps} of {steps_planned} planned steps in
  {train_s} s on 2 CPU cores{budget_note}.
- Rebuild: `python benchmarks/router_embedder.py train` then `... export .nexus/router-train/embedder models/router-embedder`.

## Leave-servers-out figures

Each index holds one part's tools only, built without example requests; top-1 / top-3 are strict, with 95 % Wilson
intervals (`nexus bench routing-lso --part PART --embedder E --reranker R`).

{figures}
"""


def figure_rows(files: list[Path]) -> str:
    if not files:
        return "No figures were given to this export (`--figures`)."
    rows = ["| part | requests | embedder | reranker | top-1 | top-3 | results file |", "|---|---|---|---|---|---|---|"]
    for f in files:
        doc = json.loads(Path(f).read_text())
        p, s = doc["params"], doc["summary"]

        def pct(x):
            return f"{100 * x['value']:.1f} % [{100 * x['lo']:.1f}, {100 * x['hi']:.1f}]"

        rows.append(f"| {p['part']} | {s['n']} | {p['embedder']} | {p['reranker']} | {pct(s['top1'])} | "
                    f"{pct(s['top3'])} | `{Path(f).relative_to(ROOT) if Path(f).is_absolute() else f}` |")
    return "\n".join(rows)


def export(src: Path, dst: Path, figures: list[Path] | None = None) -> dict:
    import torch
    from safetensors.torch import load_file, save_file

    src, dst = Path(src), Path(dst)
    record = json.loads((src / "nexus-finetune.json").read_text())
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        for p in src.rglob("*"):
            rel = p.relative_to(src)
            if p.is_dir() or p.name == "model.safetensors" or rel.parts[0].startswith("checkpoint"):
                continue
            (tmp / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, tmp / rel)
        weights = load_file(str(src / "model.safetensors"))
        save_file({k: v.to(torch.float16).contiguous() for k, v in weights.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        os.chmod(tmp / "model.safetensors", 0o644)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the model ships with the repository
        digest = sha256_file(tmp / "model.safetensors")
        train_report = json.loads((src.parent / "train-report.json").read_text()) if (src.parent / "train-report.json").is_file() else {}
        (tmp / "README.md").write_text(CARD.format(
            n_train_servers=train_report.get("servers", "?"), n_train_tools=train_report.get("tools", "?"),
            sha256=digest, recipe=json.dumps(train_report.get("recipe", RECIPE)), n_items=record.get("n_items"),
            steps=record.get("train", {}).get("steps"), train_s=record.get("train", {}).get("seconds"),
            steps_planned=record.get("train", {}).get("steps_planned"),
            budget_note=" (stopped on the time cap)" if record.get("train", {}).get("stopped_on_budget") else "",
            figures=figure_rows(list(figures or []))))
        atomic_write_json(tmp / "nexus-router.json", {"sha256": digest, "split": SPLITS.name, "finetune": record})
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(dst), "sha256": digest, "bytes": (dst / "model.safetensors").stat().st_size}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--out", default=str(ROOT / ".nexus" / "router-train"))
    t.add_argument("--epochs", type=int, default=RECIPE["epochs"])
    t.add_argument("--rounds", type=int, choices=(1, 2), default=RECIPE["rounds"],
                   help="2: a second pass whose hard negatives the first round's model mines (routing/finetune.py)")
    t.add_argument("--example-positives", action="store_true", default=RECIPE["example_positives"],
                   help="also pair each request with another example request of its tool")
    t.add_argument("--budget", type=float, default=RECIPE["time_budget_s"], help="seconds for all rounds together")
    e = sub.add_parser("export")
    e.add_argument("src")
    e.add_argument("dst")
    e.add_argument("--figures", nargs="*", default=[], help="nexus bench routing-lso results files for the card")
    a = ap.parse_args(argv)
    if a.cmd == "train":
        print(json.dumps(train(Path(a.out), a.epochs, a.budget, a.rounds, a.example_positives), indent=1))
    else:
        print(json.dumps(export(Path(a.src), Path(a.dst), [Path(f) for f in a.figures]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
