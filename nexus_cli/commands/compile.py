"""nexus compile REGISTRY... [--model M] [--out DIR]: one .atb KV block per tool, plus DIR/manifest.json.

The blocks go to the default folder (.nexus/blocks, or $NEXUS_BLOCKS) unless --out names another."""

from __future__ import annotations

from pathlib import Path
from typing import List, Optional

import typer

from ..config import DEFAULT_LLM, default_blocks_dir
from ..errors import UsageError
from ..output import emit_json, progress, stdout_console
from . import options


def compile_command(
    registries: List[Path] = typer.Argument(..., help="MCP tools/list JSON files, or directories of them."),
    model: str = typer.Option(DEFAULT_LLM, "--model", "-m", help="Model name (smollm2-135m, qwen2.5-0.5b) or GGUF path."),
    out: Optional[Path] = typer.Option(None, "--out", "-o", help="Output directory for the .atb blocks and manifest.json (default .nexus/blocks, or $NEXUS_BLOCKS)."),
    flash_attn: str = typer.Option("off", "--flash-attn", help="on|off: the V layout baked into the blocks "
                                   "(off: transposed V, on: row-major V). Splice with the same setting."),
    force: bool = typer.Option(False, "--force", help="Recompile every tool, even unchanged ones."),
    json_out: bool = options.as_json(),
) -> None:
    from ..splice.compile import compile_registries  # lazy: `nexus --help` stays fast

    fa = flash_attn.strip().lower()
    if fa not in ("on", "off"):
        raise UsageError(f"--flash-attn must be 'on' or 'off', not '{flash_attn}'")

    with progress() as bar:
        task = bar.add_task("compile", total=None)

        def on_start(n: int) -> None:
            bar.update(task, total=n)

        def on_tool(tool, compiled: bool) -> None:
            bar.update(task, advance=1, description=("compiled " if compiled else "unchanged ") + tool.key[:40])

        res = compile_registries([str(r) for r in registries], model, out or default_blocks_dir(), flash_attn=(fa == "on"),
                                 on_start=on_start, on_tool=on_tool, force=force)
    if json_out:
        emit_json(res.to_json())
        return
    console = stdout_console()
    console.print(
        f"{res.n_tools} tools: {res.n_compiled} compiled, {res.n_skipped} unchanged; "
        f"{res.n_tokens_total} tokens, {res.bytes_total / 1e6:.1f} MB in {res.seconds:.1f} s"
        + (f" ({res.tokens_per_s:.0f} tokens/s)" if res.n_compiled else "")
    )
    console.print(f"manifest: {res.manifest}")
