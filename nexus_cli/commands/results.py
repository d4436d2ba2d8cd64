"""nexus results all [--quick] | nexus results summary [--readme]: regenerate every published figure, and the tables."""

from __future__ import annotations

from typing import Optional

import typer

from ..config import REPO_ROOT
from ..errors import NexusError
from ..output import emit_json, stdout_console
from . import options

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)


def _suites(text: Optional[str]) -> list[str]:
    return [s for s in (text or "").split(",") if s]


@app.command("all", help="Run every benchmark and sweep suite in sequence into one results tree (make results).")
def all_command(
    quick: bool = options.quick("The CI smoke variant of every suite, into .nexus/results-quick/ (never results/)."),
    out: Optional[str] = typer.Option(None, "--out", help="Results folder (default results/, or .nexus/results-quick/ with --quick)."),
    only: Optional[str] = typer.Option(None, "--only", help="Comma-separated suites to run: slb, l0, deep-splice, dkl, gate, routing, args."),
    skip: Optional[str] = typer.Option(None, "--skip", help="Comma-separated suites to skip."),
    fresh: bool = typer.Option(False, "--fresh", help="Run every suite, also those a stopped run on this commit finished (by default they are not run again)."),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab.results_all import run_all  # lazy: loads every suite, so `nexus --help` stays fast

    report = run_all(quick=quick, out=out, only=_suites(only), skip=_suites(skip), fresh=fresh)
    if as_json:
        emit_json(report)
    else:
        c = stdout_console()
        for suite, r in report["suites"].items():
            c.print(f"{suite:12s} {r['status']:7s} {r['seconds']:8.1f} s" + (f"  {r['error']}" if r["error"] else "")
                    + ("  (an earlier segment)" if r.get("earlier_segment") else ""))
        segs = len(report["segments"])
        c.print(f"{'total':12s} {'':7s} {report['total_seconds']:8.1f} s ({report['total_seconds'] / 60:.1f} min"
                + (f", {segs} segments)" if segs > 1 else ")"))
    if report["failed"]:
        raise NexusError(f"{report['failed']} suite(s) failed", hint="see the lines above")


@app.command("summary", help="Write results/SUMMARY.md from every suite's latest.json (--readme: README's table too).")
def summary_command(
    out: str = typer.Option(str(REPO_ROOT / "results"), "--out", help="Results folder to summarize."),
    readme: bool = typer.Option(False, "--readme", help="Also put the headline table into README.md's results block."),
) -> None:
    from ..lab.summary import write_summary  # lazy: `nexus --help` stays fast

    stdout_console().print(write_summary(out, readme=readme), markup=False, highlight=False)
