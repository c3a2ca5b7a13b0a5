"""A Kubernetes API server + kubelet stand-in for tests: real HTTP, real processes.

No kube-apiserver can run on our CI machines (see ../../docs/scaling-out.md), so the
Kubernetes executor's contract suite drives the real client library against this stand-in.
`StandIn` runs it on its own thread and event loop on a free 127.0.0.1 port and writes a
kubeconfig for it.
"""

from .apiserver import Fault
from .kubelet import MARKER_ENV, MARKER_PREFIX, Node, python_command
from .server import StandIn, standin_processes

__all__ = ["Fault", "MARKER_ENV", "MARKER_PREFIX", "Node", "StandIn", "python_command",
           "standin_processes"]
