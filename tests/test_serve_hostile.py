"""`nexus serve` under hostile clients (lab/bench_serve.py drives it; `nexus bench serve` is the full 10,000-request
run): 8 concurrent streams mixing valid calls with malformed JSON-RPC, oversized frames, unknown methods, bad arguments
and cancellations; SIGTERM under load; a client that goes away mid-request. Real MiniLM, routing only."""

from __future__ import annotations

from pathlib import Path

import pytest

from nexus_cli.serving.stdio import INVALID_REQUEST, PARSE_ERROR, Oversize, classify_frame, split_frames

REPO = Path(__file__).resolve().parent.parent
FORGE = REPO / "tool_registries" / "github_like.json"


def test_split_frames_bounds_a_frame_without_buffering_it():
    chunks = [b'{"a":1}\n{"b"', b':2}\n', b"x" * 7, b"y" * 7, b"\n", b"tail"]
    frames = list(split_frames(iter(chunks), limit=10))
    assert frames[0] == b'{"a":1}' and frames[1] == b'{"b":2}'
    assert isinstance(frames[2], Oversize) and frames[2].n_bytes == 14
    assert frames[3] == b"tail"  # a last frame without its newline still counts


def test_classify_frame_answers_every_bad_frame():
    assert classify_frame(b"   ") == (None, None)
    for frame, code, id_ in [(b"{nope", PARSE_ERROR, None), (b"\xff\xfe", PARSE_ERROR, None),
                             (b"[1, 2]", INVALID_REQUEST, None), (b"7", INVALID_REQUEST, None),
                             (b'{"jsonrpc": "2.0", "id": 9}', INVALID_REQUEST, 9),
                             (b'{"jsonrpc": "1.0", "id": "x", "method": "ping"}', INVALID_REQUEST, "x"),
                             (Oversize(2_000_000, b'{"jsonrpc": "2.0", "id": "big-1", "method"'), INVALID_REQUEST,
                              "big-1")]:
        msg, err = classify_frame(frame)
        assert msg is None and err["error"]["code"] == code and err["id"] == id_, (frame, err)
        assert "\n" not in err["error"]["message"]
    msg, err = classify_frame(b'{"jsonrpc": "2.0", "id": 4, "method": "ping"}')
    assert err is None and msg.method == "ping"


@pytest.fixture(scope="module")
def serve_args(tmp_path_factory):
    from nexus_cli.adapters.embedder import Embedder
    from nexus_cli.registry import load_registries
    from nexus_cli.routing.build import build_index

    out = tmp_path_factory.mktemp("hostile-idx") / "forge"
    build_index(load_registries([FORGE]), out, embedder=Embedder("minilm"), sources=[str(FORGE)])
    return ["--index", str(out), "--registry", str(FORGE), "--no-args", "--reranker", "none"]


@pytest.fixture(scope="module")
def forge_tools():
    from nexus_cli.registry import load_registries

    return load_registries([FORGE])


def test_hostile_mix_every_answer_right(serve_args, forge_tools):
    from nexus_cli.lab import bench_serve

    r = bench_serve.hostile_load(serve_args, forge_tools, clients=8, requests=100, rss_after=200)
    assert r["n_failures"] == 0, r["failures"][:5]
    assert r["sent"] == 800 and r["correct"] == 800
    kinds = {k for k in r["counts"] if ":" not in k}
    assert {"route", "parse_error", "oversize", "unknown_method", "invalid_rpc", "bad_args", "cancel"} <= kinds
    assert r["alive_after_load"] and r["exit_code_on_close"] == 0 and not r["traceback_in_stderr"]
    assert not r["unexpected_lines"]
    assert r["rss_growth_after_first"] < 0.10, r["rss"]


def test_sigterm_under_load_finishes_and_exits_cleanly(serve_args, forge_tools):
    from nexus_cli.lab import bench_serve

    r = bench_serve.sigterm_under_load(serve_args, forge_tools, clients=8, after_s=2.0)
    assert r["exit_code"] == 0 and not r["traceback_in_stderr"], r
    assert r["n_failures"] == 0, r["failures"]
    assert r["answered_correctly"] > 0
    assert r["shutdown_line"] and "SIGTERM" in r["shutdown_line"] and "0 unfinished" in r["shutdown_line"]


def test_client_gone_mid_request_server_exits_cleanly(serve_args, forge_tools):
    from nexus_cli.lab import bench_serve

    r = bench_serve.disconnect_mid_request(serve_args, forge_tools)
    assert r["exit_code"] == 0 and not r["traceback_in_stderr"], r


def test_protocol_version_negotiation_and_ping(serve_args):
    """initialize with each handshake revision gets that revision back; an unknown one gets a revision the server
    supports (MCP: the client then decides whether to go on); ping answers {} before and after."""
    from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

    from nexus_cli.lab.bench_serve import ServerProcess

    for version in (*HANDSHAKE_PROTOCOL_VERSIONS, "1999-01-01"):
        s = ServerProcess(serve_args)
        try:
            res = s.request("init", "initialize", {"protocolVersion": version, "capabilities": {},
                                                   "clientInfo": {"name": "t", "version": "1"}}, timeout=300)
            got = res["result"]["protocolVersion"]
            assert got == version if version in HANDSHAKE_PROTOCOL_VERSIONS else got in HANDSHAKE_PROTOCOL_VERSIONS
            assert res["result"]["serverInfo"]["name"] == "nexus"
            s.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
            assert s.request("p", "ping")["result"] == {}
            assert s.close() == 0
        finally:
            if s.proc.poll() is None:
                s.proc.kill()
            s.discard_log()
