"""The stdio transport of `nexus serve`: newline-delimited JSON-RPC frames between the client and the MCP SDK's server,
hardened against clients that misbehave.

The SDK's own stdio transport reads a line of any size into memory and drops a frame it cannot parse without a word.
This one answers every bad frame and bounds what one frame can cost:

* a frame over `MAX_FRAME_BYTES` is discarded while it streams in (never buffered whole) and answered with JSON-RPC
  error -32600, carrying the frame's `id` when its first bytes name one;
* a frame that is not JSON (or not UTF-8) is answered with -32700 (parse error, id null);
* JSON that is not a JSON-RPC 2.0 message (a batch array, a missing method, a bad id) is answered with -32600;
* everything else goes to the SDK's server, which answers unknown methods (-32601) and bad parameters itself.

Shutdown is orderly. On SIGTERM or SIGINT, or when the client closes stdin, no new frame is taken, the requests already
in flight are finished and answered (for at most `DRAIN_SECONDS`), and then the server's streams close so
`serve_stdio` returns and the process exits 0. While serving, fd 0 reads the null device and fd 1 writes to stderr, so
stray prints of a library can never corrupt the wire (the SDK transport does the same).
"""

from __future__ import annotations

import json
import os
import re
import signal
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

MAX_FRAME_BYTES = 1 << 20  # a route_request holds at most ~100 KB of text (server.MAX_*); 1 MiB leaves room for framing
READ_CHUNK = 1 << 16
DRAIN_SECONDS = 30.0  # how long a shutdown waits for requests in flight

PARSE_ERROR = -32700
INVALID_REQUEST = -32600

_ID_PREFIX = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"(?:[^"\\]|\\.){0,128}")')


@dataclass
class Oversize:
    """A frame that was cut off and discarded at the size limit: its length and its first bytes."""
    n_bytes: int
    head: bytes


def split_frames(chunks: Iterator[bytes], limit: int = MAX_FRAME_BYTES) -> Iterator[bytes | Oversize]:
    """Newline-delimited frames from a byte stream: each complete frame (without its newline), or an `Oversize` for a
    frame longer than `limit`, whose bytes are dropped as they arrive. A last frame without a newline is yielded at
    the end of the stream."""
    buf = bytearray()
    skipping: Oversize | None = None
    for chunk in chunks:
        start = 0
        while start < len(chunk):
            nl = chunk.find(b"\n", start)
            end = nl if nl >= 0 else len(chunk)
            piece = chunk[start:end]
            if skipping is not None:
                skipping.n_bytes += len(piece)
            else:
                buf += piece
                if len(buf) > limit:
                    skipping = Oversize(n_bytes=len(buf), head=bytes(buf[:256]))
                    buf = bytearray()
            if nl < 0:
                break
            if skipping is not None:
                yield skipping
                skipping = None
            else:
                yield bytes(buf)
                buf = bytearray()
            start = nl + 1
    if skipping is not None:
        yield skipping
    elif buf:
        yield bytes(buf)


def _id_from_head(head: bytes) -> int | str | None:
    m = _ID_PREFIX.search(head)
    if not m:
        return None
    try:
        return json.loads(m.group(1))
    except ValueError:
        return None


def _error(id_: Any, code: int, message: str) -> dict:
    return {"jsonrpc": "2.0", "id": id_ if isinstance(id_, (int, str)) and not isinstance(id_, bool) else None,
            "error": {"code": code, "message": message}}


def classify_frame(frame: bytes | Oversize, limit: int = MAX_FRAME_BYTES):
    """(message, None) for a frame the server should see (a validated JSON-RPC message), (None, error) for one this
    transport answers itself, (None, None) for a blank line."""
    import mcp_types as types

    if isinstance(frame, Oversize):
        return None, _error(_id_from_head(frame.head), INVALID_REQUEST,
                            f"Invalid Request: frame of {frame.n_bytes} bytes is over the {limit}-byte limit")
    if not frame.strip():
        return None, None
    try:
        obj = json.loads(frame.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        return None, _error(None, PARSE_ERROR, f"Parse error: {str(e).splitlines()[0][:200]}")
    if not isinstance(obj, dict):
        what = "a batch (array)" if isinstance(obj, list) else f"a JSON {type(obj).__name__}"
        return None, _error(None, INVALID_REQUEST, f"Invalid Request: the frame is {what}, not a JSON-RPC object")
    try:
        return types.jsonrpc_message_adapter.validate_python(obj, by_name=False), None
    except Exception as e:  # noqa: BLE001 - pydantic's ValidationError: name the first field it rejects
        errors = getattr(e, "errors", lambda: [])()
        why = (f"{'.'.join(str(x) for x in errors[0].get('loc', ())[1:]) or 'message'}: {errors[0].get('msg', '')}"
               if errors else type(e).__name__)
        return None, _error(obj.get("id"), INVALID_REQUEST, f"Invalid Request: {why[:200]}")


@dataclass
class Wire:
    """The client's byte streams, as private descriptors."""
    read_fd: int
    write_fd: int
    restore: list = field(default_factory=list)


@contextmanager
def claim_stdio() -> Iterator[Wire]:
    """Private duplicates of fd 0 and fd 1 for the wire; fd 0 then reads /dev/null and fd 1 writes to stderr until
    the block ends, so nothing else in the process can read the client's frames or write into the answers."""
    read_fd, write_fd = os.dup(0), os.dup(1)
    saved_in, saved_out = os.dup(0), os.dup(1)
    null = os.open(os.devnull, os.O_RDONLY)
    try:
        os.dup2(null, 0)
        os.dup2(2, 1)
    finally:
        os.close(null)
    try:
        yield Wire(read_fd, write_fd)
    finally:
        try:
            sys.stdout.flush()
        except (OSError, ValueError):
            pass
        os.dup2(saved_in, 0)
        os.dup2(saved_out, 1)
        for fd in (saved_in, saved_out, read_fd, write_fd):
            try:
                os.close(fd)
            except OSError:
                pass


class Transport:
    """Frames in, frames out, and the bookkeeping an orderly shutdown needs (the requests in flight)."""

    def __init__(self, wire: Wire, limit: int = MAX_FRAME_BYTES):
        self.wire = wire
        self.limit = limit
        self.in_flight: set = set()
        self.stats = {"frames": 0, "requests": 0, "answered": 0, "errors_sent": 0, "cancelled": 0}
        self.stopping = None  # anyio.Event, set when no new frame may be taken
        self.reason = "end of input"
        self._lock = threading.Lock()
        self._write_broken = False

    # -- the wire
    def _chunks(self) -> Iterator[bytes]:
        while True:
            try:
                data = os.read(self.wire.read_fd, READ_CHUNK)
            except InterruptedError:
                continue
            except OSError:
                return
            if not data:
                return
            yield data

    def write_frame(self, obj: Any) -> None:
        """One JSON line to the client (called from a worker thread; a closed pipe just drops it)."""
        data = (obj if isinstance(obj, str) else json.dumps(obj, ensure_ascii=False)).encode("utf-8") + b"\n"
        with self._lock:
            if self._write_broken:
                return
            view = memoryview(data)
            try:
                while view:
                    n = os.write(self.wire.write_fd, view)
                    view = view[n:]
            except OSError:  # the client went away: nothing more can reach it
                self._write_broken = True

    # -- tasks
    async def reader(self, send, token) -> None:
        """Feed the server: a daemon thread reads the wire (a blocked read never holds up the exit), each frame is
        checked here and either forwarded or answered."""
        import anyio
        from mcp.shared.message import SessionMessage
        import mcp_types as types

        frames_send, frames_recv = anyio.create_memory_object_stream(16)

        def pump() -> None:
            try:
                for frame in split_frames(self._chunks(), self.limit):
                    anyio.from_thread.run(frames_send.send, frame, token=token)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, RuntimeError):
                return  # the loop is gone or stopped listening
            finally:
                try:
                    anyio.from_thread.run_sync(frames_send.close, token=token)
                except RuntimeError:
                    pass

        threading.Thread(target=pump, name="nexus-stdin", daemon=True).start()
        async with frames_recv:
            while not self.stopping.is_set():
                frame = await _next_or_stop(frames_recv, self.stopping)
                if frame is None:
                    break
                self.stats["frames"] += 1
                message, error = classify_frame(frame, self.limit)
                if error is not None:
                    self.stats["errors_sent"] += 1
                    await anyio.to_thread.run_sync(self.write_frame, error)
                    continue
                if message is None:
                    continue
                if isinstance(message, types.JSONRPCRequest):
                    self.stats["requests"] += 1
                    self.in_flight.add(_key(message.id))
                elif isinstance(message, types.JSONRPCNotification) and message.method == "notifications/cancelled":
                    rid = (message.params or {}).get("requestId")
                    if rid is not None and _key(rid) in self.in_flight:
                        self.in_flight.discard(_key(rid))  # a cancelled request is never answered (MCP)
                        self.stats["cancelled"] += 1
                await send.send(SessionMessage(message))
        if not self.stopping.is_set():
            self.stopping.set()

    async def writer(self, receive) -> None:
        import anyio
        import mcp_types as types

        async with receive:
            async for session_message in receive:
                msg = session_message.message
                text = msg.model_dump_json(by_alias=True, exclude_unset=True)
                await anyio.to_thread.run_sync(self.write_frame, text)
                if isinstance(msg, (types.JSONRPCResponse, types.JSONRPCError)) and msg.id is not None:
                    if _key(msg.id) in self.in_flight:
                        self.in_flight.discard(_key(msg.id))
                        self.stats["answered"] += 1


def _key(id_: Any) -> str:
    return str(id_)


async def _next_or_stop(stream, stopping):
    """The next frame, or None once the stream ends or `stopping` is set."""
    import anyio

    result: list = []
    async with anyio.create_task_group() as tg:
        async def take() -> None:
            try:
                result.append(await stream.receive())
            except anyio.EndOfStream:
                pass
            tg.cancel_scope.cancel()

        async def watch() -> None:
            await stopping.wait()
            tg.cancel_scope.cancel()

        tg.start_soon(take)
        tg.start_soon(watch)
    return result[0] if result else None


def serve(server, init_options, limit: int = MAX_FRAME_BYTES, drain_seconds: float = DRAIN_SECONDS,
          log=None) -> dict:
    """Run the SDK `server` over this process's stdin/stdout until the client closes stdin or a SIGTERM/SIGINT
    arrives; returns the transport's counters. `log(line)` gets the shutdown line."""
    import anyio
    from mcp.shared._context_streams import create_context_streams
    from mcp.shared.message import SessionMessage

    stats: dict = {}

    async def main() -> None:
        with claim_stdio() as wire:
            transport = Transport(wire, limit)
            transport.stopping = anyio.Event()
            to_server_send, to_server_recv = create_context_streams[SessionMessage | Exception](0)
            from_server_send, from_server_recv = create_context_streams[SessionMessage](0)
            token = anyio.lowlevel.current_token()

            async def run_server() -> None:
                await server.run(to_server_recv, from_server_send, init_options)

            async def on_signals() -> None:
                with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
                    async for signum in signals:
                        transport.reason = signal.Signals(signum).name
                        transport.stopping.set()
                        return

            async def feed_then_drain() -> None:
                async with to_server_send:
                    await transport.reader(to_server_send, token)
                    # no new frames: let the requests in flight finish and be written, then close the server's input
                    with anyio.move_on_after(drain_seconds):
                        while transport.in_flight:
                            await anyio.sleep(0.02)
                stats["unfinished"] = len(transport.in_flight)

            async with anyio.create_task_group() as tg:
                tg.start_soon(on_signals)
                tg.start_soon(transport.writer, from_server_recv)

                async def lifecycle() -> None:
                    async with anyio.create_task_group() as inner:
                        inner.start_soon(run_server)
                        await feed_then_drain()
                    tg.cancel_scope.cancel()  # the server has returned: stop the signal watcher and the writer

                tg.start_soon(lifecycle)
            stats.update(transport.stats, reason=transport.reason)

    anyio.run(main)
    if log is not None:
        def n(key: str, word: str) -> str:
            v = stats.get(key, 0)
            return f"{v} {word}" if v == 1 else f"{v} {word}s"
        log(f"nexus serve: stopped ({stats.get('reason')}); {n('requests', 'request')}, {stats.get('answered', 0)} "
            f"answered, {n('errors_sent', 'bad frame')} answered with an error, {stats.get('cancelled', 0)} cancelled "
            f"by the client, {stats.get('unfinished', 0)} unfinished")
    return stats
