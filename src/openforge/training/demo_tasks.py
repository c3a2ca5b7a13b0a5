"""Parameterized workspace-task families for the `demo` training recipe, with a teacher.

The 12 fixed `demo` tasks are too few to tell learning from memorizing. Here each family
(write a file, append a line, rename, ...) is instantiated with names and words from small
pools; `split="train"` and `split="test"` are disjoint sets of instances, so the recipe
measures reward on held-out tasks the policy never trained on. `teacher_script()` writes
the scripted engine's solutions for a set of instances: the demonstrations for SFT.

Use it as the environment `openforge.training.demo_tasks:FamilyEnvironment` (options:
`train_per_family`, `test_per_family`, `seed`, `families`, `pool_size`).
"""

from __future__ import annotations

import itertools
import random
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import Field

from openforge.environment import Environment
from openforge.options import PluginOptions
from openforge.types import RewardResult, Task

ENV_TARGET = "openforge.training.demo_tasks:FamilyEnvironment"
NAMES = ("notes", "data", "todo", "report", "items", "plan", "draft", "memo", "log", "list")
TRAIN_NAMES, HELD_OUT_NAMES = NAMES[:7], NAMES[7:]
WORDS = ("apple", "river", "green", "stone", "cloud", "tiger", "light", "paper", "music", "bread")


@dataclass(frozen=True)
class Instance:
    """One task: its prompt, fixture files, the teacher's tool call, and the expected result."""

    id: str
    family: str
    prompt: str
    files: dict[str, str]
    tool: str  # shell | write_file
    arguments: dict[str, str]
    # A plausible mistake (shell families only): what the noisy teacher demonstrates instead
    # of `arguments` on some instances. The checker fails it.
    wrong: dict[str, str] | None = None


Check = Callable[[Path, dict[str, Any]], float]


def _text(ws: Path, name: str) -> str | None:
    path = ws / name
    return path.read_text(errors="replace") if path.is_file() else None


def _make(family: str, name: str, word: str) -> Instance:
    iid = f"{family}-{name}-{word}"
    if family == "write":
        return Instance(iid, family, f"Create a file named {name}.txt containing exactly: {word}",
                        {}, "write_file", {"path": f"{name}.txt", "content": word})
    if family == "append":
        return Instance(iid, family, f"Append a line with the text {word} to {name}.txt.",
                        {f"{name}.txt": "first\nsecond\n"}, "shell",
                        {"command": f"echo {word} >> {name}.txt"})
    if family == "rename":
        return Instance(iid, family, f"Rename {name}.txt to {word}.txt.",
                        {f"{name}.txt": "keep this\n"}, "shell",
                        {"command": f"mv {name}.txt {word}.txt"})
    if family == "count":
        lines = 3 + len(word)
        return Instance(iid, family, f"Count the lines of {name}.txt and write just the number "
                        "to count.txt.", {f"{name}.txt": "".join(f"{word} {i}\n" for i in range(lines))},
                        "shell", {"command": f"wc -l < {name}.txt > count.txt"})
    if family == "delete":
        return Instance(iid, family, f"Delete the file {name}.txt and keep {word}.txt.",
                        {f"{name}.txt": "x\n", f"{word}.txt": "y\n"}, "shell",
                        {"command": f"rm {name}.txt"})
    if family == "package":
        return Instance(iid, family, f"Create the directory {name} with an empty __init__.py "
                        "file in it.", {}, "write_file",
                        {"path": f"{name}/__init__.py", "content": ""})
    # The workspace families: the prompt names the file, but one generic command solves
    # every instance, so a small model can learn them from few demonstrations and be tested
    # on instances (names, contents) it never saw.
    if family == "clean":
        return Instance(iid, family, f"Delete the temporary files (such as {word}.tmp) but keep "
                        f"{name}.txt.", {f"{name}.txt": "keep\n", f"{word}.tmp": "x\n",
                                         "cache.tmp": "y\n"}, "shell", {"command": "rm *.tmp"},
                        {"command": "rm *.txt"})
    if family == "archive":
        return Instance(iid, family, f"Archive the {word} notes: move {name}.txt into a new "
                        "directory named archive.",
                        {f"{name}.txt": f"{word}\n"}, "shell",
                        {"command": "mkdir archive && mv *.txt archive/"},
                        {"command": "mkdir archive && cp *.txt archive/"})
    if family == "tally":
        lines = 3 + len(word)
        return Instance(iid, family, f"Count the lines of {name}.txt (the {word} log) and write "
                        "just the number to count.out.", {f"{name}.txt": "".join(f"{word} {i}\n"
                                                                 for i in range(lines))},
                        "shell", {"command": "cat *.txt | wc -l > count.out"},
                        {"command": "cat *.txt | wc -w > count.out"})
    if family == "empty":
        return Instance(iid, family, f"Empty the file {name}.txt (it repeats {word}) but keep it.",
                        {f"{name}.txt": f"{word}\n" * 3}, "shell",
                        {"command": "truncate -s 0 *.txt"}, {"command": "rm *.txt"})
    raise KeyError(family)


FAMILIES = ("write", "append", "rename", "count", "delete", "package",
            "clean", "archive", "tally", "empty")


def _score(inst: Instance, ws: Path) -> tuple[float, dict[str, Any]]:
    name = inst.id.split("-")[1]
    word = inst.id.split("-")[2]
    if inst.family == "write":
        got = _text(ws, f"{name}.txt")
        return (1.0, {}) if got is not None and got.strip() == word else (0.0, {"got": got})
    if inst.family == "append":
        lines = (_text(ws, f"{name}.txt") or "").splitlines()
        return (1.0, {}) if lines == ["first", "second", word] else (0.0, {"got": lines[-3:]})
    if inst.family == "rename":
        ok = _text(ws, f"{word}.txt") == "keep this\n" and not (ws / f"{name}.txt").exists()
        return (1.0 if ok else 0.0), {}
    if inst.family == "count":
        got = (_text(ws, "count.txt") or "").strip()
        return (1.0, {}) if got == str(3 + len(word)) else (0.0, {"got": got})
    if inst.family == "delete":
        ok = not (ws / f"{name}.txt").exists() and (ws / f"{word}.txt").is_file()
        return (1.0 if ok else 0.0), {}
    if inst.family == "package":
        return (1.0 if (ws / name / "__init__.py").is_file() else 0.0), {}
    if inst.family == "clean":
        ok = not list(ws.glob("*.tmp")) and _text(ws, f"{name}.txt") == "keep\n"
        return (1.0 if ok else 0.0), {}
    if inst.family == "archive":
        ok = _text(ws, f"archive/{name}.txt") == f"{word}\n" and not (ws / f"{name}.txt").exists()
        return (1.0 if ok else 0.0), {}
    if inst.family == "tally":
        got = (_text(ws, "count.out") or "").strip()
        return (1.0, {}) if got == str(3 + len(word)) else (0.0, {"got": got})
    if inst.family == "empty":
        return (1.0 if _text(ws, f"{name}.txt") == "" else 0.0), {}
    raise KeyError(inst.family)


def instances(split: str | None, train_per_family: int = 10, test_per_family: int = 3,
              seed: int = 0, families: Sequence[str] = FAMILIES,
              pool_size: int = 5) -> list[Instance]:
    """The instances of a split: for each family, distinct (name, word) pairs.

    Train instances take their names and words from the first `pool_size` of each pool;
    held-out (`test`) instances take their names from `HELD_OUT_NAMES`, which no train
    instance uses, so a held-out prompt is never one the policy trained on.
    """
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; known: {', '.join(FAMILIES)}")
    if not 1 <= pool_size <= len(TRAIN_NAMES):
        raise ValueError(f"pool_size {pool_size}: between 1 and {len(TRAIN_NAMES)}")
    out: list[Instance] = []
    for family in families:
        rng = random.Random(f"{seed}-{family}")
        pools = {"train": list(itertools.product(TRAIN_NAMES[:pool_size], WORDS[:pool_size])),
                 "test": list(itertools.product(HELD_OUT_NAMES, WORDS))}
        wanted = {"train": train_per_family, "test": test_per_family}
        for split_name, pairs in pools.items():
            rng.shuffle(pairs)
            if split is None or split == split_name:
                out.extend(_make(family, n, w) for n, w in pairs[:wanted[split_name]])
    return out


def _parse_id(task_id: str) -> Instance:
    family, name, word = task_id.split("-")
    return _make(family, name, word)


class FamilyOptions(PluginOptions):
    """Options of the demo recipe's task families."""

    train_per_family: int = Field(default=10, ge=0)
    """Training instances per family."""
    test_per_family: int = Field(default=3, ge=0)
    """Held-out instances per family."""
    seed: int = 0
    """Which instances are drawn."""
    families: list[str] | None = None
    """Only these families (default: all)."""
    pool_size: int = Field(default=len(TRAIN_NAMES), ge=1)
    """File names the training instances draw from."""


class FamilyEnvironment(Environment):
    """Parameterized workspace tasks with train / test splits of distinct instances."""

    options_model = FamilyOptions
    options: FamilyOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.train_per_family = self.options.train_per_family
        self.test_per_family = self.options.test_per_family
        self.seed = self.options.seed
        self.families = list(self.options.families or FAMILIES)
        self.pool_size = self.options.pool_size

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for split_name in ("train", "test"):
            if split is not None and split != split_name:
                continue
            for inst in instances(split_name, self.train_per_family, self.test_per_family,
                                  self.seed, self.families, self.pool_size):
                yield Task(id=inst.id, prompt=inst.prompt, environment="demo-families",
                           split=split_name, data={"family": inst.family})

    def prepare(self, task: Task, workspace: Path) -> None:
        for rel, text in _parse_id(task.id).files.items():
            path = workspace / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        return {"files": sorted(str(p.relative_to(workspace)) for p in workspace.rglob("*"))[:100]}

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        score, details = _score(_parse_id(task.id), workspace)
        return RewardResult(score=score, passed=score >= 1.0, details=details)


def teacher_choices(tasks: Iterable[Task], accuracy: float = 1.0,
                    seed: int = 0) -> dict[str, bool]:
    """Which tasks a noisy teacher solves right (True) and which it gets wrong.

    Per family, `round(accuracy * n)` of its n tasks (a seeded choice) get the right command;
    the others get the family's plausible mistake (`Instance.wrong`). Families without one
    are always solved right.
    """
    by_family: dict[str, list[Instance]] = {}
    for task in tasks:
        inst = _parse_id(task.id)
        by_family.setdefault(inst.family, []).append(inst)
    right: dict[str, bool] = {}
    for family, group in sorted(by_family.items()):
        group.sort(key=lambda inst: inst.id)
        n_right = round(accuracy * len(group)) if group[0].wrong is not None else len(group)
        chosen = set(random.Random(f"{seed}-teacher-{family}").sample(range(len(group)), n_right))
        right.update({inst.id: i in chosen for i, inst in enumerate(group)})
    return right


def teacher_script(tasks: Iterable[Task], path: Path, accuracy: float = 1.0,
                   seed: int = 0) -> Path:
    """Write the scripted engine's solution for each task: one tool call, then "Done.".

    With `accuracy` < 1 the teacher is noisy (see `teacher_choices`): its demonstrations
    are what a cloned policy learns, mistakes included.
    """
    tasks = list(tasks)
    right = teacher_choices(tasks, accuracy, seed)
    entries = []
    for task in tasks:
        inst = _parse_id(task.id)
        arguments = inst.arguments if right[task.id] or inst.wrong is None else inst.wrong
        entries.append({"match": "^" + re.escape(inst.prompt) + "$", "replies": [
            {"tool_calls": [{"name": inst.tool, "arguments": arguments}]},
            {"content": "Done."}]})
    path.write_text(yaml.safe_dump(entries, sort_keys=False))
    return path
