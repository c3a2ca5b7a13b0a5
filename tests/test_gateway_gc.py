"""The gateway process's garbage collector: startup objects frozen, young collections rare,
cycles still collected.

`create_app` changes the collector for the whole process, once, so each test runs in a
fresh interpreter (pytest's own process has created apps in other tests already).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from openforge.gateway.app import GC_YOUNG_THRESHOLD

SCRIPT = """
import gc, json, sys, weakref
from openforge.config import GatewayConfig
from openforge.gateway.app import create_app
from openforge.gateway.engines.vllm import VLLMEngine
from openforge.gateway.model import load_model_bundle
from openforge.gateway.state import GatewayState
from openforge.store import Store

before = gc.get_threshold()
bundle = load_model_bundle("tiny")
engine = VLLMEngine(bundle, url="http://127.0.0.1:9")
create_app(GatewayState(GatewayConfig(), Store(sys.argv[1]), engine, bundle))
after = gc.get_threshold()
frozen = gc.get_freeze_count()

# A reference cycle, unreachable: only the cyclic collector can free it, and must, without
# anyone calling gc.collect(), once enough new objects have been allocated.
class Node:
    pass
a, b = Node(), Node()
a.other, b.other = b, a
freed = weakref.ref(a)
del a, b
keep = [[] for _ in range(3 * after[0])]
print(json.dumps({"before": before, "after": after, "frozen": frozen,
                  "enabled": gc.isenabled(), "cycle_freed": freed() is None}))
"""


def test_create_app_freezes_startup_objects_and_collects_young_objects_less_often(
        tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "gc.sqlite")],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["before"][0] < GC_YOUNG_THRESHOLD
    # Only the youngest generation's threshold moves; the older ones keep their defaults.
    assert seen["after"] == [GC_YOUNG_THRESHOLD, *seen["before"][1:]]
    assert seen["frozen"] > 10_000  # tokenizer, renderer, schemas: out of the collector's way
    assert seen["enabled"]
    assert seen["cycle_freed"]  # rarer collections, not none: cycles are still freed
