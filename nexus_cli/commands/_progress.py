"""A rich progress bar on stderr wired to a stage's Progress callbacks."""

from __future__ import annotations

from contextlib import contextmanager

from ..errors import UsageError
from ..output import progress as make_progress


@contextmanager
def stage_progress(label: str, enabled: bool = True):
    from ..lab.common import Progress  # lazy: `nexus --help` stays fast

    if not enabled:
        yield Progress()
        return
    with make_progress(transient=True) as bar:
        task = bar.add_task(label, total=None)

        def on_total(n: int) -> None:
            bar.update(task, total=n)

        def on_advance(desc: str) -> None:
            bar.update(task, advance=1, description=f"{label} {desc}".strip())

        yield Progress(on_advance=on_advance, on_total=on_total)


def parse_int_list(text: str, name: str) -> list[int]:
    try:
        vals = [int(x) for x in text.replace(" ", "").split(",") if x]
    except ValueError:
        raise UsageError(f"{name} must be a comma-separated list of integers, not '{text}'") from None
    if not vals:
        raise UsageError(f"{name} is empty")
    return vals
