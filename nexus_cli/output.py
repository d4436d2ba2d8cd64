"""Where output goes: results to stdout (JSON with --json), progress and logs to stderr."""

from __future__ import annotations

import json
import sys
from typing import Any


def _default(obj: Any):
    # numpy scalars/arrays and paths, without importing numpy here
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if hasattr(obj, "__fspath__"):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")


def emit_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, default=_default, ensure_ascii=False) + "\n")
    sys.stdout.flush()


def stdout_console():
    from rich.console import Console

    return Console()


def stderr_console():
    from rich.console import Console

    return Console(stderr=True)


def progress(transient: bool = True):
    """A rich progress bar on stderr."""
    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=stderr_console(),
        transient=transient,
    )
