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
