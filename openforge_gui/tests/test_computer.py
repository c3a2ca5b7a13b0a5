"""The computer API over real HTTP: auth, observations, actions, step limit, episode end,
and the browser screen in real headless Chromium on a local page."""

from __future__ import annotations

import base64
import hashlib
import io
import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from PIL import Image

from openforge.types import Task
from openforge_gui.actions import Action, Click, Type
from openforge_gui.computer import (
    ActionFailed,
    Computer,
    ComputerAPIError,
    ComputerClient,
    ComputerEnvironment,
    ComputerServer,
    Episode,
)


class Canvas(Computer):
    """A real screen of our own: a PIL image that clicks paint black."""

    def __init__(self) -> None:
        self.image = Image.new("RGB", (64, 48), "white")
        self.typed = ""

    def screenshot(self) -> tuple[bytes, int, int]:
        out = io.BytesIO()
        self.image.save(out, "PNG")
        return out.getvalue(), 64, 48

    def perform(self, action: Action) -> None:
        if isinstance(action, Click):
            if not (0 <= action.x < 64 and 0 <= action.y < 48):
                raise ActionFailed(f"({action.x}, {action.y}) is off the screen")
            self.image.putpixel((action.x, action.y), (0, 0, 0))
        elif isinstance(action, Type):
            self.typed += action.text


@pytest.fixture()
def served() -> Iterator[tuple[ComputerServer, Canvas]]:
    canvas = Canvas()
    server = ComputerServer(Episode(canvas, max_steps=3))
    yield server, canvas
    server.close()


def test_wrong_or_missing_token_is_401(served: tuple[ComputerServer, Canvas]) -> None:
    server, _ = served
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": server.token}):
        response = httpx.get(f"{server.url}/observation", headers=headers)
        assert response.status_code == 401
        assert "token" in response.json()["error"]
        response = httpx.post(f"{server.url}/action", headers=headers, json={"type": "wait"})
        assert response.status_code == 401
    with pytest.raises(ComputerAPIError, match="401"):
        ComputerClient(server.url, "wrong").observation()


def test_bad_bodies_and_paths_are_one_line_4xx(served: tuple[ComputerServer, Canvas]) -> None:
    server, _ = served
    auth = {"Authorization": f"Bearer {server.token}"}
    bad = httpx.post(f"{server.url}/action", headers=auth, content=b"{not json")
    assert bad.status_code == 400 and "\n" not in bad.json()["error"]
    unknown = httpx.post(f"{server.url}/action", headers=auth, json={"type": "teleport"})
    assert unknown.status_code == 400
    assert httpx.get(f"{server.url}/nope", headers=auth).status_code == 404


def test_actions_change_the_screen_and_the_step_limit_ends_it(
        served: tuple[ComputerServer, Canvas], tmp_path: Path) -> None:
    server, canvas = served
    server.config.write(tmp_path)
    assert json.loads((tmp_path / ".openforge/computer.json").read_text())["url"] == server.url
    client = ComputerClient.from_workspace(tmp_path)
    first = client.observation()
    assert (first.width, first.height, first.step, first.done) == (64, 48, 0, False)
    result = client.act(Click(x=10, y=20))
    assert result.ok and result.step == 1 and not result.done
    png = base64.b64decode(client.observation().screenshot)
    assert Image.open(io.BytesIO(png)).getpixel((10, 20)) == (0, 0, 0)
    off = client.act(Click(x=500, y=5))  # performed as a step, reported as failed
    assert not off.ok and "off the screen" in (off.error or "") and off.step == 2
    last = client.act({"type": "type", "text": "hi"})
    assert last.done and last.step == 3 and canvas.typed == "hi"
    refused = client.act(Click(x=1, y=1))
    assert not refused.ok and refused.done and refused.step == 3
    summary = server.episode.summary()
    assert summary["ended_by"] == "step_limit" and len(summary["history"]) == 3
    assert [h["action_text"] for h in summary["history"]][0] == "click(x=10, y=20)"


def test_answer_ends_the_episode(served: tuple[ComputerServer, Canvas]) -> None:
    server, _ = served
    client = ComputerClient(server.url, server.token)
    result = client.act({"type": "answer", "text": "42"})
    assert result.done and result.ok
    obs = client.observation()
    assert obs.done and obs.answer == "42"
    assert server.episode.summary()["ended_by"] == "answer"


def test_browser_screen_in_headless_chromium(tmp_path: Path) -> None:
    from openforge_gui.browser import BrowserComputer

    page = tmp_path / "page.html"
    page.write_text("<html><body style='margin:0'><input id='q' style='width:200px'>"
                    "<button id='b' onclick=\"document.title='clicked '+q.value\">Go</button>"
                    "</body></html>")
    browser = BrowserComputer(320, 200, allow_goto=False, action_timeout_s=1.0)
    try:
        browser.open(page.as_uri())
        episode = Episode(browser, max_steps=10, keep_screens=tmp_path / "screens")
        episode.act(Click(x=20, y=10))
        episode.act(Type(text="abc"))
        episode.act(parse("click_element(text='Go')"))
        assert browser.location()[1] == "clicked abc"
        nav = episode.act(parse('goto("https://example.com")'))
        assert not nav.ok and "does not allow" in (nav.error or "")
        missing = episode.act(parse('click_element(selector="#nope")'))
        assert not missing.ok and "\n" not in (missing.error or "")
        png, width, height = browser.screenshot()
        assert png.startswith(b"\x89PNG") and Image.open(io.BytesIO(png)).size == (320, 200)
        assert (tmp_path / "screens/step-3.png").is_file()
    finally:
        browser.close()


class _RefusingPage:
    """A Playwright page whose next `refusals` captures fail as Chromium's do now and then."""

    def __init__(self, page: object, refusals: int) -> None:
        self._page, self.refusals, self.captures = page, refusals, 0

    def screenshot(self, **options: object) -> bytes:
        from playwright.sync_api import Error as PlaywrightError

        self.captures += 1
        if self.refusals:
            self.refusals -= 1
            raise PlaywrightError("Protocol error (Page.captureScreenshot): Unable to capture "
                                  "screenshot\nCall log:\n  - taking page screenshot")
        return self._page.screenshot(**options)  # type: ignore[attr-defined, no-any-return]

    def __getattr__(self, name: str) -> object:
        return getattr(self._page, name)


def test_a_capture_chromium_refuses_once_is_taken_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from openforge_gui.browser import SCREENSHOT_TRIES, BrowserComputer

    browser = BrowserComputer(160, 120, allow_goto=False, action_timeout_s=1.0)
    try:
        browser.open("data:text/html,<title>T</title><body>hello</body>")
        page = browser.page
        flaky = _RefusingPage(page, refusals=SCREENSHOT_TRIES - 1)
        monkeypatch.setattr(browser, "page", flaky)
        png, width, height = browser.screenshot()
        assert png.startswith(b"\x89PNG") and (width, height) == (160, 120)
        assert flaky.captures == SCREENSHOT_TRIES

        # A screen that refuses every capture: one line saying so, and the browser lives on.
        monkeypatch.setattr(browser, "page", _RefusingPage(page, refusals=SCREENSHOT_TRIES))
        with pytest.raises(ActionFailed) as refused:
            browser.screenshot()
        assert str(refused.value) == (f"screenshot: {SCREENSHOT_TRIES} tries failed: Protocol "
                                      "error (Page.captureScreenshot): Unable to capture "
                                      "screenshot")
        assert browser.gone is None and browser.location()[1] == "T"
    finally:
        browser.close()


class CaptureShy(Canvas):
    """A canvas that cannot be captured while `shy` is set."""

    shy = False

    def screenshot(self) -> tuple[bytes, int, int]:
        if self.shy:
            raise ActionFailed("screenshot: 4 tries failed: Unable to capture screenshot")
        return super().screenshot()


def test_a_step_whose_screen_cannot_be_captured_is_kept_without_its_picture(
        tmp_path: Path) -> None:
    canvas = CaptureShy()
    episode = Episode(canvas, max_steps=5, keep_screens=tmp_path / "screens")
    canvas.shy = True
    first = episode.act(Click(x=1, y=1))
    canvas.shy = False
    second = episode.act(Click(x=2, y=1))
    assert first.ok and second.ok and (first.step, second.step) == (1, 2)
    assert canvas.image.getpixel((1, 1)) == (0, 0, 0)  # the step itself was done
    lost, kept = episode.history
    assert lost.screenshot is None and "Unable to capture" in (lost.screenshot_error or "")
    assert kept.screenshot == str(tmp_path / "screens" / "step-2.png")
    assert kept.screenshot_error is None and not episode.done


def parse(text: str) -> Action:
    from openforge_gui.actions import parse_action

    return parse_action(text)


class CanvasEnvironment(ComputerEnvironment):
    """The computer environment base class over a `Canvas`."""

    name = "canvas"

    def tasks(self, split: str | None = None) -> list[Task]:
        return [Task(id="t", prompt="paint")]

    def open_computer(self, task: Task, workspace: Path) -> Computer:
        return Canvas()


def clicked_canvas(workspace: Path, clicks: int) -> tuple[CanvasEnvironment, Task]:
    """A prepared canvas whose agent clicked `clicks` times, as a harness would."""
    workspace.mkdir()
    env = CanvasEnvironment()
    [task] = env.tasks()
    env.prepare(task, workspace)
    client = ComputerClient.from_workspace(workspace)  # as a harness finds it
    for x in range(1, clicks + 1):
        client.act(Click(x=x, y=1))
    client.close()
    return env, task


def test_judged_screenshots_are_out_of_the_agents_reach_until_it_is_gone(
        tmp_path: Path) -> None:
    workspace = tmp_path / "workspace"
    env, task = clicked_canvas(workspace, clicks=3)
    try:
        # What the agent can write while it runs: its workspace. No screenshot is there.
        screens = workspace / ".openforge" / "screens"
        assert not screens.exists()
        screens.mkdir(parents=True)
        forged = Canvas().screenshot()[0]  # a blank screen, "before any click"
        (screens / "step-3.png").write_bytes(forged)
        (screens / "planted.png").write_bytes(forged)
        # Without isolation it could also find the private folder: a changed screenshot
        # is shown to no judge.
        assert env.episode is not None
        private = Path(env.episode.history[1].screenshot or "")
        assert not private.is_relative_to(workspace)
        private.write_bytes(forged)

        history = env.final_state(task, workspace)["episode"]["history"]
        assert sorted(p.name for p in screens.iterdir()) == ["step-1.png", "step-3.png"]
        first, second, third = history
        assert second["screenshot"] is None and second["screenshot_changed"] is True
        for entry in (first, third):
            png = Path(entry["screenshot"]).read_bytes()
            assert Path(entry["screenshot"]).parent == screens
            assert hashlib.sha256(png).hexdigest() == entry["screenshot_sha256"]
            assert png != forged
        assert Image.open(io.BytesIO(Path(third["screenshot"]).read_bytes())).getpixel(
            (3, 1)) == (0, 0, 0)
    finally:
        env.close()
    assert not private.parent.exists()  # the private folder goes with the environment


@pytest.mark.parametrize("planted", [".openforge/screens", ".openforge"])
def test_a_file_where_the_screenshots_go_does_not_stop_the_final_state(
        tmp_path: Path, planted: str) -> None:
    workspace = tmp_path / "workspace"
    env, task = clicked_canvas(workspace, clicks=1)
    try:
        if planted == ".openforge":
            (workspace / ".openforge" / "computer.json").unlink()
            (workspace / ".openforge").rmdir()
        (workspace / planted).write_text("not a folder")
        [entry] = env.final_state(task, workspace)["episode"]["history"]
        assert Path(entry["screenshot"]) == workspace / ".openforge" / "screens" / "step-1.png"
        assert hashlib.sha256(Path(entry["screenshot"]).read_bytes()).hexdigest() == \
            entry["screenshot_sha256"]
    finally:
        env.close()
