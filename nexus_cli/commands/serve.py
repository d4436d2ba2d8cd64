"""nexus serve --index DIR [--registry ...] [--model M] [--no-args]: an MCP server over stdio (see stages/serve.py)."""

from __future__ import annotations

from typing import List, Optional

import typer


def serve_command(
    index: str = typer.Option(..., "--index", "-i", help="Index directory built by `nexus index`."),
    registry: Optional[List[str]] = typer.Option(None, "--registry", help="Registry files/dirs with the full schemas (must match the index)."),
    model: str = typer.Option("qwen2.5-0.5b", "--model", "-m", help="LLM that generates arguments."),
    no_args: bool = typer.Option(False, "--no-args", help="Route only: return no arguments (no LLM is loaded)."),
    top_k: int = typer.Option(5, "--top-k", help="Candidates returned per request."),
    reranker: str = typer.Option("auto", "--reranker", help="auto (the index's trained reranker if any; none when its embedder was fine-tuned on "
                                 "example requests; else likelihood), likelihood, cross, llm, none."),
    threads: Optional[int] = typer.Option(None, "--threads", help="CPU threads for the models."),
    deterministic: bool = typer.Option(False, "--deterministic", help="Bit-reproducible arguments: every request prefills cold instead of reusing warm prefixes of other requests."),
) -> None:
    """Speaks MCP on stdin/stdout; logs and errors go to stderr."""
    from ..errors import UsageError
    from ..output import stderr_console
    from ..stages import serve as stage

    if top_k < 1:
        raise UsageError("--top-k must be at least 1")
    service = stage.make_service(index, registry, model, with_args=not no_args, threads=threads, top_k=top_k,
                                 reranker=reranker, deterministic=deterministic)
    info = service.info()
    stderr_console().print(
        f"[dim]nexus serve: {info.tools} tools of {info.servers} servers · "
        f"{'arguments by ' + info.model if info.with_args else 'routing only'} · MCP over stdio[/]", highlight=False)
    stage.serve_stdio(service)
