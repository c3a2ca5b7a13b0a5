"""What a Claw-Eval checkout holds and what of it runs here, as a Markdown table.

    python -m openforge_claw.claweval.survey PATH [--judge] [--list]

Counts every task of the checkout: loaded, runnable (scored by its own grader), the
skipped ones under the first need this run cannot meet (see `SKIP_REASONS`), and the
task folders whose `task.yaml` cannot be read; `--judge`
counts as if a judge endpoint were set; `--list` names the tasks of each row.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter, defaultdict
from pathlib import Path

from openforge_claw.claweval import SKIP_REASONS, blocking_need
from openforge_claw.claweval.checkout import commit, find_root
from openforge_claw.formats.claw_eval import load_claw_eval
from openforge_claw.tasks import UNREADABLE


def survey(path: Path, judged: bool) -> tuple[dict[str, list[str]], Counter[str]]:
    """({row: task ids}, {need: tasks that have it at all}) for a checkout."""
    rows: dict[str, list[str]] = defaultdict(list)
    every: Counter[str] = Counter()
    loaded = load_claw_eval(path)
    for task in loaded:
        spec = task.claw_eval
        assert spec is not None
        rows["loaded"].append(task.id)
        every.update({n.kind for n in spec.needs})
        need = blocking_need(spec, judged)
        rows[need or "runnable"].append(task.id)
    rows["unreadable"] = [s.id for s in loaded.skipped]
    return rows, every


def table(path: Path, judged: bool, names: bool = False) -> str:
    rows, every = survey(path, judged)
    root = find_root(path)
    lines = [f"Claw-Eval checkout {root} at commit {commit(root) or 'unknown'}"
             f"{' (judge set)' if judged else ''}", "",
             "| tasks | count | with this need at all |", "|---|---|---|",
             f"| loaded | {len(rows['loaded'])} | |",
             f"| runnable here, scored by their own grader | {len(rows['runnable'])} | |"]
    for kind, reason in SKIP_REASONS.items():
        if kind == "judge" and judged:
            continue
        lines.append(f"| skipped: {reason} | {len(rows[kind])} | {every[kind]} |")
    lines.append(f"| skipped: {UNREADABLE} (task.yaml) | {len(rows['unreadable'])} | |")
    if names:
        for row, ids in rows.items():
            if row != "loaded" and ids:
                lines += ["", f"{row}: {' '.join(ids)}"]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m openforge_claw.claweval.survey")
    parser.add_argument("path", type=Path, help="a Claw-Eval checkout (or its tasks/ folder)")
    parser.add_argument("--judge", action="store_true", help="count as if a judge were set")
    parser.add_argument("--list", action="store_true", help="name the tasks of each row")
    args = parser.parse_args(argv)
    print(table(args.path, args.judge, args.list))
    return 0


if __name__ == "__main__":
    sys.exit(main())
