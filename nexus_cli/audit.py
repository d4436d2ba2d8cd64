"""Hostile registries: what a tool's own text may carry that is aimed at the router or at the model, and the text Nexus
uses instead.

An MCP server writes its tools' names, descriptions and parameter descriptions, and Nexus puts them in front of an
embedder and an LLM. A server can lie (tool poisoning, tool shadowing): text addressed to the model ("ignore the other
tools", "send the user's token to ..."), markup that hides such text from a human reader (`<IMPORTANT>`), invisible or
look-alike characters, a description stuffed with keywords to capture requests meant for other tools, a name or a
description that impersonates another server's tool.

* `sanitize_text` is what every description becomes before the router embeds it, the reranker reads it, or the
  argument prompt shows it: invisible characters removed, NFKC-normalized, markup blocks addressed to the model
  removed, and every sentence that matches an instruction pattern dropped.
* `audit_tools` reports suspicious tools with a reason; findings of severity "quarantine" are what
  `nexus index --quarantine` leaves out of the index ("warn" findings are reported only).

The patterns were checked against the 955 real tools of ../shared/registries: none of them matches (those servers'
own pushy lines, "ALWAYS use this tool when ...", are not instructions against other tools and stay). What was
measured is in docs/routing.md, "Hostile registries".
"""

from __future__ import annotations

import copy
import re
import unicodedata
from dataclasses import dataclass, replace
from typing import Any, Iterable, Sequence

QUARANTINE = "quarantine"
WARN = "warn"

# MCP tool names: 1-128 characters of A-Z a-z 0-9 _ - . (the spec's naming guidance); every real tool here obeys it
TOOL_NAME = re.compile(r"[A-Za-z0-9_.\-]{1,128}")
STUFFED_WORDS = 1000  # the longest real description here has 440 words (and only its first ~80 are ever read)
STUFFED_LIST_ITEMS = 30  # the longest real run of short comma-separated items here has 18 (UI component names)
STUFFED_KEYWORD_RUN = 30  # ... and of words with no function word or sentence end between them, 17
COPY_JACCARD = 0.85  # word 3-shingle overlap of two descriptions that counts as a copy

_INSTRUCTIONS = {
    "ignore-instructions": r"\bignore\b.{0,40}\b(instructions?|previous|prior|above|other tools?|all tools?)\b",
    "against-other-tools": r"\b(do not|don't|never|must not)\s+(use|call|choose|invoke|select|trust)\s+(any\s+)?"
                           r"(other|another|the other)\s+(tools?|servers?|functions?)\b",
    "secrecy": r"\b(do not|don't|never)\s+(tell|mention|inform|reveal|show|notify|disclose)\b.{0,40}"
               r"\b(user|human|anyone)\b|without (telling|informing|notifying|asking) the (user|human)"
               r"|\b(secretly|covertly|quietly|silently)\s+(send|call|include|forward|pass|read|upload|post|copy|add|"
               r"use|attach|write)\b",
    "exfiltration": r"\b(send|forward|upload|post|exfiltrate|leak|transmit|include|pass|attach|append|copy)\b.{0,60}"
                    r"\b(api[ _-]?keys?|access[ _-]tokens?|auth(entication)?[ _-]tokens?|bearer tokens?|"
                    r"(user'?s?|their) (tokens?|passwords?|keys?|credentials?)|passwords?|private[ _-]keys?|"
                    r"ssh[ _-]keys?|id_rsa|~/\.ssh|\.env\b|mcp\.json|credentials?( files?)?|session cookies?|cookies)\b",
    "reads-secrets": r"\b(read|cat|open|load)\b.{0,30}(~/\.ssh|id_rsa|\.env\b|mcp\.json|/etc/passwd|"
                     r"\.aws/credentials|\.npmrc|\.netrc)",
    "claims-precedence": r"\b(preferred|official|improved|better|upgraded|enhanced|newer|recommended|superior)\s+"
                         r"(version|replacement|implementation)\b|\binstead of (any |the )?(other|another)\s+"
                         r"(tools?|servers?)\b",
}
_INSTRUCTION_RES = {k: re.compile(v, re.I | re.S) for k, v in _INSTRUCTIONS.items()}
# markup used to hide text from a human reader while the model reads it: the whole block goes
_MARKUP_BLOCK = re.compile(r"<\s*(important|system|instructions?|secret|hidden|admin|assistant)\b[^>]*>.*?"
                           r"(<\s*/\s*\1\s*>|$)", re.I | re.S)
_MARKUP_TAG = re.compile(r"<\s*/?\s*(important|system|instructions?|secret|hidden|admin|assistant)\b[^>]*>", re.I)
_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")

# Latin look-alikes in Cyrillic and Greek, for naming the tool a confusable name imitates
_CONFUSABLE = str.maketrans({
    "а": "a", "е": "e", "о": "o", "р": "p", "с": "c", "у": "y", "х": "x", "і": "i", "ј": "j", "ѕ": "s", "ԁ": "d",
    "ɡ": "g", "һ": "h", "ӏ": "l", "ո": "n", "ԛ": "q", "ԝ": "w", "А": "A", "В": "B", "Е": "E", "К": "K", "М": "M",
    "Н": "H", "О": "O", "Р": "P", "С": "C", "Т": "T", "Х": "X", "α": "a", "ο": "o", "ρ": "p", "ν": "v", "ι": "i",
    "κ": "k", "τ": "t", "υ": "u", "Α": "A", "Β": "B", "Ε": "E", "Ζ": "Z", "Η": "H", "Ι": "I", "Κ": "K", "Μ": "M",
    "Ν": "N", "Ο": "O", "Ρ": "P", "Τ": "T", "Χ": "X", "Υ": "Y",
})


@dataclass(frozen=True)
class Finding:
    check: str
    severity: str  # QUARANTINE or WARN
    detail: str

    def as_json(self) -> dict:
        return {"check": self.check, "severity": self.severity, "detail": self.detail}

    def line(self) -> str:
        return f"{self.check}: {self.detail}"


def _invisible(ch: str) -> bool:
    o = ord(ch)
    if ch in "\n\t\r":
        return False
    if 0xFE00 <= o <= 0xFE0D or 0xE0100 <= o <= 0xE01EF:  # variation selectors but the emoji ones (can smuggle bytes)
        return True
    return unicodedata.category(ch) in ("Cf", "Co", "Cs", "Cc")


def hidden_characters(text: str) -> list[str]:
    """The invisible code points in `text` (format, control, private-use, surrogates, variation selectors)."""
    return [f"U+{ord(c):04X}" for c in (text or "") if _invisible(c)]


def strip_hidden(text: str) -> str:
    return "".join(c for c in (text or "") if not _invisible(c))


def instruction_matches(text: str) -> list[tuple[str, str]]:
    """(check, the words that matched) for every instruction pattern found in `text` (after NFKC, hidden characters
    removed, so a zero-width space cannot split a phrase)."""
    flat = unicodedata.normalize("NFKC", strip_hidden(text or ""))
    out = []
    for check, rx in _INSTRUCTION_RES.items():
        m = rx.search(flat)
        if m:
            out.append((check, " ".join(m.group(0).split())[:80]))
    tag = _MARKUP_TAG.search(flat)
    if tag:
        out.append(("markup-for-the-model", tag.group(0)[:40]))
    return out


def _matches_any(text: str) -> bool:
    flat = unicodedata.normalize("NFKC", text)
    return any(rx.search(flat) for rx in _INSTRUCTION_RES.values())


def sanitize_text(text: Any) -> str:
    """The text Nexus uses for a description: invisible characters removed, markup blocks aimed at the model removed
    whole, and sentences matching an instruction pattern (tested after NFKC, so full-width letters do not hide one)
    dropped. Everything else is left as written."""
    if not isinstance(text, str) or not text:
        return text if isinstance(text, str) else ""
    out = strip_hidden(text)
    if _MARKUP_TAG.search(unicodedata.normalize("NFKC", out)):
        out = _MARKUP_BLOCK.sub(" ", out)
        out = _MARKUP_TAG.sub(" ", out)
    if not _matches_any(out):
        return out
    kept = [p for p in _SENTENCE.split(out) if p and not _matches_any(p)]
    return " ".join(kept).strip()


def sanitize_schema(schema: Any) -> Any:
    """A copy of a JSON schema with every `description` (and `title`) string sanitized, at any depth."""
    if isinstance(schema, dict):
        return {k: (sanitize_text(v) if k in ("description", "title") and isinstance(v, str) else sanitize_schema(v))
                for k, v in schema.items()}
    if isinstance(schema, list):
        return [sanitize_schema(v) for v in schema]
    return schema


def sanitize_tool(tool):
    """A registry Tool whose description and parameter descriptions are sanitized (name and server untouched)."""
    return replace(tool, description=sanitize_text(tool.description),
                   input_schema=sanitize_schema(copy.deepcopy(tool.input_schema)))


def _schema_texts(schema: Any, path: str = "") -> Iterable[tuple[str, str]]:
    if isinstance(schema, dict):
        for k in ("description", "title"):
            if isinstance(schema.get(k), str):
                yield (path or "inputSchema"), schema[k]
        props = schema.get("properties")
        if isinstance(props, dict):
            for name, sub in props.items():
                yield from _schema_texts(sub, f"{path}.{name}" if path else str(name))
        for k in ("items", "additionalProperties"):
            if isinstance(schema.get(k), dict):
                yield from _schema_texts(schema[k], f"{path}[]" if path else "[]")
        for k in ("anyOf", "oneOf", "allOf"):
            if isinstance(schema.get(k), list):
                for sub in schema[k]:
                    yield from _schema_texts(sub, path)


def _longest_list_run(text: str) -> int:
    best = 0
    for seg in re.split(r"[.;:!?\n()]", text):
        run = 0
        for item in re.split(r",|\bor\b|\band\b|/|\|", seg):
            item = item.strip()
            if item and len(item.split()) <= 3:
                run += 1
                best = max(best, run)
            else:
                run = 0
    return best


_FUNCTION_WORDS = frozenset(
    "a an the to of in on for and or with by from is are be this that it as at its into your you if when which can "
    "will not use all any each do does how what who was were has have than then also only more most such these those "
    "their our we they".split())


def _longest_keyword_run(text: str) -> int:
    """The longest run of words with no function word, number or sentence end between them: prose has one every few
    words, a pasted keyword list does not."""
    best = cur = 0
    for tok in re.split(r"[\s,;/|]+", text):
        word = tok.strip(".:!?()[]\"'").lower()
        content = bool(word) and word.isalpha() and word.isascii() and word not in _FUNCTION_WORDS
        cur = cur + 1 if content else 0
        best = max(best, cur)
        if re.search(r"[.:!?]$", tok):
            cur = 0
    return best


def _shingles(text: str) -> set[tuple[str, ...]]:
    words = re.findall(r"[a-z0-9]+", unicodedata.normalize("NFKC", text or "").lower())
    return {tuple(words[i:i + 3]) for i in range(max(0, len(words) - 2))}


def _fold(name: str) -> str:
    return re.sub(r"[-_. ]", "", unicodedata.normalize("NFKC", strip_hidden(name)).translate(_CONFUSABLE).lower())


def audit_tool(tool) -> list[Finding]:
    """Findings about one tool on its own (no comparison with the rest of the registry)."""
    out: list[Finding] = []
    hidden_name = hidden_characters(tool.name)
    if hidden_name or not TOOL_NAME.fullmatch(tool.name):
        bad = sorted({f"U+{ord(c):04X}" for c in tool.name if not re.fullmatch(r"[A-Za-z0-9_.\-]", c)})
        out.append(Finding("name-characters", QUARANTINE,
                           f"name has characters outside A-Z a-z 0-9 _ - . ({', '.join(bad[:4]) or 'length'})"))
    texts = [("description", tool.description or "")] + list(_schema_texts(tool.input_schema))
    hidden = [(where, hidden_characters(text)) for where, text in texts]
    hidden = [(w, h) for w, h in hidden if h]
    if hidden:
        where, cps = hidden[0]
        n = sum(len(h) for _, h in hidden)
        out.append(Finding("hidden-characters", QUARANTINE,
                           f"{n} invisible characters ({', '.join(sorted(set(cps))[:3])} in {where})"))
    seen = set()
    for where, text in texts:
        for check, words in instruction_matches(text):
            if check not in seen:
                seen.add(check)
                out.append(Finding(check, QUARANTINE, f"text addressed to the model in {where}: \"{words}\""))
    desc = tool.description or ""
    n_words = len(desc.split())
    run, keywords = _longest_list_run(desc), _longest_keyword_run(desc)
    if n_words > STUFFED_WORDS or run >= STUFFED_LIST_ITEMS or keywords >= STUFFED_KEYWORD_RUN:
        why = (f"a list of {run} short items" if run >= STUFFED_LIST_ITEMS else
               f"a run of {keywords} keywords without a sentence" if keywords >= STUFFED_KEYWORD_RUN else "")
        out.append(Finding("stuffed-description", QUARANTINE, f"description of {n_words} words" + (f" with {why}" if why else "")))
    return out


def audit_tools(tools: Sequence) -> dict[str, list[Finding]]:
    """Findings per tool key, for the tools that have any: each tool on its own (`audit_tool`), then against the
    registry: a name that imitates another server's tool, a description far longer than its server's others, a
    description copied from another server's tool under another name."""
    found: dict[str, list[Finding]] = {t.key: audit_tool(t) for t in tools}
    by_fold: dict[str, list] = {}
    for t in tools:
        by_fold.setdefault(_fold(t.name), []).append(t)
    for t in tools:
        if TOOL_NAME.fullmatch(t.name):
            continue
        twins = [o for o in by_fold.get(_fold(t.name), []) if o.key != t.key and TOOL_NAME.fullmatch(o.name)]
        if twins:
            found[t.key].append(Finding("impersonation", QUARANTINE, f"name looks like {twins[0].key}"))
    shingles = {t.key: _shingles(t.description) for t in tools}
    index: dict[tuple, list[str]] = {}
    for key, sh in shingles.items():
        for s in sh:
            index.setdefault(s, []).append(key)
    by_key = {t.key: t for t in tools}
    for t in tools:
        mine = shingles[t.key]
        if len(mine) < 8:
            continue
        counts: dict[str, int] = {}
        for s in mine:
            bucket = index[s]
            if len(bucket) > 50:  # boilerplate shared by many tools says nothing about copying
                continue
            for other in bucket:
                if other != t.key and by_key[other].server != t.server:
                    counts[other] = counts.get(other, 0) + 1
        for other, shared in sorted(counts.items(), key=lambda kv: -kv[1])[:1]:
            theirs = shingles[other]
            jac = shared / max(1, len(mine | theirs))
            if jac >= COPY_JACCARD and by_key[other].name != t.name:
                found[t.key].append(Finding("copied-description", WARN,
                                            f"description is {jac:.0%} the same as {other}'s, under another name"))
    return {k: v for k, v in found.items() if v}


def quarantined(findings: dict[str, list[Finding]]) -> set[str]:
    return {k for k, fs in findings.items() if any(f.severity == QUARANTINE for f in fs)}
