"""The action space and its tolerant parser: the spellings models use, round trips, and
one-line errors for everything else."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from openforge_gui.actions import (
    ACTION_ADAPTER,
    ActionParseError,
    Click,
    ClickElement,
    Fail,
    Goto,
    Key,
    Scroll,
    Type,
    Wait,
    format_action,
    parse_action,
)
from openforge_gui.actions import Answer as AnswerAction

CASES = [
    ("click(120, 45)", Click(x=120, y=45)),
    ("CLICK 120 45", Click(x=120, y=45)),
    ("click(x=120.4, y=44.6)", Click(x=120, y=45)),
    ("pyautogui.click(120, 45)", Click(x=120, y=45)),
    ("click([120, 45])", Click(x=120, y=45)),
    ('{"type": "click", "x": 120, "y": 45}', Click(x=120, y=45)),
    ('```json\n{"name": "click", "arguments": {"x": 120, "y": 45}}\n```', Click(x=120, y=45)),
    ('<tool_call>{"name": "click", "arguments": "{\\"x\\": 120, \\"y\\": 45}"}</tool_call>',
     Click(x=120, y=45)),
    ("I see the button at the top.\nAction: click(120, 45)", Click(x=120, y=45)),
    ('click("Submit")', ClickElement(text="Submit")),
    ('click_element(selector="#subbtn")', ClickElement(selector="#subbtn")),
    ('type("hello world")', Type(text="hello world")),
    ("TYPE hello world", Type(text="hello world")),
    ("type(hello world)", Type(text="hello world")),
    ('key("ctrl+a")', Key(keys="Control+a")),
    ('hotkey("ctrl", "c")', Key(keys="Control+c")),
    ("KEY enter", Key(keys="Enter")),
    ("scroll(down)", Scroll(dy=300)),
    ("scroll(10, 20, 0, -50)", Scroll(x=10, y=20, dy=-50)),
    ('{"action": "scroll", "direction": "up"}', Scroll(dy=-300)),
    ('goto("https://example.com")', Goto(url="https://example.com")),
    ("wait(2)", Wait(seconds=2)),
    ("wait()", Wait(seconds=1)),
    ("ANSWER: 42", AnswerAction(text="42")),
    ('finish("done")', AnswerAction(text="done")),
    ('fail("the page is broken")', Fail(reason="the page is broken")),
    ({"name": "type", "arguments": '{"text": "x"}'}, Type(text="x")),
    ({"function": {"name": "key", "arguments": {"keys": "Tab"}}}, Key(keys="Tab")),
]


@pytest.mark.parametrize(("text", "expected"), CASES, ids=[str(c[0])[:40] for c in CASES])
def test_parses_the_usual_spellings(text: object, expected: object) -> None:
    assert parse_action(text) == expected  # type: ignore[arg-type]


@pytest.mark.parametrize("text", [
    "", "I think we should look around first.", "click(1, 2, 3)", "click(a=1)",
    '{"foo": 1}', "explode(3)", '{"name": "click", "arguments": "not json"}',
    "wait(1000)", 'click_element()',
])
def test_rejects_what_is_not_one_action_with_one_line(text: str) -> None:
    with pytest.raises(ActionParseError) as info:
        parse_action(text)
    assert "\n" not in str(info.value) and str(info.value)


coords = st.integers(min_value=-5000, max_value=5000)
texts = st.text(min_size=1, max_size=40).filter(lambda s: s.strip() == s and s)
actions = st.one_of(
    st.builds(Click, x=coords, y=coords),
    st.builds(ClickElement, text=texts),
    st.builds(ClickElement, selector=texts),
    st.builds(Type, text=texts),
    st.builds(Key, keys=st.sampled_from(["Enter", "Tab", "Control+a", "Shift+ArrowDown"])),
    st.builds(Scroll, x=coords, y=coords, dx=coords, dy=coords),
    st.builds(Goto, url=st.from_regex(r"https://[a-z]{1,10}\.com/[a-z0-9]{0,8}", fullmatch=True)),
    st.builds(Wait, seconds=st.floats(min_value=0, max_value=30)),
    st.builds(AnswerAction, text=texts),
    st.builds(Fail, reason=texts),
)


@settings(max_examples=300, deadline=None)
@given(actions)
def test_canonical_text_json_and_tool_calls_round_trip(action: object) -> None:
    assert parse_action(format_action(action)) == action  # type: ignore[arg-type]
    dumped = action.model_dump()  # type: ignore[attr-defined]
    assert parse_action(json.dumps(dumped)) == action
    name = dumped.pop("type")
    call = {"name": name, "arguments": json.dumps({k: v for k, v in dumped.items() if v is not None})}
    assert parse_action(call) == action
    assert ACTION_ADAPTER.validate_json(json.dumps(action.model_dump())) == action  # type: ignore[attr-defined]


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_arbitrary_text_parses_or_fails_cleanly(text: str) -> None:
    try:
        parse_action(text)
    except ActionParseError as exc:
        assert "\n" not in str(exc)
