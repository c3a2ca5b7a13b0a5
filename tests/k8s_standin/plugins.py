"""Throwaway plugins the Kubernetes contract suite runs inside Pods (`k8s_standin.plugins:Name`).

The Pods import them through PYTHONPATH (the stand-in's image env; on a real cluster, the
test image built with `--target test` from deploy/kubernetes/Dockerfile).
"""

from __future__ import annotations

import sys

from openforge.harness import Command, Harness, HarnessContext
from openforge.options import PluginOptions


class WaitOptions(PluginOptions):
    seconds: float = 3.0


class WaitHarness(Harness):
    """Sleeps `seconds` (harness option), then writes ok.txt: a rollout that takes a while."""

    options_model = WaitOptions

    def command(self, ctx: HarnessContext) -> Command:
        seconds = self.options.seconds
        script = f"import time; time.sleep({seconds}); open('ok.txt', 'w').write('ok'); print('waited')"
        return Command(argv=[sys.executable, "-c", script], cwd=ctx.workspace)
