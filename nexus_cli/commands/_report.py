"""Shared pieces of the measurement commands: formatting intervals for rich tables, printing a results document.

Stages return plain dicts (JSON-ready results documents, see nexus_cli/results.py); this module only renders them.
"""

from __future__ import annotations

from typing import Any, Callable

from ..output import emit_json, stderr_console, stdout_console


def fmt_num(v: Any, digits: int = 2, scale: float = 1.0) -> str:
    if v is None:
        return "—"
    try:
        return f"{float(v) * scale:.{digits}f}"
    except (TypeError, ValueError):
        return str(v)


def fmt_ci(iv: dict | None, digits: int = 1, scale: float = 1.0, suffix: str = "") -> str:
    """'12.3 [11.0, 13.5]' from an Interval dict ({value, lo, hi}); '—' when missing."""
    if not iv or iv.get("value") is None:
        return "—"
    v, lo, hi = iv.get("value"), iv.get("lo"), iv.get("hi")
    if lo is None or hi is None:
        return f"{fmt_num(v, digits, scale)}{suffix}"
    return f"{fmt_num(v, digits, scale)}{suffix} [{fmt_num(lo, digits, scale)}, {fmt_num(hi, digits, scale)}]"


def fmt_pct(iv: dict | None, digits: int = 1) -> str:
    return fmt_ci(iv, digits, 100.0, "")


def fmt_speedup(sp: dict | None, digits: int = 2) -> str:
    if not sp or sp.get("value") is None:
        return "—"
    return f"{sp['value']:.{digits}f}x [{sp['lo']:.{digits}f}, {sp['hi']:.{digits}f}]"


def fmt_kl(v: Any) -> str:
    if v is None:
        return "—"
    v = float(v)
    if v == 0.0:
        return "0"
    return f"{v:.2e}" if v < 1e-3 else f"{v:.4f}"


def finish(doc: dict, as_json: bool, render: Callable[[dict, Any], None]) -> None:
    """Print the document as JSON (--json) or as rich tables; say on stderr where the files went."""
    if as_json:
        emit_json(doc)
    else:
        console = stdout_console()
        if not console.is_terminal:
            console.width = max(console.width, 200)  # files and pipes get the whole table, not 80 squeezed columns
        render(doc, console)
    files = doc.get("files") or {}
    if files:
        where = files.get("json", "")
        png = files.get("png")
        stderr_console().print(
            f"[dim]results: {where}" + (f"  figure: {png}" if png else "") + f"  ({doc.get('wall_s', 0):.0f} s)[/]",
            highlight=False,
        )


def env_line(doc: dict) -> str:
    env = doc.get("environment") or {}
    cpu = env.get("cpu") or {}
    git = env.get("git") or {}
    model = next(iter((doc.get("models") or {}).values()), None) or {}
    parts = [
        f"{cpu.get('model', '?')} ({cpu.get('usable_cores', '?')} cores, simd {env.get('simd_level') or '/'.join(cpu.get('flags', [])[-3:])})",
        f"git {git.get('short') or '?'}{'+dirty' if git.get('dirty') else ''}",
        f"llama-cpp-python {(env.get('packages') or {}).get('llama-cpp-python') or '?'}",
    ]
    if model:
        parts.append(f"model {model.get('name')} ({(model.get('sha256') or '')[:12]})")
    return " · ".join(parts)
