"""A `View` as a bubblewrap command line (`view_options`; `bwrap_argv` for the harness).

Besides the view: every namespace unshared, the network too (bubblewrap brings up `lo` and
nothing else: no host port is reachable; the harness reaches the gateway and its own
environment's services through `openforge.sandbox.relay`, whose unix sockets PID 1 serves on
127.0.0.1), a new session (no TIOCSTI into a
terminal), `--die-with-parent`, and `--cap-drop ALL`: bubblewrap run by root keeps every
capability inside the sandbox unless told otherwise, and with CAP_SYS_ADMIN the agent could
remount a read-only bind read-write (tests/test_sandbox.py shows it cannot).
`--info-fd` reports the sandbox's PID 1, whose PID namespace the supervisor then watches.
PID 1 is openforge's own reaper (`--as-pid-1`, `nsinit --reap`), as in the namespaces mode:
it reports how the harness ended and how many processes it left running, and carries the
harness's connections to the relayed ports.
"""

from __future__ import annotations

from openforge.sandbox.view import View

# Every namespace unshared (the network too), no terminal, no capabilities, gone with us.
ISOLATE = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]


def view_options(view: View, *, proc: bool = True) -> list[str]:
    """The view as bubblewrap mount options, ending in `--chdir` (its working folder).
    `proc=False` inside another bubblewrap sandbox, which cannot mount a /proc of its own."""
    argv = ["--dev", "/dev", *(["--proc", "/proc"] if proc else [])]
    size = ["--size", str(view.tmpfs_size)] if view.tmpfs_size else []
    for path in view.tmpfs:
        argv += [*size, "--tmpfs", path]
    for bind in view.binds:
        argv += ["--bind" if bind.rw else "--ro-bind", bind.src, bind.dst]
    for path in view.hidden:  # after the binds: over the folder a read-only bind shows
        argv += ["--tmpfs", path, "--remount-ro", path]
    for target, path in view.symlinks:
        argv += ["--symlink", target, path]
    for path in view.masks:
        argv += ["--ro-bind", "/dev/null", path]
    return [*argv, "--chdir", view.cwd]


def bwrap_argv(bwrap: str, view: View, command: list[str], info_fd: int) -> list[str]:
    return [bwrap, *ISOLATE, "--hostname", "openforge", "--as-pid-1",
            "--info-fd", str(info_fd), *view_options(view), "--", *command]
