"""A stand-in for `desktop_env.desktop_env.DesktopEnv` (PyPI desktop-env 1.0.2), for machines
where the real package cannot be installed (it pins torch 2.5 / transformers 4.35 and pulls
CUDA wheels, easyocr, librosa, playwright...).

It keeps the real class's interface and wire behaviour, so the tests that drive it also run
against the real package (set OPENFORGE_OSWORLD_PYTHON to an interpreter that has it):

- the provider is the `vmware` one: `vmrun -T ws start|list|getGuestIPAddress|
  revertToSnapshot|stop VMX` as subprocesses, a `host:port:...` answer selecting the ports;
- the controller speaks the in-VM server's HTTP protocol: GET /screenshot, POST /execute
  with `["python", "-c", "import pyautogui; import time; pyautogui.FAILSAFE = False; CMD"]`,
  POST /setup/execute, /setup/launch, /file;
- `evaluate()` follows the real order: postconfig, `infeasible` (1 only after FAIL), 0 after
  FAIL, then getters and metrics with `and`/`or` conjunction. Only a few getters (rule,
  vm_command_line, vm_file) and metrics (exact_match, check_include_exclude) are here.

Standard library only.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.parse
import urllib.request
from typing import Any

PREFIX = "import pyautogui; import time; pyautogui.FAILSAFE = False; {command}"


def _http(url: str, data: bytes | None = None, headers: dict[str, str] | None = None,
          timeout: float = 90) -> tuple[int, bytes]:
    request = urllib.request.Request(url, data=data, headers=headers or {},
                                     method="POST" if data is not None else "GET")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def _vmrun(*args: str) -> str:
    proc = subprocess.run(["vmrun", "-T", "ws", *args], capture_output=True, text=True)
    return proc.stdout.strip()


def exact_match(result: Any, rules: dict[str, Any]) -> float:
    return 1.0 if result == rules["expected"] else 0.0


def check_include_exclude(result: str | None, rules: dict[str, list[str]]) -> float:
    if result is None:
        return 0.0
    ok = all(r in result for r in rules.get("include", [])) and \
        all(r not in result for r in rules.get("exclude", []))
    return 1.0 if ok else 0.0


METRICS = {"exact_match": exact_match, "check_include_exclude": check_include_exclude}


class DesktopEnv:
    def __init__(self, provider_name: str = "vmware", region: str | None = None,
                 path_to_vm: str | None = None, snapshot_name: str = "init_state",
                 action_space: str = "pyautogui", cache_dir: str = "cache",
                 screen_size: tuple[int, int] = (1920, 1080), headless: bool = False,
                 require_a11y_tree: bool = True, require_terminal: bool = False,
                 os_type: str = "Ubuntu", enable_proxy: bool = False,
                 client_password: str = "") -> None:
        if provider_name != "vmware":
            raise ValueError(f"Invalid provider name: {provider_name} (the stand-in has vmware)")
        if not path_to_vm:
            raise ValueError("the stand-in needs path_to_vm")
        assert action_space in ["computer_13", "pyautogui"]
        self.path_to_vm = os.path.abspath(path_to_vm)
        self.snapshot_name = snapshot_name
        self.action_space = action_space
        self.cache_dir_base = cache_dir
        self.is_environment_used = True  # vmware starts dirty, as in the real class
        self.action_history: list[Any] = []
        self.evaluator: dict[str, Any] = {}
        self._start_emulator()

    # provider + controllers ------------------------------------------------------------

    def _start_emulator(self) -> None:
        while self.path_to_vm not in _vmrun("list").splitlines():
            _vmrun("start", self.path_to_vm, "nogui")
            time.sleep(0.2)
        parts = _vmrun("getGuestIPAddress", self.path_to_vm, "-wait").split(":")
        self.vm_ip = parts[0]
        self.server_port = int(parts[1]) if len(parts) > 1 else 5000
        self.http_server = f"http://{self.vm_ip}:{self.server_port}"

    def _execute(self, route: str, command: Any, shell: bool = False) -> dict[str, Any]:
        status, body = _http(self.http_server + route,
                             json.dumps({"command": command, "shell": shell}).encode(),
                             {"Content-Type": "application/json"})
        if status != 200:
            raise RuntimeError(f"{route} answered {status}")
        return json.loads(body)

    def _setup(self, config: list[dict[str, Any]]) -> None:
        for step in config:
            kind, params = step["type"], step.get("parameters", {})
            if kind in ("execute", "command"):
                self._execute("/setup/execute", params["command"], params.get("shell", False))
            elif kind == "launch":
                self._execute("/setup/launch", params["command"], params.get("shell", False))
            elif kind == "sleep":
                time.sleep(params["seconds"])
            else:
                raise NotImplementedError(f"the stand-in has no setup step {kind!r}")

    # the gym interface -----------------------------------------------------------------

    def reset(self, task_config: dict[str, Any] | None = None, seed: Any = None,
              options: Any = None) -> dict[str, Any]:
        self.action_history.clear()
        if self.is_environment_used:
            _vmrun("revertToSnapshot", self.path_to_vm, self.snapshot_name)
            self._start_emulator()
            self.is_environment_used = False
        if task_config is not None:
            self.task_id = task_config["id"]
            self.cache_dir = os.path.join(self.cache_dir_base, self.task_id)
            os.makedirs(self.cache_dir, exist_ok=True)
            self.instruction = task_config["instruction"]
            self.evaluator = task_config["evaluator"]
            config = task_config.get("config", [])
            self._setup(config)
            if config:
                self.is_environment_used = True
        return self._get_obs()

    def _get_obs(self) -> dict[str, Any]:
        return {"screenshot": self.render(), "accessibility_tree": None, "terminal": None,
                "instruction": getattr(self, "instruction", None)}

    def render(self, mode: str = "rgb_array") -> bytes:
        status, body = _http(self.http_server + "/screenshot", timeout=10)
        if status != 200 or body[:8] != b"\x89PNG\r\n\x1a\n":
            raise RuntimeError("no screenshot")
        return body

    def step(self, action: Any, pause: float = 2) -> tuple[dict[str, Any], int, bool, dict]:
        self.action_history.append(action)
        self.is_environment_used = True
        done, info = False, {}
        if action == "FAIL":
            done, info = True, {"fail": True}
        elif action == "DONE":
            done, info = True, {"done": True}
        elif action == "WAIT":
            time.sleep(pause)
        elif self.action_space == "pyautogui":
            command = action["command"] if isinstance(action, dict) else action
            self._execute("/execute", ["python", "-c", PREFIX.format(command=command)])
        else:
            self._execute("/execute", ["python", "-c", PREFIX.format(
                command=self._computer_13(action))])
        time.sleep(pause)
        return self._get_obs(), 0, done, info

    @staticmethod
    def _computer_13(action: dict[str, Any]) -> str:
        kind = action["action_type"]
        if kind == "CLICK":
            return f"pyautogui.click(x={action['x']}, y={action['y']})"
        if kind == "TYPING":
            return f"pyautogui.typewrite({action['text']!r})"
        if kind == "PRESS":
            return f"pyautogui.press('{action['key']}')"
        if kind == "HOTKEY":
            return f"pyautogui.hotkey({', '.join(repr(k) for k in action['keys'])})"
        if kind == "SCROLL":
            return f"pyautogui.hscroll({action['dx']}); pyautogui.vscroll({action['dy']})"
        raise NotImplementedError(f"the stand-in has no computer_13 action {kind}")

    # evaluation ------------------------------------------------------------------------

    def _get(self, config: dict[str, Any] | None) -> Any:
        if config is None:
            return None
        kind = config["type"]
        if kind == "rule":
            return config["rules"]
        if kind == "vm_command_line":
            return self._execute("/execute", config["command"], config.get("shell", False))["output"]
        if kind == "vm_file":
            form = urllib.parse.urlencode({"file_path": config["path"]}).encode()
            status, body = _http(self.http_server + "/file", form,
                                 {"Content-Type": "application/x-www-form-urlencoded"})
            if status != 200:
                return None
            path = os.path.join(self.cache_dir, config["dest"])
            with open(path, "wb") as f:
                f.write(body)
            return path
        raise NotImplementedError(f"the stand-in has no getter {kind!r}")

    def evaluate(self) -> float:
        self._setup(self.evaluator.get("postconfig", []))
        last = self.action_history[-1] if self.action_history else None
        if self.evaluator["func"] == "infeasible":
            return 1 if last == "FAIL" else 0
        if last == "FAIL":
            return 0
        funcs = self.evaluator["func"]
        many = isinstance(funcs, list)
        funcs = funcs if many else [funcs]
        results = self.evaluator.get("result") if many else [self.evaluator.get("result")]
        expected = self.evaluator.get("expected") if many else [self.evaluator.get("expected")]
        options = self.evaluator.get("options") if many else [self.evaluator.get("options")]
        conj = self.evaluator.get("conj", "and")
        scores = []
        for i, func in enumerate(funcs):
            got = self._get(results[i] if results else None)
            want = self._get(expected[i]) if expected else None
            opts = (options[i] if options else None) or {}
            score = METRICS[func](got, want, **opts) if want is not None \
                else METRICS[func](got, **opts)
            if conj == "and" and float(score) == 0.0:
                return 0
            if conj == "or" and float(score) == 1.0:
                return 1
            scores.append(score)
        return sum(scores) / len(scores) if conj == "and" else max(scores)

    def close(self) -> None:
        _vmrun("stop", self.path_to_vm)
