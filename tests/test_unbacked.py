"""Optional fields cut while they are written (arguments/unbacked.py): the verdict must never cut a field the drop of
unsupported fields would have kept, the cut point must lie before the field's comma, and the pipeline must give a
valid answer without the cut field."""

from __future__ import annotations

import random

import pytest

from nexus_cli.arguments.repairs import doomed_while_written, norm_text, supported
from nexus_cli.arguments.unbacked import UnbackedFieldWatch, _string_so_far, cuttable_fields, without_fields
from nexus_cli.registry import Tool
from nexus_cli.schema import compile_tool

REQUEST = "open a pull request in acme/api from feature/login into main titled Add login page"
CTX = norm_text(REQUEST)
PR = Tool("forge", "create_pull_request", "Open a pull request.", {
    "type": "object", "required": ["owner", "repo", "title", "head", "base"], "properties": {
        "owner": {"type": "string"}, "repo": {"type": "string"}, "title": {"type": "string"},
        "head": {"type": "string"}, "base": {"type": "string"},
        "body": {"type": "string", "description": "Text of the pull request."},
        "draft": {"type": "boolean", "description": "Whether it is a draft."},
        "state": {"type": "string", "enum": ["open", "closed"]},
        "maintainer_can_modify": {"type": "boolean"},
        "reviewers": {"type": "array", "items": {"type": "string"}}}})


@pytest.mark.parametrize("name, schema, written, doomed", [
    ("body", {"type": "string"}, "This", True),  # no word of the request starts so
    ("body", {"type": "string"}, "Add log", False),  # "add login page" may still come
    ("body", {"type": "string"}, "  add   LOGIN", False),  # case and spacing as norm_text reads them
    ("body", {"type": "string"}, "itle", True),  # inside "titled" only: supported needs a word's start
    ("body", {"type": "string"}, "", False),  # nothing written yet
    ("body", {"type": "string"}, "Añadir", False),  # not ASCII: not judged
    ("state", {"type": "string", "enum": ["open", "closed"]}, "xyz", False),  # enum members: other rules
    ("draft", {"type": "boolean", "description": "Whether it is a draft."}, None, True),
    ("login", {"type": "boolean"}, None, False),  # its name is in the request
    ("draft", {"type": "boolean", "description": "Open it as a draft."}, None, False),  # described ("open")
    ("body", {"type": "string"}, None, False),  # a string is judged by its text, not at its key
    ("count", {"type": "integer"}, None, False),  # numbers: never
])
def test_verdicts(name, schema, written, doomed):
    assert doomed_while_written(name, schema, written, CTX, ["create", "pull", "request"]) is doomed


def test_a_doomed_beginning_is_never_the_start_of_a_supported_value():
    """The verdict's promise, over random values and requests written from a small alphabet (so that values often
    are, or begin like, words of the request): whenever some beginning of a value is judged doomed, `supported`
    rejects the whole value."""
    rng = random.Random(7)
    words = ["add", "login", "log", "page", "main", "in", "Login", "pa", "a", "feature/login", "x-1", "acme/api"]
    checked = 0
    for _ in range(3000):
        ctx = norm_text(" ".join(rng.choice(words) for _ in range(rng.randint(1, 8))))
        value = rng.choice([" ", "", "  "]).join(rng.choice(words) for _ in range(rng.randint(1, 3)))
        value += rng.choice(["", " ", "s", "-2"])
        for end in range(1, len(value) + 1):
            if doomed_while_written("body", {"type": "string"}, value[:end], ctx):
                assert not supported(value, ctx, "body"), (value[:end], value, ctx)
                checked += 1
    assert checked > 500


def test_escapes_cut_in_half_are_left_out():
    assert _string_so_far("abc") == "abc"
    assert _string_so_far("ab\\") == "ab"
    assert _string_so_far("ab\\u00") == "ab"
    assert _string_so_far('a\\"b') == 'a"b'
    assert _string_so_far("a\\u00e9") == "a\u00e9"


def test_cuttable_fields_are_the_top_level_optional_ones():
    spec = compile_tool(PR)
    assert set(cuttable_fields(spec)) == {"body", "draft", "state", "maintainer_can_modify", "reviewers"}
    assert "body" not in without_fields(spec.input_schema, ["body"])["properties"]
    assert without_fields(spec.input_schema, ["body"])["required"] == spec.input_schema["required"]


class _Chars:
    """A model whose tokens are the characters of the text (token = code point), so cut points are exact."""

    def token_to_piece(self, token, special=True):
        return chr(token).encode("utf-8")


def _watch_on(text: str):
    watch = UnbackedFieldWatch(_Chars(), compile_tool(PR), REQUEST)
    tokens = [ord(c) for c in text]
    for n in range(1, len(tokens) + 1):  # as generate calls it: after each token
        if watch(tokens[:n]):
            key, kept, tail = watch.found
            assert tail == ""  # one character a token: nothing to write again
            return text[:n], text[:kept], key
    return None


def test_the_watch_stops_at_the_first_certain_token_and_cuts_before_the_comma():
    head = '{"owner": "acme", "repo": "api", "title": "Add login page", "head": "feature/login", "base": "main"'
    # "t" may still become "titled"; "th" starts no word of the request
    assert _watch_on(head + ', "body": "This is it"}') == (head + ', "body": "Th', head, "body")
    assert _watch_on(head + ', "draft": true}') == (head + ', "draft"', head, "draft")
    assert _watch_on(head + ', "body": "Add login page"}') is None  # backed: written to the end
    assert _watch_on(head + ', "state": "closed"}') is None  # an enum
    assert _watch_on(head + ', "reviewers": ["This"]}') is None  # inside a list: not judged
    assert _watch_on('{"owner": "This"}') is None  # required
    # the first field of the object: cut back to just after "{"
    watch = UnbackedFieldWatch(_Chars(), compile_tool(Tool("s", "t", "", {"type": "object", "properties": {
        "note": {"type": "string"}}})), REQUEST)
    text = '{ "note": "zz'
    stops = [n for n in range(1, len(text) + 1) if watch([ord(c) for c in text[:n]])]
    assert stops[0] == len('{ "note": "z') and watch.found == ("note", 1, "")


@pytest.mark.slow
def test_the_pipeline_cuts_an_unbacked_field_and_answers_validly(monkeypatch):
    """With the real test model, a tool whose one optional field the request cannot back: uncut, the model writes a
    text of its own there; cut, the answer is the same up to that field, ends without it, is valid, and reports
    the field among the dropped ones."""
    from nexus_cli.adapters.llama import LlamaContext, load_model
    from nexus_cli.arguments import pipeline

    spec = compile_tool(Tool("notes", "add_note", "Add a note to the project.", {
        "type": "object", "required": ["project"], "properties": {
            "project": {"type": "string", "description": "Project name."},
            "text": {"type": "string", "description": "The note's text."}}}))
    ctx = LlamaContext(load_model("smollm2-135m"), n_ctx=2048, n_seq_max=1)
    request = "add a note to the apollo project"
    results = {}
    original = ctx.generate
    try:
        for cut in (False, True):
            monkeypatch.setattr(pipeline, "CUT_UNBACKED", cut)
            ctx.clear()
            calls: list[dict] = []
            monkeypatch.setattr(ctx, "generate", lambda *a, **k: calls.append(k) or original(*a, **k))
            res = pipeline.generate_arguments(ctx, spec, request, max_tokens=40, time_limit_s=None)
            results[cut] = (res, calls)
    finally:
        ctx.close()
    (plain, plain_calls), (res, cut_calls) = results[False], results[True]
    assert '"text": "' in plain.raw  # the test's premise: this model makes a text up
    assert res.valid and res.dropped[:1] == ["text"] and '"text"' not in res.raw
    assert plain.raw.startswith(res.raw[:res.raw.index('"project"')]) and res.arguments["project"]
    assert plain.raw.startswith(res.raw.rstrip("}").rstrip())  # the same answer up to the cut field
    assert any(k.get("grammar_prefix") for k in cut_calls) and not any(k.get("grammar_prefix") for k in plain_calls)
