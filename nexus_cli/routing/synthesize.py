"""Requests a registry writes for itself: `nexus index --synthesize`.

For a tool that nobody wrote example requests for, the local LLM reads the tool (server, name, description,
parameters) and writes REQUESTS_PER_TOOL requests a user might send for it, varied (terse, chatty, the goal without
the action's name) and with concrete values. Each request is checked against the tool before it is kept
(`check_request`), and the kept ones become the tool's example requests (extra vectors and BM25 words, like
`--examples`).

Several tools are written at once, one llama.cpp sequence each, so a decoding step reads the weights once for all of
them (LlamaContext.generate_greedy_many). Decoding is greedy: the same tool and model give the same requests.

Cache and resume: every tool's answer (the LLM's raw text: the parsing and the checks run again on every read, so
they can change without writing anything again) is stored in its own file under
`<cache>/requests/<model sha256>/<tool hash>.json` (the hash covers the prompt revision, the tool's server, name,
description and input schema), written by temporary file + rename as soon as its batch ends. Re-indexing writes only
for new or changed tools, and an interrupted run resumes where it stopped; a damaged cache file is written again.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Callable, Sequence

from .. import textgen
from ..config import models_dir
from ..files import atomic_write_json
from ..models import resolve_model

# Bumped whenever the prompt changes, so answers to an older prompt are written again.
PROMPT_REVISION = 1
REQUESTS_PER_TOOL = 6
BATCH = 8  # tools written at once (one sequence each)
MAX_NEW_TOKENS = 220  # six lines of ~25 tokens, with room
TEMPERATURE = 0.0
SEED = 0
DESC_WORDS = 70
MAX_PARAMS = 8
MIN_WORDS, MAX_WORDS = 3, 40

SYSTEM = "You write realistic messages that users type to an AI assistant. You answer with the messages only."
INSTRUCTION = (
    "An assistant can perform the action described below. Write {n} different messages a user would send when they "
    "need exactly this action, one per line, no numbering, no quotes. Vary them: short commands, casual sentences "
    "about their situation, the goal in their own words. Never use the action's name. Give concrete, realistic values "
    "(names, ids, paths, numbers, dates) for the inputs.")
# A worked example (a made-up tool) shows the form; it opens every prompt, so a batch decodes it once.
EXAMPLE_TOOL = ("Service: calendar\nAction: create event\nWhat it does: Create an event in the user's calendar.\n"
                "Inputs:\n- title (string, required): Event title.\n- start (string, required): Start, ISO 8601.\n"
                "- duration_minutes (integer): Length in minutes.\n- attendees (array): Emails to invite.")
EXAMPLE_REQUESTS = (
    "add the dentist to my calendar tomorrow at 9\n"
    "new event: quarterly review, Dec 14 2pm, 90 min, invite ana@corp.io\n"
    "ugh I keep forgetting the team lunch, can you put it down for Friday 12:30?\n"
    "my sister lands on the 22nd at 6pm, block that evening so nobody books me\n"
    "set up a 30-minute sync with bob@acme.com and li@acme.com next Monday at 10\n"
    "I need the budget workshop on the books for March 3rd, 1 to 4pm")


def cache_root() -> Path:
    """$NEXUS_REQUESTS_CACHE, else `requests` next to the models cache (~/.cache/nexus/requests by default)."""
    env = os.environ.get("NEXUS_REQUESTS_CACHE")
    return Path(env).expanduser() if env else models_dir().parent / "requests"


def tool_hash(tool) -> str:
    doc = [PROMPT_REVISION, REQUESTS_PER_TOOL, tool.server, tool.name, tool.description or "", tool.input_schema]
    return hashlib.sha256(json.dumps(doc, sort_keys=True, default=str).encode("utf-8")).hexdigest()[:24]


def _param_lines(schema) -> list[str]:
    req, opt = textgen.param_names(schema, MAX_PARAMS)
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    lines = []
    for name in (req + opt)[:MAX_PARAMS]:
        spec = props.get(name) if isinstance(props.get(name), dict) else {}
        kind = spec.get("type") if isinstance(spec.get("type"), str) else "value"
        desc = textgen.truncate_words(textgen.first_sentence(str(spec.get("description") or "")), 14)
        lines.append(f"- {name} ({kind}{', required' if name in req else ''}){': ' + desc if desc else ''}")
    return lines


def tool_card(tool) -> str:
    desc = textgen.truncate_words(textgen.clean_description(tool.description or ""), DESC_WORDS)
    params = _param_lines(tool.input_schema)
    return (f"Service: {tool.server}\nAction: {textgen.readable_name(tool.name)}\n"
            f"What it does: {desc or '(no description)'}" + ("\nInputs:\n" + "\n".join(params) if params else ""))


def prompt_messages(tool, n: int = REQUESTS_PER_TOOL) -> list[dict]:
    return [{"role": "system", "content": SYSTEM},
            {"role": "user", "content": INSTRUCTION.format(n=n) + "\n\n" + EXAMPLE_TOOL},
            {"role": "assistant", "content": EXAMPLE_REQUESTS},
            {"role": "user", "content": tool_card(tool)}]


_BULLET = re.compile(r"^\s*(?:[-*•]|\d+[.)]|\(?\d+\))\s*")


_QUOTED = re.compile(r'^(["“”\'])(.*)\1$|^“(.*)”$')


def parse_lines(text: str) -> list[str]:
    """The messages of the LLM's answer: one a line, numbering, bullets and quotes around the whole line removed."""
    out = []
    for line in text.splitlines():
        line = _BULLET.sub("", line).strip()
        m = _QUOTED.match(line)
        if m:
            line = (m.group(2) if m.group(2) is not None else m.group(3)).strip()
        if line:
            out.append(line)
    return out


def _numeric_required(schema) -> bool:
    req, _ = textgen.param_names(schema, 64)
    props = schema.get("properties", {}) if isinstance(schema, dict) else {}
    return any(isinstance(props.get(p), dict) and props[p].get("type") in ("integer", "number") for p in req)


def check_request(tool, request: str) -> str | None:
    """Why `request` is not kept for `tool`, or None. It must be a message of MIN_WORDS..MAX_WORDS words that does
    not name the tool, and when the schema requires a number (an issue number, a count) it must give one."""
    words = request.split()
    if not MIN_WORDS <= len(words) <= MAX_WORDS:
        return "length"
    low = request.lower()
    if tool.name.lower() in low and ("_" in tool.name or "-" in tool.name or len(tool.name) > 12):
        return "names the tool"
    if _numeric_required(tool.input_schema) and not re.search(r"\d", request):
        return "no number for a required numeric input"
    return None


def _keep(tool, lines: Sequence[str], n: int) -> list[str]:
    seen, kept = set(), []
    for line in lines:
        key = " ".join(line.lower().split())
        if key in seen or check_request(tool, line) is not None:
            continue
        seen.add(key)
        kept.append(line)
    return kept[:n]


def _read_cached(path: Path, key: str) -> str | None:
    """The LLM's answer stored for a tool, or None when there is none or it is not a whole, matching entry."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("tool") != key or not isinstance(doc.get("text"), str):
        return None
    return doc["text"]


class RequestWriter:
    """Writes (and caches) example requests for tools with a local LLM (a Nexus model name or GGUF path)."""

    def __init__(self, model: str, cache_dir: Path | None = None, batch: int = BATCH):
        from ..adapters.llama import LlamaContext, load_model  # lazy: the model loads only when a tool needs it

        self._load = lambda: LlamaContext(load_model(model), n_ctx=batch * 768, n_batch=2048, n_seq_max=batch)
        self._path = resolve_model(model)  # a missing or damaged model is refused here, before any work
        self._ctx = None
        self.model = model
        self.batch = batch
        self._cache_dir = cache_dir

    @property
    def ctx(self):
        if self._ctx is None:
            self._ctx = self._load()
        return self._ctx

    def cache_dir(self) -> Path:
        """Keyed by the GGUF's sha256 (remembered per file by the adapter), so a re-index whose tools are all cached
        never loads the model."""
        if self._cache_dir is None:
            from ..adapters.llama import file_sha256

            self._cache_dir = cache_root() / file_sha256(self._path)[:16]
        return self._cache_dir

    def write(self, tools: Sequence, progress: Callable[[str, int, int], None] | None = None) -> tuple[dict, dict]:
        """({tool key: [requests]}, record). Cached tools are read back; the rest are written in batches, each
        tool's file stored as soon as its batch ends (so an interruption loses at most one batch)."""
        report = progress or (lambda *_: None)
        folder = self.cache_dir()
        folder.mkdir(parents=True, exist_ok=True)
        out: dict[str, list[str]] = {}
        todo = []
        for t in tools:
            hit = _read_cached(folder / f"{tool_hash(t)}.json", t.key)
            if hit is None:
                todo.append(t)
            else:
                out[t.key] = _keep(t, parse_lines(hit), REQUESTS_PER_TOOL)
        cached = len(out)
        report("writing requests", 0, len(todo))
        for b0 in range(0, len(todo), self.batch):
            group = todo[b0:b0 + self.batch]
            prompts = [self.ctx.model.chat_tokens(prompt_messages(t)) for t in group]

            def enough(toks: list[int]) -> bool:  # its lines are all written, or the last one runs away
                text = self.ctx.detokenize(toks, special=False)
                return text.count("\n") >= REQUESTS_PER_TOOL or len(text.rsplit("\n", 1)[-1].split()) > MAX_WORDS

            gens = self.ctx.generate_many(prompts, MAX_NEW_TOKENS, stop=enough, temperature=TEMPERATURE, seed=SEED)
            for t, toks in zip(group, gens):
                text = self.ctx.detokenize(toks, special=False)
                atomic_write_json(folder / f"{tool_hash(t)}.json", {"tool": t.key, "text": text})
                out[t.key] = _keep(t, parse_lines(text), REQUESTS_PER_TOOL)
            report("writing requests", min(b0 + self.batch, len(todo)), len(todo))
        record = {"model": self.model, "per_tool": REQUESTS_PER_TOOL, "revision": PROMPT_REVISION,
                  "n_tools": len(tools), "n_written": len(todo), "n_cached": cached,
                  "n_requests": sum(len(v) for v in out.values())}
        return out, record
