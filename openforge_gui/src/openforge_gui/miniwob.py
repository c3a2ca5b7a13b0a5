"""The `miniwob` environment: MiniWoB++ pages from PyPI `miniwob`, fully offline.

The tasks are every environment the installed `miniwob` package registers with Gymnasium
(`miniwob/<name>-v1`; 128 in miniwob 1.1.0). Each is one MiniWoB++ page in headless
Chromium: `miniwob/html/miniwob/<name>.html` as a file:// URL, or for the `flight.*` tasks
`html/flight/<site>/wrapper.html` served over HTTP on 127.0.0.1 (they cannot run from
file://, as in MiniWoB itself), at the size MiniWoB gives them (160x210, flights 375x667).
A fixed seed, `Math.seedrandom(seed)` before the episode starts, makes the instruction and
the layout the same on every run, so scripted solutions are static and results
comparable. For the sample in `SAMPLES` (the tasks with scripted solutions) the
instruction for its seed is stored below, put in the prompt and checked against the live
page in `prepare` (a mismatch is an error, never a silently different task); for the
others the prompt points at the instruction shown on the page.

The reward is read from the page (`WOB_DONE_GLOBAL`, `WOB_RAW_REWARD_GLOBAL`, set by
MiniWoB's own `core.js`) into the final state; `check` scores it: the raw reward when the
episode ended with a positive one, else 0 (MiniWoB's -1 for a wrong answer, or no answer
at all). The time limit of the page is lifted (the rollout timeout applies instead): a
policy on a CPU must not lose for being slow. The episode ends as soon as the page has
scored, on `answer` / `fail`, or at the step limit (option `max_steps`, default 8).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Iterable
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from pydantic import Field

from openforge.errors import OpenforgeError
from openforge.types import RewardResult, Task
from openforge_gui.browser import BrowserComputer
from openforge_gui.computer import ComputerEnvironment, ComputerOptions

ENV_NAME = "miniwob"
# MiniWoB++ draws in a 160 x 210 box at the page's top left; the flight sites in 375 x 667.
WIDTH, HEIGHT = 160, 210
FLIGHT_WIDTH, FLIGHT_HEIGHT = 375, 667
DEFAULT_SEED = 1
# (page, seed, instruction the page shows for that seed): the tasks with scripted solutions
SAMPLES: list[tuple[str, int, str]] = [
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
_BY_ID = {name: (name, seed, text) for name, seed, text in SAMPLES}
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


@functools.cache
def registered() -> list[str]:
    """The task names the installed `miniwob` registers with Gymnasium (`miniwob/<name>-v1`)."""
    import gymnasium
    import miniwob  # noqa: F401 - importing it registers its environments

    prefix = "miniwob/"
    return sorted(key[len(prefix):].rsplit("-v", 1)[0] for key in gymnasium.envs.registry
                  if key.startswith(prefix))


def is_flight(name: str) -> bool:
    return name.startswith("flight.")


def size_of(name: str) -> tuple[int, int]:
    return (FLIGHT_WIDTH, FLIGHT_HEIGHT) if is_flight(name) else (WIDTH, HEIGHT)


def prompt_for(name: str, instruction: str | None) -> str:
    width, height = size_of(name)
    what = instruction or "do what the instruction at the top of the page asks."
    return (f"MiniWoB++ task {name}: {what}\n"
            f"The {width}x{height} page is in the screenshot; act on it until the task is done.")


class PageServer:
    """MiniWoB's html/ folder over HTTP on 127.0.0.1 (the flight tasks need http://)."""

    def __init__(self, root: Path) -> None:
        handler = functools.partial(_QuietHandler, directory=str(root))
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/"

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


class _QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - stdlib signature
        pass

    def handle(self) -> None:
        try:
            super().handle()
        except (BrokenPipeError, ConnectionResetError):  # the browser dropped a request
            pass


class MiniWobComputer(BrowserComputer):
    """A browser on one MiniWoB page; `finished()` once the page has scored."""

    def finished(self) -> bool:
        return bool(self.evaluate("() => WOB_DONE_GLOBAL"))

    def page_state(self) -> dict[str, Any]:
        """MiniWoB's own account of the episode: done, rewards, reason, instruction."""
        return dict(self.evaluate(_STATE))


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
        self.pages: PageServer | None = None

    def tasks(self, split: str | None = None) -> Iterable[Task]:
        for name in registered():
            _, seed, instruction = _BY_ID.get(name, (name, DEFAULT_SEED, None))
            yield Task(id=name, prompt=prompt_for(name, instruction), environment=ENV_NAME,
                       data={"page": name, "seed": seed, "instruction": instruction})

    def page_url(self, name: str) -> str:
        """Where the page of task `name` is: a file:// URL, or HTTP for the flight sites."""
        if is_flight(name):
            site = html_dir().parent / "flight" / name.split(".", 1)[1] / "wrapper.html"
            if not site.is_file():
                raise MiniWobError(f"miniwob has no flight site {name!r} (looked for {site})")
            if self.pages is None:
                self.pages = PageServer(html_dir().parent)
            return f"{self.pages.url}flight/{name.split('.', 1)[1]}/wrapper.html"
        page = html_dir() / f"{name}.html"
        if not page.is_file():
            raise MiniWobError(f"miniwob has no page {name!r} (looked in {page.parent})")
        return page.as_uri()

    def open_computer(self, task: Task, workspace: Path) -> MiniWobComputer:
        computer = MiniWobComputer(*size_of(task.data.get("page", task.id)),
                                   chromium=self.chromium, allow_goto=False)
        try:
            self.start(computer, task)
        except Exception:
            computer.close()
            raise
        return computer

    def start(self, computer: MiniWobComputer, task: Task) -> None:
        """Load the task's page in `computer` and start its episode with the task's seed."""
        name = task.data.get("page", task.id)
        seed = task.data.get("seed", _BY_ID.get(name, (name, DEFAULT_SEED, ""))[1])
        computer.open(self.page_url(name))
        computer.add_style(_HIDE)
        shown = computer.evaluate(_START, {"ms": self.episode_ms, "seed": seed})
        if isinstance(shown, dict):  # tasks with natural-language fields answer {utterance, fields}
            shown = shown.get("utterance")
        expected = task.data.get("instruction")
        if expected and shown != expected:
            raise MiniWobError(f"miniwob page {name} with seed {seed} shows {shown!r}, not the "
                               f"stored instruction {expected!r}")

    def final_state(self, task: Task, workspace: Path) -> dict[str, Any]:
        state = super().final_state(task, workspace)
        if self.episode is not None:
            computer = self.episode.computer
            assert isinstance(computer, MiniWobComputer)
            # A page that is gone has not scored: `check` gives it 0.
            state["miniwob"] = self.read_screen(state, computer.page_state, {})
        return state

    def check(self, task: Task, workspace: Path, final_state: dict[str, Any]) -> RewardResult:
        page = final_state.get("miniwob") or {}
        raw = float(page.get("raw_reward") or 0.0)
        done = bool(page.get("done"))
        score = min(max(raw, 0.0), 1.0) if done else 0.0
        details = {"done": done, "raw_reward": raw, "reason": page.get("reason"),
                   "steps": (final_state.get("episode") or {}).get("steps")}
        return RewardResult(score=score, passed=score >= 1.0, details=details)

    def close(self) -> None:
        try:
            super().close()
        finally:
            if self.pages is not None:
                self.pages.close()
                self.pages = None
