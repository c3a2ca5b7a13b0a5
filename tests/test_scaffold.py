"""`openforge new-plugin NAME`: the package it writes installs in a fresh virtual environment
next to this repository's openforge, and its own tests pass there; its dependency on
openforge cannot resolve to the unrelated `openforge` on the package index."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import openforge
from openforge.scaffold import OPENFORGE_REQUIREMENT, ScaffoldError, new_plugin

# `pip index versions openforge`, run 2026-11-30: every version of the unrelated project
# that owns the name "openforge" on PyPI.
PYPI_OPENFORGE_VERSIONS = ["0.20260727.2", "0.20260727.1", "0.20260727.0", "0.20260726.2",
                           "0.20260726.1", "0.20260726.0", "0.20260724.5", "0.20260724.4",
                           "0.20260724.3", "0.20260724.2", "0.20260724.1", "0.1.0"]


def test_the_pin_matches_this_openforge_and_none_of_the_other_project_s_versions() -> None:
    requirement = Requirement(OPENFORGE_REQUIREMENT)
    assert requirement.name == "openforge"
    assert requirement.specifier.contains(Version(openforge.__version__))
    assert not [v for v in PYPI_OPENFORGE_VERSIONS if requirement.specifier.contains(Version(v))]
    # What the docs used to show, and the obvious alternative, both would match it.
    assert Requirement("openforge").specifier.contains(Version("0.20260727.2"))
    assert Requirement("openforge~=0.1.0").specifier.contains(Version("0.1.0"))


def test_names_that_cannot_be_used_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(ScaffoldError, match="lowercase letters"):
        new_plugin("My_Plugin", tmp_path / "a")
    with pytest.raises(ScaffoldError, match=r"'mini' is already registered \(harness\)"):
        new_plugin("mini", tmp_path / "b")
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x").write_text("")
    with pytest.raises(ScaffoldError, match="not empty"):
        new_plugin("acme", tmp_path / "c")


def test_the_package_installs_in_a_fresh_venv_and_its_tests_pass(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "openforge.cli", "new-plugin", "acme", "--dir",
                          str(tmp_path / "openforge-acme")], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    package = tmp_path / "openforge-acme"
    assert f'dependencies = ["{OPENFORGE_REQUIREMENT}"]' in (package / "pyproject.toml").read_text()
    # A fresh venv whose only view of openforge (and of its dependencies) is this
    # environment's site-packages, where openforge is installed from this repository.
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    python = venv / "bin" / "python"
    fresh_site = subprocess.run([str(python), "-c", "import sysconfig; "
                                 "print(sysconfig.get_paths()['purelib'])"],
                                capture_output=True, text=True, check=True).stdout.strip()
    ours = sysconfig.get_paths()["purelib"]
    assert ours in site.getsitepackages() or ours in sys.path
    Path(fresh_site, "local-openforge.pth").write_text(f"import site; site.addsitedir({ours!r})\n")
    # pip resolves the plugin's dependency offline: only the local openforge can satisfy it.
    install = subprocess.run(
        [sys.executable, "-m", "pip", "--python", str(python), "install", "--no-index",
         "--no-build-isolation", "--quiet", str(package)],
        capture_output=True, text=True, timeout=600)
    assert install.returncode == 0, install.stdout + install.stderr
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    listed = subprocess.run([str(python), "-m", "openforge.cli", "plugins"], capture_output=True,
                            text=True, env=env, timeout=120)
    acme = [line for line in listed.stdout.splitlines() if " acme " in line]
    assert len(acme) == 3 and all("openforge-acme" in line for line in acme), listed.stdout
    tests = subprocess.run([str(python), "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            str(package / "tests")], capture_output=True, text=True, env=env,
                           cwd=package, timeout=900)
    assert tests.returncode == 0, tests.stdout[-3000:] + tests.stderr[-2000:]
    assert "4 passed" in tests.stdout
