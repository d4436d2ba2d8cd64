"""Arguments stage: history window, post-processing, llama.cpp accepting every compiled grammar, and SmolLM2 end to end."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from gbnf_match import Grammar

from nexus_cli.arguments.pipeline import (
    ArgumentPrefixes,
    build_messages,
    drop_unsupported,
    generate_arguments,
    supported,
    tool_block,
    tool_prefix_tokens,
)
from nexus_cli.arguments.prompt import prune_history, surrogate
from nexus_cli.errors import SchemaError
from nexus_cli.registry import Tool, load_registries
from nexus_cli.schema import compile_tool, validate_arguments

ROOT = Path(__file__).resolve().parent.parent
FORGE = ROOT / "tool_registries" / "github_like.json"
REGISTRIES = ROOT.parent / "shared" / "registries"


# ------------------------------------------------------------------------------------------------ no model

def test_surrogates_keep_salient_values():
    repo = {"full_name": "acme/api", "name": "api", "owner": {"login": "acme"}, "private": False,
            "description": "x" * 500, "html_url": "https://github.com/acme/api"}
    s = surrogate(json.dumps(repo))
    assert s.startswith("[tool result:") and "full_name=acme/api" in s and len(s) < 200
    items = [{"number": 12, "title": "Crash on start", "state": "open"}, {"number": 13, "title": "b", "state": "open"}]
    s = surrogate(json.dumps(items))
    assert "2 items" in s and "keys: number,title,state" in s and "number=12" in s
    assert surrogate("plain text " * 100).startswith("[tool result:")


def test_tool_digest_keeps_the_values_follow_ups_need():
    from nexus_cli.arguments.prompt import TOOL_RESULT_CHARS, tool_digest

    small = {"total": 3, "objectIDs": [436535, 436528, 437329]}
    assert tool_digest(json.dumps(small, indent=2)) == '{"total": 3, "objectIDs": [436535, 436528, 437329]}'
    papers = {"total_results": 3, "papers": [
        {"id": f"2305.1060{i}", "title": "A long title about deliberate problem solving " * 2,
         "authors": ["A. Author", "B. Author", "C. Author"], "published": "2023-05-17"} for i in range(3)]}
    d = tool_digest(json.dumps(papers))
    assert len(d) <= TOOL_RESULT_CHARS and all(f'"id": "2305.1060{i}"' in d for i in range(3))  # every id stays
    many = [{"number": i, "title": f"issue {i}"} for i in range(40)]
    d = tool_digest(json.dumps(many))
    assert len(d) <= TOOL_RESULT_CHARS and '"number": 0' in d and "more" in d
    assert tool_digest("plain words") == "plain words"
    assert tool_digest("x " * 400).startswith("[tool result:")  # too long and not JSON: the one-line surrogate


def test_prune_history_window():
    hist = [{"role": "user", "content": f"turn {i}"} for i in range(20)]
    hist.append({"role": "tool", "content": json.dumps([{"id": i, "body": "y" * 300} for i in range(30)])})
    hist.append({"role": "assistant", "content": "z" * 5000})
    win = prune_history(hist)
    assert len(win) <= 6
    assert win[-1]["role"] == "assistant" and len(win[-1]["content"]) <= 401
    assert win[-2]["content"].startswith('[{"id": 0, "body": "yyy') and '"+24 more"' in win[-2]["content"]
    assert prune_history(hist, digest=False)[-2]["content"].startswith("[tool result: 30 items")  # routing's form
    assert [m["content"] for m in win[:-2]] == [f"turn {i}" for i in range(16, 20)]  # recent turns verbatim
    assert sum(len(m["content"]) for m in win) < 1300
    assert prune_history(None) == [] and prune_history(["just a string"]) == [{"role": "user", "content": "just a string"}]


def test_supported_values():
    ctx = "create an issue in acme/api titled crash on start, label bug, priority 3, make it private"
    assert supported("acme", ctx) and supported("Crash on Start", ctx)
    assert not supported("enhancement", ctx)
    assert supported(3, ctx) and not supported(30, ctx) and not supported(4, ctx)
    assert supported(True, ctx, "private") and not supported(True, ctx, "draft")
    assert supported(["bug"], ctx) and not supported(["bug", "urgent"], ctx)
    assert not supported(None, ctx) and not supported("", ctx)


def test_drop_unsupported_never_touches_required():
    spec = compile_tool(Tool("s", "t", "", {"type": "object", "properties": {
        "owner": {"type": "string"}, "per_page": {"type": "integer"}, "state": {"enum": ["open", "closed"]}},
        "required": ["owner"]}))
    args, dropped = drop_unsupported({"owner": "invented", "per_page": 30, "state": "closed"}, spec,
                                     "show closed ones")
    assert args == {"owner": "invented", "state": "closed"} and dropped == ["per_page"]



def test_flags_and_abbreviated_members_backed_by_what_the_request_says():
    from nexus_cli.arguments.repairs import described, enum_supported

    spec = compile_tool(Tool("s", "pods_log", "", {"type": "object", "properties": {
        "name": {"type": "string"},
        "previous": {"type": "boolean", "description": "Return previous terminated container logs"},
        "dryRun": {"type": "boolean", "default": False, "description": "Preview changes using git-style diff format"},
        "autostart": {"type": "boolean"},
        "raw": {"type": "boolean", "description": "Get the actual HTML content of the page."},
        "direction": {"enum": ["ASC", "DESC"]}}, "required": ["name"]}))
    full = {"name": "web", "previous": True, "dryRun": True, "autostart": True, "raw": True, "direction": "DESC"}
    # a flag by what it does ("the termination" / "show me the diff"), a flag's name by its stem ("start it
    # automatically"), an abbreviated member ("descending")
    args, dropped = drop_unsupported(dict(full), spec, "logs of web since the termination, just show me the diff, "
                                                       "start it automatically, newest descending")
    assert args == {"name": "web", "previous": True, "dryRun": True, "autostart": True, "direction": "DESC"}
    assert dropped == ["raw"]  # "html" inside a URL is not prose
    args, dropped = drop_unsupported(dict(full, dryRun=False), spec, "fetch https://x.io/a.html for web, show the diff")
    assert args == {"name": "web", "dryRun": False} or "dryRun" in dropped  # a default value needs its name
    assert "dryRun" in dropped and "raw" in dropped and "direction" in dropped
    # common words and the tool's own name back nothing
    assert not described("Allow commits from upstream members", "merge from main")
    assert not described("Return previous terminated container logs", "show the pods logs", ["pods", "logs"])
    # "open" names the operation ("open a PR"), not a pull request's draft flag
    assert not described("Open it as a draft that cannot be merged yet.", "open a pr")
    assert described("Open it as a draft that cannot be merged yet.", "open a pr as a draft")
    assert enum_supported("DESC", "order descending") and enum_supported("prev", "the previous one")  # abbreviations
    assert enum_supported("asc", "oldest first, ascending")
    assert not enum_supported("DESC", "a description") and not enum_supported("main", "maintain it")

def test_prompt_carries_signature_history_and_query():
    tool = next(t for t in load_registries([FORGE]) if t.name == "create_pull_request")
    spec = compile_tool(tool)
    msgs, win = build_messages(spec, "open a PR there", [{"role": "user", "content": "I made acme/site"}])
    text = msgs[-1]["content"]
    assert msgs[0]["role"] == "system"
    assert "user: I made acme/site" in text and "create_pull_request(" in text and text.endswith("Request: open a PR there")
    assert win == [{"role": "user", "content": "I made acme/site"}]
    assert text.startswith("Conversation so far:\n") and (tool_block(spec) + "\n\nRequest: ") in text


def test_uncompilable_tool_is_a_clear_error():
    spec = compile_tool(Tool("s", "bad", "", {"type": "string"}))
    with pytest.raises(SchemaError, match="cannot be called: grammar: root schema is a string"):
        generate_arguments(object(), spec, "anything")


# ------------------------------------------------------------------------------------------------ real model

@pytest.fixture(scope="module")
def smollm():
    from nexus_cli.adapters.llama import LlamaContext, load_model

    try:
        model = load_model("smollm2-135m")
    except Exception as e:  # noqa: BLE001
        pytest.fail(f"SmolLM2 is needed (run `make models`): {e}")
    ctx = LlamaContext(model, n_ctx=2048, n_seq_max=1)
    yield ctx
    ctx.close()


@pytest.mark.slow
def test_llama_cpp_accepts_every_real_grammar(smollm):
    """llama.cpp's own GBNF parser (llama_sampler_init_grammar) accepts the grammar of all 955 real tools."""
    import llama_cpp.llama_cpp as L  # test-only: checks our grammars with llama.cpp's own parser

    if not REGISTRIES.is_dir():
        pytest.skip(f"registries not found at {REGISTRIES}")
    vocab = smollm.model._vocab
    failed = []
    tools = load_registries([REGISTRIES])
    for t in tools:
        spec = compile_tool(t)
        assert spec.ok, spec.problems
        g = L.llama_sampler_init_grammar(vocab, spec.grammar.encode("utf-8"), b"root")
        if not g:
            failed.append(spec.key)
        else:
            L.llama_sampler_free(g)
    assert len(tools) == 955
    assert not failed, failed[:10]


def test_stated_optional_keys_are_the_left_out_fields_the_request_names():
    from nexus_cli.arguments.pipeline import stated_optional_keys

    schema = {"type": "object", "required": ["owner"], "properties": {
        "owner": {"type": "string"}, "state": {"type": "string", "enum": ["open", "closed", "all"]},
        "perPage": {"type": "integer"}, "page": {"type": "integer"}, "since": {"type": "string"},
        "assignee_ids": {"type": "array", "items": {"type": "integer"}}, "draft": {"type": "boolean"},
        "pull_number": {"type": "integer"}, "milestone": {"type": "integer"}}}
    topic = ["list", "pull", "requests"]
    ctx = "list closed pull requests of acme, 50 per page, since 2024-06-01, assignee ids 17 and 42, drafts too"
    got = stated_optional_keys({"owner": "acme", "perPage": 50}, schema, ctx, topic)
    # page: its word is perPage's; draft: a flag; pull_number: a word of the tool's name; milestone: not written
    assert got == ["state", "since", "assignee_ids"]
    # perPage left out: "per page" names it, and not page as well (the more specific field)
    assert stated_optional_keys({"owner": "acme", "state": "closed"}, schema, ctx, topic) == ["perPage", "since",
                                                                                               "assignee_ids"]
    # two members named: the request does not say which one
    assert "state" not in stated_optional_keys({"owner": "a"}, schema, "open or closed ones", topic)
    assert stated_optional_keys({}, {"type": "object"}, ctx) == []


class _Answer:
    def __init__(self, text):
        self.text, self.t_total_ms = text, 5.0
        self.drafted = self.accepted = 0


class _FixedAnswerContext:
    """Stands in for a LlamaContext whose forced pass writes `text` (the acceptance rule is what is tested here)."""

    def __init__(self, text):
        self.text, self.calls = text, []
        self.model = None

    def generate(self, tokens, **kw):
        self.calls.append(kw)
        return _Answer(self.text)


def _longer_lists_pass(ctx, spec, args, tokens, source, source_chars, max_tokens, seq_id):
    from nexus_cli.arguments.pipeline import _Generations, _longer_lists_pass as longer_lists_pass

    return longer_lists_pass(_Generations(ctx, seq_id, source, drafting=False), spec, args, tokens, source,
                             source_chars, max_tokens)


def test_longer_lists_pass_keeps_only_new_items_the_request_writes():
    from nexus_cli.arguments.repairs import one_item_lists

    tool = Tool("charts", "radar", "Draw a radar chart.", {"type": "object", "required": ["data"], "properties": {
        "data": {"type": "array", "items": {"type": "object", "properties": {
            "name": {"type": "string"}, "value": {"type": "number"}}}},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 1}, "title": {"type": "string"}}})
    spec = compile_tool(tool)
    query = "radar chart of my skills: Python 85, SQL 70, Docker 60"
    first = {"data": [{"name": "Python", "value": 85}], "tags": ["x"], "title": "skills"}
    assert one_item_lists(first, spec.input_schema) == ["data"]  # tags: maxItems 1

    def run(text):
        ctx = _FixedAnswerContext(text)
        out = _longer_lists_pass(ctx, spec, first, [1, 2, 3], query, len(query), 64, 0)
        assert len(ctx.calls) == 1 and ctx.calls[0]["start_pos"] == 2  # only the prompt's last token again
        forced = Grammar(ctx.calls[0]["grammar"])  # the second pass must write two data points or more
        assert not forced.accepts(json.dumps({"data": [{"name": "Python", "value": 85}]}))
        assert forced.accepts(json.dumps({"data": [{"name": "Python", "value": 85}, {"name": "SQL", "value": 70}]}))
        out.pop("_ms")
        return out

    # new items written in the request are taken, up to the first one that is not (Kubernetes is nowhere)
    longer = ('{"data": [{"name": "Python", "value": 85}, {"name": "SQL", "value": 70}, '
              '{"name": "Docker", "value": 60}, {"name": "Kubernetes", "value": 45}]}')
    assert run(longer) == {"data": [{"name": "Python", "value": 85}, {"name": "SQL", "value": 70},
                                    {"name": "Docker", "value": 60}]}
    # a second item with no value of its own, or a list that starts elsewhere, leaves the answer alone
    assert run('{"data": [{"name": "Python", "value": 85}, {"name": "Python", "value": 85}]}') == {}
    assert run('{"data": [{"name": "SQL", "value": 70}, {"name": "Python", "value": 85}]}') == {}
    assert run("not json") == {}
    # an optional one-item list whose item the request does not write is dropped later whatever follows it:
    # no second pass is run for it
    # (a required list is never dropped, so its pass runs whatever its item)
    ctx = _FixedAnswerContext(longer)
    _longer_lists_pass(ctx, spec, {"data": [{"name": "Rust", "value": 99}]}, [1, 2, 3], query, len(query), 64, 0)
    assert len(ctx.calls) == 1
    optional = compile_tool(Tool("forge", "create_pull_request", "Open a pull request.", {
        "type": "object", "required": ["title"], "properties": {
            "title": {"type": "string"}, "reviewers": {"type": "array", "items": {"type": "string"}}}}))
    pr = "open a pull request titled Add login page and ask ana and bo to review"
    ctx = _FixedAnswerContext('{"title": "Add login page", "reviewers": ["it", "bo"]}')
    assert _longer_lists_pass(ctx, optional, {"title": "Add login page", "reviewers": ["it"]}, [1, 2, 3], pr,
                              len(pr), 64, 0) == {} and ctx.calls == []
    ctx = _FixedAnswerContext('{"title": "Add login page", "reviewers": ["ana", "bo"]}')
    out = _longer_lists_pass(ctx, optional, {"title": "Add login page", "reviewers": ["ana"]}, [1, 2, 3], pr,
                             len(pr), 64, 0)
    assert len(ctx.calls) == 1 and out["reviewers"] == ["ana", "bo"]


@pytest.mark.slow
def test_smollm_end_to_end_valid_arguments(smollm):
    tools = {t.name: t for t in load_registries([FORGE])}
    cases = [("create_issue", "file a bug in acme/api titled Login button broken"),
             ("list_commits", "show the last commits on the main branch of acme/web"),
             ("merge_pull_request", "squash merge PR 57 in acme/api")]
    for name, query in cases:
        spec = compile_tool(tools[name])
        res = generate_arguments(smollm, spec, query, max_tokens=256)
        assert json.loads(res.raw) is not None  # grammar-constrained: always parses
        assert isinstance(res.arguments, dict)
        assert res.valid, (name, res.raw, res.errors)
        assert validate_arguments(tools[name].input_schema, res.arguments) == []
        assert res.timings_ms["total"] >= res.timings_ms["first_token"] > 0 and res.prompt_tokens > 50


def test_smollm_answers_name_the_required_values_the_request_does_not_give(smollm):
    """`guessed` comes with every valid answer: the required fields whose value the request holds no word of (SmolLM2
    invents an owner for this one), and none whose value it writes."""
    tools = {t.name: t for t in load_registries([FORGE])}
    spec = compile_tool(tools["create_pull_request"])
    query = "open a pull request in acme/api from feature/login into main titled Add login page"
    res = generate_arguments(smollm, spec, query)
    assert res.valid and res.guessed, (res.arguments, res.guessed)
    required = set(tools["create_pull_request"].input_schema["required"])
    for key, value in res.arguments.items():
        if key in required and isinstance(value, str):
            words = set(query.lower().replace("/", " ").split())
            assert (key in res.guessed) == (not any(w in words for w in value.lower().replace("/", " ").split())), \
                (key, value)
    assert res.guessed == [k for k in res.arguments if k in res.guessed]  # in the answer's order


def test_values_stated_in_another_form_back_their_optional_fields():
    """A date in words, a period code written as a count and a unit, an enum code a description explains: the drop
    keeps them (they were removed as unbacked). A date of another day or year, or a period of another count, is
    still dropped."""
    spec = compile_tool(Tool("s", "get_options", "Get options data. Type: C=calls, P=puts.", {
        "type": "object", "properties": {
            "ticker": {"type": "string"}, "checkin": {"type": "string"}, "checkout": {"type": "string"},
            "period": {"type": "string", "enum": ["1mo", "1y", "2y", "5y"]}, "interval": {"type": "string"},
            "option_type": {"anyOf": [{"enum": ["C", "P"], "type": "string"}, {"type": "null"}]}},
        "required": ["ticker"]}))
    args, dropped = drop_unsupported(
        {"ticker": "AAPL", "checkin": "2025-07-14", "checkout": "2025-07-19", "period": "2y", "option_type": "P"},
        spec, "AAPL put options from July 14 to 19th of July, 2025, over the last two years")
    assert args == {"ticker": "AAPL", "checkin": "2025-07-14", "checkout": "2025-07-19", "period": "2y",
                    "option_type": "P"} and dropped == []
    args, dropped = drop_unsupported(
        {"ticker": "AAPL", "checkin": "2024-07-14", "checkout": "2025-07-15", "period": "5y", "option_type": "C"},
        spec, "AAPL put options from July 14 to 19th of July, 2025, over the last two years")
    assert args == {"ticker": "AAPL"} and dropped == ["checkin", "checkout", "period", "option_type"]
    from nexus_cli.arguments.repairs import date_backed, period_backed

    assert date_backed("2025-03-05", "due 03/05/2025") and date_backed("2025-03-05T09:00:00Z", "on 5 mar")
    assert not date_backed("2025-03-05", "due 2025") and not date_backed("not a date", "march 5")
    assert period_backed("1wk", "over 1 week") and not period_backed("1wk", "weekly candles")


def test_unbacked_beginning_only_where_no_longer_value_can_be_backed():
    from nexus_cli.arguments.repairs import norm_text, unbacked_beginning

    ctx = norm_text("open a pull request in acme/api titled Add login page")
    text = {"type": "string"}
    assert unbacked_beginning(text, "This", ctx)  # no word of the request starts with "this"
    assert not unbacked_beginning(text, "Add lo", ctx)  # may still become "Add login page"
    assert not unbacked_beginning(text, "log", ctx)  # "login" starts with it
    assert unbacked_beginning(text, "Add logout", ctx)
    assert not unbacked_beginning({"type": "string", "enum": ["This"]}, "This", ctx)  # members are judged otherwise
    assert not unbacked_beginning({"type": "integer"}, "7", ctx)
    assert not unbacked_beginning(text, "Äpfel", ctx)  # only ASCII beginnings are judged
    assert not unbacked_beginning(text, "", ctx)
    assert not unbacked_beginning(text, "2025-0", ctx)  # a digit first: it may become a date the request writes in words


def test_unbacked_string_watch_closes_optional_strings_the_drop_would_remove(smollm):
    from nexus_cli.arguments.unbacked import UnbackedStringWatch, closable_fields

    spec = compile_tool({t.name: t for t in load_registries([FORGE])}["create_pull_request"])
    assert set(closable_fields(spec)) == {"body"}  # optional strings without an enum; required ones never
    watch = UnbackedStringWatch(smollm.model, spec, "open a pull request in acme/api titled Add login page")

    def says(text):
        return watch(smollm.model.tokenize(text, parse_special=False))

    assert not says('{"owner": "acme", "repo": "api", "title": "Zebra')  # a required field: never closed
    assert not says('{"owner": "acme", "repo": "api", "title": "t", "body": "Add login')
    assert not says('{"owner": "acme", "repo": "api", "title": "t", "body')  # a key, not a value
    assert not says('{"owner": "acme", "repo": "api", "title": "t", "body": "a\\')  # inside an escape
    assert says('{"owner": "acme", "repo": "api", "title": "t", "body": "This')
    assert watch.closed == ["body"]


@pytest.mark.slow
def test_closing_unbacked_strings_keeps_the_arguments_and_saves_their_tokens(smollm):
    """SmolLM2 makes up an issue's body: closed early, the answer is shorter and the arguments kept are the same."""
    spec = compile_tool({t.name: t for t in load_registries([FORGE])}["create_issue"])
    query = "file a bug in acme/api titled Login button broken"
    out = generate_arguments(smollm, spec, query, close_unbacked=False, drafting=False)
    closed = generate_arguments(smollm, spec, query, close_unbacked=True, drafting=False)
    assert out.closed == [] and "body" in out.dropped and len(json.loads(out.raw)["body"]) > 10
    assert closed.closed == ["body"] and "body" in closed.dropped and len(closed.raw) < len(out.raw)
    assert closed.valid and closed.arguments == out.arguments
    assert not generate_arguments(smollm, spec, query, post_process=False).closed  # nothing would drop it there


@pytest.mark.slow
def test_tool_prefixes_kept_in_memory_and_on_disk_give_the_same_answer(smollm, tmp_path):
    """ArgumentPrefixes: without history the prompt up to the end of the tool's block is the same for every call of
    that tool (with history, the system prompt is); its KV state is decoded once, then restored (from memory, or
    from disk in a new context) instead of decoded, and the answer is the one decoding it gives. A damaged file is a
    miss: decoded and written again."""
    from nexus_cli.adapters.llama import LlamaContext
    from nexus_cli.prefix_store import PrefixStore

    tools = {t.name: t for t in load_registries([FORGE])}
    issue, commits = compile_tool(tools["create_issue"]), compile_tool(tools["list_commits"])
    first_q, second_q = "file a bug in acme/api titled Login button broken", "report a crash in acme/web"
    history = [{"role": "user", "content": "we work on acme/api"}]

    # the shared part: without history the same tokens for two requests of one tool, more than the system prompt and
    # less than the prompt; with history the system prompt and the user turn's header
    model = smollm.model
    m1, _ = build_messages(issue, first_q)
    m2, _ = build_messages(issue, second_q)
    m3, _ = build_messages(issue, second_q, history)
    t1, t2, t3 = model.chat_tokens(m1), model.chat_tokens(m2), model.chat_tokens(m3)
    n1 = tool_prefix_tokens(model, m1, tool_block(issue), t1)
    n2 = tool_prefix_tokens(model, m2, tool_block(issue), t2)
    n3 = tool_prefix_tokens(model, m3, tool_block(issue), t3)
    system = len(model.chat_tokens(m1[:1], add_assistant=False))
    assert n1 == n2 and system < n1 < len(t1) and t1[:n1] == t2[:n2]
    assert system <= n3 < n1 and t3[:n3] == t1[:n3]

    def run(ctx, prefixes, spec, query, hist=None):
        return generate_arguments(ctx, spec, query, hist, max_tokens=96, prefixes=prefixes).raw

    store = PrefixStore(tmp_path / "args")
    ctx = LlamaContext(model, n_ctx=2048, n_seq_max=1)
    made = ArgumentPrefixes(store=store)
    calls = [(commits, "list the commits there", history), (issue, first_q, None),
             (commits, "show the last commits of acme/web", None), (issue, second_q, None)]
    decoded = [run(ctx, made, *c) for c in calls]
    # the first call (history) keeps the system prompt's prefix, the next two their tools'; the fourth finds
    # issue's in memory
    assert (made.decoded, made.memory_hits, made.disk_hits) == (3, 1, 0)
    assert len(list((tmp_path / "args").glob("*.npz"))) == 3
    ctx.close()

    ctx = LlamaContext(model, n_ctx=2048, n_seq_max=1)
    again = ArgumentPrefixes(store=PrefixStore(tmp_path / "args"))
    read = [run(ctx, again, *c) for c in calls]
    assert (again.decoded, again.disk_hits, again.memory_hits) == (0, 3, 1)
    assert read == decoded  # the restored state is the decoded one, byte for byte

    ctx.close()

    for f in (tmp_path / "args").glob("*.npz"):
        f.write_bytes(b"not a state")
    ctx = LlamaContext(model, n_ctx=2048, n_seq_max=1)
    third = ArgumentPrefixes(store=PrefixStore(tmp_path / "args"))
    assert run(ctx, third, issue, first_q) == decoded[1]
    assert third.decoded == 1 and third.disk_hits == 0
    ctx.close()


@pytest.mark.slow
def test_smollm_picks_value_from_history(smollm):
    """A trivially simple coreference: the only path in the conversation is the one to read."""
    spec = compile_tool(Tool("files", "read_file", "Read a text file.", {
        "type": "object", "properties": {"path": {"type": "string", "description": "Path of the file"}},
        "required": ["path"]}))
    history = [{"role": "user", "content": "the notes are in docs/setup.md"},
               {"role": "assistant", "content": "Noted: docs/setup.md."}]
    res = generate_arguments(smollm, spec, "read that file", history, max_tokens=64)
    assert res.valid, res.errors
    assert res.arguments.get("path") == "docs/setup.md", res.raw


@pytest.mark.slow
def test_answer_that_runs_out_of_tokens_is_retried_over_the_tight_grammar(smollm):
    """A budget too small for the full answer (seven tags): the first answer cannot close its JSON, the retry over
    the tight grammar (at most two array items) gives a valid object instead of an error."""
    spec = compile_tool(Tool("notes", "tag_note", "Tag a note.", {
        "type": "object", "properties": {"id": {"type": "integer", "description": "Note id"},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["id"]}))
    query = "tag note 42 with alpha, beta, gamma, delta, epsilon, zeta and theta"
    full = generate_arguments(smollm, spec, query, max_tokens=96)
    assert len(json.loads(full.raw).get("tags", [])) >= 4, full.raw  # what the model wants to write
    res = generate_arguments(smollm, spec, query, max_tokens=20)
    assert res.retries[:1] == ["tight"], (res.raw, res.retries)
    assert res.valid, (res.raw, res.errors)
    assert json.loads(res.raw)["id"] == 42 and len(json.loads(res.raw).get("tags", [])) <= 2, res.raw


class _ScriptedContext:
    """A stand-in LlamaContext whose generations are the given answers in order; it records each grammar."""

    n_ctx = 4096

    def __init__(self, answers):
        from nexus_cli.adapters.llama import GenerationResult

        self._answers = list(answers)
        self._result = GenerationResult
        self.grammars: list[str] = []

        class _Model:
            def chat_tokens(self, messages):
                return list(range(len(json.dumps(messages)) // 8 + 2))

        self.model = _Model()
        self._pos = -1

    def seq_pos_max(self, seq_id):
        return self._pos

    def generate(self, prompt_tokens, max_tokens=128, grammar=None, seq_id=0, start_pos=0, deadline=None, **_):
        text, stop = self._answers.pop(0)
        self.grammars.append(grammar or "")
        self._pos = start_pos + len(prompt_tokens) + 3
        return self._result(text=text, tokens=[1, 2, 3], n_prompt=len(prompt_tokens), t_first_token_ms=1.0,
                            t_total_ms=2.0, stop=stop)


NOTE_TOOL = Tool("notes", "update_note", "Update a note.", {
    "type": "object", "properties": {"id": {"type": "integer", "description": "Note id"},
                                     "priority": {"type": "string", "description": "Priority"},
                                     "color": {"type": "string", "description": "Label color"}},
    "required": ["id"]})


def test_a_failed_answer_is_retried_over_the_tight_then_the_required_first_grammar():
    """An answer that fails validation gets the tight grammar, then the required-first one (the required fields and
    only the optional ones the request states); the first valid retry is kept."""
    spec = compile_tool(NOTE_TOOL)
    ctx = _ScriptedContext([("{}", "eog"), ('{"id": 4', "max_tokens"), ('{"id": 42, "priority": "high"}', "eog")])
    res = generate_arguments(ctx, spec, "set the priority of note 42 to high", post_process=False)
    assert res.valid and res.arguments == {"id": 42, "priority": "high"}, (res.raw, res.errors)
    assert res.retries == ["tight", "required-first"]
    tight, required_first = ctx.grammars[1:]
    assert "color" in tight and "priority" in tight
    assert "color" not in required_first and "priority" in required_first


def test_a_final_failure_is_null_arguments_with_every_reason():
    spec = compile_tool(NOTE_TOOL)
    ctx = _ScriptedContext([("{}", "eog"), ("{}", "eog"), ('{"id": 4', "max_tokens")])
    res = generate_arguments(ctx, spec, "set the priority of note 42 to high", post_process=False)
    assert not res.valid and res.retries == ["tight", "required-first"]
    assert any("'id' is a required property" in e for e in res.errors), res.errors
    assert "did not give valid arguments" in res.errors[-1]


def test_a_call_is_bounded_in_time_whatever_the_schema(smollm):
    """Past its time limit a generation stops and no retry starts: the result is a failure that says so."""
    spec = compile_tool(Tool("notes", "tag_note", "Tag a note.", {
        "type": "object", "properties": {"id": {"type": "integer"},
                                         "tags": {"type": "array", "items": {"type": "string"}}},
        "required": ["id"]}))
    res = generate_arguments(smollm, spec, "tag note 42 with alpha, beta, gamma, delta and epsilon",
                             max_tokens=96, time_limit_s=1e-3)
    assert not res.valid and res.retries == [], (res.raw, res.errors)
    assert any("time limit" in e for e in res.errors), res.errors


def test_numbers_are_clamped_onto_their_bounds():
    from nexus_cli.arguments.repairs import clamp_numbers
    from nexus_cli.schema import normalize_schema

    schema, _ = normalize_schema({"type": "object", "properties": {
        "percent": {"type": "number", "minimum": 0, "maximum": 1},
        "n": {"type": "integer", "exclusiveMaximum": 10, "exclusiveMinimum": 0},
        "ok": {"type": "integer", "minimum": 0},
        "pts": {"type": "array", "items": {"type": "object", "properties": {"x": {"type": "number", "minimum": -1}}}},
        "flag": {"type": "boolean"}}})
    clamped: list[str] = []
    out = clamp_numbers({"percent": 100, "n": 10, "ok": 5, "pts": [{"x": -5}, {"x": 3}], "flag": True, "extra": 9},
                        schema, "", clamped)
    assert out == {"percent": 1, "n": 9, "ok": 5, "pts": [{"x": -1}, {"x": 3}], "flag": True, "extra": 9}
    assert sorted(clamped) == ["n: 10 -> 9", "percent: 100 -> 1", "pts[].x: -5 -> -1"]
    assert clamp_numbers({"n": 0}, schema)["n"] == 1


def test_string_bound_follows_the_context():
    from nexus_cli.schema import STRING_MAX_CHARS, with_string_limit

    g = compile_tool(Tool("s", "t", "", {"type": "object", "properties": {"a": {"type": "string"}}})).grammar
    assert f"char{{0,{STRING_MAX_CHARS}}}" in g
    assert "char{0,40}" in with_string_limit(g, 40) and f"char{{0,{STRING_MAX_CHARS}}}" not in with_string_limit(g, 40)


def test_restore_path_prefixes_only_when_the_request_holds_that_path():
    from nexus_cli.arguments.repairs import restore_path_prefixes

    ctx = "stage posts/intro.md in /home/ana/code/blog, then diff ./build/out against ~/old/out"
    notes: list[str] = []
    out = restore_path_prefixes({"repo_path": "home/ana/code/blog", "file": "posts/intro.md", "n": 3,
                                 "dirs": ["build/out", "old/out"], "nested": {"p": "home/ana/code/blog"}}, ctx, "", notes)
    assert out == {"repo_path": "/home/ana/code/blog", "file": "posts/intro.md", "n": 3,
                   "dirs": ["./build/out", "~/old/out"], "nested": {"p": "/home/ana/code/blog"}}
    assert len(notes) == 4 and notes[0].startswith("repo_path:")
    # a string written as is stays; ambiguity stays
    assert restore_path_prefixes({"r": "acme/api"}, "open acme/api and /acme/api") == {"r": "acme/api"}
    assert restore_path_prefixes({"p": "srv/app"}, "in ~/srv/app or /srv/app") == {"p": "srv/app"}
    assert restore_path_prefixes({"p": "/srv/app"}, "in /srv/app") == {"p": "/srv/app"}
    assert restore_path_prefixes({"p": "b/c"}, "open a/b/c and x/b/c") == {"p": "b/c"}


def test_restore_path_prefixes_gives_a_cut_path_its_leading_directories_back():
    from nexus_cli.arguments.repairs import restore_path_prefixes

    notes: list[str] = []
    # leading directories of a multi-segment path (Qwen2.5-0.5B wrote ledger/reconcile.go, c027 of args_cases_c)
    assert restore_path_prefixes({"path": "ledger/reconcile.go", "line": 87},
                                 "comment on src/ledger/reconcile.go line 87", "", notes) == {
        "path": "src/ledger/reconcile.go", "line": 87}
    assert notes == ["path: 'ledger/reconcile.go' -> 'src/ledger/reconcile.go'"]
    assert restore_path_prefixes({"p": "code/blog"}, "diff /home/ana/code/blog") == {"p": "/home/ana/code/blog"}
    # not when the part cut off is another argument (a file relative to its repository), nor for a single segment,
    # nor with a host in front (a repository reference is not a URL)
    assert restore_path_prefixes({"repo_path": "/srv/blog", "file": "posts/a.md"}, "stage /srv/blog/posts/a.md") == {
        "repo_path": "/srv/blog", "file": "posts/a.md"}
    assert restore_path_prefixes({"f": "intro.md"}, "open src/posts/intro.md") == {"f": "intro.md"}
    assert restore_path_prefixes({"repo": "grafana/loki"}, "see github.com/grafana/loki") == {"repo": "grafana/loki"}
    assert restore_path_prefixes({"u": "example.com/page"}, "fetch https://example.com/page") == {
        "u": "example.com/page"}


def test_split_repository_sets_the_repo_the_request_names():
    from nexus_cli.arguments.repairs import repository_refs, split_repository

    assert repository_refs("PRs of github.com/Shopify/liquid and https://github.com/acme/api/pull/512, acme/web#3") == [
        ("Shopify", "liquid"), ("acme", "api"), ("acme", "web")]
    schema = {"properties": {"owner": {}, "repo": {}, "path": {}}}
    notes: list[str] = []
    # the owner repeated as the repo, a neighbouring path taken as the repo, "owner/name" whole in owner
    assert split_repository({"owner": "kestrel-labs", "repo": "kestrel-labs"}, schema,
                            "cancel run 77123 in kestrel-labs/kestrel", notes)["repo"] == "kestrel"
    assert split_repository({"owner": "facebook", "repo": "react-dom"}, schema,
                            "tree of facebook/react under packages/react-dom", notes)["repo"] == "react"
    assert split_repository({"owner": "acme/api"}, schema, "star acme/api", notes) == {"owner": "acme", "repo": "api"}
    # a URL's host taken for the owner
    assert split_repository({"owner": "github.com", "repo": "grafana"}, schema,
                            "collaborators on github.com/grafana/loki?", notes) == {"owner": "grafana", "repo": "loki"}
    assert len(notes) == 4
    # two repositories of that owner, an owner the request does not write as owner/name, or no repo parameter:
    # the answer stays
    for args, ctx in [({"owner": "acme", "repo": "api"}, "fork acme/api into acme/api2"),
                      ({"owner": "acme", "repo": "web"}, "open web of acme; see other/api"),
                      ({"owner": "acme", "repo": "api"}, "in acme/api"),
                      ({"owner": "github.com", "repo": "loki"}, "see github.com/grafana/loki and acme/api")]:
        assert split_repository(args, schema, ctx) == args
    assert split_repository({"owner": "acme", "name": "x"}, {"properties": {"owner": {}, "name": {}}},
                            "acme/api") == {"owner": "acme", "name": "x"}


def test_convert_units_only_when_the_field_states_a_unit_the_request_does_not_use():
    from nexus_cli.arguments.repairs import convert_units, field_unit

    assert field_unit("lookbackSeconds", {}) == ("time", 1)
    assert field_unit("timeout_ms", {}) == ("time", 0.001)
    assert field_unit("radius", {"description": "Search radius in meters (max 50000)"}) == ("length", 1)
    assert field_unit("limit", {"description": "Maximum number of traces"}) is None
    schema = {"properties": {"lookbackSeconds": {"type": "integer"}, "limit": {"type": "integer"},
                             "radius": {"type": "number", "description": "Search radius in meters"}}}
    notes: list[str] = []
    out = convert_units({"lookbackSeconds": 10, "limit": 20, "radius": 1.5}, schema,
                        "traces over the last 10 minutes, max 20, within 1.5 km", notes)
    assert out == {"lookbackSeconds": 600, "limit": 20, "radius": 1500} and len(notes) == 2
    # already in the field's unit, the number written twice, or a non-integral result for an integer field: kept
    assert convert_units({"lookbackSeconds": 600}, schema, "the last 600 seconds") == {"lookbackSeconds": 600}
    assert convert_units({"lookbackSeconds": 10}, schema, "10 minutes or 10 hours") == {"lookbackSeconds": 10}
    assert convert_units({"lookbackSeconds": 1}, schema, "1 ms") == {"lookbackSeconds": 1}


def test_named_enum_member_replaces_an_unnamed_choice():
    from nexus_cli.arguments.repairs import named_enum_members

    schema = {"properties": {"champion": {"type": "string", "enum": ["ANNIE", "LEE_SIN", "AHRI"]},
                             "position": {"type": "string", "enum": ["TOP", "JUNGLE", "MID"]},
                             "state": {"type": "string", "enum": ["open", "closed", "all"]},
                             "kind": {"type": "string", "enum": ["pullRequest", "issue"]},
                             "note": {"type": "string"}}}
    notes: list[str] = []
    out = named_enum_members({"champion": "ANNIE", "position": "TOP", "state": "open", "kind": "issue", "note": "x"},
                             schema, "How does Lee Sin do in the jungle? Only the open pull requests", notes)
    # written as words (LEE_SIN, JUNGLE); `open` is named, so kept; `issue` is not, and one other member is named
    assert out == {"champion": "LEE_SIN", "position": "JUNGLE", "state": "open", "kind": "pullRequest", "note": "x"}
    assert len(notes) == 3
    # the chosen member named, none named, or two others named: unchanged
    assert named_enum_members({"champion": "ANNIE"}, schema, "Annie or Lee Sin?") == {"champion": "ANNIE"}
    assert named_enum_members({"champion": "ANNIE"}, schema, "best champion?") == {"champion": "ANNIE"}
    assert named_enum_members({"champion": "ANNIE"}, schema, "Ahri or Lee Sin?") == {"champion": "ANNIE"}
    # whole words only: "topology" does not name TOP
    assert named_enum_members({"position": "MID"}, schema, "topology") == {"position": "MID"}


def test_post_processing_renames_an_unnamed_enum_member_before_dropping_it():
    from nexus_cli.arguments.pipeline import post_process_arguments

    spec = compile_tool(Tool(server="t", name="list_workflow_runs", description="", input_schema={
        "type": "object", "required": ["workflow_id"], "properties": {
            "workflow_id": {"type": "string"},
            "event": {"type": "string", "enum": ["check_run", "push", "pull_request"]},
            "status": {"type": "string", "enum": ["queued", "completed"]}}}))
    args, notes = post_process_arguments({"workflow_id": "release.yml", "event": "check_run", "status": "completed"},
                                         spec, "runs of release.yml triggered by pushes to main", [])
    # event: check_run is not named, push is ("pushes"): renamed, then kept; status: nothing named, dropped
    assert args == {"workflow_id": "release.yml", "event": "push"}
    assert "status" in notes and any("check_run -> push" in n for n in notes)


def test_numbers_backed_by_number_words_and_by_the_field_s_unit():
    from nexus_cli.arguments.repairs import unit_backed

    assert supported(2, "go two levels deep", "depth") and supported(12.0, "a twelve item list", "n")
    assert not supported(1, "open the top one", "page")  # "one" backs no number
    assert not supported(2, "between us", "depth")  # whole words only
    meters = {"type": "number", "description": "Search radius in meters (defaults to 500m)"}
    assert unit_backed(1000, "radius", meters, "everything within 1 km of 40.7128, -74.0060")
    assert unit_backed(1500, "radius", meters, "within 1.5 km")
    assert not unit_backed(1000, "radius", meters, "within 2 km")
    assert not unit_backed(1000, "radius", {"type": "number"}, "within 1 km")  # the field states no unit
    assert not unit_backed(60, "timeout_s", {}, "limit 60")  # no unit written with the number
    spec = compile_tool(Tool(server="t", name="explore_area", description="",
                             input_schema={"type": "object", "properties": {"radius": meters, "limit": {}}}))
    assert drop_unsupported({"radius": 1000, "limit": 1000}, spec, "within 1 km") == ({"radius": 1000}, ["limit"])


def test_strip_field_word_cuts_the_field_s_own_name_out_of_a_value():
    from nexus_cli.arguments.repairs import strip_field_word

    schema = {"properties": {"project": {"type": "string"}, "namespace": {"type": "string"},
                             "project_name": {"type": "string"}, "query": {"type": "string"},
                             "mode": {"type": "string", "enum": ["dark project", "light"]}}}
    ctx = 'search my notes in the work project for "vector database", pods of the staging namespace'
    notes: list[str] = []
    out = strip_field_word({"project": "work project", "namespace": "staging namespace",
                            "project_name": "work project", "query": "vector database"}, schema, ctx, notes)
    assert out == {"project": "work", "namespace": "staging", "project_name": "work", "query": "vector database"}
    assert len(notes) == 3
    # prose fields, enum members, one-word values, and values the request does not write that way stay
    assert strip_field_word({"query": "work project"}, schema, ctx) == {"query": "work project"}
    assert strip_field_word({"mode": "dark project"}, schema, "the dark project") == {"mode": "dark project"}
    assert strip_field_word({"project": "project"}, schema, ctx) == {"project": "project"}
    assert strip_field_word({"project": "home project"}, schema, ctx) == {"project": "home project"}


def test_enum_members_backed_by_a_stem_of_the_request():
    from nexus_cli.arguments.repairs import enum_supported

    spec = compile_tool(Tool(server="t", name="list_notifications", description="", input_schema={
        "type": "object", "properties": {
            "filter": {"type": "string", "enum": ["default", "include_read_notifications", "only_participating"]},
            "mode": {"type": "string", "enum": ["driving", "walking", "bicycling"]},
            "sort": {"type": "string"}}}))
    ctx = "notifications where I'm directly participating, cycling there"
    args, dropped = drop_unsupported({"filter": "only_participating", "mode": "bicycling", "sort": "cycles"},
                                     spec, ctx)
    assert args == {"filter": "only_participating", "mode": "bicycling"} and dropped == ["sort"]  # not an enum field
    # the tool's own name backs nothing; short words need an exact match
    args, dropped = drop_unsupported({"filter": "include_read_notifications"}, spec, ctx)
    assert args == {} and dropped == ["filter"]
    assert not enum_supported("desc", "with a description") and enum_supported("desc", "sort desc")


def test_members_of_optional_enum_arrays_and_inflected_members_are_backed():
    spec = compile_tool(Tool("s", "fear_greed", "", {"type": "object", "properties": {
        "days": {"type": "integer"},
        "indicators": {"anyOf": [{"type": "array", "items": {"type": "string", "enum": [
            "put_call_options", "market_volatility_vix", "junk_bond_demand"]}}, {"type": "null"}], "default": None},
        "since": {"enum": ["daily", "weekly", "monthly"]}}, "required": ["days"]}))
    args, dropped = drop_unsupported({"days": 14, "indicators": ["put_call_options", "market_volatility_vix"],
                                      "since": "weekly"}, spec, "last 14 days, only put/call options and VIX this week")
    assert args == {"days": 14, "indicators": ["put_call_options", "market_volatility_vix"], "since": "weekly"}
    args, dropped = drop_unsupported({"days": 14, "indicators": ["put_call_options", "junk_bond_demand"],
                                      "since": "monthly"}, spec, "last 14 days, only put/call options this week")
    assert args == {"days": 14} and dropped == ["indicators", "since"]  # one member unbacked drops the list


def test_restore_spacing_copies_the_requests_spacing():
    from nexus_cli.arguments.repairs import restore_spacing

    ctx = 'save this: <svg width="64"><circle r="28" fill="#e63946"/></svg> please'
    schema = {"properties": {"svg": {"type": "string"}, "kind": {"enum": ["NewYork", "x"]}}}
    notes: list[str] = []
    out = restore_spacing({"svg": '<svg width="64"><circle r="28" fill="#e63946" /></svg>', "kind": "NewYork"},
                          ctx + " in New York", schema, "", notes)
    assert out == {"svg": '<svg width="64"><circle r="28" fill="#e63946"/></svg>', "kind": "NewYork"}  # not an enum
    assert notes == ["svg: spacing as in the request"]
    # a string the request holds, a short one, and one whose spacing matches two stretches stay
    assert restore_spacing({"a": "circle r"}, ctx, schema) == {"a": "circle r"}
    assert restore_spacing({"a": "a b"}, "ab and ab", schema) == {"a": "a b"}
    assert restore_spacing({"a": "abc defgh"}, "abcdefgh or abc  defgh", schema) == {"a": "abc defgh"}
    assert restore_spacing({"a": "iframe#card-frame"}, "fill the iframe #card-frame", schema) == {"a": "iframe#card-frame"}


def test_cut_swallowed_values_ends_a_copy_before_another_arguments_words():
    from nexus_cli.arguments.repairs import cut_swallowed_values

    q = "search the web for best hiking trails near Asheville - just 5 results, and put safesearch on strict pls"
    notes: list[str] = []
    out = cut_swallowed_values({"query": "best hiking trails near Asheville - just 5 results, and put safesearch "
                                         "on strict pls", "count": 5, "safeSearch": "strict"}, {}, q, notes)
    assert out == {"query": "best hiking trails near Asheville", "count": 5, "safeSearch": "strict"}
    assert notes == ["query: cut before the words of another argument"]
    # left alone: a copy that stops before the request's end, one with no other argument's words in it, one with
    # no clause break before them, and an enum member
    same = {"query": "best hiking trails near Asheville - just 5", "count": 5}
    assert cut_swallowed_values(same, {}, q) == same
    plain = {"query": "best hiking trails near Asheville - just 5 results, and put safesearch on strict pls"}
    assert cut_swallowed_values(plain, {}, q) == plain
    q2 = "commit with message bump version to 1.4.0"
    assert cut_swallowed_values({"message": "bump version to 1.4.0", "v": "1.4.0"}, {}, q2) == {
        "message": "bump version to 1.4.0", "v": "1.4.0"}


def test_complete_ids_gives_a_cut_id_its_head_back():
    from nexus_cli.arguments.repairs import complete_ids

    ctx = "search knowledge base KB7QX2M4LP for the parental leave policy, top 5"
    notes: list[str] = []
    assert complete_ids({"knowledgeBaseId": "7QX2M4LP", "n": 5}, ctx, "", notes) == {
        "knowledgeBaseId": "KB7QX2M4LP", "n": 5}
    assert notes == ["knowledgeBaseId: '7QX2M4LP' -> 'KB7QX2M4LP'"]
    # a word of the request, a plain word, a short id, and an id two words end with stay
    for v, c in [("KB7QX2M4LP", ctx), ("policy", "the leave policy"), ("X2M4", ctx),
                 ("7QX2M4LP", "KB7QX2M4LP or AB7QX2M4LP")]:
        assert complete_ids({"id": v}, c) == {"id": v}
