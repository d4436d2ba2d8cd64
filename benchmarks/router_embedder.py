"""The router embedder Nexus ships: trained on the example requests of the train servers of a leave-servers-out split
(benchmarks/server_splits.json), so the dev and test servers are tools it has never seen.

    python benchmarks/router_embedder.py train  [--out .nexus/router-train] [--epochs 1] [--rounds 1]
        [--example-positives] [--budget 1500] [--batch-size 32] [--lr 3e-5] [--n-hard 1] [--device cpu|cuda]
    python benchmarks/router_embedder.py sweep benchmarks/router_embedder_grid.json [--out .nexus/router-sweep]
        [--device cuda] [--deadline 420] [--export DIR]
    python benchmarks/router_embedder.py export .nexus/router-train/embedder models/router-embedder \
        [--figures results/routing-lso/FILE.json ...]
    python benchmarks/router_embedder.py interpolate A OUT [--router models/router-embedder]

`train` fine-tunes the base on the train servers' tools with their example requests (routing/finetune.py, the
recipe below) and leaves the model in OUT/embedder with OUT/train-report.json. `sweep` trains each recipe of a grid
file from the base and scores it on the dev part with the retriever alone (`nexus bench routing-lso --part dev
--reranker none`, the same code), keeps a record per recipe (a rerun skips the recipes already scored), stops starting
recipes after `--deadline` seconds, and with `--export` exports the best by dev top-1 (then top-3). `export` writes it as float16 safetensors with its tokenizer and
config, a model card (README.md, with the leave-servers-out figures of the `nexus bench routing-lso` results files
given) and the weights' sha256 into the destination folder, atomically. `interpolate` writes the router pulled back
toward its base in weight space, (1 - A) x all-MiniLM-L6-v2 + A x the router, every tensor, rounded to float16
(results/router-embedder/interpolated/RULE.txt). Exporting the same model again gives the same
bytes, so the card can be rewritten once figures exist without changing the pinned digest.

Recipe of the shipped model (chosen for the 2-core budget; figures in models/router-embedder/README.md): MiniLM-L6-v2
base, one epoch of MNRL with one mined hard negative per request, no second positives, one round, a 1,500 s cap.
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
          example_positives: bool = RECIPE["example_positives"], batch_size: int = 32, lr: float = 3e-5,
          n_hard: int = 1, device: str = "cpu", base: str = BASE, registries: Path = REGISTRIES) -> dict:
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.routing.build import match_examples
    from nexus_cli.routing.finetune import finetune_embedder

    tools = split_tools("train", registries)
    tool_examples, _ = match_examples(tools, load_example_requests([EXAMPLES]))
    recipe = {**RECIPE, "epochs": epochs, "rounds": rounds, "example_positives": example_positives,
              "time_budget_s": budget, "batch_size": batch_size, "lr": lr, "n_hard": n_hard}
    t0 = time.time()
    last = [0.0]

    def progress(stage: str, done: int, total: int) -> None:
        if time.time() - last[0] > 30 or done == total:
            last[0] = time.time()
            print(f"[{time.time() - t0:7.0f} s] {stage}: {done}/{total}", file=sys.stderr, flush=True)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    model_dir = out / "embedder"
    tmp = out / "embedder.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    # from the stock model, not the default embedder (which is this script's own earlier output)
    finetune_embedder(tools, Embedder(base, device=device), tmp, examples=tool_examples, epochs=epochs, rounds=rounds,
                      example_positives=example_positives, time_budget_s=budget, batch_size=batch_size, lr=lr,
                      n_hard=n_hard, device=device, progress=progress)
    shutil.rmtree(model_dir, ignore_errors=True)
    tmp.rename(model_dir)
    info = {"tools": len(tools), "servers": len({t.server for t in tools}), "recipe": recipe,
            "base": str(base), "device": device,
            "seconds": round(time.time() - t0, 1)}
    atomic_write_json(out / "train-report.json", info)
    return info


def sweep(grid_file: Path, out: Path, device: str, deadline_s: float, base: str = BASE,
          registries: Path = REGISTRIES, export_to: Path | None = None, queries: list[str] | None = None) -> dict:
    """Train every recipe of the grid and score it on the dev part, retriever alone; export the best. With `queries`
    (request files), the dev part is scored on those requests (the ones whose gold tool is a dev server's) as well as
    on its own example requests, and the best is chosen on them."""
    from nexus_cli.lab import bench_lso

    grid = json.loads(Path(grid_file).read_text())["recipes"]
    out = Path(out)
    t0 = time.time()
    rows = []
    for rec in grid:
        name = rec["name"]
        done = out / name / "dev.json"
        if done.is_file():
            rows.append(json.loads(done.read_text()))
            continue
        if time.time() - t0 > deadline_s:
            rows.append({"name": name, "skipped": f"not started: the sweep's {deadline_s:.0f} s deadline had passed"})
            continue
        opts = {k: v for k, v in rec.items() if k != "name"}
        info = train(out / name, base=base, device=device, registries=registries, **opts)
        t1 = time.time()
        doc = bench_lso.run(part="dev", embedder=str(out / name / "embedder"), reranker="none",
                            registry_dir=str(registries), write=False)
        summ = doc["summary"]
        row = {"name": name, "recipe": info["recipe"], "train_seconds": info["seconds"],
               "dev_seconds": round(time.time() - t1, 1), "n": summ["n"],
               "top1": summ["top1"], "top3": summ["top3"], "follow_up_top1": summ["follow_up_top1"]}
        if queries:
            written = bench_lso.run(part="dev", embedder=str(out / name / "embedder"), reranker="none",
                                    registry_dir=str(registries), queries=list(queries), write=False)["summary"]
            row["examples"] = {k: row.pop(k) for k in ("n", "top1", "top3", "follow_up_top1")}
            row.update(queries=list(queries), n=written["n"], top1=written["top1"], top3=written["top3"],
                       follow_up_top1=written["follow_up_top1"])
        atomic_write_json(done, row)
        rows.append(row)
        print(f"{name}: dev top-1 {100 * row['top1']['value']:.1f} %, top-3 {100 * row['top3']['value']:.1f} %"
              f" (train {info['seconds']:.0f} s)", file=sys.stderr, flush=True)
    scored = [r for r in rows if "top1" in r]
    best = max(scored, key=lambda r: (r["top1"]["value"], r["top3"]["value"])) if scored else None
    report = {"grid": str(grid_file), "device": device, "base": str(base), "rows": rows,
              "best": best["name"] if best else None, "seconds": round(time.time() - t0, 1)}
    atomic_write_json(out / "sweep.json", report)
    if best and export_to:
        report["export"] = export(out / best["name"] / "embedder", Path(export_to))
    return report


CARD = """# Nexus router embedder

A sentence embedder for routing requests to MCP tools: all-MiniLM-L6-v2 fine-tuned by `benchmarks/router_embedder.py`
on the example requests (`tool_registries/examples/shared_registries.jsonl`) of the **train** servers of the
leave-servers-out split in `benchmarks/server_splits.json` ({n_train_servers} servers, {n_train_tools} tools). The dev
and test servers' requests were never trained on.

- Architecture: BERT, 6 layers, 384 dimensions, mean pooling, unit-norm output (as all-MiniLM-L6-v2); weights in
  float16 (`model.safetensors`, sha256 `{sha256}`); loaded as float32.
- Training: {recipe}; {n_items} (request, tool text, hard negative) items; {steps} of {steps_planned} planned steps in
  {train_s} s on {where}{budget_note}.
- Rebuild: `{rebuild}` then `python benchmarks/router_embedder.py export .nexus/router-train/embedder
  models/router-embedder`.

## Leave-servers-out figures

Each index holds one part's tools only, built without example requests; top-1 / top-3 are strict, with 95 % Wilson
intervals (`nexus bench routing-lso --part PART --embedder E --reranker R`).

{figures}
"""


def copy_model_files(src: Path, dst: Path, keep) -> None:
    """Copy the files of model folder src for which keep(path relative to src) holds into dst, keeping the layout."""
    for p in src.rglob("*"):
        rel = p.relative_to(src)
        if p.is_file() and keep(rel):
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(p, dst / rel)


def save_fp16(src: Path, dst: Path) -> None:
    """A safetensors file's weights rounded to float16, written to dst."""
    import torch
    from safetensors.torch import load_file, save_file

    weights = load_file(str(src))
    save_file({k: v.to(torch.float16).contiguous() for k, v in weights.items()}, str(dst), metadata={"format": "pt"})


def base_fp16(dst: Path) -> dict:
    """all-MiniLM-L6-v2 with its weights rounded to float16, the base the GPU recipes start from (the GPU machine
    takes at most 64 MiB of files; training runs in float32 either way)."""
    from nexus_cli.models import resolve_model

    src = resolve_model(BASE, kind="embedder")
    dst = Path(dst)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        copy_model_files(src, tmp, lambda rel: rel.suffix in (".json", ".txt")
                         and not rel.name.startswith("data_config"))
        save_fp16(src / "model.safetensors", tmp / "model.safetensors")
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(dst), "sha256": sha256_file(dst / "model.safetensors")}


def rebuild_command(recipe: dict, device: str, base: str = BASE) -> str:
    """The `train` command line that runs `recipe` again."""
    flags = [f"--epochs {recipe['epochs']}", f"--rounds {recipe['rounds']}"]
    flags += [f"--{k.replace('_', '-')} {recipe[k]}" for k in ("batch_size", "lr", "n_hard") if k in recipe]
    flags += ["--example-positives"] * bool(recipe.get("example_positives"))
    flags += [f"--budget {recipe['time_budget_s']:.0f}", f"--device {device}"]
    flags += [f"--base {base}"] * (base != BASE)
    first = f"python benchmarks/router_embedder.py base-fp16 {base}`, then `" if base != BASE else ""
    return first + "python benchmarks/router_embedder.py train " + " ".join(flags)


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
    src, dst = Path(src), Path(dst)
    record = json.loads((src / "nexus-finetune.json").read_text())
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        copy_model_files(src, tmp, lambda rel: rel.name != "model.safetensors"
                         and not rel.parts[0].startswith("checkpoint"))
        save_fp16(src / "model.safetensors", tmp / "model.safetensors")
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
            where="one GPU" if record.get("train", {}).get("device", "cpu") != "cpu" else "2 CPU cores",
            rebuild=rebuild_command(train_report.get("recipe", RECIPE), train_report.get("device", "cpu"),
                                    ".nexus/minilm-fp16" if train_report.get("base", BASE) != BASE else BASE),
            figures=figure_rows(list(figures or []))))
        atomic_write_json(tmp / "nexus-router.json", {"sha256": digest, "split": SPLITS.name, "finetune": record})
        if dst.exists():
            shutil.rmtree(dst)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(dst), "sha256": digest, "bytes": (dst / "model.safetensors").stat().st_size}


def interpolate(alpha: float, dst: Path, router: Path = ROOT / "models" / "router-embedder") -> dict:
    """(1 - alpha) x the base + alpha x the router, tensor by tensor in float32, rounded to float16 and written with
    the router's tokenizer and config into dst, atomically. alpha = 1 gives the router's own weights back."""
    import torch
    from safetensors.torch import load_file, save_file

    from nexus_cli.models import resolve_model

    if not 0.0 <= alpha <= 1.0:
        raise SystemExit(f"interpolate: A must lie in [0, 1], got {alpha}")
    router, dst = Path(router), Path(dst)
    base = load_file(str(resolve_model(BASE, kind="embedder") / "model.safetensors"))
    tuned = load_file(str(router / "model.safetensors"))
    missing = sorted(k for k in tuned if k not in base or base[k].shape != tuned[k].shape)
    if missing:
        raise SystemExit(f"interpolate: the base lacks or reshapes {len(missing)} tensors, e.g. {missing[0]}")
    mixed = {k: ((1.0 - alpha) * base[k].float() + alpha * v.float()).to(torch.float16).contiguous()
             for k, v in tuned.items()}
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dst.name}.tmp-", dir=dst.parent))
    try:
        copy_model_files(router, tmp,
                         lambda rel: rel.name not in ("model.safetensors", "nexus-router.json", "README.md"))
        save_file(mixed, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        digest = sha256_file(tmp / "model.safetensors")
        record = json.loads((router / "nexus-router.json").read_text())
        atomic_write_json(tmp / "nexus-router.json", {
            **record, "sha256": digest,
            "interpolated": {"alpha": alpha, "base": "all-MiniLM-L6-v2", "router_sha256": record.get("sha256")}})
        os.chmod(tmp, 0o755)
        shutil.rmtree(dst, ignore_errors=True)
        tmp.rename(dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"out": str(dst), "alpha": alpha, "sha256": digest}


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
    t.add_argument("--batch-size", type=int, default=32)
    t.add_argument("--lr", type=float, default=3e-5)
    t.add_argument("--n-hard", type=int, default=1, help="mined hard negatives per request")
    for q in (t, w := sub.add_parser("sweep")):
        q.add_argument("--device", default="cpu", help="cpu or cuda")
        q.add_argument("--base", default=BASE, help="the model to start from (default all-MiniLM-L6-v2)")
        q.add_argument("--registries", default=str(REGISTRIES))
    w.add_argument("grid")
    w.add_argument("--out", default=str(ROOT / ".nexus" / "router-sweep"))
    w.add_argument("--deadline", type=float, default=420.0, help="start no recipe after this many seconds")
    w.add_argument("--export", default=None, help="export the best recipe's model to this folder")
    w.add_argument("--queries", action="append", default=None,
                   help="score the dev part on these request files too, and choose on them (repeatable)")
    f = sub.add_parser("base-fp16", help="write all-MiniLM-L6-v2 rounded to float16 (the GPU recipes' base)")
    f.add_argument("dst")
    e = sub.add_parser("export")
    e.add_argument("src")
    e.add_argument("dst")
    e.add_argument("--figures", nargs="*", default=[], help="nexus bench routing-lso results files for the card")
    i = sub.add_parser("interpolate", help="the router pulled back toward its base: (1 - A) x base + A x router")
    i.add_argument("alpha", type=float)
    i.add_argument("dst")
    i.add_argument("--router", default=str(ROOT / "models" / "router-embedder"))
    a = ap.parse_args(argv)
    if a.cmd == "interpolate":
        print(json.dumps(interpolate(a.alpha, Path(a.dst), Path(a.router)), indent=1))
    elif a.cmd == "train":
        print(json.dumps(train(Path(a.out), a.epochs, a.budget, a.rounds, a.example_positives, a.batch_size, a.lr,
                               a.n_hard, a.device, a.base, Path(a.registries)), indent=1))
    elif a.cmd == "sweep":
        print(json.dumps(sweep(Path(a.grid), Path(a.out), a.device, a.deadline, a.base, Path(a.registries),
                               Path(a.export) if a.export else None, a.queries), indent=1))
    elif a.cmd == "base-fp16":
        print(json.dumps(base_fp16(Path(a.dst)), indent=1))
    else:
        print(json.dumps(export(Path(a.src), Path(a.dst), [Path(f) for f in a.figures]), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
