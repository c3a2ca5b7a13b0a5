"""The `miniwob` environment: MiniWoB++ pages from PyPI `miniwob`, fully offline.

Each task is one MiniWoB++ page (`miniwob/html/miniwob/<name>.html`, loaded as a file://
URL into headless Chromium) with a fixed seed: `Math.seedrandom(seed)` before the episode
starts makes the instruction and the layout the same on every run, so scripted solutions
are static and results comparable. The instruction for each (page, seed) is stored below
and checked against the live page in `prepare` (a mismatch is an error, never a silently
different task).

The reward is read from the page (`WOB_DONE_GLOBAL`, `WOB_RAW_REWARD_GLOBAL`, set by
MiniWoB's own `core.js`) into the final state; `check` scores it: the raw reward when the
episode ended with a positive one, else 0 (MiniWoB's -1 for a wrong answer, or no answer
at all). The time limit of the page is lifted (the rollout timeout applies instead): a
policy on a CPU must not lose for being slow. The episode ends as soon as the page has
scored, on `answer` / `fail`, or at the step limit (option `max_steps`, default 8).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import Field

from openforge.errors import OpenforgeError
from openforge.types import RewardResult, Task
from openforge_gui.browser import BrowserComputer
from openforge_gui.computer import ComputerEnvironment, ComputerOptions

ENV_NAME = "miniwob"
# MiniWoB++ draws in a 160 x 210 box at the page's top left.
WIDTH, HEIGHT = 160, 210
# (page, seed, instruction the page shows for that seed)
TASKS: list[tuple[str, int, str]] = [
    ("click-test", 1, "Click the button."),
    ("click-test-2", 1, "Click button ONE."),
    ("click-button-sequence", 1, "Click button ONE, then click button TWO."),
    ("click-button", 1, 'Click on the "Ok" button.'),
    ("click-link", 1, 'Click on the link "nam".'),
    ("click-checkboxes", 1, "Select DKkQH and click Submit."),
    ("click-option", 1, "Select GDKkQ and click Submit."),
    ("click-tab", 1, "Click on Tab #1."),
    ("enter-text", 1, 'Enter "Jerald" into the text field and press Submit.'),
    ("focus-text", 1, "Focus into the textbox."),
    ("enter-password", 1, 'Enter the password "fU" into both text fields and press submit.'),
    ("login-user", 1, 'Enter the username "vina" and the password "US" into the text fields '
                      "and press login."),
]
_BY_ID = {name: (name, seed, text) for name, seed, text in TASKS}
_HIDE = "#reward-display { display: none !important; }"  # MiniWoB's score panel, off-screen
_START = """(args) => {
  core.EPISODE_MAX_TIME = args.ms;
  Math.seedrandom(args.seed);
  core.startEpisodeReal();
  return core.getUtterance();
}"""
_STATE = """() => ({done: WOB_DONE_GLOBAL, raw_reward: WOB_RAW_REWARD_GLOBAL,
  reward: WOB_REWARD_GLOBAL, reason: WOB_REWARD_REASON === null ? null : String(WOB_REWARD_REASON),
  utterance: core.getUtterance()})"""


class MiniWobError(OpenforgeError):
    """The MiniWoB page could not be set up as stored (missing page, other instruction)."""


def html_dir() -> Path:
    """Where PyPI `miniwob` keeps the task pages."""
    import miniwob

    return Path(miniwob.__file__).parent / "html" / "miniwob"


def prompt_for(name: str, instruction: str) -> str:
    return (f"MiniWoB++ task {name}: {instruction}\n"
            f"The {WIDTH}x{HEIGHT} page is in the screenshot; act on it until the task is done.")


class MiniWobComputer(BrowserComputer):
    """A browser on one MiniWoB page; `finished()` once the page has scored."""

    def finished(self) -> bool:
        return bool(self.evaluate("() => WOB_DONE_GLOBAL"))


class MiniWobOptions(ComputerOptions):
    """Options of the `miniwob` environment."""

    max_steps: int = Field(default=8, ge=1)
    """Actions per episode at most."""
    chromium: str | None = None
    """The Chromium binary (default: found on PATH)."""
    episode_time_s: float = Field(default=3600.0, gt=0)
    """The page's own episode timer."""


class MiniWobEnvironment(ComputerEnvironment):
    """MiniWoB++ pages (PyPI miniwob) in headless Chromium, fixed seeds, reward read from the page."""

    options_model = MiniWobOptions
    options: MiniWobOptions

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.chromium: str | None = self.options.chromium
        self.episode_ms = int(self.options.episode_time_s * 1000)

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for name, seed, instruction in TASKS:
            yield Task(id=name, prompt=prompt_for(name, instruction), environment=ENV_NAME,
                       data={"page": name, "seed": seed, "instruction": instruction})

    def open_computer(self, task: Task, workspace: Path) -> MiniWobComputer:
        name = task.data.get("page", task.id)
        seed = task.data.get("seed", _BY_ID.get(name, (name, 1, ""))[1])
        page = html_dir() / f"{name}.html"
        if not page.is_file():
            raise MiniWobError(f"miniwob has no page {name!r} (looked in {page.parent})")
        computer = MiniWobComputer(WIDTH, HEIGHT, chromium=self.chromium, allow_goto=False)
        try:
            computer.open(page.as_uri())
            computer.add_style(_HIDE)
            shown = computer.evaluate(_START, {"ms": self.episode_ms, "seed": seed})
        except Exception:
            computer.close()
            raise
        expected = task.data.get("instruction")
        if expected and shown != expected:
            computer.close()
            raise MiniWobError(f"miniwob page {name} with seed {seed} shows {shown!r}, not the "
                               f"stored instruction {expected!r}")
        return computer

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        state = super().final_state(task, workspace)
        if self.episode is not None:
            computer = self.episode.computer
            assert isinstance(computer, MiniWobComputer)
            state["miniwob"] = computer.evaluate(_STATE)
        return state

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        page = final_state.get("miniwob") or {}
        raw = float(page.get("raw_reward") or 0.0)
        done = bool(page.get("done"))
        score = min(max(raw, 0.0), 1.0) if done else 0.0
        details = {"done": done, "raw_reward": raw, "reason": page.get("reason"),
                   "steps": (final_state.get("episode") or {}).get("steps")}
        return RewardResult(score=score, passed=score >= 1.0, details=details)
