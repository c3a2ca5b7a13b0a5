"""`openforge check-template`: is a model's chat template append-only across turns?

For a few built-in conversations (tool calls, reasoning, several user turns), each assistant
turn is tokenized as the model would generate it; the next prompt is built both by bridging
(the gateway's way) and by a full re-render, and compared. Where the re-render rewrites
earlier tokens, the `exact` render policy opens a branch and `append` keeps the sampled ids.
"""

from __future__ import annotations

import json

from openforge.gateway.conversation import Message, Tool, ToolCall
from openforge.gateway.model import ModelBundle, load_model_bundle
from openforge.gateway.render import assistant_turn_ids


def check_template(model: str, renderer: str = "auto") -> bool:
    """Print whether `model`'s template is append-only across turns; True when it is.

    For a few built-in conversations (tool calls, reasoning, several user turns), each
    assistant turn is tokenized as the model would generate it; the next prompt is built
    both by bridging (the gateway's way) and by a full re-render, and compared. False
    when some turn could not extend the previous ids (the gateway would open a branch).
    """
    bundle = load_model_bundle(model, renderer)
    rend = bundle.renderer
    print(f"model: {model}  renderer: {type(rend).__name__} ({bundle.renderer_name})")
    print(f"is_prefix_stable: {rend.is_prefix_stable}")
    all_ok = True
    for title, tools, messages in _CHECK_CONVERSATIONS:
        lines, ok = _check_conversation(bundle, tools, messages)
        all_ok &= ok
        print(f"{'ok ' if ok else 'BAD'} {title}")
        for line in lines:
            print(f"      {line}")
    print("append-only: yes" if all_ok else
          "append-only: NO (the gateway opens a new branch where marked BAD)")
    return all_ok


def _check_conversation(bundle: ModelBundle, tools: list[Tool],
                        messages: list[Message]) -> tuple[list[str], bool]:
    rend = bundle.renderer
    specs = [t.to_renderer() for t in tools] or None
    lines: list[str] = []
    ok = True
    prompt: list[int] | None = None
    completion: list[int] = []
    i = 0
    while i < len(messages):
        if messages[i].role != "assistant":
            i += 1
            continue
        # messages[:i] is the context of this assistant turn; the previous turn's ids
        # must extend into this turn's prompt.
        full = list(rend.render_ids([m.to_renderer() for m in messages[:i]], tools=specs,
                                    add_generation_prompt=True))
        if prompt is not None:
            start = _last_assistant(messages[:i]) + 1
            new = [m.to_renderer() for m in messages[start:i]]
            bridged = rend.bridge_to_next_turn(prompt, completion, new, tools=specs)
            previous = prompt + completion
            turn = f"turn {i}"
            if bridged is None:
                if full[:len(previous)] == previous:
                    lines.append(f"{turn}: bridge declined; full re-render extends exactly")
                else:
                    ok = False
                    at = _first_difference(full, previous)
                    lines.append(f"{turn}: bridge declined and the re-render rewrites token "
                                 f"{at}: {_context(bundle, previous, full, at)}")
                prompt = full
            else:
                ids = list(bridged.token_ids)
                if ids == full:
                    lines.append(f"{turn}: bridge == full re-render ({len(ids)} tokens)")
                else:
                    at = _first_difference(ids, full)
                    lines.append(f"{turn}: bridge extends exactly; full re-render differs at "
                                 f"token {at}: {_context(bundle, ids, full, at)}")
                prompt = ids
        else:
            prompt = full
        completion = assistant_turn_ids(bundle, messages[:i], messages[i], tools)
        i += 1
    return lines, ok


def _last_assistant(messages: list[Message]) -> int:
    for j in range(len(messages) - 1, -1, -1):
        if messages[j].role == "assistant":
            return j
    return -1


def _first_difference(a: list[int], b: list[int]) -> int:
    for j, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return j
    return min(len(a), len(b))


def _context(bundle: ModelBundle, a: list[int], b: list[int], at: int) -> str:
    lo = max(0, at - 8)
    return (f"kept {bundle.decode(a[lo:at + 8])!r} vs re-rendered "
            f"{bundle.decode(b[lo:at + 8])!r}")


def _check_set() -> list[tuple[str, list[Tool], list[Message]]]:
    shell = Tool(name="shell", description="Run a shell command.",
                 parameters={"type": "object", "properties": {"cmd": {"type": "string"}},
                             "required": ["cmd"]})

    def call(cid: str, cmd: str) -> ToolCall:
        return ToolCall(id=cid, name="shell", arguments=json.dumps({"cmd": cmd}))

    sys_msg = Message(role="system", content="You are a careful coding agent.")
    tool_loop = [
        sys_msg, Message(role="user", content="How many files are here?"),
        Message(role="assistant", content="", tool_calls=[call("c1", "ls")]),
        Message(role="tool", content="a.txt\nb.txt", tool_call_id="c1"),
        Message(role="assistant", content="", tool_calls=[call("c2", "wc -l a.txt")]),
        Message(role="tool", content="3 a.txt", tool_call_id="c2"),
        Message(role="assistant", content="There are 2 files."),
    ]
    reasoning_tools = [
        sys_msg, Message(role="user", content="Fix the failing test."),
        Message(role="assistant", reasoning="Run the tests first.", content="",
                tool_calls=[call("c1", "pytest -q")]),
        Message(role="tool", content="1 failed", tool_call_id="c1"),
        Message(role="assistant", reasoning="Look at the test.", content="Looking.",
                tool_calls=[call("c2", "cat test_x.py")]),
        Message(role="tool", content="assert add(1, 2) == 3", tool_call_id="c2"),
        Message(role="assistant", reasoning="Done.", content="Fixed."),
    ]
    chat = [
        Message(role="user", content="Hi!"),
        Message(role="assistant", content="Hello! How can I help?"),
        Message(role="user", content="Name a prime."),
        Message(role="assistant", content="7"),
        Message(role="user", content="Another?"),
        Message(role="assistant", content="11"),
    ]
    reasoning_chat = [
        sys_msg, Message(role="user", content="2+2?"),
        Message(role="assistant", reasoning="Simple sum.", content="4"),
        Message(role="user", content="And 3+3?"),
        Message(role="assistant", reasoning="Again simple.", content="6"),
    ]
    return [
        ("tool loop (3 assistant turns, tool results between)", [shell], tool_loop),
        ("tool loop with reasoning", [shell], reasoning_tools),
        ("plain chat, 3 user turns", [], chat),
        ("chat with reasoning, 2 user turns", [], reasoning_chat),
    ]


_CHECK_CONVERSATIONS = _check_set()
