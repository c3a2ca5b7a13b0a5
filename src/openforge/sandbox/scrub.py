"""What the agent left in its folder, made safe for the trusted side to read.

The supervisor's plugin code (the harness's `parse_output`, the environment's `final_state`,
the reward) reads the agent's folder after the agent ended, as the run's user and outside
the sandbox. A symbolic link the agent left there would be followed on the trusted side: a
link `answer.txt -> /path/of/the/grader's/expected/answer` (a path the sandbox never
showed it) would make a checker compare the answer with itself, and a link to a host file
would carry that file into the result. A FIFO would hang whoever opens it.

`scrub` removes, before any of that code runs, every symbolic link whose target resolves
outside what the agent could see anyway (its own folder and the read-only view), and every
FIFO, socket or device node; it returns what it removed (reported in the result:
`harness_output.removed_files`, and counted by `tally` in the reward's details, which also
reach a Pod's compact result). A removed link is not a violation: harnesses and tools leave
benign links too (a virtualenv's interpreter, a `node_modules/.bin` entry). `scrub_agent`
does it for all the agent could write: its folder and, where that is a folder of its own (a
Pod's workspace volume), its workspace.
"""

from __future__ import annotations

import os
import shutil
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from openforge.sandbox.view import View

# What `scrub` says of each thing it removed, and the names `tally` counts them under.
_LINK = "(a link out of the sandbox's view)"
LINKS, SPECIAL_FILES = "scrubbed_links", "scrubbed_special_files"


def _inside(path: str, roots: list[str]) -> bool:
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def scrub(folder: Path, visible: Iterable[str], masked: Iterable[str] = ()) -> list[str]:
    """Remove links out of `visible` (or into `masked`) and special files under `folder`;
    what was removed."""
    roots = [os.path.realpath(p) for p in (*visible, str(folder))]
    hidden = [os.path.realpath(p) for p in masked]
    removed: list[str] = []
    for parent, dirs, files in os.walk(folder, followlinks=False):
        for name in [*dirs, *files]:
            path = os.path.join(parent, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if stat.S_ISLNK(mode):
                target = os.path.realpath(path)
                if _inside(target, roots) and not _inside(target, hidden):
                    continue
                why = f"{path} -> {os.readlink(path)} {_LINK}"
            elif stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                continue
            else:
                why = f"{path} (a {'FIFO' if stat.S_ISFIFO(mode) else 'special file'})"
            try:
                os.unlink(path)
                removed.append(why)
            except OSError:
                continue
    return removed


def scrub_agent(agent_dir: Path, view: View) -> list[str]:
    """`scrub` of all the agent could write: its folder, and its workspace (the view's `cwd`)
    when that is a folder of its own (a Pod's workspace volume, beside the agent's)."""
    folders = [os.path.realpath(agent_dir)]
    workspace = os.path.realpath(view.cwd)
    if not _inside(workspace, folders):
        folders.append(workspace)
    visible = [*view.sources(), *folders]
    masked = [*view.masks, *view.hidden]
    return [why for folder in folders for why in scrub(Path(folder), visible, masked)]


def tally(removed: list[str]) -> dict[str, int]:
    """How many links and special files `removed` (what `scrub` returned) names; only the
    kinds it has any of."""
    links = sum(1 for why in removed if why.endswith(_LINK))
    counts = {LINKS: links, SPECIAL_FILES: len(removed) - links}
    return {name: n for name, n in counts.items() if n}


def fresh_path(workspace: Path, relpath: str | Path) -> Path:
    """`workspace/relpath` with nothing there yet, under real folders of the workspace.

    What the trusted side writes into the workspace after the agent (a grader's files, the
    screenshots a judge sees, a judge log, a benchmark's result folder) must land there and
    hold only its own content. Whatever the agent left at the path or in its way goes first:
    a link (else the write follows it out of the workspace, onto any file the host can
    write), a file or folder where a folder must be (else the write fails and a scored
    attempt becomes an environment error), files of its own in the folder (else they pass
    for the trusted side's).
    """
    path = workspace
    parts = Path(relpath).parts
    for part in parts[:-1]:
        path = path / part
        if path.is_symlink() or (path.exists() and not path.is_dir()):
            path.unlink()
        path.mkdir(exist_ok=True)
    target = path / parts[-1]
    if target.is_dir() and not target.is_symlink():
        shutil.rmtree(target)
    elif target.exists() or target.is_symlink():
        target.unlink()
    return target
