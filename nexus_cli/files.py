"""File helpers every package shares: atomic writes, sha256 digests and whether a writer process is still alive.

A write never leaves a half-written file under its final name: the bytes go to a hidden temporary file in the same
folder, are flushed and fsynced, and the file is renamed into place (a rename within one folder is atomic).
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any

CHUNK = 1 << 22


def atomic_write_bytes(path: str | os.PathLike, data: bytes, mode: int = 0o644) -> Path:
    """Write `data` to `path` atomically (temporary file + fsync + rename); the folder is created if missing."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # `.NAME.<random>.<pid>.tmp`: a cleaner can tell a dead writer's leftover from a live one's (pid_alive)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=f".{os.getpid()}.tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def _plain(obj: Any) -> Any:
    """NumPy scalars and arrays as Python numbers and lists (json's fallback)."""
    if hasattr(obj, "tolist"):
        return obj.tolist()
    raise TypeError(f"{type(obj).__name__} is not JSON serializable")


def atomic_write_json(path: str | os.PathLike, obj: Any, compact: bool = False) -> Path:
    """JSON (UTF-8, no NaN) written atomically; `compact` drops the indentation (large machine-read files)."""
    if compact:
        text = json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_plain)
    else:
        text = json.dumps(obj, ensure_ascii=False, indent=1, allow_nan=False, default=_plain) + "\n"
    return atomic_write_text(path, text)


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def pid_alive(pid: int) -> bool:
    """Whether process `pid` exists (this process counts): a temporary file or folder whose writer is alive is not
    a leftover."""
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True
