"""arguments/guessed.py: which required values of an answer the request gives no trace of, and the report of them
through generate_arguments, `nexus route --json` and the route panel."""

from __future__ import annotations

from nexus_cli.arguments.guessed import guessed_values
from nexus_cli.registry import Tool
from nexus_cli.schema import compile_tool


def spec_of(properties: dict, required: list[str]):
    return compile_tool(Tool(server="s", name="t", description="a tool",
                             input_schema={"type": "object", "properties": properties, "required": required}))


PR = spec_of({"owner": {"type": "string"}, "repo": {"type": "string"}, "head": {"type": "string"},
              "base": {"type": "string"}, "title": {"type": "string"}, "body": {"type": "string"}},
             ["owner", "repo", "head", "base", "title"])


def test_values_the_request_does_not_give_are_named_in_the_answers_order():
    args = {"owner": "your_username", "repo": "your_repository", "title": "Open PR", "head": "your_branch",
            "base": "main"}
    # "Open PR" is traced (its words are the request's); the rest are the model's
    assert guessed_values(args, PR, "open a PR") == ["owner", "repo", "head", "base"]
    stated = {"owner": "acme", "repo": "api", "title": "Add login page", "head": "feature/login", "base": "main"}
    assert guessed_values(stated, PR, "open a pull request in acme/api from feature/login into main titled Add "
                                      "login page") == []


def test_the_history_window_traces_values_too():
    args = {"owner": "acme", "repo": "api", "title": "Fix", "head": "fix/x", "base": "main"}
    assert guessed_values(args, PR, "open a PR for it") == ["owner", "repo", "title", "head", "base"]
    # the request + window as the pipeline joins them (prompt.source_text)
    assert guessed_values(args, PR, "open a PR for it I pushed fix/x to acme/api, based on main") == []


def test_optional_values_flags_enums_and_defaults_are_never_guesses():
    spec = spec_of({"path": {"type": "string"}, "recursive": {"type": "boolean"},
                    "mode": {"type": "string", "enum": ["fast", "slow"]}, "encoding": {"type": "string",
                                                                                      "default": "utf-8"},
                    "note": {"type": "string"}}, ["path", "recursive", "mode", "encoding"])
    args = {"path": "/tmp/x", "recursive": True, "mode": "slow", "encoding": "utf-8", "note": "made up"}
    assert guessed_values(args, spec, "list the folder") == ["path"]
    assert guessed_values(args, spec, "list /tmp/x") == []


def test_numbers_are_traced_by_value_and_by_words():
    spec = spec_of({"lat": {"type": "number"}, "n": {"type": "integer"}, "step": {"type": "integer"}},
                   ["lat", "n", "step"])
    assert guessed_values({"lat": 52.52, "n": 3, "step": 1}, spec, "at 52.5200, three of them, the first step") == []
    assert guessed_values({"lat": 48.85, "n": 3, "step": 2}, spec, "at 52.5200, three of them, the first step") == \
        ["lat", "step"]
    # another unit of the field, which its name states: "2 minutes" traces timeout_ms 120000
    unit = spec_of({"timeout_ms": {"type": "integer"}}, ["timeout_ms"])
    assert guessed_values({"timeout_ms": 120000}, unit, "wait 2 minutes") == []
    assert guessed_values({"timeout_ms": 5000}, unit, "wait 2 minutes") == ["timeout_ms"]
    # digits inside another number trace nothing: 12 is not in "2012"
    assert guessed_values({"lat": 12, "n": 3, "step": 1}, spec, "since 2012, three, first") == ["lat"]


def test_words_are_traced_by_stem_and_by_the_start_of_a_word():
    spec = spec_of({"currency": {"type": "string"}, "city": {"type": "string"}}, ["currency", "city"])
    assert guessed_values({"currency": "EUR", "city": "Asia/Tokyo"}, spec, "euros to yen in tokyo") == []
    assert guessed_values({"currency": "USD", "city": "Paris"}, spec, "euros to yen in tokyo") == ["currency", "city"]
    # stop words trace nothing, not even by their start ("the" and "there"); a value of stop words alone is no value
    assert guessed_values({"currency": "the EUR", "city": "of"}, spec, "the price of it") == ["currency", "city"]
    assert guessed_values({"currency": "EUR", "city": "there"}, spec, "euros, the price") == ["city"]


def test_lists_and_nested_objects():
    spec = spec_of({"paths": {"type": "array", "items": {"type": "string"}},
                    "query": {"type": "object", "properties": {"field": {"type": "string"}, "op": {"type": "string"}},
                              "required": ["field"]}}, ["paths", "query"])
    ctx = "read a.txt and b.txt, filter on status"
    assert guessed_values({"paths": ["a.txt", "b.txt"], "query": {"field": "status", "op": "eq"}}, spec, ctx) == []
    assert guessed_values({"paths": ["a.txt", "c.md"], "query": {"field": "owner"}}, spec, ctx) == \
        ["paths", "query.field"]
    assert guessed_values(None, spec, ctx) == []


def test_placeholders_and_empty_values_are_guesses_even_with_a_word_of_the_request():
    spec = spec_of({"repo_path": {"type": "string"}, "url": {"type": "string"}, "target": {"type": "string"}},
                   ["repo_path", "url", "target"])
    ctx = "diff my repo against main and fetch it"
    assert guessed_values({"repo_path": "your-repo-path", "url": "https://example.com/repo", "target": "main"},
                          spec, ctx) == ["repo_path", "url"]
    assert guessed_values({"repo_path": "", "url": "it", "target": "main"}, spec, ctx) == ["repo_path", "url"]
    # a placeholder's word the request writes itself is the request's
    assert guessed_values({"repo_path": "/srv/example", "url": "https://example.com", "target": "main"}, spec,
                          "diff /srv/example against main, fetch https://example.com") == []


def test_a_pointer_word_is_no_value():
    """"close issue 3 there": "there" points at a repository the request never names, so an owner "there" is a
    guess; a value with a word of its own beside a pointer word is traced by that word."""
    spec = spec_of({"owner": {"type": "string"}, "repo": {"type": "string"}, "issue_number": {"type": "integer"}},
                   ["owner", "repo", "issue_number"])
    assert guessed_values({"owner": "there", "repo": "api", "issue_number": 3}, spec, "close issue 3 there") == \
        ["owner", "repo"]
    assert guessed_values({"owner": "them", "repo": "those", "issue_number": 3}, spec, "close issue 3 for them, "
                          "in one of those") == ["owner", "repo"]
    place = spec_of({"destination": {"type": "string"}}, ["destination"])
    assert guessed_values({"destination": "Here Park"}, place, "directions to Here Park") == []


def test_words_of_scripts_written_without_spaces_are_traced_as_written():
    spec = spec_of({"names": {"type": "string"}}, ["names"])
    assert guessed_values({"names": "杭州东|南京南"}, spec, "杭州东和南京南的车站代码") == []
    assert guessed_values({"names": "上海虹桥"}, spec, "杭州东和南京南的车站代码") == ["names"]
