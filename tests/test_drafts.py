"""The argument drafter (arguments/drafts.py): what it expects the JSON to say next, from the schema's property
order and the request's text. Its guesses decide speed only; tests/test_adapter_llama.py checks that a draft never
changes the greedy output."""

from __future__ import annotations

import pytest

from nexus_cli.arguments.drafts import ArgumentDrafter

PR = {"type": "object", "required": ["owner", "repo", "title", "head"], "properties": {
    "owner": {"type": "string"}, "repo": {"type": "string"}, "title": {"type": "string"},
    "head": {"type": "string"}, "draft": {"type": "boolean"}, "count": {"type": "integer"},
    "body": {"type": "string"}}}
REQUEST = "open a pull request in acme/api from feature/login titled Add login page, 3 reviewers"


@pytest.mark.parametrize("text, expected", [
    ("", '{ "owner": "'),  # the first property, in the grammar's order
    ('{"', 'owner": "'),
    ('{ "ow', 'ner": "'),
    ('{ "owner"', ': "'),
    ('{ "owner": "', ""),  # which value begins is not guessed
    ('{ "owner": "ac', 'me", "repo": "'),  # owner/repo are one path segment each: the value ends at "/"
    ('{ "owner": "acme",', ' "repo": "'),
    ('{"owner":"acme","repo":"api"', ',"title":"'),  # the answer's own spacing
    ('{ "owner": "acme", "repo": "api", "title": "Add', ' login page", "head": "'),  # up to the comma
    ('{ "owner": "acme", "repo": "api", "title": "Add login page", "head": "feature/login", "draft": f',
     'alse, "count": '),  # a literal completed
    ('{ "owner": "acme", "repo": "api", "title": "x", "head": "y", "draft": true, "count": ', ""),
    ('{"count": 3', ', "body": "'),  # the number the request writes ends there
    ('{ "owner": "acme", "repo": "api", "title": "x", "head": "y", "draft": true, "count": 3, "body": "z"', "}"),
    ('{ "owner": "acme", "nested": {"a": 1', ""),  # inside a nested object nothing is guessed
    ('{ "title": "Kubernetes', ""),  # a value the request does not write
])
def test_drafter_guesses(text, expected):
    assert ArgumentDrafter(None, PR, REQUEST).text(text) == expected


def test_numbers_are_read_from_the_request_whole():
    drafter = ArgumentDrafter(None, {"type": "object", "required": ["width", "height"], "properties": {
        "width": {"type": "integer"}, "height": {"type": "integer"}}}, "resize the browser to 1366x768")
    assert drafter.text('{"width": 1') == '366, "height": '
    assert drafter.text('{"width": 1366, "height": 7') == "68}"
    assert drafter.text('{"width": 9') == ""  # not a number of the request


def test_a_schema_without_properties_drafts_nothing():
    assert ArgumentDrafter(None, {"type": "object"}, REQUEST).text("") == ""
    assert ArgumentDrafter(None, "not a schema", REQUEST).text('{"a": "b') == ""


def test_the_drafter_never_raises_on_real_schemas():
    """It runs inside every argument generation: over each of the 955 shared tools' schemas, every prefix of an
    answer and random JSON-ish text gives a string (possibly empty), never an error."""
    import json
    import random
    from pathlib import Path

    from nexus_cli.lab.bench_routing import pool_tools
    from nexus_cli.schema import compile_tool

    registries = Path(__file__).resolve().parent.parent.parent / "shared" / "registries"
    if not registries.is_dir():
        pytest.skip("needs ../shared/registries")
    rng = random.Random(0)
    alphabet = '{}[]",: \\abc123.-tfnrue\n'
    for tool in pool_tools(registries):
        spec = compile_tool(tool)
        drafter = ArgumentDrafter(None, spec.schema, REQUEST)
        answer = json.dumps({k: "acme" for k in list(spec.schema.get("properties") or {})[:4]})
        texts = [answer[:i] for i in range(len(answer))]
        texts += ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30))) for _ in range(8)]
        for text in texts:
            assert isinstance(drafter.text(text), str)
