"""nexus serve [--index DIR] [--registry ...] [--model M] [--no-args]: an MCP server over stdio (serving/server.py)."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..config import ARGUMENTS_LLM, DEFAULT_ARGS_TIME_LIMIT_S
from ..errors import UsageError
from ..output import stderr_console
from . import options
from .route import resolve_index


def serve_command(
    index: Optional[str] = options.index(),
    registry: Optional[List[str]] = options.registry(),
    model: str = typer.Option(ARGUMENTS_LLM, "--model", "-m", help="LLM that generates arguments (the likelihood reranker runs on qwen2.5-0.5b with the default, else on this one)."),
    no_args: bool = typer.Option(False, "--no-args", help="Route only: return no arguments (no LLM is loaded)."),
    top_k: int = typer.Option(5, "--top-k", help="Candidates returned per request."),
    reranker: str = options.reranker(),
    rerank_model: Optional[str] = options.rerank_model(),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for the models."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Bit-reproducible arguments: every request prefills cold instead of reusing warm prefixes of other requests."),
    args_time_limit: float = typer.Option(DEFAULT_ARGS_TIME_LIMIT_S, "--args-time-limit", help="Seconds one request's argument generation may take, retries included (0: no limit)."),
    cards: bool = options.cards(),
) -> None:
    """Speaks MCP on stdin/stdout; logs and errors go to stderr."""
    from ..serving import server as stage  # lazy: `nexus --help` stays fast

    if top_k < 1:
        raise UsageError("--top-k must be at least 1")
    if args_time_limit < 0:
        raise UsageError("--args-time-limit must be 0 (no limit) or a number of seconds")
    service = stage.make_service(resolve_index(index), registry, model, with_args=not no_args, threads=threads, top_k=top_k,
                                 reranker=reranker, deterministic=deterministic,
                                 args_time_limit_s=args_time_limit or None, rerank_model=rerank_model,
                                 card_splice=cards)
    info = service.info()
    stderr_console().print(
        f"[dim]nexus serve: {info.tools} tools of {info.servers} servers · "
        f"{'arguments by ' + info.model if info.with_args else 'routing only'} · MCP over stdio[/]", highlight=False)
    err = stderr_console()
    stage.serve_stdio(service, log=lambda line: err.print(f"[dim]{line}[/]", highlight=False, soft_wrap=True))
