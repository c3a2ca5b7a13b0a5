"""Sandbox modes: what `auto` resolves to on this machine, probed once per process.

- `bwrap`: bubblewrap is installed (`apt-get install bubblewrap`);
- `namespaces`: no bubblewrap, but the kernel lets this user create user, mount and PID
  namespaces (`openforge.sandbox.nsinit` builds the same view itself);
- `none`: neither; the agent runs as a plain process of this user (see docs/sandboxing.md
  for what that cannot stop).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
from typing import Literal

SandboxMode = Literal["bwrap", "namespaces", "none"]
SandboxOption = Literal["auto", "bwrap", "namespaces", "none"]
ISOLATING: frozenset[str] = frozenset({"bwrap", "namespaces"})


class SandboxUnavailable(RuntimeError):
    """The mode asked for cannot run here; the message says what to install or choose."""


def bwrap_path() -> str | None:
    return shutil.which("bwrap")


@functools.cache
def bwrap_works(bwrap: str) -> bool:
    """True when bubblewrap can build a sandbox here (inside a container it often cannot)."""
    try:
        proc = subprocess.run([bwrap, "--unshare-all", "--die-with-parent",
                               "--cap-drop", "ALL", "--ro-bind", "/", "/", "--proc", "/proc",
                               "--dev", "/dev", "true"],
                              capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


@functools.cache
def namespaces_available() -> bool:
    """True when this process can build the `namespaces` sandbox (tried once, in a child)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        proc = subprocess.run([sys.executable, "-m", "openforge.sandbox.nsinit", "--probe"],
                              capture_output=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0 and proc.stdout.strip() == b"ok"


def resolve(option: str) -> SandboxMode:
    """The mode `option` means here, or `SandboxUnavailable` saying why it cannot run."""
    if option == "none":
        return "none"
    if option == "bwrap":
        bwrap = bwrap_path()
        if bwrap is None:
            raise SandboxUnavailable("sandbox=bwrap, but bubblewrap is not installed; install it "
                                     "(apt-get install bubblewrap) or use sandbox=auto")
        if not bwrap_works(bwrap):
            raise SandboxUnavailable(f"sandbox=bwrap, but {bwrap} cannot create namespaces here "
                                     "(a container without user namespaces?); use sandbox=auto")
        return "bwrap"
    if option == "namespaces":
        if not namespaces_available():
            raise SandboxUnavailable(
                "sandbox=namespaces, but this kernel does not let this user create user, mount "
                "and PID namespaces (see /proc/sys/kernel/unprivileged_userns_clone and "
                "/proc/sys/user/max_user_namespaces); install bubblewrap or use sandbox=auto")
        return "namespaces"
    if option != "auto":
        raise SandboxUnavailable(f"unknown sandbox mode {option!r}: auto, bwrap, namespaces or none")
    bwrap = bwrap_path()
    if bwrap is not None and bwrap_works(bwrap):
        return "bwrap"
    if namespaces_available():
        return "namespaces"
    return "none"


def none_mode_warning(why: str) -> str:
    """The loud line a run without isolation prints at start and writes into its report."""
    return (f"WARNING: rollouts run WITHOUT isolation (sandbox none: {why}). The agent runs as "
            f"user {_user()}: it can read and write every file that user can (your HOME, this "
            "run's directory), read other rollouts' tokens and signal their processes. Install "
            "bubblewrap (apt-get install bubblewrap) or allow unprivileged user namespaces; "
            "docs/sandboxing.md says what each mode guarantees.")


def _user() -> str:
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())
