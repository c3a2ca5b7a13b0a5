"""The GUI action space and a tolerant parser from model output to one `Action`.

An action is a pydantic model discriminated by `type`:

    click{x, y}                 click at viewport pixel (x, y)
    click_element{selector|text} click a CSS selector, or the element showing this text
    type{text}                  type text into the focused element
    key{keys}                   press a key or chord, Playwright spelling ("Enter", "Control+a")
    scroll{x, y, dx, dy}        wheel-scroll by (dx, dy) pixels with the pointer at (x, y)
    goto{url}                   navigate
    wait{seconds}               let the page settle
    answer{text}                end the episode with an answer
    fail{reason}                end the episode, giving up

`parse_action(text_or_tool_call)` accepts what models actually write: JSON (bare, in code
fences, in `<tool_call>` tags), a tool call `{"name": "click", "arguments": {...}}` (also
OpenAI's `{"function": {...}}` shape, arguments as a JSON string), a function call
`click(120, 45)` / `click(x=120, y=45)` / `pyautogui.click(120, 45)`, or a command line
`CLICK 120 45` / `TYPE hello` / `ANSWER: 42`, optionally after an `Action:` marker and
some reasoning. Anything else raises a one-line `ActionParseError`.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError, model_validator

# Pixels a direction-only scroll ("scroll down") moves.
SCROLL_STEP = 300
MAX_WAIT_S = 30.0


class _Action(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Click(_Action):
    type: Literal["click"] = "click"
    x: int
    y: int


class ClickElement(_Action):
    type: Literal["click_element"] = "click_element"
    selector: str | None = None
    text: str | None = None

    @model_validator(mode="after")
    def _one_target(self) -> ClickElement:
        if not (self.selector or self.text):
            raise ValueError("click_element needs a selector or a text")
        return self


class Type(_Action):
    type: Literal["type"] = "type"
    text: str


class Key(_Action):
    type: Literal["key"] = "key"
    keys: str = Field(min_length=1)


class Scroll(_Action):
    type: Literal["scroll"] = "scroll"
    x: int = 0
    y: int = 0
    dx: int = 0
    dy: int = 0


class Goto(_Action):
    type: Literal["goto"] = "goto"
    url: str = Field(min_length=1)


class Wait(_Action):
    type: Literal["wait"] = "wait"
    seconds: float = Field(default=1.0, ge=0.0, le=MAX_WAIT_S)


class Answer(_Action):
    type: Literal["answer"] = "answer"
    text: str = ""


class Fail(_Action):
    type: Literal["fail"] = "fail"
    reason: str = ""


Action = Annotated[Click | ClickElement | Type | Key | Scroll | Goto | Wait | Answer | Fail,
                   Field(discriminator="type")]
ACTION_ADAPTER: TypeAdapter[Action] = TypeAdapter(Action)
ACTION_TYPES = ("click", "click_element", "type", "key", "scroll", "goto", "wait", "answer", "fail")
# Actions after which the episode is over.
FINAL_TYPES = frozenset({"answer", "fail"})


class ActionParseError(ValueError):
    """Model output that is not one action; the message is one line saying why."""


# --- spellings -------------------------------------------------------------------------------

# Names models use for each action, lowercased, `-`/space folded to `_`.
_ALIASES: dict[str, str] = {
    **{n: "click" for n in ("click", "left_click", "tap", "mouse_click", "click_at")},
    **{n: "click_element" for n in ("click_element", "click_on", "click_text", "click_selector")},
    **{n: "type" for n in ("type", "type_text", "input", "input_text", "write", "typewrite", "fill")},
    **{n: "key" for n in ("key", "keys", "press", "press_key", "hotkey", "keypress", "key_press")},
    **{n: "scroll" for n in ("scroll", "scroll_page", "wheel")},
    **{n: "goto" for n in ("goto", "go_to", "navigate", "open", "open_url", "visit", "go_to_url")},
    **{n: "wait" for n in ("wait", "sleep", "pause")},
    **{n: "answer" for n in ("answer", "final_answer", "finish", "done", "stop", "respond",
                             "submit_answer", "terminate")},
    **{n: "fail" for n in ("fail", "give_up", "infeasible", "abort")},
}
# The argument names each action's positional arguments fill, in order.
_POSITIONAL: dict[str, tuple[str, ...]] = {
    "click": ("x", "y"), "click_element": ("text",), "type": ("text",), "key": ("keys",),
    "scroll": ("x", "y", "dx", "dy"), "goto": ("url",), "wait": ("seconds",),
    "answer": ("text",), "fail": ("reason",),
}
# Other names models give to arguments.
_ARG_ALIASES: dict[str, dict[str, str]] = {
    "type": {"content": "text", "value": "text", "string": "text", "message": "text"},
    "key": {"key": "keys", "combo": "keys", "keys_": "keys"},
    "goto": {"href": "url", "link": "url"},
    "wait": {"time": "seconds", "duration": "seconds", "secs": "seconds", "s": "seconds"},
    "answer": {"answer": "text", "content": "text", "result": "text", "response": "text"},
    "fail": {"text": "reason", "message": "reason"},
    "scroll": {"delta_x": "dx", "delta_y": "dy", "scroll_x": "dx", "scroll_y": "dy"},
    "click_element": {"element": "text", "label": "text", "css": "selector"},
}
_KEY_NAMES: dict[str, str] = {
    "ctrl": "Control", "control": "Control", "alt": "Alt", "option": "Alt", "shift": "Shift",
    "cmd": "Meta", "command": "Meta", "meta": "Meta", "win": "Meta", "super": "Meta",
    "enter": "Enter", "return": "Enter", "esc": "Escape", "escape": "Escape", "tab": "Tab",
    "backspace": "Backspace", "delete": "Delete", "del": "Delete", "space": "Space",
    "up": "ArrowUp", "down": "ArrowDown", "left": "ArrowLeft", "right": "ArrowRight",
    "arrowup": "ArrowUp", "arrowdown": "ArrowDown", "arrowleft": "ArrowLeft",
    "arrowright": "ArrowRight", "home": "Home", "end": "End", "pageup": "PageUp",
    "pagedown": "PageDown", "insert": "Insert",
}
_DIRECTIONS: dict[str, tuple[int, int]] = {
    "down": (0, SCROLL_STEP), "up": (0, -SCROLL_STEP),
    "right": (SCROLL_STEP, 0), "left": (-SCROLL_STEP, 0),
}
_FENCE = re.compile(r"```[a-zA-Z0-9_-]*\s*\n?(.*?)```", re.DOTALL)
_MARKER = re.compile(r"(?:^|\n)\s*(?:\*\*)?(?:action|next action)(?:\*\*)?\s*[:：]\s*",
                     re.IGNORECASE)
_CALL = re.compile(r"^\s*(?:[A-Za-z_][\w]*\.)*([A-Za-z_][\w-]*)\s*\((.*)\)\s*;?\s*$", re.DOTALL)
_COMMAND = re.compile(r"^\s*([A-Za-z_][\w-]*)\s*[:：]?(?:\s+(.*))?$", re.DOTALL)


def normalize_keys(keys: str | list[Any]) -> str:
    """A chord in Playwright's spelling: "ctrl+a" -> "Control+a", ["ctrl", "c"] -> "Control+c"."""
    parts = [str(k) for k in keys] if isinstance(keys, list) else re.split(r"\s*\+\s*", keys.strip())
    out = []
    for part in parts:
        name = _KEY_NAMES.get(part.strip().lower().replace("_", ""))
        out.append(name or part.strip())
    return "+".join(p for p in out if p)


def _name(raw: str) -> str | None:
    return _ALIASES.get(raw.strip().lower().replace("-", "_").replace(" ", "_"))


def _build(name: str, args: list[Any], kwargs: dict[str, Any]) -> Action:
    """The action `name` from positional and keyword arguments, after the usual fix-ups."""
    action = _name(name)
    if action is None:
        raise ActionParseError(f"unknown action {name!r}; actions are: {', '.join(ACTION_TYPES)}")
    aliases = _ARG_ALIASES.get(action, {})
    fields = {aliases.get(k.lower(), k.lower()): v for k, v in kwargs.items()}
    # click([120, 45]) / click("120, 45") / click("Submit"): coordinates or an element.
    if action == "click" and len(args) == 1 and not {"x", "y"} & fields.keys():
        only = args[0]
        if isinstance(only, list | tuple) and len(only) == 2:
            args = list(only)
        elif isinstance(only, str) and re.fullmatch(r"\s*-?\d+(\.\d+)?\s*[, ]\s*-?\d+(\.\d+)?\s*", only):
            args = [float(v) for v in re.split(r"[, ]+", only.strip())]
        else:
            action = "click_element"
    if action == "click" and not args and ({"selector", "text"} & fields.keys()):
        action = "click_element"
    if action == "click" and "coordinate" in fields:
        fields["x"], fields["y"] = fields.pop("coordinate")
    if action == "scroll" and args and isinstance(args[0], str) and args[0].lower() in _DIRECTIONS:
        fields["dx"], fields["dy"] = _DIRECTIONS[args[0].lower()]
        args = []
    if action == "scroll" and isinstance(fields.get("direction"), str):
        direction = fields.pop("direction").lower()
        if direction not in _DIRECTIONS:
            raise ActionParseError(f"scroll direction {direction!r} is not up, down, left or right")
        amount = int(fields.pop("amount", SCROLL_STEP))
        fields["dx"], fields["dy"] = (v * amount // SCROLL_STEP for v in _DIRECTIONS[direction])
    if action == "key" and len(args) > 1:  # hotkey("ctrl", "a")
        args = ["+".join(str(a) for a in args)]
    names = _POSITIONAL[action]
    if len(args) > len(names):
        raise ActionParseError(f"{action} takes at most {len(names)} argument(s), got {len(args)}")
    for field, value in zip(names, args, strict=False):
        fields.setdefault(field, value)
    if action == "key" and "keys" in fields:
        fields["keys"] = normalize_keys(fields["keys"])
    for coord in ("x", "y", "dx", "dy"):
        if isinstance(fields.get(coord), float | str):
            try:
                fields[coord] = round(float(fields[coord]))
            except ValueError:
                raise ActionParseError(f"{action}: {coord} must be a number, "
                                       f"not {fields[coord]!r}") from None
    for text_field in ("text", "reason", "url", "selector"):
        if text_field in fields and fields[text_field] is not None \
                and not isinstance(fields[text_field], str):
            fields[text_field] = str(fields[text_field])
    fields["type"] = action
    try:
        return ACTION_ADAPTER.validate_python(fields)
    except ValidationError as exc:
        err = exc.errors()[0]
        where = ".".join(str(p) for p in err["loc"][1:]) or action
        raise ActionParseError(f"{action}: {where}: {err['msg']}") from None


def _from_dict(data: dict[str, Any]) -> Action:
    """A JSON object: an Action itself, a tool call, or `{"action": name, ...}`."""
    if isinstance(data.get("function"), dict):  # OpenAI tool-call shape
        data = data["function"]
    if "name" in data and "arguments" in data:
        args = data["arguments"]
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError as exc:
                raise ActionParseError(f"tool call arguments are not valid JSON: {exc}") from None
        if not isinstance(args, dict):
            raise ActionParseError("tool call arguments must be a JSON object")
        return _build(str(data["name"]), [], args)
    for key in ("type", "action", "action_type", "name"):
        if isinstance(data.get(key), str):
            rest = {k: v for k, v in data.items() if k != key}
            nested = rest.pop("args", None) or rest.pop("parameters", None)
            if isinstance(nested, dict):
                rest.update(nested)
            positional = nested if isinstance(nested, list) else []
            return _build(data[key], positional, rest)
    raise ActionParseError("JSON object names no action (expected a \"type\" or tool-call \"name\")")


def _json_objects(text: str) -> list[Any]:
    """Every JSON value that starts at a `{` in `text`, outermost first."""
    decoder = json.JSONDecoder()
    found, pos = [], 0
    while (start := text.find("{", pos)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            pos = start + 1
            continue
        found.append(value)
        pos = end
    return found


def _literal(node: ast.expr, source: str) -> Any:
    try:
        return ast.literal_eval(node)
    except ValueError:
        # A bare word (`scroll(down)`, `key(Enter)`): take its text.
        return ast.get_source_segment(source, node) or ""


def _from_call(name: str, inner: str) -> Action:
    """`name(inner)`: Python-style arguments, or one unquoted text when they do not parse."""
    if not inner.strip():
        return _build(name, [], {})
    source = f"f({inner})"
    try:
        call = ast.parse(source, mode="eval").body
    except SyntaxError:
        return _build(name, [inner.strip()], {})
    if not isinstance(call, ast.Call):
        return _build(name, [inner.strip()], {})
    args = [_literal(a, source) for a in call.args]
    kwargs = {k.arg: _literal(k.value, source) for k in call.keywords if k.arg}
    return _build(name, args, kwargs)


def _from_command(name: str, rest: str) -> Action:
    """`CLICK 120 45`, `TYPE hello world`, `KEY ctrl+a`, `SCROLL down`, `ANSWER: 42`."""
    action = _name(name)
    rest = rest.strip()
    if action in ("click", "scroll"):
        numbers = re.findall(r"-?\d+(?:\.\d+)?", rest)
        if numbers and re.fullmatch(r"[\s,()\[\]\-\d.xy=]*", rest):
            return _build(name, [float(n) for n in numbers], {})
        if action == "scroll":
            return _build(name, [rest.split()[0]] if rest else ["down"], {})
    if len(rest) >= 2 and rest[0] == rest[-1] and rest[0] in "\"'":
        rest = rest[1:-1]
    return _build(name, [rest] if rest else [], {})


def _from_line(line: str) -> Action | None:
    """One line as an action, or None when it does not look like one."""
    line = line.strip().strip("`").strip()
    if match := _CALL.match(line):
        if _name(match.group(1)):
            return _from_call(match.group(1), match.group(2))
    if match := _COMMAND.match(line):
        if _name(match.group(1)):
            return _from_command(match.group(1), match.group(2) or "")
    return None


def parse_action(value: str | dict[str, Any] | BaseModel) -> Action:
    """One action from model text or a tool call; `ActionParseError` (one line) otherwise."""
    if isinstance(value, BaseModel):
        value = value.model_dump()
    if isinstance(value, dict):
        return _from_dict(value)
    if not isinstance(value, str):
        raise ActionParseError(f"cannot parse an action from a {type(value).__name__}")
    text = value.strip()
    if not text:
        raise ActionParseError("the model output is empty: no action")
    # What follows the last "Action:" marker is the action; reasoning may come before.
    markers = list(_MARKER.finditer(text))
    if markers:
        text = text[markers[-1].end():].strip()
    fenced = _FENCE.findall(text)
    candidates = [f.strip() for f in fenced] + [text]
    first_error: ActionParseError | None = None
    for candidate in candidates:
        for obj in _json_objects(candidate):
            if isinstance(obj, dict):
                try:
                    return _from_dict(obj)
                except ActionParseError as exc:
                    first_error = first_error or exc
        # The last line that reads as an action wins: models reason first, act last.
        for line in reversed([ln for ln in candidate.splitlines() if ln.strip()]):
            try:
                action = _from_line(line)
            except ActionParseError as exc:
                first_error = first_error or exc
                continue
            if action is not None:
                return action
    if first_error is not None:
        raise first_error
    snippet = " ".join(text.split())[:80]
    raise ActionParseError(f"no action found in the model output {snippet!r}")


def _quote(value: Any) -> str:
    """JSON, which Python's literal syntax reads back, kept on one line: the characters
    `str.splitlines` breaks at that JSON leaves raw are escaped too."""
    text = json.dumps(value, ensure_ascii=False)
    return text.translate({0x85: "\\u0085", 0x2028: "\\u2028", 0x2029: "\\u2029"})


def format_action(action: Action) -> str:
    """The canonical one-line spelling of `action`, e.g. `click(x=120, y=45)`; parses back."""
    fields = action.model_dump(exclude={"type"}, exclude_none=True)
    args = ", ".join(f"{k}={_quote(v)}" for k, v in fields.items())
    return f"{action.type}({args})"


# Tool schemas for harnesses that let the model answer with tool calls instead of text.
ACTION_TOOLS: list[dict[str, Any]] = [
    {"type": "function", "function": {"name": name, "description": desc, "parameters": {
        "type": "object", "properties": props, "required": required}}}
    for name, desc, props, required in [
        ("click", "Click at pixel (x, y) of the screenshot.",
         {"x": {"type": "integer"}, "y": {"type": "integer"}}, ["x", "y"]),
        ("click_element", "Click the element matching a CSS selector, or showing a text.",
         {"selector": {"type": "string"}, "text": {"type": "string"}}, []),
        ("type", "Type text into the focused element.", {"text": {"type": "string"}}, ["text"]),
        ("key", "Press a key or chord, e.g. Enter or Control+a.",
         {"keys": {"type": "string"}}, ["keys"]),
        ("scroll", "Scroll by (dx, dy) pixels with the pointer at (x, y).",
         {k: {"type": "integer"} for k in ("x", "y", "dx", "dy")}, []),
        ("goto", "Open a URL.", {"url": {"type": "string"}}, ["url"]),
        ("wait", "Wait a few seconds.", {"seconds": {"type": "number"}}, []),
        ("answer", "Finish the task, giving the answer.", {"text": {"type": "string"}}, ["text"]),
        ("fail", "Give up on the task, saying why.", {"reason": {"type": "string"}}, []),
    ]
]
