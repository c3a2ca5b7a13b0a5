""".ci/run stops at once, saying why, when the disk cannot hold a run (rather than pip
failing minutes in with "No space left on device")."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

CI_RUN = Path(__file__).resolve().parents[1] / ".ci" / "run"

# `df -Pk` as it prints a disk with 3 GB free: a test cannot fill the real disk.
DF_3_GB_FREE = """#!/bin/sh
echo "Filesystem 1024-blocks Used Available Capacity Mounted on"
echo "/dev/vda 264241152 261095424 3145728 99% /"
"""


def test_ci_refuses_to_start_on_a_disk_too_full_for_a_run(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    (checkout / ".ci").mkdir(parents=True)
    shutil.copy(CI_RUN, checkout / ".ci" / "run")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "df").write_text(DF_3_GB_FREE)
    (bin_dir / "df").chmod(0o755)

    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(["bash", str(checkout / ".ci" / "run")], env=env,
                          capture_output=True, text=True, timeout=120)

    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"ci: 3 GB free under {checkout}, a run needs 10 GB: "
        "remove old checkouts or temporary folders first"]
    assert not (checkout / ".ci-venv").exists()  # nothing was installed first
