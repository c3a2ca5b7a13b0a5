"""Makes the real harness plugin distributions under plugins/ usable from the tests.

Unit tests import the plugin modules from their source folders (no install needed);
`pip_install` installs a distribution for real into a private folder, for tests that go
through entry points (`openforge plugins`, `openforge run`) in a subprocess.
"""

from __future__ import annotations

import importlib.metadata
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLUGINS = REPO / "plugins"
CODEX = PLUGINS / "openforge-codex"
CLAUDE_CODE = PLUGINS / "openforge-claude-code"


def import_sources(*projects: Path) -> None:
    """Put the projects' `src` folders on sys.path (after anything installed)."""
    for project in projects:
        src = str(project / "src")
        if src not in sys.path:
            sys.path.append(src)


def installed(distribution: str) -> bool:
    """Whether the environment already has `distribution` (e.g. the nox session installed it)."""
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def pip_install(target: Path, *projects: Path) -> None:
    """Install distributions (no dependencies, offline) into `target`.

    Each is built from a copy, so setuptools leaves no build/ or egg-info in the tree.
    """
    copies = []
    for project in projects:
        copy = target.parent / f"{target.name}-src" / project.name
        shutil.copytree(project, copy, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
        copies.append(copy)
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--target", str(target), *map(str, copies)],
        check=True, capture_output=True)


def with_path(target: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """A copy of the environment with `target` first on PYTHONPATH."""
    out = dict(os.environ if env is None else env)
    out["PYTHONPATH"] = os.pathsep.join(filter(None, [str(target), out.get("PYTHONPATH")]))
    return out
