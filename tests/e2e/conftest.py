"""End-to-end tests with real harness binaries from npm: opt-in with OPENFORGE_E2E=1.

`nox -s e2e` sets it, installs the plugin distributions and the pinned npm packages
first. Without it these tests are skipped, so the quick suite never downloads the
harnesses (Claude Code alone is ~400 MB).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

E2E_ENV = "OPENFORGE_E2E"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: runs real harness binaries (OPENFORGE_E2E=1)")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if os.environ.get(E2E_ENV) == "1":
        return
    skip = pytest.mark.skip(reason=f"real harness binaries: set {E2E_ENV}=1 (nox -s e2e)")
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.e2e)
            item.add_marker(skip)


@pytest.fixture(scope="session")
def codex_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder for PYTHONPATH that makes openforge-codex importable: empty where the
    environment already has it installed (the nox session does)."""
    from harness_plugins import CODEX, installed, pip_install

    target = tmp_path_factory.mktemp("site")
    if not installed(CODEX.name):
        pip_install(target, CODEX)
    return target
