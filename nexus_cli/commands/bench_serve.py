"""nexus bench serve: `nexus serve` under hostile clients, SIGTERM under load, and a client that disconnects."""

from __future__ import annotations

from typing import Optional

import typer

from ..errors import UsageError
from . import options
from ._progress import stage_progress
from ._report import env_line, finish


def command(
    clients: int = typer.Option(8, "--clients", help="Concurrent request streams on the one stdio connection."),
    requests: int = typer.Option(1250, "--requests", help="Requests per client (8 x 1250 = 10,000)."),
    registry_dir: Optional[str] = options.registry_dir(),
    embedder: Optional[str] = options.embedder("Embedder of the index the server routes over (default: the shipped one)."),
    reranker: str = typer.Option("none", "--reranker", help="The server's --reranker (none keeps 10,000 requests in minutes)."),
    seed: int = options.seed("Seed of the request mix."),
    out: str = options.results_out("serve"),
    as_json: bool = options.as_json(),
) -> None:
    from ..lab import bench_serve as stage  # lazy: `nexus --help` stays fast

    if clients < 1 or requests < 1:
        raise UsageError("--clients and --requests must be at least 1")
    with stage_progress("serve") as prog:
        doc = stage.run(out_dir=out, registry=registry_dir, clients=clients, requests=requests, seed=seed,
                        reranker=reranker, embedder=embedder, progress=prog)
    finish(doc, as_json, render)


def render(doc: dict, console) -> None:
    from rich.table import Table

    s = doc["summary"]
    load, term, gone = s["load"], s["sigterm"], s["disconnect"]
    p = doc["params"]
    t = Table(title=f"nexus serve under hostile clients · {p['n_tools']} tools · {load['clients']} clients x "
                    f"{load['requests_per_client']} requests", title_justify="left")
    t.add_column("check")
    t.add_column("result", justify="right")
    t.add_column("pass")
    ok = lambda b: "[green]yes[/]" if b else "[red]NO[/]"  # noqa: E731
    t.add_row("requests sent / answered as expected", f"{load['sent']} / {load['correct']}",
              ok(s["passed"]["no_lost_or_wrong_answers"]))
    for kind in sorted(k for k in load["counts"] if ":" not in k):
        t.add_row(f"  {kind}", f"{load['counts'].get(kind + ':ok', 0)} / {load['counts'][kind]}", "")
    g = load["rss_growth_after_first"]
    rss = load["rss"]
    t.add_row(f"VmRSS after {load['rss_after_first_n']} → after all", f"{(rss.get('after_first_kb') or 0) / 1024:.1f} → "
              f"{(rss.get('after_all_kb') or 0) / 1024:.1f} MB ({'—' if g is None else f'{g * 100:+.2f} %'})",
              ok(s["passed"]["memory_flat_5pct"]))
    t.add_row("SIGTERM under load: exit code, seconds", f"{term['exit_code']}, {term['seconds_to_exit']:.2f} s "
              f"({term['answered_correctly']} answered, {term['n_failures']} wrong)", ok(s["passed"]["clean_sigterm_exit"]))
    t.add_row("client gone mid-request: exit code, seconds", f"{gone['exit_code']}, {gone['seconds_to_exit']:.2f} s",
              ok(s["passed"]["clean_disconnect_exit"]))
    console.print(t)
    for f in load["failures"][:5]:
        console.print(f"[red]failure[/] {f}")
    console.print(f"[dim]{env_line(doc)} · {load['requests_per_s']} requests/s[/]", highlight=False)
