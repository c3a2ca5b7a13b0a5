"""Fixtures: a stand-in VM behind a `vmrun` stand-in, and the interpreter that runs DesktopEnv.

DesktopEnv is the real package when OPENFORGE_OSWORLD_PYTHON names an interpreter that has
desktop-env installed; otherwise it is the stand-in package in standin/desktop_env, which
keeps the real interface (it cannot be installed next to openforge, see README.md). Either
way it manages the VM through its `vmware` provider, i.e. `vmrun` on PATH, which here is
standin/vmrun.py starting standin/vm/server.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
STANDIN = HERE / "standin"
TASKS = HERE / "tasks"
REAL_PYTHON = os.environ.get("OPENFORGE_OSWORLD_PYTHON")


@dataclass
class StandinVM:
    """What the osworld environment needs to reach the stand-in VM."""

    vmx: Path
    python: str
    worker_env: dict[str, str]

    @property
    def home(self) -> Path:
        """The guest's home folder, on the VM's disk."""
        return self.vmx.parent / "disk" / "home" / "user"

    def environment_options(self, **extra: object) -> dict[str, object]:
        return {"tasks_dir": str(TASKS), "provider": "vmware", "path_to_vm": str(self.vmx),
                "python": self.python, "worker_env": self.worker_env, "pause": 0.1,
                "setup_timeout_s": 120, "step_timeout_s": 60, **extra}


@pytest.fixture
def standin_vm(tmp_path: Path) -> Iterator[StandinVM]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    vmrun = bin_dir / "vmrun"
    vmrun.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{STANDIN / "vmrun.py"}" "$@"\n')
    vmrun.chmod(0o755)
    vm_dir = tmp_path / "vm"
    vm_dir.mkdir()
    vmx = vm_dir / "standin.vmx"
    vmx.write_text('displayName = "openforge stand-in"\n')
    worker_env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
                  "OSW_VMRUN_REGISTRY": str(tmp_path / "vmrun-registry")}
    if REAL_PYTHON:
        python = REAL_PYTHON
    else:
        python = sys.executable
        worker_env["PYTHONPATH"] = str(STANDIN)
    yield StandinVM(vmx=vmx, python=python, worker_env=worker_env)
    # Whatever a test left running: stop the VM the way DesktopEnv.close() would.
    subprocess.run([str(vmrun), "-T", "ws", "stop", str(vmx)], env={**os.environ, **worker_env},
                   capture_output=True, timeout=30)
