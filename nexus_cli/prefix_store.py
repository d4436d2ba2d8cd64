"""KV states of decoded prompt prefixes on disk, so that a one-shot process reuses what an earlier one decoded.

Two users: the likelihood reranker keeps each candidate's prefix (`routing/rerank.LikelihoodReranker`), and argument
generation keeps each tool's prompt prefix, the system prompt and the tool's signature block
(`arguments/pipeline.ArgumentPrefixes`, in the `arguments/` subdirectory, with its own cap).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .files import atomic_write_bytes


class PrefixStore:
    """Decoded prompt prefixes on disk, so that a one-shot `nexus route` reuses what an earlier process decoded (an
    in-memory cache lives only as long as one process).

    One file per prefix, `<key>.npz` (the llama.cpp sequence state, the next-token log-probabilities as float16, empty
    where the user needs none, the prefix's length in tokens), written atomically. The key is a SHA-256 over
    everything the state depends on: the GGUF's sha256, llama-cpp-python's version, the V-cache layout (flash
    attention or not) and the prefix's text (the arguments stage passes its token ids), so a stale entry is never
    found, only left to age out. A file that does not load, or a state llama.cpp refuses, counts as a miss and is
    removed. The directory is capped at `max_bytes`; the oldest files (by modification time) go first.
    Nothing here is required: a store that cannot be written (read-only disk, full disk) just stops saving."""

    DEFAULT_MAX_BYTES = 256 * 1024 * 1024  # ~340 reranker prefixes of Qwen2.5-0.5B (~0.45 MB of KV + 0.3 MB of
    #                                        log-probs), ~100-160 argument prefixes (1.6-2.5 MB)

    def __init__(self, path: str | Path, max_bytes: int = DEFAULT_MAX_BYTES):
        self.path = Path(path).expanduser()
        self.max_bytes = int(max_bytes)
        self.hits = self.misses = self.writes = 0
        self._writable = True

    @classmethod
    def default(cls, subdir: str = "", max_bytes: int = DEFAULT_MAX_BYTES) -> "PrefixStore | None":
        """$NEXUS_PREFIX_CACHE (a directory; "off" disables), else ~/.cache/nexus/prefix-states; `subdir` below it
        (each directory has its own cap: the eviction looks at one directory's files only)."""
        import os

        env = os.environ.get("NEXUS_PREFIX_CACHE", "")
        if env.strip().lower() in ("off", "0", "none", "false"):
            return None
        root = Path(env) if env.strip() else Path.home() / ".cache" / "nexus" / "prefix-states"
        return cls(root / subdir if subdir else root, max_bytes=max_bytes)

    @staticmethod
    def key(ctx, text: str) -> str:
        import hashlib

        try:
            from llama_cpp import __version__ as llama_version
        except ImportError:  # pragma: no cover - the adapter could not have loaded either
            llama_version = "?"
        ident = ctx.model.identity
        parts = [ident.sha256, llama_version, f"v_layout={ctx.v_layout}", text]
        return hashlib.sha256("\x00".join(parts).encode("utf-8")).hexdigest()

    def get(self, key: str) -> tuple[bytes, np.ndarray, int] | None:
        f = self.path / f"{key}.npz"
        try:
            with np.load(f, allow_pickle=False) as z:
                blob, first, n = z["state"], z["first"], int(z["n"])
            if blob.dtype != np.uint8 or blob.size == 0 or first.dtype != np.float16 or first.ndim != 1 or n <= 0:
                raise ValueError("unexpected contents")
        except FileNotFoundError:
            self.misses += 1
            return None
        except Exception:  # noqa: BLE001 - a damaged entry is a miss, and is removed
            self.discard(key)
            self.misses += 1
            return None
        self.hits += 1
        return blob.tobytes(), first, n

    def put(self, key: str, value: tuple[bytes, np.ndarray, int]) -> None:
        if not self._writable:
            return
        import io

        blob, first, n = value
        buf = io.BytesIO()
        np.savez(buf, state=np.frombuffer(blob, dtype=np.uint8), first=first.astype(np.float16), n=np.int64(n))
        try:
            atomic_write_bytes(self.path / f"{key}.npz", buf.getvalue())
            self.writes += 1
            self._evict()
        except OSError:
            self._writable = False  # read-only or full: keep routing, stop trying

    def discard(self, key: str) -> None:
        try:
            (self.path / f"{key}.npz").unlink(missing_ok=True)
        except OSError:
            pass

    def _evict(self) -> None:
        files = []
        for f in self.path.glob("*.npz"):
            try:
                st = f.stat()
            except OSError:
                continue
            files.append((st.st_mtime, st.st_size, f))
        total = sum(s for _, s, _ in files)
        for _, size, f in sorted(files, key=lambda x: x[0]):
            if total <= self.max_bytes:
                break
            try:
                f.unlink()
                total -= size
            except OSError:
                pass
