"""Options several commands share, defined once, and how a suite's defaults give way to what the user typed.

Options whose "given or not" matters (a --quick run picks smaller values for those the user left out) default to
None; `settings` then fills them from the quick or the full defaults.
"""

from __future__ import annotations

from typing import Any, Optional

import typer

from ..config import DEFAULT_LLM


def model(help: str = f"LLM: smollm2-135m, qwen2.5-0.5b or a .gguf path (default {DEFAULT_LLM}).") -> Any:
    return typer.Option(None, "--model", "-m", help=help)


def embedder(help: str = "Embedder name (minilm) or a sentence-transformers folder.") -> Any:
    return typer.Option(None, "--embedder", help=help)


def as_json() -> Any:
    return typer.Option(False, "--json", help="Print the result as JSON on stdout (progress and logs go to stderr).")


def index() -> Any:
    return typer.Option(None, "--index", "-i", help="Index directory (default .nexus/index, or $NEXUS_INDEX).")


def registry() -> Any:
    return typer.Option(None, "--registry", help="Registry files the index was built from (their schemas are used for arguments).")


def reranker() -> Any:
    return typer.Option("auto", "--reranker", help="auto (none for an embedder fine-tuned on example requests, else likelihood), likelihood, llm, cascade (likelihood, and llm where it disagrees with the retriever) or none.")


def rerank_model() -> Any:
    return typer.Option(None, "--rerank-model", help="LLM of the reranker (default: qwen2.5-1.5b for llm and the name choice of cascade; for likelihood qwen2.5-0.5b with the default --model, else --model).")


def cards() -> Any:
    return typer.Option(True, "--cards/--no-cards", help="Sessions and serve: splice the chosen tool's compiled card after the conversation instead of decoding it (kept in $NEXUS_CARD_CACHE or ~/.cache/nexus/cards).")


def results_out(suite: str) -> Any:
    return typer.Option("results", "--out", help=f"Results folder (writes <out>/{suite}/).")


def registry_dir() -> Any:
    return typer.Option(None, "--registry-dir", help="Registries folder (default ../shared/registries).")


def seed(help: str = "Seed of the bootstrap.") -> Any:
    return typer.Option(0, "--seed", help=help)


def quick(help: str) -> Any:
    return typer.Option(False, "--quick", help=help)


def flash_attn(default: bool = False) -> Any:
    return typer.Option(default, "--flash-attn/--no-flash-attn", help="Row-major V cache (on) or transposed (off).")


def tool() -> Any:
    return typer.Option("github/create_pull_request", "--tool", help="The schema to splice (server/name).")


def settings(given: dict[str, Optional[Any]], defaults: dict[str, Any], quick: bool = False,
             quick_values: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each setting as the user gave it, else its --quick value (with --quick), else its default."""
    base = {**defaults, **((quick_values or {}) if quick else {})}
    return {k: (v if v is not None else base.get(k)) for k, v in given.items()}
