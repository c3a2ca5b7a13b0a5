"""Parameterized workspace-task families for the `demo` training recipe, with a teacher.

Each family (archive the notes, count the lines, empty a file, clean up temporary files,
...) is instantiated with a file name, a word and a file type (`txt`, `md`, `log`, `csv`)
from small pools. Three splits of distinct instances:

- `train`: what the teacher demonstrates and GRPO trains on: train names, and for each
  family the file types of `TRAIN_TYPES`;
- `validation`: the same (family, file type) pairs with file names no train task uses;
  every choice of the recipe's settings is made on it;
- `test`: what is reported and never tuned on. Its instances need a command that no train
  task contains verbatim: the held-out (family, file type) pairs of `HELD_OUT_TYPES`
  (`archive` of `md` notes is `mkdir archive && mv *.md archive/`, a command the
  training set never shows; it shows `*.md` only in other families' commands), and the
  `compose` family, which asks for two trained skills in one task (clean up, then count).

So the test measures whether the policy composes what it learned (an operation from the
verb, a file type from the file it is told about) on unseen names; it does not measure
copying names it never saw (one generic command per (family, file type) solves every
instance) nor skills absent from training.

`teacher_script()` writes the scripted engine's solutions for a set of instances: the
demonstrations for SFT.

Use it as the environment `openforge.training.demo_tasks:FamilyEnvironment` (options:
`train_per_family`, `validation_per_family`, `test_per_family`, `seed`, `families`,
`pool_size`).
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
NAMES = ("notes", "data", "todo", "report", "items", "plan", "draft", "memo", "inbox", "list")
TRAIN_NAMES, HELD_OUT_NAMES = NAMES[:7], NAMES[7:]
WORDS = ("apple", "river", "green", "stone", "cloud", "tiger", "light", "paper", "music", "bread")
SPLITS = ("train", "validation", "test")
TYPES = ("txt", "md", "log", "csv")
# The families whose command names the file type. Each holds one type out of training: the
# test split's (family, type) pairs. Every type still occurs in train with two or three of
# the other families, so the pair is new and its parts are not.
HELD_OUT_TYPES = {"archive": "md", "tally": "log", "empty": "csv"}
TRAIN_TYPES = {family: tuple(t for t in TYPES if t != held)
               for family, held in HELD_OUT_TYPES.items()}
TRAIN_TYPES["clean"] = TYPES  # its command (`rm *.tmp`) does not depend on the type
# Test-only families: two trained skills in one task.
COMPOSED = {"compose": ("clean", "tally")}


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


def _lines(word: str) -> str:
    return "".join(f"{word} {i}\n" for i in range(3 + len(word)))


def _make(family: str, name: str, word: str, ext: str = "txt") -> Instance:
    iid = f"{family}-{name}-{word}-{ext}"
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
        return Instance(iid, family, f"Count the lines of {name}.txt and write just the number "
                        "to count.txt.", {f"{name}.txt": _lines(word)},
                        "shell", {"command": f"wc -l < {name}.txt > count.txt"})
    if family == "delete":
        return Instance(iid, family, f"Delete the file {name}.txt and keep {word}.txt.",
                        {f"{name}.txt": "x\n", f"{word}.txt": "y\n"}, "shell",
                        {"command": f"rm {name}.txt"})
    if family == "package":
        return Instance(iid, family, f"Create the directory {name} with an empty __init__.py "
                        "file in it.", {}, "write_file",
                        {"path": f"{name}/__init__.py", "content": ""})
    # The recipe's families: the prompt names the file; one command per file type solves
    # every instance, so a small model can learn them from few demonstrations.
    if family == "clean":
        return Instance(iid, family, f"Delete the temporary files (such as {word}.tmp) but keep "
                        f"{name}.{ext}.", {f"{name}.{ext}": "keep\n", f"{word}.tmp": "x\n",
                                           "cache.tmp": "y\n"}, "shell", {"command": "rm *.tmp"},
                        {"command": f"rm *.{ext}"})
    if family == "archive":
        return Instance(iid, family, f"Archive the {word} notes: move {name}.{ext} into a new "
                        "directory named archive.",
                        {f"{name}.{ext}": f"{word}\n"}, "shell",
                        {"command": f"mkdir archive && mv *.{ext} archive/"},
                        {"command": f"mkdir archive && cp *.{ext} archive/"})
    if family == "tally":
        return Instance(iid, family, f"Count the lines of {name}.{ext} (the {word} log) and "
                        "write just the number to count.out.", {f"{name}.{ext}": _lines(word)},
                        "shell", {"command": f"cat *.{ext} | wc -l > count.out"},
                        {"command": f"cat *.{ext} | wc -w > count.out"})
    if family == "empty":
        return Instance(iid, family, f"Empty the file {name}.{ext} (it repeats {word}) but keep "
                        "it.", {f"{name}.{ext}": f"{word}\n" * 3}, "shell",
                        {"command": f"truncate -s 0 *.{ext}"}, {"command": f"rm *.{ext}"})
    if family == "compose":
        return Instance(iid, family, f"Delete the temporary files (such as {word}.tmp), then "
                        f"count the lines of {name}.{ext} and write just the number to "
                        "count.out.", {f"{name}.{ext}": _lines(word), f"{word}.tmp": "x\n",
                                       "cache.tmp": "y\n"}, "shell",
                        {"command": f"rm *.tmp && cat *.{ext} | wc -l > count.out"})
    raise KeyError(family)


FAMILIES = ("write", "append", "rename", "count", "delete", "package",
            "clean", "archive", "tally", "empty")


def _score(inst: Instance, ws: Path) -> tuple[float, dict[str, Any]]:
    _, name, word, ext = inst.id.split("-")
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
        ok = not list(ws.glob("*.tmp")) and _text(ws, f"{name}.{ext}") == "keep\n"
        return (1.0 if ok else 0.0), {}
    if inst.family == "archive":
        ok = (_text(ws, f"archive/{name}.{ext}") == f"{word}\n"
              and not (ws / f"{name}.{ext}").exists())
        return (1.0 if ok else 0.0), {}
    if inst.family in ("tally", "compose"):
        got = (_text(ws, "count.out") or "").strip()
        if got != str(3 + len(word)):
            return 0.0, {"got": got}
        if inst.family == "compose" and list(ws.glob("*.tmp")):
            return 0.0, {"left": sorted(p.name for p in ws.glob("*.tmp"))}
        return 1.0, {}
    if inst.family == "empty":
        return (1.0 if _text(ws, f"{name}.{ext}") == "" else 0.0), {}
    raise KeyError(inst.family)


def _types(family: str, split: str) -> tuple[str, ...]:
    """The file types a family's instances of `split` take."""
    if family in COMPOSED:
        return TYPES
    if split == "test":
        return (HELD_OUT_TYPES[family],) if family in HELD_OUT_TYPES else ()
    return TRAIN_TYPES.get(family, ("txt",))


def test_families(families: Sequence[str]) -> list[str]:
    """The families the test split holds for these train families: those with a held-out
    file type, and each composed family whose parts are all trained."""
    held = [f for f in families if f in HELD_OUT_TYPES]
    composed = [c for c, parts in COMPOSED.items() if all(p in families for p in parts)]
    return held + composed


def instances(split: str | None, train_per_family: int = 10, test_per_family: int = 3,
              seed: int = 0, families: Sequence[str] = FAMILIES,
              pool_size: int = 5, validation_per_family: int | None = None) -> list[Instance]:
    """The instances of a split (`None`: all three), per family, distinct and balanced over
    the family's file types.

    Train instances take their names and words from the first `pool_size` of each pool;
    validation and test instances take their names from `HELD_OUT_NAMES`, which no train
    instance uses. Validation repeats train's (family, file type) pairs; test holds the
    pairs and families train never shows (`test_families`).
    """
    unknown = [f for f in families if f not in FAMILIES]
    if unknown:
        raise ValueError(f"unknown task families {unknown}; known: {', '.join(FAMILIES)}")
    if not 1 <= pool_size <= len(TRAIN_NAMES):
        raise ValueError(f"pool_size {pool_size}: between 1 and {len(TRAIN_NAMES)}")
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; the demo families have {', '.join(SPLITS)}")
    wanted = {"train": train_per_family, "test": test_per_family,
              "validation": test_per_family if validation_per_family is None
              else validation_per_family}
    names = {"train": TRAIN_NAMES[:pool_size], "validation": HELD_OUT_NAMES,
             "test": HELD_OUT_NAMES}
    words = {"train": WORDS[:pool_size], "validation": WORDS, "test": WORDS}
    out: list[Instance] = []
    for split_name in SPLITS:
        if split is not None and split != split_name:
            continue
        chosen = test_families(families) if split_name == "test" else list(families)
        for family in chosen:
            rng = random.Random(f"{seed}-{family}-{split_name}")
            types = _types(family, split_name)
            pairs = list(itertools.product(names[split_name], words[split_name]))
            rng.shuffle(pairs)
            # Round-robin over the types, so each gets its share of the instances.
            out.extend(_make(family, name, word, types[i % len(types)])
                       for i, (name, word) in enumerate(pairs[:wanted[split_name]]))
    return out


def _parse_id(task_id: str) -> Instance:
    family, name, word, ext = task_id.split("-")
    return _make(family, name, word, ext)


class FamilyOptions(PluginOptions):
    """Options of the demo recipe's task families."""

    train_per_family: int = Field(default=10, ge=0)
    """Training instances per family."""
    validation_per_family: int = Field(default=3, ge=0)
    """Validation instances per family (the split settings are chosen on)."""
    test_per_family: int = Field(default=3, ge=0)
    """Test instances per test family (the split that is reported, never tuned on)."""
    seed: int = 0
    """Which instances are drawn."""
    families: list[str] | None = None
    """Only these families (default: all)."""
    pool_size: int = Field(default=len(TRAIN_NAMES), ge=1)
    """File names the training instances draw from."""


class FamilyEnvironment(Environment):
    """Parameterized workspace tasks with train / validation / test splits."""

    options_model = FamilyOptions
    options: FamilyOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.families = list(self.options.families or FAMILIES)

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        o = self.options
        for split_name in SPLITS if split is None else (split,):
            for inst in instances(split_name, o.train_per_family, o.test_per_family, o.seed,
                                  self.families, o.pool_size, o.validation_per_family):
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


# Each harness's own shell tool, as (tool name, argument that holds the command): the
# teacher demonstrates the harness's real tool, so the policy learns to call what that
# harness offers. `mini`'s `write_file` is the only non-shell tool a family uses.
SHELL_TOOLS = {"mini": ("shell", "command"), "codex": ("exec_command", "cmd"),
               "claude-code": ("Bash", "command")}


def teacher_script(tasks: Iterable[Task], path: Path, accuracy: float = 1.0,
                   seed: int = 0, harness: str = "mini") -> Path:
    """Write the scripted engine's solution for each task: one tool call, then "Done.".

    With `accuracy` < 1 the teacher is noisy (see `teacher_choices`): its demonstrations
    are what a cloned policy learns, mistakes included. The tool call is `harness`'s own
    shell tool (`SHELL_TOOLS`).
    """
    if harness not in SHELL_TOOLS:
        raise ValueError(f"the demo teacher knows the shell tool of {', '.join(SHELL_TOOLS)}; "
                         f"not of {harness!r}")
    tool, argument = SHELL_TOOLS[harness]
    tasks = list(tasks)
    right = teacher_choices(tasks, accuracy, seed)
    entries = []
    for task in tasks:
        inst = _parse_id(task.id)
        arguments = inst.arguments if right[task.id] or inst.wrong is None else inst.wrong
        if inst.tool == "shell":
            call = {"name": tool, "arguments": {argument: arguments["command"]}}
        elif harness == "mini":
            call = {"name": inst.tool, "arguments": arguments}
        else:
            raise ValueError(f"family {inst.family!r} needs mini's {inst.tool} tool")
        entries.append({"match": "^" + re.escape(inst.prompt) + "$", "replies": [
            {"tool_calls": [call]}, {"content": "Done."}]})
    path.write_text(yaml.safe_dump(entries, sort_keys=False))
    return path
