"""nexus route "QUERY" [--index DIR] [--registry ...] [--history FILE] [--no-args] [--model M] [--batch FILE] [--json].

Without --index it reads the default index (.nexus/index, or $NEXUS_INDEX), the one `nexus index` and `make demo` write.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import List, Optional

import typer

from ..config import ARGUMENTS_LLM, DEFAULT_ARGS_TIME_LIMIT_S, default_index_dir
from ..errors import FormatError, UsageError
from ..output import emit_json, stdout_console
from . import options


def _read_history(path: str) -> list[dict]:
    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text("utf-8"))
    except OSError as e:
        raise FormatError(f"cannot read --history {p}: {e.strerror}") from None
    except ValueError as e:
        raise FormatError(f"--history {p} is not valid JSON: {e}") from None
    return _check_history(data, str(p))


def _check_history(data, where: str) -> list[dict]:
    if not isinstance(data, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str) for m in data
    ):
        raise FormatError(f"{where}: history must be a JSON list of {{\"role\", \"content\"}} objects")
    return data


def _read_batch(path: str) -> list[dict]:
    p = Path(path).expanduser()
    try:
        lines = p.read_text("utf-8").splitlines()
    except OSError as e:
        raise FormatError(f"cannot read --batch {p}: {e.strerror}") from None
    items = []
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as e:
            raise FormatError(f"{p}:{n}: not valid JSON ({e})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("query"), str) or not obj["query"].strip():
            raise FormatError(f"{p}:{n}: each line needs a non-empty \"query\" string")
        if "history" in obj and obj["history"] is not None:
            _check_history(obj["history"], f"{p}:{n}")
        items.append(obj)
    if not items:
        raise FormatError(f"--batch {p} holds no queries")
    return items


def resolve_index(index: Optional[str]) -> str:
    """The --index given, else the default one; with neither, one line naming the command that builds it."""
    if index is not None:
        return index
    default = default_index_dir()
    if not (default / "manifest.json").is_file():
        raise UsageError(f"no index at {default}",
                         hint="build one with `nexus index REGISTRY` (or `make demo`), or pass --index DIR")
    return str(default)


def route_command(
    query: Optional[str] = typer.Argument(None, help="The request to route (omit with --batch)."),
    index: Optional[str] = options.index(),
    registry: Optional[List[str]] = options.registry(),
    history: Optional[str] = typer.Option(None, "--history", help="JSON file: list of {role, content} earlier turns."),
    no_args: bool = typer.Option(False, "--no-args", help="Stop after routing (no argument generation)."),
    model: str = typer.Option(ARGUMENTS_LLM, "--model", "-m", help="LLM for arguments: qwen2.5-1.5b, qwen2.5-0.5b, smollm2-135m or a .gguf path. The likelihood reranker runs on qwen2.5-0.5b with the default, else on this one (--rerank-model overrides)."),
    batch: Optional[str] = typer.Option(None, "--batch", help="JSONL file of {id, query, history?}; one JSON line out per input."),
    top_k: int = typer.Option(5, "--top-k", help="Candidates to report."),
    reranker: str = options.reranker(),
    rerank_k: Optional[int] = typer.Option(None, "--rerank-k", help="Candidates the reranker sees (default: 4 for likelihood, 5 for llm and cascade)."),
    rerank_model: Optional[str] = options.rerank_model(),
    as_json: bool = options.as_json(),
    session: Optional[str] = typer.Option(None, "--session", help="Session folder: continue (or start) a multi-turn conversation kept there with its KV state."),
    args_time_limit: float = typer.Option(DEFAULT_ARGS_TIME_LIMIT_S, "--args-time-limit", help="Seconds one request's argument generation may take, retries included (0: no limit)."),
    cards: bool = options.cards(),
) -> None:
    from ..routing.router import Router, RouterConfig  # lazy: `nexus --help` stays fast

    index = resolve_index(index)
    if args_time_limit < 0:
        raise UsageError("--args-time-limit must be 0 (no limit) or a number of seconds")
    if session is not None:
        if batch is not None or history is not None or query is None or not query.strip():
            raise UsageError("--session takes one QUERY (no --batch, no --history: the session keeps the history)")
        if rerank_k is not None:
            raise UsageError("--rerank-k is not available with --session (a session keeps its router's settings)")
        from ..serving.session import route_with_session  # lazy: only a session needs the serving engine

        turn = route_with_session(session, query, index, registry, model, no_args, top_k, reranker,
                                  args_time_limit_s=args_time_limit or None, rerank_model=rerank_model,
                                  card_splice=cards)
        if as_json:
            emit_json(turn.as_json())
        else:
            _render(query, turn.route, with_args=not no_args)
        if not no_args and turn.route.args_error:
            raise typer.Exit(1)  # "arguments": null above; a script must not take the turn for a call it can make
        return

    if batch is None and (query is None or not query.strip()):
        raise UsageError("give a QUERY or --batch FILE")
    if batch is not None and query is not None:
        raise UsageError("give either a QUERY or --batch FILE, not both")
    if top_k < 1:
        raise UsageError("--top-k must be at least 1")
    if rerank_k is not None and rerank_k < 2:
        raise UsageError("--rerank-k must be at least 2")
    hist = _read_history(history) if history else None
    items = _read_batch(batch) if batch else None
    router = Router(index, RouterConfig(top_k=top_k, reranker=reranker, model=model, rerank_k=rerank_k,
                                        rerank_model=rerank_model, args_time_limit_s=args_time_limit or None,
                                        warm=items is not None),  # one request: load only what it needs
                    registry=registry)
    if items is not None:
        for n, item in enumerate(items, 1):
            res = router.route(item["query"], history=item.get("history") or hist, with_args=not no_args)
            res.id = item.get("id", n)
            emit_json(res.as_json())
        return
    res = router.route(query, history=hist, with_args=not no_args)
    from ..cli import skip_teardown

    skip_teardown()  # the answer is all this process has left to give (cli.skip_teardown)
    if as_json:
        emit_json(res.as_json())
    else:
        _render(query, res, with_args=not no_args)
    if not no_args and res.args_error:
        raise typer.Exit(1)  # "arguments": null above, the reason in args_error: a failure, not a call to make


def _render(query: str, res, with_args: bool) -> None:
    from rich.console import Group
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text


    head = Text.assemble(("→ ", "bold"), (f"{res.server}/", "dim"), (res.tool, "bold green"))
    gate = res.gate
    margin = "none (no rival tool)" if gate["margin"] is None else f"{gate['margin']:.4f}"
    if not gate["escalated"]:
        decided = "auto-routed"
    elif not res.reranker:
        decided = "below τ, but no reranker is configured"
    else:
        decided = f"escalated to the {res.reranker} reranker"
        if res.name_choice is not None:  # the cascade: which of its two judges decided (the slow one or not)
            decided += " (its name choice decided)" if res.name_choice else " (its likelihood decided)"
    gate_line = Text(f"gate: margin {margin} {'<' if gate['escalated'] else '≥'} τ {gate['tau']:.4f} → {decided}",
                     style="yellow" if gate["escalated"] else "cyan")
    table = Table(title="candidates", show_edge=False, pad_edge=False, expand=False)
    table.add_column("#", justify="right")
    table.add_column("server")
    table.add_column("tool")
    table.add_column("retrieval", justify="right")
    if res.reranker:
        table.add_column(res.reranker, justify="right")
    for i, c in enumerate(res.candidates, 1):
        style = "bold green" if (c.tool == res.tool and c.server == res.server) else None
        cells = [str(i), c.server, c.tool, f"{c.score:.4f}"]
        if res.reranker:
            cells.append("—" if c.rerank_score is None else f"{c.rerank_score:.4f}")
        table.add_row(*cells, style=style)
    parts = [Text(f"request: {query}", style="italic"), head, gate_line, table, Text(f"signature: {res.signature}")]
    if res.interchangeable:
        parts.append(Text("the same tool on: " + ", ".join(t["server"] for t in res.interchangeable), style="dim"))
    if with_args:
        if res.arguments is not None:
            parts.append(Text("arguments: " + json.dumps(res.arguments, ensure_ascii=False), style="bold"))
            if res.guessed:
                parts.append(Text("guessed, not in the request: " + ", ".join(res.guessed)
                                  + " (state them to replace the model's guesses)", style="yellow"))
        if res.args_error:
            parts.append(Text(f"arguments: {res.args_error}", style="red"))
    t = res.timings_ms
    parts.append(Text(
        f"timings: embed {t['embed']:.1f} ms · scan {t['scan']:.2f} ms · rerank {t['rerank']:.1f} ms · "
        f"args {t['args']:.0f} ms · total {t['total']:.1f} ms", style="dim"))
    stdout_console().print(Panel(Group(*parts), title="nexus route", expand=False))
