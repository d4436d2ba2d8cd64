"""nexus bench slb: INT8 SLB scan latency (native, Python call, NumPy float32 and int8) and top-1 agreement."""

from __future__ import annotations

import typer

from ..errors import UsageError
from . import options
from ._progress import parse_int_list, stage_progress
from ._report import env_line, finish, fmt_num


def command(
    sizes: str = typer.Option("250,1000,10000,100000", "--sizes", help="Database sizes N, comma-separated."),
    dim: int = typer.Option(384, "--dim", help="Vector dimension."),
    reps: int = typer.Option(1000, "--reps", help="Timed repetitions per method (fewer for large N)."),
    seed: int = options.seed("Seed of the random vectors."),
    out: str = options.results_out("slb"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_slb as stage  # lazy: `nexus --help` stays fast

    ns = parse_int_list(sizes, "--sizes")
    if any(n < 1 for n in ns):
        raise UsageError("--sizes must all be >= 1")
    if not 1 <= dim <= 65536:
        raise UsageError("--dim must be between 1 and 65536")
    if reps < 1:
        raise UsageError("--reps must be at least 1")
    with stage_progress("slb", enabled=not as_json) as prog:
        doc = stage.run(sizes=ns, dim=dim, reps=reps, seed=seed, out_dir=out, progress=prog)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    t = Table(title=f"INT8 SLB top-{doc['params']['k']} scan · dim {doc['params']['dim']} · simd {doc['simd_level']}",
              title_justify="left", caption=env_line(doc), caption_justify="left")
    for col in ("N", "C++ scan µs", "row-major µs", "Python call µs", "NumPy f32 µs", "NumPy int8 µs", "C++ vs f32", "top-1 agree",
                "exact µs", "exact vs f32", "exact agree", "rescored"):
        t.add_column(col, justify="right")
    for r in doc["sizes"]:
        sp = r.get("speedup_cpp_vs_numpy_f32")
        ex = r.get("exact_us_p50")  # absent in results written before the exact scan existed
        rm = r.get("cpp_row_major_us_p50")  # absent in results written before the prepared scan existed
        sx = r.get("speedup_exact_vs_numpy_f32")  # absent before it was reported
        t.add_row(f"{r['n']:,}", fmt_num(r["cpp_us_p50"], 2), fmt_num(rm, 2) if rm is not None else "—",
                  fmt_num(r["python_us_p50"], 2),
                  fmt_num(r["numpy_f32_us_p50"], 1), fmt_num(r["numpy_i8_us_p50"], 1),
                  f"{sp:.1f}x" if sp else "—", f"{r['top1_agreement'] * 100:.1f}%",
                  fmt_num(ex, 2) if ex is not None else "—", f"{sx:.1f}x" if sx else "—",
                  f"{r['exact_top1_agreement'] * 100:.1f}%" if ex is not None else "—",
                  f"{r['exact_rescored_median']:.0f}" if ex is not None else "—")
    console.print(t)
