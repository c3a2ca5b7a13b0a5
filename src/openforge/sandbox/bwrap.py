"""A `View` as a bubblewrap command line.

Besides the view: every namespace unshared except the network (the harness reaches the
gateway and the environment's services on 127.0.0.1), a new session (no TIOCSTI into a
terminal), `--die-with-parent`, and `--cap-drop ALL`: bubblewrap run by root keeps every
capability inside the sandbox unless told otherwise, and with CAP_SYS_ADMIN the agent could
remount a read-only bind read-write (tests/test_sandbox.py shows it cannot).
`--info-fd` reports the sandbox's PID 1, whose PID namespace the supervisor then watches.
PID 1 is openforge's own reaper (`--as-pid-1`, `nsinit --reap`), as in the namespaces mode:
it reports how the harness ended and how many processes it left running.
"""

from __future__ import annotations

from openforge.sandbox.view import View


def bwrap_argv(bwrap: str, view: View, command: list[str], info_fd: int) -> list[str]:
    argv = [bwrap, "--unshare-all", "--share-net", "--die-with-parent", "--new-session",
            "--cap-drop", "ALL", "--hostname", "openforge", "--as-pid-1",
            "--info-fd", str(info_fd),
            "--dev", "/dev", "--proc", "/proc"]
    for path in view.tmpfs:
        argv += ["--tmpfs", path]
    for bind in view.binds:
        argv += ["--bind" if bind.rw else "--ro-bind", bind.src, bind.dst]
    for target, path in view.symlinks:
        argv += ["--symlink", target, path]
    for path in view.masks:
        argv += ["--ro-bind", "/dev/null", path]
    argv += ["--chdir", view.cwd, "--", *command]
    return argv
