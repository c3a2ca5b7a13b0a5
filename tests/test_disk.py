"""`openforge.sandbox.disk`: what a rollout's folder takes, and the watch past its limits.

Measured by the real `du` on real files; the executor's use of it (a rollout ended at its
limit and scored 0) is in `test_adversarial.py::test_an_agent_that_fills_the_disk_...`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from openforge.executors.local import LocalExecutor, LocalExecutorError
from openforge.sandbox import disk

pytestmark = pytest.mark.skipif(disk.unavailable() is not None, reason=f"{disk.unavailable()}")

MIB = 2**20


def test_usage_counts_blocks_on_disk_and_names_once(tmp_path: Path) -> None:
    (tmp_path / "data.bin").write_bytes(b"\1" * (3 * MIB))
    with open(tmp_path / "sparse.bin", "wb") as f:  # 1 GiB long, nothing written: no blocks
        f.truncate(2**30)
    os.link(tmp_path / "data.bin", tmp_path / "again.bin")  # the same blocks under two names
    outside = tmp_path.parent / f"{tmp_path.name}-outside.bin"
    outside.write_bytes(b"\1" * (5 * MIB))
    (tmp_path / "link").symlink_to(outside)  # not followed
    try:
        used = asyncio.run(disk.usage(tmp_path))
    finally:
        outside.unlink()
    assert 3 * MIB <= used.bytes < 4 * MIB
    # The folder itself, data.bin (twice named, once counted), sparse.bin, link.
    assert used.files == 4


def test_a_folder_du_cannot_read_cannot_be_measured(tmp_path: Path) -> None:
    with pytest.raises(disk.Unmeasurable, match="No such file or directory"):
        asyncio.run(disk.usage(tmp_path / "missing"))


def test_over_names_the_limit_passed() -> None:
    used = disk.Usage(bytes=20 * MIB, files=12_000)
    assert disk.over(used, 16 * MIB, None) == "20.0 MiB on disk, past its limit of 16.0 MiB"
    assert disk.over(used, None, 10_000) == "12,000 files, past its limit of 10,000"
    assert disk.over(used, 32 * MIB, 20_000) is None
    assert disk.over(used, None, None) is None


def watch_with(monkeypatch: pytest.MonkeyPatch, folder: Path,
               before_check: Callable[[int], Path]) -> tuple[str, int]:
    """`disk.watch(folder)` (1 MiB, every 10 ms) where check n measures `before_check(n)`
    (the real `du`); what it returned and how many checks it took."""
    checks = 0
    real = disk.usage

    async def usage(_: Path) -> disk.Usage:
        nonlocal checks
        checks += 1
        return await real(before_check(checks))

    monkeypatch.setattr(disk, "usage", usage)
    found = asyncio.run(asyncio.wait_for(disk.watch(folder, MIB, None, 0.01), 30))
    return found, checks


def test_the_watch_returns_once_the_folder_is_past_its_limit(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def grow(check: int) -> Path:
        if check == 3:  # within the limit twice, then past it
            (tmp_path / "big.bin").write_bytes(b"\1" * (2 * MIB))
        return tmp_path

    found, checks = watch_with(monkeypatch, tmp_path, grow)
    assert checks == 3
    assert found == "its folder took 2.0 MiB on disk, past its limit of 1.0 MiB"


def test_the_watch_gives_up_on_a_folder_only_unmeasurable_three_times_in_a_row(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Unreadable twice, readable (a permission test's moment is over), then for good.
    missing = tmp_path / "missing"
    found, checks = watch_with(monkeypatch, tmp_path,
                               lambda check: tmp_path if check == 3 else missing)
    assert checks == 6
    assert found == ("its folder could not be measured 3 times in a row (du: cannot access "
                     f"'{missing}': No such file or directory)")


def test_a_watch_cancelled_with_its_rollout_leaves_no_du_behind(tmp_path: Path) -> None:
    async def cancel_soon() -> None:
        task = asyncio.ensure_future(disk.watch(tmp_path, MIB, None, 0.01))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(cancel_soon())
    deadline = time.monotonic() + 5
    while any(_du_on(tmp_path)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert list(_du_on(tmp_path)) == []


def _du_on(folder: Path) -> list[int]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmdline[:1] == [b"du"] and str(folder).encode() in cmdline:
            found.append(int(pid))
    return found


def test_the_header_says_the_disk_limits(tmp_path: Path) -> None:
    header = LocalExecutor(sandbox="none", base_dir=str(tmp_path)).describe_sandbox()
    assert "at most 10 GiB and 1,000,000 files on disk per rollout (measured every 2 s)" \
        in header
    header = LocalExecutor(sandbox="none", base_dir=str(tmp_path), disk_max="512MiB",
                           files_max=None, disk_check_s=0.5).describe_sandbox()
    assert "at most 512 MiB on disk per rollout (measured every 0.5 s)" in header
    header = LocalExecutor(sandbox="none", base_dir=str(tmp_path), disk_max=None,
                           files_max=None).describe_sandbox()
    assert "on disk" not in header


def test_without_du_the_default_limits_are_left_out_and_explicit_ones_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no du here
    header = LocalExecutor(sandbox="none", base_dir=str(tmp_path)).describe_sandbox()
    assert "no disk limit per rollout (no du (coreutils) on PATH)" in header
    with pytest.raises(LocalExecutorError, match="executor option disk_max: no du"):
        LocalExecutor(sandbox="none", base_dir=str(tmp_path), disk_max="1GiB")


def test_watches_cancelled_at_any_moment_reap_their_own_du_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # A rollout ends at any moment of its watch's du: as it starts, while it walks, just
    # after it ended. Each du is then killed by its own pid and reaped once, by the watch:
    # asyncio's subprocess reaped it in a thread of its own as well and logged "Unknown
    # child process" when it lost that race (CPython #103847).
    (tmp_path / "file").write_bytes(b"\1" * 4096)
    delays = [i * 0.0005 for i in range(60)]

    async def cancel_after(delay: float) -> None:
        task = asyncio.ensure_future(disk.usage(tmp_path))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def all_of_them() -> None:
        for delay in delays:
            await cancel_after(delay)

    with caplog.at_level(logging.DEBUG, logger="asyncio"):
        asyncio.run(all_of_them())
    assert [r.getMessage() for r in caplog.records if "child" in r.getMessage()] == []
    assert _du_on(tmp_path) == []
    assert [p.pid for p in psutil.Process().children() if p.name() == "du"] == []


_DEEP = "du: {} '" + "d/" * 50_000


@pytest.mark.parametrize(("said", "found"), [
    # Files removed while du walked are not counted: not a problem, but what it said.
    ([b"du: cannot access 'a/tmp1': No such file or directory"] * 3,
     (None, "du: cannot access 'a/tmp1': No such file or directory")),
    # One entry it could not read, after any number of removed ones, is.
    ([b"du: cannot access 'a/tmp1': No such file or directory"] * 20_000
     + [b"du: cannot read directory 'a/locked': Permission denied"],
     ("du: cannot read directory 'a/locked': Permission denied",
      "du: cannot access 'a/tmp1': No such file or directory")),
    # A path nested without end: its line is judged by how it ends, said by its head.
    ([_DEEP.format("cannot access").encode() + b"x': No such file or directory"],
     (None, _DEEP.format("cannot access")[:disk._LINE_KEEP])),
    ([_DEEP.format("cannot read directory").encode() + b"x': Permission denied", b""],
     (_DEEP.format("cannot read directory")[:disk._LINE_KEEP],
      _DEEP.format("cannot read directory")[:disk._LINE_KEEP])),
    ([], (None, None)),
])
def test_what_du_said_is_read_a_bounded_line_at_a_time(
        tmp_path: Path, said: list[bytes], found: tuple[str | None, str | None]) -> None:
    err = tmp_path / "stderr"
    err.write_bytes(b"".join(line + b"\n" for line in said))
    with open(err, "rb") as f:
        assert disk._what_du_said(f) == found
