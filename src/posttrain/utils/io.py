"""Atomic file writes and JSON/JSONL helpers.

Every file that a crash could leave half-written (checkpoints, results, summaries) goes through
`atomic_write_*`: write to a temporary file in the same directory, fsync, then `os.replace`, so a
reader sees either the old complete file or the new complete file, never a torn one.

Temporary files and directories (``tempfile.mkstemp`` / ``mkdtemp``) are created private (0600 / 0700);
before they are renamed into place they get the permissions an ordinary ``open()`` / ``mkdir`` would
have given (0666 / 0777 minus the process umask), so a teammate or a serving process under another
user can read the results when the umask allows it.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from posttrain.utils.errors import InvalidTypeError, InvalidValueError


def current_umask() -> int:
    """The process umask (read from /proc on Linux, else by the set-and-restore idiom)."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_file_mode() -> int:
    """Mode of a file created by ``open(path, "w")``: 0666 minus the umask."""
    return 0o666 & ~current_umask()


def default_dir_mode() -> int:
    """Mode of a directory created by ``mkdir``: 0777 minus the umask."""
    return 0o777 & ~current_umask()


def make_public_dir(path: str | os.PathLike) -> None:
    """Give a ``tempfile.mkdtemp`` directory (created 0700) the mode ``mkdir`` would have given it."""
    os.chmod(path, default_dir_mode())


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, default_file_mode())
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def atomic_write_text(path: str | os.PathLike, text: str) -> Path:
    return atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any, *, indent: int | None = 2) -> Path:
    return atomic_write_text(
        path, json.dumps(obj, indent=indent, sort_keys=False, default=_json_default) + "\n"
    )


def _json_default(obj: Any) -> Any:
    # numpy / torch scalars and paths show up in metrics; make them plain JSON values.
    if hasattr(obj, "item") and callable(obj.item):
        return obj.item()
    if hasattr(obj, "tolist") and callable(obj.tolist):
        return obj.tolist()
    if isinstance(obj, os.PathLike):
        return os.fspath(obj)
    if isinstance(obj, set | frozenset):
        return sorted(obj)
    raise InvalidTypeError(f"object of type {type(obj).__name__} is not JSON serializable")


def append_jsonl(path: str | os.PathLike, row: dict[str, Any]) -> None:
    """Append one JSON row and flush it to disk (a killed process loses at most a partial last line).
    A write that fails (disk full) takes back what it wrote of the row, so the file keeps whole rows
    only, and raises the OSError."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    data = (json.dumps(row, default=_json_default) + "\n").encode("utf-8")
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)
    try:
        start = os.fstat(fd).st_size
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except BaseException:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, start)
            raise
    finally:
        os.close(fd)


def read_jsonl(path: str | os.PathLike, *, skip_torn_tail: bool = True) -> Iterator[dict[str, Any]]:
    """Read JSONL rows. A torn last line (from a killed writer) is skipped when `skip_torn_tail`;
    a malformed line anywhere else raises a ValueError naming the file and line number."""
    path = Path(path)
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    for i, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            yield json.loads(line)
        except json.JSONDecodeError as e:
            if skip_torn_tail and i == len(lines) and not line.endswith("\n"):
                return
            raise InvalidValueError(f"{path}: line {i}: invalid JSON ({e.msg})") from e
