"""`nexus bench serve`: `nexus serve` under hostile clients (concurrent streams of valid calls mixed with malformed
JSON-RPC, oversized frames, unknown methods, bad arguments and cancellations), then SIGTERM under load, then a client
that disconnects mid-request. The server's answers are checked, not timed.

One `nexus serve` process speaks MCP over stdio (one connection); CLIENTS threads are concurrent request streams on
it, each keeping one request in flight. Every valid routing request's answer must equal the answer the same request got
alone before the load (tool, server, candidates, gate decision): concurrency must never mix answers. Every bad frame
must come back as a JSON-RPC error with the right code (or an MCP error result for a bad tool call). The server's
resident memory (VmRSS) is read after the first `rss_after` answers and at the end.

Kinds of request (weights in MIX): route (a valid route_request), schema (get_tool_schema of a routed tool), ping,
list (tools/list), bad_args (route_request with an empty or wrong-typed request: isError result), unknown_tool,
unknown_method (-32601), invalid_rpc (JSON with an id but no method or a wrong jsonrpc: -32600), parse_error (not
JSON: -32700 with a null id, counted globally), oversize (a frame over the transport's limit: -32600 with its id),
cancel (a route request followed at once by notifications/cancelled: answered correctly or not at all).
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

from ..config import REPO_ROOT
from ..serving.stdio import MAX_FRAME_BYTES
from .results import Run

SUITE = "serve"
CLIENTS = 8
REQUESTS = 1250  # per client: 8 x 1250 = 10,000
RSS_AFTER = 1000
ANSWER_TIMEOUT_S = 300.0
CANCEL_WAIT_S = 3.0
SIGTERM_AFTER_S = 3.0
MIX = {"route": 40, "schema": 10, "ping": 6, "list": 4, "bad_args": 8, "unknown_tool": 4, "unknown_method": 6,
       "invalid_rpc": 6, "parse_error": 6, "oversize": 2, "cancel": 8}
PROTOCOL = "2025-06-18"


def _route_key(payload: dict) -> str:
    """What must not change between a request answered alone and the same request under load."""
    return json.dumps({"server": payload.get("server"), "tool": payload.get("tool"),
                       "candidates": [(c.get("server"), c.get("tool")) for c in payload.get("candidates", [])],
                       "escalated": (payload.get("gate") or {}).get("escalated")}, sort_keys=True)


def rss_kb(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


class ServerProcess:
    """`nexus serve` as a child, with a reader thread that matches answers to request ids."""

    def __init__(self, args: list[str]):
        env = {**os.environ, "NEXUS_DEBUG": "0", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        self.stderr_file = open(_tmp_log(), "w+b")
        self.proc = subprocess.Popen([sys.executable, "-m", "nexus_cli.cli", "serve", *args], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.stderr_file, cwd=str(REPO_ROOT), env=env)
        self.pid = self.proc.pid
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._waiting: dict[str, threading.Event] = {}
        self.answers: dict[str, dict] = {}
        self.null_id_errors: list[dict] = []
        self.unexpected: list[str] = []
        self.n_answers = 0
        self.on_answer = None  # called with the running count of answers
        self.closed = threading.Event()
        self._stop = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        """Answers off the raw pipe with a poll, never inside a buffered read: a buffered read holds the file's lock,
        and closing the pipe to play a client that goes away would then wait for the next answer forever."""
        fd = self.proc.stdout.fileno()
        pending = b""
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select([fd], [], [], 0.2)
                if not ready:
                    continue
                data = os.read(fd, 1 << 16)
                if not data:
                    break
                pending += data
                while b"\n" in pending:
                    line, pending = pending.split(b"\n", 1)
                    self._answer(line)
        except (OSError, ValueError):
            pass
        self.closed.set()

    def _answer(self, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            self.unexpected.append(line[:200].decode("utf-8", "replace"))
            return
        key = str(msg.get("id")) if msg.get("id") is not None else None
        with self._lock:
            self.n_answers += 1
            n = self.n_answers
            if key is None:
                self.null_id_errors.append(msg)
            else:
                self.answers[key] = msg
                ev = self._waiting.get(key)
                if ev is not None:
                    ev.set()
        if self.on_answer is not None:
            self.on_answer(n)

    def stop_reading(self) -> None:
        """Close our end of the server's stdout, as a client that went away does."""
        self._stop.set()
        self._reader.join(5)
        self.proc.stdout.close()

    def send_raw(self, data: bytes) -> bool:
        with self._write_lock:
            try:
                self.proc.stdin.write(data + b"\n")
                self.proc.stdin.flush()
                return True
            except (BrokenPipeError, ValueError, OSError):
                return False

    def send(self, obj: dict) -> bool:
        return self.send_raw(json.dumps(obj, ensure_ascii=False).encode("utf-8"))

    def expect(self, rid: str) -> threading.Event:
        ev = threading.Event()
        with self._lock:
            self._waiting[rid] = ev
            if rid in self.answers:
                ev.set()
        return ev

    def request(self, rid: str, method: str, params: dict | None = None, timeout: float = ANSWER_TIMEOUT_S) -> dict | None:
        ev = self.expect(rid)
        msg = {"jsonrpc": "2.0", "id": rid, "method": method}
        if params is not None:
            msg["params"] = params
        if not self.send(msg):
            return None
        if not ev.wait(timeout):
            return None
        with self._lock:
            self._waiting.pop(rid, None)
            return self.answers.pop(rid, None)

    def handshake(self) -> dict | None:
        res = self.request("init", "initialize", {"protocolVersion": PROTOCOL, "capabilities": {},
                                                  "clientInfo": {"name": "nexus-bench-serve", "version": "1"}},
                           timeout=600)
        self.send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        return res

    def stderr_text(self) -> str:
        try:
            self.stderr_file.flush()
            return Path(self.stderr_file.name).read_text(errors="replace")
        except OSError:
            return ""

    def discard_log(self) -> None:
        self.stderr_file.close()
        try:
            os.unlink(self.stderr_file.name)
        except OSError:
            pass

    def close(self, timeout: float = 120.0) -> int | None:
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            return None


def _tmp_log() -> str:
    import tempfile

    fd, path = tempfile.mkstemp(prefix="nexus-serve-", suffix=".log")
    os.close(fd)
    return path


def _tool_text(res: dict) -> tuple[bool, str]:
    r = res.get("result") or {}
    return bool(r.get("isError")), "".join(c.get("text", "") for c in r.get("content", []))


def route_requests(tools, n: int, seed: int) -> list[str]:
    """Distinct registry-derived requests (textgen), the pool the clients draw from."""
    from .. import textgen

    rng = random.Random(seed)
    out: list[str] = []
    seen: set[str] = set()
    tries = 0
    while len(out) < n and tries < 50 * n:
        tries += 1
        q = rng.choice(textgen.training_queries(rng.choice(tools), rng, n=3))
        if q not in seen:
            seen.add(q)
            out.append(q)
    return out


class Client:
    def __init__(self, server: ServerProcess, c: int, n: int, seed: int, pool: list[str], reference: dict[str, str],
                 failures: list, counts: Counter, lock: threading.Lock, stop: threading.Event | None = None):
        self.s, self.c, self.n, self.pool, self.ref = server, c, n, pool, reference
        self.rng = random.Random(seed * 1000 + c)
        self.failures, self.counts, self.lock, self.stop = failures, counts, lock, stop
        self.routed: list[tuple[str, str]] = []
        self.kinds = list(MIX)
        self.weights = [MIX[k] for k in self.kinds]

    def fail(self, i: int, kind: str, why: str) -> None:
        with self.lock:
            self.failures.append({"client": self.c, "i": i, "kind": kind, "why": why[:300]})

    def count(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def call(self, rid: str, name: str, arguments) -> dict | None:
        return self.s.request(rid, "tools/call", {"name": name, "arguments": arguments})

    def check_route(self, i: int, kind: str, query: str, res: dict | None) -> None:
        if res is None:
            return self.fail(i, kind, "no answer")
        err, text = _tool_text(res)
        if err or "result" not in res:
            return self.fail(i, kind, f"error for a valid request: {text or res.get('error')}")
        try:
            payload = json.loads(text)
        except ValueError:
            return self.fail(i, kind, f"not JSON: {text[:200]}")
        if _route_key(payload) != self.ref[query]:
            return self.fail(i, kind, f"answer differs from the same request alone: {query!r}")
        self.routed.append((payload["server"], payload["tool"]))
        self.count(kind + ":ok")

    def expect_error(self, i: int, kind: str, res: dict | None, code: int) -> None:
        if res is None:
            return self.fail(i, kind, "no answer")
        got = (res.get("error") or {}).get("code")
        if got != code:
            return self.fail(i, kind, f"expected JSON-RPC error {code}, got {json.dumps(res)[:200]}")
        self.count(kind + ":ok")

    def expect_error_result(self, i: int, kind: str, res: dict | None) -> None:
        if res is None:
            return self.fail(i, kind, "no answer")
        err, text = _tool_text(res)
        if not err or "\n" in text.strip() or not text.startswith("error:"):
            return self.fail(i, kind, f"expected a one-line error result, got {json.dumps(res)[:200]}")
        self.count(kind + ":ok")

    def run(self) -> None:
        for i in range(self.n):
            if self.stop is not None and self.stop.is_set():
                return
            kind = self.rng.choices(self.kinds, self.weights)[0] if self.stop is None else "route"
            rid = f"c{self.c}-{i}"
            self.count(kind)
            if kind == "route":
                q = self.rng.choice(self.pool)
                res = self.call(rid, "route_request", {"request": q})
                if self.stop is not None and res is None:
                    return  # the server is shutting down: an unanswered request is not a wrong answer
                self.check_route(i, kind, q, res)
            elif kind == "schema":
                if not self.routed:
                    self.routed.append(("", ""))
                server, tool = self.rng.choice(self.routed)
                if not tool:
                    res = self.call(rid, "get_tool_schema", {"tool": "no_such_tool_anywhere"})
                    self.expect_error_result(i, kind, res)
                    continue
                res = self.call(rid, "get_tool_schema", {"tool": tool, "server": server})
                if res is None:
                    self.fail(i, kind, "no answer")
                    continue
                err, text = _tool_text(res)
                if err or json.loads(text).get("name") != tool:
                    self.fail(i, kind, f"wrong schema for {server}/{tool}: {text[:200]}")
                else:
                    self.count(kind + ":ok")
            elif kind == "ping":
                res = self.s.request(rid, "ping")
                if res is None or res.get("result") != {}:
                    self.fail(i, kind, f"bad ping answer: {res}")
                else:
                    self.count(kind + ":ok")
            elif kind == "list":
                res = self.s.request(rid, "tools/list")
                names = sorted(t.get("name") for t in ((res or {}).get("result") or {}).get("tools", []))
                if names != ["get_tool_schema", "route_request"]:
                    self.fail(i, kind, f"bad tools/list answer: {str(res)[:200]}")
                else:
                    self.count(kind + ":ok")
            elif kind == "bad_args":
                bad = self.rng.choice([{"request": ""}, {"request": 42}, {}, {"request": "x", "history": "no"},
                                       {"request": "x", "extra": 1}])
                self.expect_error_result(i, kind, self.call(rid, "route_request", bad))
            elif kind == "unknown_tool":
                self.expect_error_result(i, kind, self.call(rid, "delete_everything", {"x": 1}))
            elif kind == "unknown_method":
                self.expect_error(i, kind, self.s.request(rid, self.rng.choice(["tools/destroy", "admin/shutdown",
                                                                               "resources/nope"])), -32601)
            elif kind == "invalid_rpc":
                ev = self.s.expect(rid)
                frame = self.rng.choice([{"jsonrpc": "2.0", "id": rid},
                                         {"jsonrpc": "1.0", "id": rid, "method": "ping"},
                                         {"jsonrpc": "2.0", "id": rid, "method": 7}])
                self.s.send(frame)
                ev.wait(ANSWER_TIMEOUT_S)
                self.expect_error(i, kind, self.s.answers.pop(rid, None), -32600)
            elif kind == "parse_error":
                junk = self.rng.choice([b"{not json", b"\xff\xfe\x00garbage", b'{"jsonrpc": "2.0", "id": ',
                                        b"]]]", b"nul"])
                self.s.send_raw(junk)
            elif kind == "oversize":
                ev = self.s.expect(rid)
                head = json.dumps({"jsonrpc": "2.0", "id": rid, "method": "tools/call"})[:-1]
                filler = b"a" * (MAX_FRAME_BYTES + self.rng.randint(1, 4096))
                self.s.send_raw(head.encode() + b', "params": {"name": "route_request", "arguments": {"request": "'
                                + filler + b'"}}}')
                ev.wait(ANSWER_TIMEOUT_S)
                self.expect_error(i, kind, self.s.answers.pop(rid, None), -32600)
            elif kind == "cancel":
                q = self.rng.choice(self.pool)
                ev = self.s.expect(rid)
                self.s.send({"jsonrpc": "2.0", "id": rid, "method": "tools/call",
                             "params": {"name": "route_request", "arguments": {"request": q}}})
                self.s.send({"jsonrpc": "2.0", "method": "notifications/cancelled",
                             "params": {"requestId": rid, "reason": "user pressed stop"}})
                if ev.wait(CANCEL_WAIT_S):
                    self.check_route(i, "cancel", q, self.s.answers.pop(rid, None))
                    self.count("cancel:answered")
                else:
                    self.count("cancel:ok")
                    self.count("cancel:silent")


def _references(server: ServerProcess, pool: list[str]) -> dict[str, str]:
    ref = {}
    for j, q in enumerate(pool):
        res = server.request(f"ref-{j}", "tools/call", {"name": "route_request", "arguments": {"request": q}})
        if res is None:
            raise RuntimeError(f"the server did not answer the reference request {q!r}: {server.stderr_text()[-500:]}")
        err, text = _tool_text(res)
        if err:
            raise RuntimeError(f"reference request {q!r} failed: {text}")
        ref[q] = _route_key(json.loads(text))
    return ref


def hostile_load(serve_args: list[str], tools, clients: int = CLIENTS, requests: int = REQUESTS, seed: int = 0,
                 rss_after: int = RSS_AFTER, pool_size: int = 60, progress=None) -> dict:
    """Phase 1: the mixed load; returns counts, failures and memory."""
    server = ServerProcess(serve_args)
    try:
        if server.handshake() is None:
            raise RuntimeError(f"nexus serve did not start: {server.stderr_text()[-800:]}")
        pool = route_requests(tools, pool_size, seed)
        reference = _references(server, pool)
        base = server.n_answers
        rss = {"after_references_kb": rss_kb(server.pid), "trajectory": []}
        marks = {"first": base + rss_after}

        def on_answer(n: int) -> None:
            if n == marks.get("first"):
                rss["after_first_kb"] = rss_kb(server.pid)
            if (n - base) % rss_after == 0:  # the curve: a plateau or a leak
                rss["trajectory"].append([n - base, rss_kb(server.pid)])
            if progress is not None:
                progress.advance("answers")

        server.on_answer = on_answer
        failures: list = []
        counts: Counter = Counter()
        lock = threading.Lock()
        if progress is not None:
            progress.set_total(clients * requests)
        t0 = time.perf_counter()
        threads = [threading.Thread(target=Client(server, c, requests, seed, pool, reference, failures, counts,
                                                  lock).run) for c in range(clients)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        # the parse errors are answered with a null id: wait for all of them
        deadline = time.time() + 60
        while len(server.null_id_errors) < counts["parse_error"] and time.time() < deadline:
            time.sleep(0.05)
        wall = time.perf_counter() - t0
        rss["after_all_kb"] = rss_kb(server.pid)
        bad_null = [e for e in server.null_id_errors if (e.get("error") or {}).get("code") != -32700]
        counts["parse_error:ok"] = len(server.null_id_errors) - len(bad_null)
        if len(server.null_id_errors) != counts["parse_error"] or bad_null:
            failures.append({"kind": "parse_error", "why": f"{counts['parse_error']} unparsable frames sent, "
                             f"{len(server.null_id_errors)} null-id errors back ({len(bad_null)} with another code)"})
        alive = server.proc.poll() is None
        rc = server.close()
        stderr = server.stderr_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.discard_log()
    growth = None
    if rss.get("after_first_kb") and rss.get("after_all_kb"):
        growth = (rss["after_all_kb"] - rss["after_first_kb"]) / rss["after_first_kb"]
    sent = sum(v for k, v in counts.items() if ":" not in k)
    ok = sum(v for k, v in counts.items() if k.endswith(":ok"))
    return {"clients": clients, "requests_per_client": requests, "sent": sent, "correct": ok,
            "counts": dict(sorted(counts.items())), "failures": failures[:50], "n_failures": len(failures),
            "alive_after_load": alive, "exit_code_on_close": rc, "traceback_in_stderr": "Traceback" in stderr,
            "unexpected_lines": server.unexpected[:5], "wall_s": round(wall, 2),
            "requests_per_s": round(sent / wall, 1) if wall else None, "rss": rss, "rss_growth_after_first": growth,
            "rss_after_first_n": rss_after}


def sigterm_under_load(serve_args: list[str], tools, clients: int = CLIENTS, seed: int = 1,
                       after_s: float = SIGTERM_AFTER_S) -> dict:
    """Phase 2: clients stream valid route requests; SIGTERM arrives; the server must answer what it took, correctly,
    and exit 0 without a traceback."""
    server = ServerProcess(serve_args)
    try:
        if server.handshake() is None:
            raise RuntimeError(f"nexus serve did not start: {server.stderr_text()[-800:]}")
        pool = route_requests(tools, 20, seed)
        reference = _references(server, pool)
        failures: list = []
        counts: Counter = Counter()
        lock = threading.Lock()
        stop = threading.Event()
        threads = [threading.Thread(target=Client(server, c, 10**6, seed, pool, reference, failures, counts, lock,
                                                  stop=stop).run, daemon=True) for c in range(clients)]
        for t in threads:
            t.start()
        time.sleep(after_s)
        t_signal = time.perf_counter()
        server.proc.send_signal(signal.SIGTERM)
        try:
            rc = server.proc.wait(120)
        except subprocess.TimeoutExpired:
            rc = None
        exit_s = time.perf_counter() - t_signal
        stop.set()
        server.closed.wait(10)
        for ev in list(server._waiting.values()):
            ev.set()  # release the clients still waiting on requests the server never took
        for t in threads:
            t.join(10)
        stderr = server.stderr_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.discard_log()
    last = [ln for ln in stderr.splitlines() if "stopped" in ln]
    return {"exit_code": rc, "seconds_to_exit": round(exit_s, 3), "answered_correctly": counts.get("route:ok", 0),
            "failures": failures[:20], "n_failures": len(failures), "traceback_in_stderr": "Traceback" in stderr,
            "shutdown_line": last[-1] if last else None}


def disconnect_mid_request(serve_args: list[str], tools, seed: int = 2) -> dict:
    """Phase 3: a client sends requests and goes away (closes both pipes) before the answers; the server must exit 0
    on its own, without a traceback."""
    server = ServerProcess(serve_args)
    try:
        if server.handshake() is None:
            raise RuntimeError(f"nexus serve did not start: {server.stderr_text()[-800:]}")
        for j, q in enumerate(route_requests(tools, 8, seed)):
            server.send({"jsonrpc": "2.0", "id": f"gone-{j}", "method": "tools/call",
                         "params": {"name": "route_request", "arguments": {"request": q}}})
        server.stop_reading()  # the answers hit a closed pipe
        t0 = time.perf_counter()
        try:
            server.proc.stdin.close()
        except OSError:
            pass
        try:
            rc = server.proc.wait(120)
        except subprocess.TimeoutExpired:
            rc = None
        exit_s = time.perf_counter() - t0
        stderr = server.stderr_text()
    finally:
        if server.proc.poll() is None:
            server.proc.kill()
        server.discard_log()
    return {"exit_code": rc, "seconds_to_exit": round(exit_s, 3), "traceback_in_stderr": "Traceback" in stderr}


def run(out_dir: str = "results", registry: str | None = None, clients: int = CLIENTS, requests: int = REQUESTS,
        seed: int = 0, reranker: str = "none", embedder: str | None = None, progress=None, write: bool = True) -> dict:
    from ..adapters.embedder import index_embedder
    from ..config import DEFAULT_EMBEDDER
    from ..registry import load_registries
    from .bench_routing import _index_for
    from .common import registry_dir_default

    reg = Path(registry) if registry else registry_dir_default()
    tools = load_registries([reg])
    emb = index_embedder(embedder or DEFAULT_EMBEDDER)  # as `nexus index` embeds
    index = _index_for(tools, emb)
    run_ = Run(SUITE, {"registry": str(reg), "n_tools": len(tools), "clients": clients,
                       "requests_per_client": requests, "reranker": reranker, "embedder": emb.name,
                       "mix": MIX, "max_frame_bytes": MAX_FRAME_BYTES, "rss_after": RSS_AFTER}, seed=seed)
    del emb
    args = ["--index", str(index), "--registry", str(reg), "--no-args", "--reranker", reranker]
    load = hostile_load(args, tools, clients, requests, seed, progress=progress)
    term = sigterm_under_load(args, tools, clients, seed + 1)
    gone = disconnect_mid_request(args, tools, seed + 2)
    summary = {"load": load, "sigterm": term, "disconnect": gone,
               "passed": {"no_lost_or_wrong_answers": load["n_failures"] == 0 and term["n_failures"] == 0,
                          "memory_flat_5pct": load["rss_growth_after_first"] is not None
                          and abs(load["rss_growth_after_first"]) <= 0.05,
                          "clean_sigterm_exit": term["exit_code"] == 0 and not term["traceback_in_stderr"],
                          "clean_disconnect_exit": gone["exit_code"] == 0 and not gone["traceback_in_stderr"]}}
    run_.note("routing only (--no-args); every valid answer is compared with the same request answered alone first")
    if not write:
        return run_.document(summary)
    return run_.write(summary=summary, out_dir=out_dir)
