"""`python -m k8s_standin`: serve a stand-in in a process of its own (for benchmarks).

    python -m k8s_standin --kubeconfig PATH [--simulate MODULE:FUNCTION] [--nodes N]
                          [--stats PATH]

Writes the kubeconfig, prints `ready` on stdout, serves until SIGTERM or stdin closes,
then writes its counters to `--stats` (JSON): calls by verb and resource, the most watches
open at once by resource and selector, the most Pods alive at once.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import shutil
import signal
import sys
import threading
from pathlib import Path

from .kubelet import Node
from .server import StandIn


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kubeconfig", type=Path, required=True)
    parser.add_argument("--simulate", help="MODULE:FUNCTION, a runtime.Behaviour")
    parser.add_argument("--nodes", type=int, default=1)
    parser.add_argument("--node-cpu", type=float, default=64.0)
    parser.add_argument("--history", type=int, default=20000)
    parser.add_argument("--stats", type=Path)
    args = parser.parse_args()
    behaviour = None
    if args.simulate:
        module, attr = args.simulate.split(":", 1)
        behaviour = getattr(importlib.import_module(module), attr)
    nodes = [Node(f"standin-node-{i}", cpu=args.node_cpu, memory=2.0**50)
             for i in range(args.nodes)]
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    threading.Thread(target=lambda: (sys.stdin.read(), done.set()), daemon=True).start()
    # Containers import what this process can (the test plugins, a benchmark's module).
    image_env = {"PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    with StandIn(nodes=nodes, simulate=behaviour, history=args.history,
                 image_env=image_env) as k8s:
        shutil.copy(k8s.kubeconfig, args.kubeconfig)
        print("ready", flush=True)
        done.wait()
        if args.stats:
            args.stats.write_text(json.dumps({
                "calls": k8s.calls(), "max_open_watches": k8s.max_open_watches(),
                "max_live_pods": k8s.max_live_pods, "pods_left": len(k8s.pods()),
                "secrets_left": len(k8s.objects("Secret"))}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
