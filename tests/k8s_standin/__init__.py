"""A Kubernetes API server + kubelet stand-in for tests: real HTTP, real processes.

No kube-apiserver can run on our CI machines (see ../../docs/scaling-out.md), so the
Kubernetes executor's contract suite drives the real client library against this stand-in.
`StandIn` runs it on its own thread and event loop on a free 127.0.0.1 port and writes a
kubeconfig for it; `python -m k8s_standin` serves one in a process of its own.
"""

from .apiserver import Fault
from .kubelet import Image, Node
from .runtime import MARKER_ENV, MARKER_PREFIX, SimContainer, standin_processes
from .server import StandIn

__all__ = ["Fault", "Image", "MARKER_ENV", "MARKER_PREFIX", "Node", "SimContainer", "StandIn",
           "standin_processes"]
