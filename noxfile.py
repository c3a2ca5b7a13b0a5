"""Developer and CI sessions. `nox -s tests` is the test command the README names.

torch is pinned to the CPU build 2.13.0 first in every session that needs it: a bare
`torch` requirement would pull a multi-GB CUDA build.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typecheck", "tests"]
nox.options.reuse_existing_virtualenvs = True

TORCH = "torch==2.13.0"


def install_openforge(session: nox.Session, extras: str = "test") -> None:
    session.install("pip>=24", "setuptools>=68", "wheel")
    session.install(TORCH)
    session.install("-e", f".[{extras}]")


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite (unit, integration over real HTTP, property tests)."""
    install_openforge(session)
    session.run("python", "-m", "pytest", "-q", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff over the package, the tests, the plugins and the benchmarks."""
    session.install("ruff>=0.6")
    session.run("ruff", "check", "src", "tests", "plugins", "benchmarks", "noxfile.py")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy over src/."""
    install_openforge(session)
    session.install("mypy>=1.10", "types-PyYAML")
    session.run("mypy", "src/openforge")


@nox.session
def bench(session: nox.Session) -> None:
    """Benchmarks: print ratios and rates measured in one run (they assert nothing about time)."""
    install_openforge(session)
    args = session.posargs or []
    for script in ("bench_gateway.py", "bench_export.py", "bench_executor.py"):
        session.run("python", f"benchmarks/{script}", *args)
