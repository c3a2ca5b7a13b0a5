"""Folders a killed runner's rollouts leave are removed by the next local executor, and
nothing else is: not a live process's, not a kept one, not another user's, not what a link
points to (`openforge.sandbox.leftovers`)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from openforge.executors.local import LocalExecutor
from openforge.sandbox.leftovers import KEPT, left_behind, make_folder, maker_tag, sweep_folders

MAKE_AND_EXIT = """
import sys
import time
from openforge.sandbox.leftovers import make_folder
print(make_folder("gone", sys.argv[1]))
"""


def made_by_a_process_that_is_gone(parent: Path) -> Path:
    """A folder `make_folder` made in another process, which then exited without removing
    it (as a runner killed with SIGKILL would)."""
    out = subprocess.run([sys.executable, "-c", MAKE_AND_EXIT, str(parent)], check=True,
                         capture_output=True, text=True).stdout
    folder = Path(out.strip())
    (folder / "agent" / "workspace").mkdir(parents=True)
    (folder / "agent" / "workspace" / "notes.txt").write_text("left behind")
    return folder


def test_only_folders_whose_maker_is_gone_are_removed(tmp_path: Path) -> None:
    gone = made_by_a_process_that_is_gone(tmp_path)
    namespace, pid, start = maker_tag(os.getpid()).split(".")
    # This process's pid with another start time: a process gone, its pid reused since.
    reused = tmp_path / f"openforge-{namespace}.{pid}.{int(start) + 1}-reused-0"
    reused.mkdir()
    live = make_folder("live", tmp_path)  # this process lives
    kept = made_by_a_process_that_is_gone(tmp_path)
    (kept / KEPT).touch()
    # Made in another PID namespace: its maker cannot be checked from here.
    elsewhere = tmp_path / f"openforge-{int(namespace) + 1}.1.1-elsewhere-0"
    elsewhere.mkdir()
    unrelated = tmp_path / "openforge-notes"
    unrelated.mkdir()

    removed = sweep_folders([tmp_path, tmp_path / "missing"])

    assert sorted(removed) == sorted([gone, reused])
    assert not gone.exists() and not reused.exists()
    assert all(p.is_dir() for p in (live, kept, elsewhere, unrelated))
    assert left_behind(gone.name) and not left_behind(live.name)


def test_a_link_named_like_a_leftover_is_not_followed(tmp_path: Path) -> None:
    # Something named like a killed runner's folder that links to a folder worth keeping:
    # the sweep removes neither the link's target nor anything in it.
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    swept = tmp_path / "swept"
    swept.mkdir()
    gone = made_by_a_process_that_is_gone(swept)
    link = gone.with_name(gone.name + "-link")
    link.symlink_to(precious, target_is_directory=True)

    removed = sweep_folders([swept])

    assert removed == [gone]
    assert (precious / "thesis.tex").read_text() == "years of work"
    assert link.is_symlink()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a folder to another user takes root")
def test_another_users_folder_is_left_alone(tmp_path: Path) -> None:
    theirs = made_by_a_process_that_is_gone(tmp_path)
    os.chown(theirs, 65534, 65534)
    assert sweep_folders([tmp_path]) == []
    assert theirs.is_dir()


def test_a_new_local_executor_sweeps_its_folders_and_says_so(tmp_path: Path) -> None:
    base = tmp_path / "sandboxes"
    base.mkdir()
    gone = made_by_a_process_that_is_gone(base)

    executor = LocalExecutor(sandbox="none", base_dir=base, max_processes=None,
                             memory_max=None)

    # (It sweeps the temporary folder too: other runs' leftovers may be among those removed.)
    assert gone in executor.swept_folders and not gone.exists()
    n = len(executor.swept_folders)
    assert executor.describe_sandbox().endswith(
        f"; removed {n} folder{'' if n == 1 else 's'} that killed runners' rollouts had left.")
    assert "had left" not in LocalExecutor(sandbox="none", base_dir=base, max_processes=None,
                                           memory_max=None).describe_sandbox()


def test_a_folder_whose_maker_is_a_zombie_is_removed(tmp_path: Path) -> None:
    # A process that has exited but whose parent has not read its status yet (a killed
    # runner's supervisor, reparented) still has its pid and start time: it holds nothing.
    child = subprocess.Popen([sys.executable, "-c", MAKE_AND_EXIT, str(tmp_path)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    folder = Path(child.stdout.readline().strip())
    deadline = time.monotonic() + 60  # a hang guard, not a bound under test
    while psutil.Process(child.pid).status() != psutil.STATUS_ZOMBIE:
        assert time.monotonic() < deadline, "the child did not exit"
        time.sleep(0.01)

    assert sweep_folders([tmp_path]) == [folder]
    child.wait()


def test_links_inside_a_leftover_go_with_it_and_their_targets_stay(tmp_path: Path) -> None:
    # An agent without isolation (sandbox none) can plant links in a folder it makes, named
    # like a killed runner's, to the user's files: the sweep removes the links only.
    precious = tmp_path / "home"
    (precious / "project").mkdir(parents=True)
    (precious / "project" / "main.py").write_text("print('mine')")
    (precious / "notes.txt").write_text("mine")
    swept = tmp_path / "swept"
    swept.mkdir()
    gone = made_by_a_process_that_is_gone(swept)
    (gone / "to-a-file").symlink_to(precious / "notes.txt")
    (gone / "agent" / "to-a-folder").symlink_to(precious / "project", target_is_directory=True)

    assert sweep_folders([swept]) == [gone]

    assert not os.path.lexists(gone)
    assert (precious / "notes.txt").read_text() == "mine"
    assert (precious / "project" / "main.py").read_text() == "print('mine')"
