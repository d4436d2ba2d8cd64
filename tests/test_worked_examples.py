"""Worked example calls in the tool's card (arguments/examples.py): the rule an example must pass, the card's text,
the cache (written once per model and tool, read back, a damaged file derived again, a changed tool looked up
under another file), and the router showing them for a tool whose index holds example requests (real SmolLM2)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nexus_cli.arguments.examples import WorkedExample, WorkedExamples, examples_text, keep_example
from nexus_cli.arguments.prompt import build_messages, tool_block
from nexus_cli.registry import load_registries
from nexus_cli.schema import compile_tool

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"


def _forge_spec(name: str):
    tool = next(t for t in load_registries([FORGE]) if t.name == name)
    return compile_tool(tool)


# ------------------------------------------------------------------------------------------------ no model

def test_an_example_is_kept_only_when_valid_not_empty_and_backed_by_its_request():
    request = "close issue 42 in acme/api as completed"
    good = {"owner": "acme", "repo": "api", "issue_number": 42}
    assert keep_example(request, good, valid=True)
    assert not keep_example(request, good, valid=False)
    assert not keep_example(request, {}, valid=True)
    assert not keep_example(request, None, valid=True)
    assert not keep_example(request, {**good, "issue_number": 43}, valid=True)  # a number the request never wrote
    assert not keep_example(request, {**good, "repo": "web"}, valid=True)  # a name copied from elsewhere
    assert keep_example(request, {**good, "lock": True}, valid=True)  # flags are not written values


def test_the_card_shows_its_worked_examples_after_the_signature():
    spec = _forge_spec("close_issue")
    plain = tool_block(spec)
    examples = [WorkedExample("close issue 42 in acme/api", {"owner": "acme", "repo": "api", "issue_number": 42}),
                WorkedExample("shut #7 of " + "x" * 200, {"owner": "x" * 200})]
    card = tool_block(spec, examples=examples)
    assert card.startswith(plain + "\nExamples:\nRequest: close issue 42 in acme/api\n")
    assert 'Call: {"owner": "acme", "repo": "api", "issue_number": 42}' in card
    assert "x" * 200 not in card.split("Call: ")[-1]  # a long value is cut in the card
    assert examples_text([]) == "" and tool_block(spec, examples=[]) == plain
    messages, _ = build_messages(spec, "close issue 9 in acme/web", examples=examples[:1])
    user = messages[-1]["content"]
    assert user.index("Examples:") < user.index("Request: close issue 9")


# ------------------------------------------------------------------------------------------------ real models

@pytest.fixture(scope="module")
def qwen():
    from nexus_cli.adapters.llama import LlamaContext, load_model

    ctx = LlamaContext(load_model("qwen2.5-0.5b"), n_ctx=2048, n_seq_max=1)
    yield ctx
    ctx.close()


def test_worked_examples_are_derived_once_cached_and_rederived_when_damaged(qwen, tmp_path):
    spec = _forge_spec("get_user")
    requests = ["show me the profile of octocat", "who is torvalds on the forge?", "look up user ada-l"]
    store = WorkedExamples(tmp_path, n=2)
    first = store.for_tool(qwen, spec, requests)
    assert store.derived == 1 and store.cached == 0 and first
    for ex in first:  # what is shown passed the rule
        assert ex.request in requests and keep_example(ex.request, ex.arguments, valid=True)
    files = list(tmp_path.glob("*/*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["tool"] == spec.key
    assert store.for_tool(qwen, spec, requests) == first and store.derived == 1  # memory

    again = WorkedExamples(tmp_path, n=2)
    assert again.for_tool(qwen, spec, requests) == first and again.cached == 1 and again.derived == 0

    files[0].write_text("{ not json")
    damaged = WorkedExamples(tmp_path, n=2)
    assert damaged.for_tool(qwen, spec, requests) == first and damaged.derived == 1
    assert json.loads(files[0].read_text())["tool"] == spec.key  # written again, whole

    changed = compile_tool(next(t for t in load_registries([FORGE]) if t.name == "get_user"))
    changed.input_schema["properties"]["username"]["description"] = "another description"
    other = WorkedExamples(tmp_path, n=2)
    other.for_tool(qwen, changed, requests)
    assert other.derived == 1 and len(list(tmp_path.glob("*/*.json"))) == 2
    assert WorkedExamples(tmp_path, n=2).for_tool(qwen, spec, []) == []


@pytest.mark.slow
def test_the_router_shows_a_tools_worked_examples_in_its_argument_prompt(tmp_path, monkeypatch):
    """The router reads the tool's worked examples (here already in the cache, as a previous call left them) and
    its argument prompt shows them; with worked_examples=0 it shows none."""
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.arguments.examples import examples_hash
    from nexus_cli.files import atomic_write_json
    from nexus_cli.routing import router as router_module
    from nexus_cli.routing.build import build_index
    from nexus_cli.routing.router import Router, RouterConfig

    requests = ["show me the profile of octocat", "look up user ada-l on the forge"]
    out = tmp_path / "forge-ex"
    build_index(load_registries([FORGE]), out, embedder=Embedder("minilm"), examples={"forge/get_user": requests})
    monkeypatch.setenv("NEXUS_WORKED_CACHE", str(tmp_path / "worked"))
    router = Router(out, RouterConfig(model="smollm2-135m", reranker="none"))
    entry = next(t for t in router.index.tools if t.name == "get_user")
    seeded = [WorkedExample(requests[0], {"username": "octocat"})]
    path = tmp_path / "worked" / router.llm().identity.fingerprint / f"{examples_hash(router.spec(entry), requests)}.json"
    path.parent.mkdir(parents=True)
    atomic_write_json(path, {"tool": entry.key, "examples": [{"request": requests[0],
                                                               "arguments": {"username": "octocat"}}]})
    prompts = []
    real = router_module.generate_arguments

    def spy(*args, **kwargs):
        res = real(*args, **kwargs)
        prompts.append((list(kwargs.get("examples") or ()), res.prompt))
        return res

    monkeypatch.setattr(router_module, "generate_arguments", spy)
    res = router.route("get the user grace-h", with_args=True)
    assert res.tool == "get_user"
    shown, prompt = prompts[-1]
    assert shown == seeded and router._worked.cached == 1 and router._worked.derived == 0
    assert 'Examples:\nRequest: show me the profile of octocat\nCall: {"username": "octocat"}' in prompt

    off = Router(out, RouterConfig(model="smollm2-135m", reranker="none", worked_examples=0))
    off.route("get the user grace-h", with_args=True)
    assert prompts[-1][0] == [] and "Examples:" not in prompts[-1][1]
