"""nexus index REGISTRY... [--mcp CMD] [--out INDEX_DIR] [--json]: embed a registry into an INT8 SLB, calibrate the
gate. The index goes to the default folder (.nexus/index, or $NEXUS_INDEX) that `nexus route` reads."""

from __future__ import annotations

from typing import List, Optional

import typer

from ..config import (
    DEFAULT_EMBEDDER,
    DEFAULT_LEX_WEIGHT,
    DEFAULT_RECIPE,
    FINETUNE_BUDGET_S,
    FINETUNE_EPOCHS,
    FINETUNE_EXAMPLE_POSITIVES,
    FINETUNE_ROUNDS,
    SYNTHESIS_MODEL,
    default_index_dir,
)
from ..errors import NexusError, UsageError
from ..output import emit_json, progress, stdout_console
from ..registry import load_example_requests, load_registries


def index_command(
    registry: Optional[List[str]] = typer.Argument(None, help="Registry files or directories (MCP tools/list JSON)."),
    mcp: Optional[List[str]] = typer.Option(None, "--mcp", help="Also index a live MCP server over stdio (command line; repeatable)."),
    out: Optional[str] = typer.Option(None, "--out", "-o", help="Index directory to write (replaced atomically); default .nexus/index or $NEXUS_INDEX."),
    embedder: str = typer.Option(DEFAULT_EMBEDDER, "--embedder", help="Embedder name (minilm) or a sentence-transformers folder; its own query/document prompts are used."),
    recipe: str = typer.Option(DEFAULT_RECIPE, "--recipe", help="Tool text recipe: multi (several vectors per tool) or doc."),
    lexical: bool = typer.Option(True, "--lexical/--no-lexical", help="Store the BM25 index for hybrid retrieval."),
    lex_weight: float = typer.Option(DEFAULT_LEX_WEIGHT, "--lex-weight", help="Weight of the normalized BM25 score in the fusion."),
    examples: Optional[List[str]] = typer.Option(None, "--examples", help="JSONL of example requests {server, tool, query}; each tool's first 12 become extra vectors and BM25 words, its first 4 join the reranker's prompt (repeatable)."),
    shipped_examples: bool = typer.Option(True, "--shipped-examples/--no-shipped-examples", help="Give the tools that are tools of the public MCP servers Nexus ships example requests for (tool_registries/examples) those requests, as with --examples (docs/routing.md)."),
    synthesize: bool = typer.Option(False, "--synthesize/--no-synthesize", help="Have the local LLM write example requests for every tool without --examples (cached per tool; resumes; slow: see docs/routing.md for tools per minute)."),
    synthesize_model: str = typer.Option(SYNTHESIS_MODEL, "--synthesize-model", help="The LLM that writes the requests (a model name or GGUF path)."),
    value_masking: bool = typer.Option(True, "--value-masking/--no-value-masking", help="Also score each request with its literal values (paths, titles, numbers) masked, and average."),
    finetune: bool = typer.Option(False, "--finetune/--no-finetune", help="Fine-tune the embedder (on the example requests, --examples and the shipped ones, if the tools have any, else registry-derived ones) and store it in the index (minutes)."),
    finetune_epochs: int = typer.Option(FINETUNE_EPOCHS, "--finetune-epochs", help="Passes over the fine-tuning requests."),
    finetune_example_positives: bool = typer.Option(FINETUNE_EXAMPLE_POSITIVES, "--finetune-example-positives/--no-finetune-example-positives", help="With example requests, also pair each example request with another of its tool (doubles the training time)."),
    finetune_rounds: int = typer.Option(FINETUNE_ROUNDS, "--finetune-rounds", help="With example requests: 2 adds one pass from the fine-tuned model, its hard negatives mined by that model (1 or 2)."),
    finetune_budget: float = typer.Option(FINETUNE_BUDGET_S, "--finetune-budget", help="Fine-tuning time budget in seconds (a cap)."),
    quarantine: bool = typer.Option(False, "--quarantine/--no-quarantine", help="Leave out the tools the audit finds hostile (text addressed to the model, hidden characters, look-alike names, keyword stuffing); without it they are indexed, sanitized, with a warning."),
    as_json: bool = typer.Option(False, "--json", help="Print the build report as JSON."),
) -> None:
    from rich.markup import escape

    from ..routing.build import build_index  # lazy: `nexus --help` stays fast
    from ..serving import mcp_client  # lazy: `nexus --help` stays fast

    if not registry and not mcp:
        raise UsageError("give at least one REGISTRY file/directory or --mcp CMD")
    if recipe not in ("multi", "doc"):
        raise UsageError(f"unknown --recipe '{recipe}' (multi, doc)")
    if finetune_epochs < 1:
        raise UsageError(f"--finetune-epochs must be at least 1, got {finetune_epochs}")
    if finetune_rounds not in (1, 2):
        raise UsageError(f"--finetune-rounds must be 1 or 2, got {finetune_rounds}")
    writer = None
    if synthesize:
        from ..routing.synthesize import RequestWriter

        writer = RequestWriter(synthesize_model)  # a missing or damaged model is refused here, before any work
    tools = load_registries(registry) if registry else []
    example_requests = load_example_requests(examples) if examples else None
    sources = list(registry or [])
    for cmd in mcp or []:
        live = mcp_client.list_tools(cmd)
        seen = {t.key for t in tools}
        for t in live:
            if t.key in seen:
                raise NexusError(f"duplicate tool '{t.key}' (from --mcp {cmd})")
            seen.add(t.key)
        tools.extend(live)
        sources.append(f"mcp:{cmd}")
    n_shipped = 0
    if shipped_examples:
        from ..routing.shipped_examples import with_shipped

        example_requests, n_shipped = with_shipped(tools, example_requests)
    with progress() as bar:
        tasks: dict[str, int] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in tasks:
                tasks[stage] = bar.add_task(stage, total=total)
            bar.update(tasks[stage], completed=done, total=total)

        report = build_index(tools, out or default_index_dir(), embedder_name=embedder, recipe=recipe, lexical=lexical, lex_weight=lex_weight,
                             finetune=finetune, finetune_options={"time_budget_s": finetune_budget, "epochs": finetune_epochs,
                                               "example_positives": finetune_example_positives,
                                               "rounds": finetune_rounds},
                             value_masking=value_masking, examples=example_requests, synthesize=writer,
                             quarantine=quarantine, progress=on_progress, sources=sources, n_shipped=n_shipped)
    if as_json:
        emit_json(report.as_json())
        return
    c = stdout_console()
    servers = "server" if report.n_servers == 1 else "servers"
    # soft_wrap: the index path stays on one line (copyable) however narrow the terminal
    c.print(f"[bold green]indexed[/] {report.n_tools} tools from {report.n_servers} {servers} "
            f"({report.n_vectors} INT8 vectors, dim {report.dim}) → {report.out}", soft_wrap=True)
    c.print(f"gate: τ = {report.tau:.4f} (P20 of adversarial-pair margins), expected fire rate "
            f"{report.fire_rate:.1%}")
    ex = report.examples
    if ex:
        c.print(f"examples: {ex['n_requests']} requests for {ex['n_tools_with']} of {report.n_tools} tools"
                + (f", the shipped ones for {n_shipped}" if n_shipped else "")
                + (f" ({ex['n_unmatched_tools']} tools named in the examples are not in this registry)"
                   if ex["n_unmatched_tools"] else ""))
    syn = (ex or {}).get("synthesized")
    if syn:
        c.print(f"synthesized: {syn['n_requests']} requests for {syn['n_tools']} tools by {syn['model']} "
                f"({syn['n_written']} written now, {syn['n_cached']} from the cache)", soft_wrap=True)
    ft = report.finetuned
    if ft:
        c.print(f"embedder: fine-tuned on {ft['n_triples']} {'example' if 'example' in ft['data'] else 'registry-derived'} "
                f"requests in {ft['train']['seconds']} s"
                + (f", then a second round in {ft['second_round']['train']['seconds']} s"
                   if "train" in (ft.get("second_round") or {}) else ""))
    if report.interchangeable:
        n = sum(len(g) for g in report.interchangeable)
        c.print(f"interchangeable: {len(report.interchangeable)} tools served by several servers unchanged ({n} "
                f"entries, e.g. {' = '.join(report.interchangeable[0])}); the gate does not count a copy as a rival")
    if report.problems:
        c.print(f"[yellow]{len(report.problems)} tools with schema notes[/] (see tools.json)")
    if report.suspicious:
        out_of = set(report.quarantined)
        c.print(f"[yellow]{len(report.suspicious)} suspicious tools[/]"
                + (f", {len(out_of)} quarantined (left out)" if out_of else
                   " (indexed with their descriptions sanitized; --quarantine leaves out the hostile ones)"))
        for key, lines in list(report.suspicious.items())[:8]:
            c.print(f"  {'[red]quarantined[/] ' if key in out_of else ''}{escape(key)}: {escape(lines[0])}",
                    soft_wrap=True, highlight=False)
        if len(report.suspicious) > 8:
            c.print(f"  … {len(report.suspicious) - 8} more (nexus index --json, or manifest.json \"audit\")")
    c.print(f"[dim]{report.seconds['total']:.1f} s[/]")
