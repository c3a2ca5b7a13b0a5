"""Did the agent change the task's data? A digest of `Environment.data_paths`, before and after.

In the isolating modes the data is mapped read-only and cannot change; without isolation
(sandbox none) the agent can write it, so the supervisor takes this digest before the agent
starts and compares it before scoring: a change is a `violation`, never a pass.
Contents are hashed, not modification times (which an agent can set back).
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path


def _file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def digest(paths: Iterable[Path | str]) -> dict[str, str]:
    """Every file, link and directory under `paths` -> what it holds (a link: its target)."""
    out: dict[str, str] = {}

    def one(path: str) -> None:
        try:
            st = os.lstat(path)
        except OSError:
            out[path] = "missing"
            return
        if stat.S_ISLNK(st.st_mode):
            out[path] = "link:" + os.readlink(path)
        elif stat.S_ISDIR(st.st_mode):
            out[path] = f"dir:{stat.S_IMODE(st.st_mode):o}"
            for name in sorted(os.listdir(path)):
                one(os.path.join(path, name))
        elif stat.S_ISREG(st.st_mode):
            try:
                out[path] = f"file:{stat.S_IMODE(st.st_mode):o}:" + _file_digest(path)
            except OSError:
                out[path] = "unreadable"
        else:
            out[path] = f"special:{stat.S_IFMT(st.st_mode)}"

    for path in paths:
        one(os.path.abspath(path))
    return out


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """The paths whose digest differs (added, removed or changed), sorted."""
    return sorted(p for p in before.keys() | after.keys() if before.get(p) != after.get(p))
