"""`python -m k8s_standin.tini -- CMD...`: the stand-in's `tini`, the init the real image
runs as its ENTRYPOINT (`["tini", "--"]`, deploy/kubernetes/Dockerfile).

As the container's first process it forwards the signals a kubelet sends to its child,
reaps every orphan that re-parents to it, and exits with its child's status (128 + N when
signal N killed it). When it exits, its PID namespace, and every process in it, ends.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys


def main() -> int:
    args = sys.argv[1:]
    if args[:1] == ["--"]:
        args = args[1:]
    if not args:
        print("usage: python -m k8s_standin.tini -- CMD [ARG...]", file=sys.stderr)
        return 2
    child = subprocess.Popen(args)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1,
                signal.SIGUSR2):
        signal.signal(sig, lambda signum, _: child.send_signal(signum))
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == child.pid:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


if __name__ == "__main__":
    sys.exit(main())
