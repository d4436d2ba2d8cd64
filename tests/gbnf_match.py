"""A tiny reference GBNF matcher for tests: does a grammar (llama.cpp syntax) accept a whole string?

Supports what nexus_cli.schema emits and llama.cpp's README documents: `name ::= alternatives` (one rule per line),
string literals with escapes, character classes (ranges, `^`), rule references, groups, `|`, and the postfix
operators `?`, `*`, `+`, `{m}`, `{m,}`, `{m,n}`. Matching is set-of-positions with memoized rule calls, so it is exact
for any grammar without left recursion (the schema compiler never emits one).
"""

from __future__ import annotations

import re


class GbnfSyntaxError(ValueError):
    pass


def _unescape(src: str, i: int) -> tuple[str, int]:
    """Decode one (possibly escaped) character at src[i]; returns (char, next index)."""
    c = src[i]
    if c != "\\":
        return c, i + 1
    n = src[i + 1]
    simple = {"n": "\n", "r": "\r", "t": "\t", "\\": "\\", '"': '"', "[": "[", "]": "]", "/": "/", "-": "-", "^": "^"}
    if n in simple:
        return simple[n], i + 2
    width = {"x": 2, "u": 4, "U": 8}.get(n)
    if width:
        return chr(int(src[i + 2 : i + 2 + width], 16)), i + 2 + width
    raise GbnfSyntaxError(f"unknown escape \\{n}")


class Grammar:
    def __init__(self, text: str):
        self.rules: dict[str, object] = {}
        for line in text.split("\n"):  # only \n ends a rule (not U+2028 and kin)
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            m = re.match(r"\s*([a-zA-Z0-9-]+)\s*::=\s*(.*)$", line)
            if not m:
                raise GbnfSyntaxError(f"bad rule line: {line[:80]}")
            self.src = m.group(2)
            self.i = 0
            node = self._alt()
            self._ws()
            if self.i != len(self.src):
                raise GbnfSyntaxError(f"trailing text in rule {m.group(1)}: {self.src[self.i:self.i + 40]}")
            self.rules[m.group(1)] = node
        for name in self._refs():
            if name not in self.rules:
                raise GbnfSyntaxError(f"undefined rule {name}")

    def _refs(self):
        out = set()

        def walk(n):
            if n[0] == "ref":
                out.add(n[1])
            elif n[0] in ("seq", "alt"):
                for x in n[1]:
                    walk(x)
            elif n[0] == "rep":
                walk(n[1])

        for r in self.rules.values():
            walk(r)
        return out

    # parsing ----------------------------------------------------------------------------------------------
    def _ws(self):
        while self.i < len(self.src) and self.src[self.i] in " \t":
            self.i += 1

    def _alt(self):
        alts = [self._seq()]
        while True:
            self._ws()
            if self.i < len(self.src) and self.src[self.i] == "|":
                self.i += 1
                alts.append(self._seq())
            else:
                break
        return alts[0] if len(alts) == 1 else ("alt", alts)

    def _seq(self):
        items = []
        while True:
            self._ws()
            if self.i >= len(self.src) or self.src[self.i] in "|)":
                break
            items.append(self._postfix(self._atom()))
        return ("seq", items)

    def _atom(self):
        s, c = self.src, self.src[self.i]
        if c == '"':
            self.i += 1
            out = []
            while s[self.i] != '"':
                ch, self.i = _unescape(s, self.i)
                out.append(ch)
            self.i += 1
            return ("lit", "".join(out))
        if c == "[":
            self.i += 1
            neg = s[self.i] == "^"
            if neg:
                self.i += 1
            ranges = []
            while s[self.i] != "]":
                a, self.i = _unescape(s, self.i)
                b = a
                if s[self.i] == "-" and s[self.i + 1] != "]":
                    b, self.i = _unescape(s, self.i + 1)
                ranges.append((a, b))
            self.i += 1
            return ("cls", neg, ranges)
        if c == "(":
            self.i += 1
            node = self._alt()
            self._ws()
            if s[self.i] != ")":
                raise GbnfSyntaxError("missing )")
            self.i += 1
            return node
        m = re.compile(r"[a-zA-Z0-9-]+").match(s, self.i)
        if not m:
            raise GbnfSyntaxError(f"unexpected {s[self.i:self.i + 20]!r}")
        self.i = m.end()
        return ("ref", m.group(0))

    def _postfix(self, node):
        s = self.src
        while self.i < len(s):
            c = s[self.i]
            if c == "?":
                node, self.i = ("rep", node, 0, 1), self.i + 1
            elif c == "*":
                node, self.i = ("rep", node, 0, None), self.i + 1
            elif c == "+":
                node, self.i = ("rep", node, 1, None), self.i + 1
            elif c == "{":
                m = re.compile(r"\{(\d+)(,(\d*))?\}").match(s, self.i)
                if not m:
                    raise GbnfSyntaxError("bad {m,n}")
                lo = int(m.group(1))
                hi = lo if m.group(2) is None else (int(m.group(3)) if m.group(3) else None)
                node, self.i = ("rep", node, lo, hi), m.end()
            else:
                break
        return node

    # matching ---------------------------------------------------------------------------------------------
    def accepts(self, text: str, root: str = "root") -> bool:
        self.text = text
        self.memo: dict = {}
        return len(text) in self._m(("ref", root), 0)

    def _m(self, n, pos: int) -> frozenset:
        kind = n[0]
        t = self.text
        if kind == "lit":
            return frozenset([pos + len(n[1])]) if t.startswith(n[1], pos) else frozenset()
        if kind == "cls":
            if pos >= len(t):
                return frozenset()
            ch = t[pos]
            hit = any(a <= ch <= b for a, b in n[2])
            return frozenset([pos + 1]) if hit != n[1] else frozenset()
        if kind == "ref":
            key = (n[1], pos)
            if key not in self.memo:
                self.memo[key] = frozenset()
                self.memo[key] = self._m(self.rules[n[1]], pos)
            return self.memo[key]
        if kind == "seq":
            cur = frozenset([pos])
            for x in n[1]:
                cur = frozenset(q for p in cur for q in self._m(x, p))
                if not cur:
                    break
            return cur
        if kind == "alt":
            return frozenset(q for x in n[1] for q in self._m(x, pos))
        if kind == "rep":
            _, x, lo, hi = n
            result = set([pos]) if lo == 0 else set()
            frontier, seen, count = {pos}, {pos}, 0
            while frontier and (hi is None or count < hi):
                count += 1
                nxt = {q for p in frontier for q in self._m(x, p)}
                if count >= lo:
                    result |= nxt
                frontier = nxt - seen if count >= lo else nxt
                seen |= nxt
            return frozenset(result)
        raise AssertionError(kind)


def accepts(grammar_text: str, text: str) -> bool:
    return Grammar(grammar_text).accepts(text)
