"""OSWorld task files (folder, index, split) and the action mapping to both action spaces."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import TASKS
from openforge_gui.actions import parse_action
from openforge_osworld.actions import UnsupportedAction, to_computer_13, to_pyautogui
from openforge_osworld.environment import OSWorldEnvironment
from openforge_osworld.tasks import TaskFileError, load_task


def ids(**options: object) -> list[str]:
    split = options.pop("split", None)
    return [t.id for t in OSWorldEnvironment(tasks_dir=str(TASKS), **options).tasks(split)]


def test_tasks_from_the_folder_an_index_or_a_split() -> None:
    assert ids() == ["standin-infeasible", "standin-notes-save"]  # every file, sorted
    assert ids(index="test_all.json") == ["standin-notes-save", "standin-infeasible"]
    assert ids(split="test_small") == ["standin-notes-save"]
    assert ids(domains="chrome") == []
    task = next(iter(OSWorldEnvironment(tasks_dir=str(TASKS)).tasks()))
    assert task.data["domain"] == "notes" and task.data["osworld"]["evaluator"]["func"]
    assert task.data["osworld"]["related_apps"] == ["notes"]


def test_task_file_faults_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(TaskFileError, match="no index .*nope.json"):
        ids(split="nope")
    bad = tmp_path / "t.json"
    bad.write_text('{"id": "x", "instruction": "do"}')
    with pytest.raises(TaskFileError, match=r"t.json: not an OSWorld task: evaluator: Field required"):
        load_task(bad)
    index = tmp_path / "idx.json"
    index.write_text('{"notes": ["missing"]}')
    with pytest.raises(TaskFileError, match="lists notes/missing"):
        ids(index=str(index))


@pytest.mark.parametrize(("text", "pyautogui", "computer_13"), [
    ("click(120, 45)", "pyautogui.click(120, 45)", {"action_type": "CLICK", "x": 120, "y": 45}),
    ("type(\"it's <b>\")", "pyautogui.typewrite(\"it's <b>\")",
     {"action_type": "TYPING", "text": "it's <b>"}),
    ("key(\"ctrl+shift+t\")", "pyautogui.hotkey('ctrl', 'shift', 't')",
     {"action_type": "HOTKEY", "keys": ["ctrl", "shift", "t"]}),
    ("key(\"Enter\")", "pyautogui.press('enter')", {"action_type": "PRESS", "key": "enter"}),
    ("scroll(10, 20, 0, 300)", "pyautogui.moveTo(10, 20); pyautogui.scroll(-3)",
     {"action_type": "SCROLL", "dx": 0, "dy": -3}),
    ("wait(2)", "time.sleep(2.0)", "WAIT"),
])
def test_actions_map_to_both_action_spaces(text: str, pyautogui: str, computer_13: object) -> None:
    action = parse_action(text)
    assert to_pyautogui(action) == pyautogui
    assert to_computer_13(action) == computer_13


def test_browser_only_actions_are_refused_with_a_reason() -> None:
    for text in ("goto(\"https://example.com\")", "click_element(text=\"OK\")"):
        with pytest.raises(UnsupportedAction, match="needs a browser page"):
            to_pyautogui(parse_action(text))


def test_an_unknown_action_space_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="action_space must be one of pyautogui, computer_13"):
        OSWorldEnvironment(action_space="claude")
