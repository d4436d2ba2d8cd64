"""Text derived from a registry alone: tool text recipes, name splitting, templated probe requests, lexical tokens.

Nothing here looks at evaluation data. Every string is a deterministic function of one tool's name, description and
input schema (and, for probes, a seeded RNG), so an index is reproducible from its registry.
"""

from __future__ import annotations

import functools
import random
import re
from typing import Any, Iterable, Sequence

# ------------------------------------------------------------------------------------------------ name handling

_CAMEL = re.compile(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])")
# [^0-9A-Za-z\u00C0-\uFFFF]+ spelled as the ranges it matches: the same matches, and it compiles in a tenth of
# the time (re builds a bitmap of a negated BMP-wide class; a one-shot route pays that at import)
_NON_WORD = re.compile(r"[\x00-\x2F\x3A-\x40\x5B-\x60\x7B-\xBF\U00010000-\U0010FFFF]+")


def name_words(name: str) -> list[str]:
    """`create_pull_request` / `createPullRequest` / `browser-navigate` → ['create', 'pull', 'request']."""
    parts = _NON_WORD.split(_CAMEL.sub(" ", name))
    return [p.lower() for p in parts if p]


_ABBREV = {
    "repo": "repository", "repos": "repositories", "pr": "pull request", "prs": "pull requests", "msg": "message",
    "dir": "directory", "dirs": "directories", "db": "database", "info": "information", "config": "configuration",
    "params": "parameters", "param": "parameter", "env": "environment", "ns": "namespace", "k8s": "kubernetes",
    "img": "image", "doc": "document", "docs": "documents", "del": "delete", "ls": "list", "md": "markdown",
    "url": "url", "id": "id", "ids": "ids", "vm": "virtual machine", "vms": "virtual machines", "cfg": "configuration",
}


def readable_name(name: str) -> str:
    """Name words with common abbreviations expanded: `get_pr_diff` → 'get pull request diff'."""
    return " ".join(_ABBREV.get(w, w) for w in name_words(name))


# ------------------------------------------------------------------------------------------------ descriptions

_SENT = re.compile(r"(?<=[.!?。])\s+|\n\s*\n|\n(?=[-*#])")
_BOILER = re.compile(
    r"^(this tool|this function|this endpoint|tool to|use this tool to|use this to|a tool (that|to)|allows you to|"
    r"you can use this tool to|this allows you to|used to|helps you)\s+",
    re.I,
)


def clean_description(desc: str) -> str:
    desc = re.sub(r"\s+", " ", (desc or "").replace("`", "")).strip()
    return desc


def sentences(desc: str, limit: int = 4) -> list[str]:
    out = []
    for s in _SENT.split(desc or ""):
        s = re.sub(r"\s+", " ", s.replace("`", "")).strip(" -*#\t")
        if len(s) >= 8:
            out.append(s)
        if len(out) >= limit:
            break
    return out


def first_sentence(desc: str) -> str:
    s = sentences(desc, 1)
    return s[0] if s else ""


def truncate_words(text: str, n: int) -> str:
    words = text.split()
    return " ".join(words[:n]) + (" …" if len(words) > n else "")


def param_names(schema: Any, limit: int = 8) -> tuple[list[str], list[str]]:
    """(required, optional) top-level property names of an input schema."""
    if not isinstance(schema, dict):
        return [], []
    props = schema.get("properties")
    if not isinstance(props, dict):
        return [], []
    req = schema.get("required") if isinstance(schema.get("required"), list) else []
    required = [p for p in props if p in req][:limit]
    optional = [p for p in props if p not in req][:limit]
    return required, optional


# ------------------------------------------------------------------------------------------------ recipes

def doc_text(tool, desc_words: int = 48) -> str:
    """The main vector's text: readable name, raw name, then the description's start.

    `create pull request (create_pull_request): Create a new pull request in a GitHub repository. …`
    """
    desc = truncate_words(clean_description(tool.description), desc_words)
    return f"{readable_name(tool.name)} ({tool.name}): {desc}".strip()


def extra_texts(tool) -> list[str]:
    """Extra vectors per tool (max-sim at query time): short texts that look like requests rather than documentation.

    - the readable name alone (the name carries the dominant routing signal),
    - the description's first sentence without tool boilerplate ("Use this tool to …"),
    - the second sentence when it exists (often the "use this when …" clause),
    - the readable name with the required parameters ("create pull request with owner, repo, title, head, base").
    """
    out: list[str] = [readable_name(tool.name)]
    sents = sentences(clean_description(tool.description), 3)
    if sents:
        out.append(_BOILER.sub("", sents[0]))
    if len(sents) > 1:
        out.append(_BOILER.sub("", sents[1]))
    req, _opt = param_names(tool.input_schema, 5)
    if req:
        out.append(f"{readable_name(tool.name)} with " + ", ".join(" ".join(name_words(p)) for p in req))
    seen, uniq = set(), []
    for t in out:
        t = truncate_words(t, 40)
        if t and t.lower() not in seen:
            seen.add(t.lower())
            uniq.append(t)
    return uniq


# ------------------------------------------------------------------------------------------------ probe requests

_VERB_PHRASES = {
    "get": ["show me", "get", "fetch", "what is"],
    "list": ["list", "show all", "what are the"],
    "search": ["search for", "find", "look up"],
    "find": ["find", "look up"],
    "create": ["create", "make a new", "add a"],
    "add": ["add", "put a new"],
    "update": ["update", "change", "edit"],
    "edit": ["edit", "modify"],
    "delete": ["delete", "remove"],
    "remove": ["remove", "delete"],
    "read": ["read", "open", "show the contents of"],
    "write": ["write", "save"],
    "run": ["run", "execute"],
    "set": ["set", "configure"],
    "close": ["close"],
    "merge": ["merge"],
    "send": ["send", "post"],
    "download": ["download", "save a copy of"],
    "upload": ["upload"],
    "navigate": ["go to", "open"],
    "click": ["click"],
    "move": ["move", "rename"],
}


def probe_queries(tool, rng: random.Random, n: int = 4) -> list[str]:
    """Request-like probes for one tool, from its name, description and parameters only.

    Used to calibrate the gate (margins of probes of near-neighbour tools) and as the training queries of the
    locally trained reranker / fine-tuned embedder. Deterministic for a given rng state.
    """
    words = name_words(tool.name)
    rname = readable_name(tool.name)
    verb = words[0] if words else ""
    obj = " ".join(_ABBREV.get(w, w) for w in words[1:]) or rname
    sents = sentences(clean_description(tool.description), 3)
    req, opt = param_names(tool.input_schema, 6)
    cands: list[str] = []
    if sents:
        s0 = _BOILER.sub("", sents[0]).rstrip(".")
        cands.append(s0[:1].lower() + s0[1:])
        cands.append(f"please {s0[:1].lower() + s0[1:]}")
        cands.append(f"I want to {s0[:1].lower() + s0[1:]}")
    if len(sents) > 1:
        s1 = _BOILER.sub("", sents[1]).rstrip(".")
        cands.append(s1[:1].lower() + s1[1:])
    if verb in _VERB_PHRASES:
        cands.append(f"{rng.choice(_VERB_PHRASES[verb])} {obj}")
    cands.append(f"can you {rname}")
    if req:
        ps = [" ".join(name_words(p)) for p in req[:3]]
        cands.append(f"{rname} for {' and '.join(ps)}")
    elif opt:
        cands.append(f"{rname} by {' '.join(name_words(rng.choice(opt)))}")
    # dedupe, keep order, then sample n deterministically
    seen, uniq = set(), []
    for c in cands:
        c = truncate_words(re.sub(r"\s+", " ", c).strip(), 30)
        if c and c.lower() not in seen:
            seen.add(c.lower())
            uniq.append(c)
    if len(uniq) <= n:
        return uniq
    head = uniq[:1]
    rest = uniq[1:]
    rng.shuffle(rest)
    return head + rest[: n - 1]


# ------------------------------------------------------------------------------------------------ request values

# Literal values in a request (a title in quotes, a path, "acme/api#58", a commit hash, numbers) say little about
# WHICH tool is meant, and MiniLM reads them as content: "show me README.md from vercel/next.js" lands on a Notion
# page tool, "open a PR ... titled 'Add per-key rate limiting'" on a reaction tool. mask_values() replaces each value
# by a word for its kind, in this order (a URL before a path, a quoted title before the words inside it):
_MASKS = [
    # a URL: the site's main label stays ("github.com/acme/api/pull/512" -> "github link")
    (re.compile(r"\b[a-z][a-z0-9+.-]*://[^\s'\"]+", re.I), lambda m: f" {_url_label(m.group(0))} link "),
    # quoted text, not an apostrophe inside a word ("what's", "haven't")
    (re.compile(r"(?<!\w)'[^']{2,}'(?!\w)|(?<!\w)\"[^\"]{2,}\"(?!\w)|\u2018[^\u2019]+\u2019|\u201c[^\u201d]+\u201d"),
     lambda m: " text "),
    # owner/name#number
    (re.compile(r"(?<![\w/])[\w.-]+/[\w.-]+#\d+"), lambda m: " repository issue "),
    # an absolute, home or relative path
    (re.compile(r"(?<![\w/~.])(?:~|\.)?/[\w.@-]+(?:/[\w.@*-]*)*"), lambda m: " path "),
    # a file name with a common extension
    (re.compile(r"(?<![\w/])[\w.-]+\.(?:md|txt|py|go|rs|ts|js|json|ya?ml|toml|env|log|csv|html|sh)\b"),
     lambda m: " file "),
    # owner/name (also chart and image references)
    (re.compile(r"(?<![\w/])[A-Za-z0-9_.-]+/[A-Za-z0-9_./-]+"), lambda m: " repository "),
    # a hexadecimal hash with letters and digits (7-40 characters)
    (re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b"), lambda m: " commit "),
    # numbers, issue references, times, coordinates
    (re.compile(r"#?\b\d[\d.,:-]*\b"), lambda m: " number "),
]


def _url_label(url: str) -> str:
    host = re.sub(r"^[a-z][a-z0-9+.-]*://", "", url, flags=re.I).split("/")[0].split(":")[0]
    parts = [p for p in host.split(".") if p]
    return parts[-2] if len(parts) >= 2 else (parts[0] if parts else "web")


def mask_values(text: str) -> str:
    """The request with its literal values replaced by words for their kind: "open a PR in acme/api from
    feature/x titled 'Fix login'" -> "open a PR in repository from repository titled text"."""
    for pattern, repl in _MASKS:
        text = pattern.sub(repl, text)
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------------ lexical tokens

_STOP = frozenset(
    "a an the of to in on for and or is are be by with from at as it its this that these those into via your you my me i "
    "we our can will should would please want need do does use used using tool tools specified given provided if when "
    "which what all any each about not no only also then than more most such other get".split()
)


@functools.lru_cache(maxsize=1 << 16)  # a request's words repeat across requests: the router's lexical step reuses them
def stem(w: str) -> str:
    """A very light English suffix stripper (enough to join list/lists, issue/issues, commit/commits/committed)."""
    for suf, rep in (("ies", "y"), ("sses", "ss"), ("ing", ""), ("ed", ""), ("es", ""), ("s", "")):
        if len(w) > len(suf) + 2 and w.endswith(suf) and not w.endswith("ss"):
            return w[: -len(suf)] + rep
    return w


# The lexical tokenizer's version, stored in an index's lexical.json: a request is tokenized as its index's tools were.
# 1: words as name_words splits them. 2: CJK text as overlapping character pairs, and CJK, full-width and general
# punctuation as separators (1 kept a whole run such as "获取抖音热搜榜单，展示…" as one word, so a Chinese request
# shared no token with its tool).
LEX_TOKENIZER = 2

# Han, kana and Hangul: written without spaces between words (Korean has spaces, but its words inflect), so a run is
# indexed as its overlapping character pairs, the standard for CJK search (a lone character stays itself).
_CJK = "\u1100-\u11FF\u3040-\u30FF\u3130-\u318F\u3400-\u4DBF\u4E00-\u9FFF\uAC00-\uD7AF\uF900-\uFAFF"


@functools.cache
def _cjk_patterns() -> tuple[re.Pattern, re.Pattern]:
    """(a word as alternating CJK and other runs, one CJK character), compiled on first use: ~6 ms that a process
    meeting only ASCII text never pays."""
    return re.compile(f"[{_CJK}]+|[^{_CJK}]+"), re.compile(f"[{_CJK}]")


# Punctuation inside name_words' word range (U+00C0-U+FFFF): general punctuation (dashes, curly quotes, ellipsis),
# CJK punctuation (、。「」), full-width forms (，：？！（）).
_WIDE_PUNCT = re.compile(r"[\u2000-\u206F\u3000-\u303F\uFF00-\uFF0F\uFF1A-\uFF20\uFF3B-\uFF40\uFF5B-\uFF65]+")


def _latin_tokens(w: str, out: list[str]) -> None:
    w = _ABBREV.get(w, w)
    for part in w.split():
        if part not in _STOP and len(part) > 1:
            out.append(stem(part))


def lex_tokens(text: str, version: int = LEX_TOKENIZER) -> list[str]:
    """BM25 tokens of a text: lower-case words without stop words, lightly stemmed; from version 2, CJK runs as
    character pairs. Text of ASCII, Latin and other alphabets without CJK or wide punctuation gives the same tokens in
    both versions."""
    out: list[str] = []
    if version < 2 or text.isascii():
        for w in name_words(text):
            _latin_tokens(w, out)
        return out
    cjk_run, cjk_char = _cjk_patterns()
    for w in name_words(_WIDE_PUNCT.sub(" ", text)):
        for run in cjk_run.findall(w):
            if cjk_char.match(run):
                out.extend([run] if len(run) == 1 else [run[i:i + 2] for i in range(len(run) - 1)])
            else:
                _latin_tokens(run, out)
    return out


def lexical_doc(tool, name_weight: int = 3, examples: Sequence[str] = ()) -> list[str]:
    """Tokens of one tool for BM25: the name (repeated: it carries the routing signal), description, parameters, and
    the words of its example requests, value-masked (users' words for the tool, which its author's text lacks)."""
    req, opt = param_names(tool.input_schema, 12)
    toks = lex_tokens(tool.name) * name_weight
    toks += lex_tokens(truncate_words(clean_description(tool.description), 80))
    toks += lex_tokens(" ".join(req + opt))
    for q in examples:
        toks += lex_tokens(mask_values(q))
    return toks


def unique(items: Iterable[str]) -> list[str]:
    seen, out = set(), []
    for x in items:
        if x not in seen:
            seen.add(x)
            out.append(x)
    return out


# ------------------------------------------------------------------------------------------------ training requests

_VALUES = {
    "owner": ["octocat", "acme", "my-org"], "repo": ["hello-world", "api", "website"], "org": ["acme", "openai"],
    "branch": ["feature/login", "main", "dev"], "path": ["src/app.py", "README.md", "docs/index.md"],
    "file": ["report.pdf", "notes.txt"], "url": ["https://example.com", "https://news.ycombinator.com"],
    "query": ["machine learning", "rust async", "weather"], "title": ["Fix login bug", "Quarterly report"],
    "body": ["see the details below", "steps to reproduce"], "content": ["hello world", "some notes"],
    "text": ["hello there", "meeting at 3pm"], "message": ["deploy finished", "hi team"], "name": ["demo", "alpha"],
    "email": ["alice@example.com"], "city": ["Paris", "Tokyo"], "location": ["Berlin", "San Francisco"],
    "date": ["2024-05-01", "tomorrow"], "namespace": ["default", "kube-system"], "pod": ["web-0"],
    "channel": ["general", "C024BE91L"], "user": ["alice", "bob"], "username": ["alice"], "tag": ["v1.2.0"],
    "issue": ["42", "17"], "number": ["42", "7"], "id": ["123", "abc123"], "selector": ["#submit", "button.login"],
    "symbol": ["AAPL", "BTC"], "language": ["python", "go"], "key": ["session:42"], "sql": ["SELECT * FROM users"],
    "code": ["print(1)"], "comment": ["looks good"], "label": ["bug"], "keyword": ["pizza"], "sha": ["a1b2c3d"],
}


def _value_for(param: str, schema: Any, rng: random.Random) -> str | None:
    if isinstance(schema, dict):
        enum = schema.get("enum")
        if isinstance(enum, list) and enum and all(isinstance(e, (str, int)) for e in enum):
            return str(rng.choice(enum))
        t = schema.get("type")
        if t == "boolean":
            return None
        if t in ("integer", "number"):
            return str(rng.choice([3, 5, 10, 42, 100]))
    words = name_words(param)
    for w in reversed(words):
        w = stem(w) if w not in _VALUES else w
        for k in (w, w + "s"):
            if k in _VALUES:
                return rng.choice(_VALUES[k])
    return None


def arg_phrase(tool, rng: random.Random, max_params: int = 2) -> str:
    """A short phrase carrying plausible argument values for the tool's required parameters."""
    req, opt = param_names(tool.input_schema, 8)
    props = tool.input_schema.get("properties", {}) if isinstance(tool.input_schema, dict) else {}
    parts = []
    for p in (req + opt[:1])[:max_params]:
        v = _value_for(p, props.get(p) if isinstance(props, dict) else None, rng)
        if v is not None:
            parts.append(rng.choice([f"{' '.join(name_words(p))} {v}", f"{v}", f"for {v}"]))
    return " ".join(parts)


def training_queries(tool, rng: random.Random, n: int = 4) -> list[str]:
    """Request-like training queries for one tool (registry-derived only): probes plus variants that carry argument
    values, as real requests do ("open a pull request in acme/api titled Fix login bug")."""
    base = probe_queries(tool, rng, n=6)
    words = name_words(tool.name)
    verb = words[0] if words else ""
    obj = " ".join(_ABBREV.get(w, w) for w in words[1:]) or readable_name(tool.name)
    out = list(base)
    vp = rng.choice(_VERB_PHRASES[verb]) if verb in _VERB_PHRASES else (words[0] if words else "")
    out.append(f"{vp} {obj} {arg_phrase(tool, rng)}".strip())
    if base:
        out.append(f"{base[0]} {arg_phrase(tool, rng)}".strip())
    seen, uniq = set(), []
    for q in out:
        q = re.sub(r"\s+", " ", q).strip()
        if q and q.lower() not in seen:
            seen.add(q.lower())
            uniq.append(q)
    rng.shuffle(uniq)
    return uniq[:n]
