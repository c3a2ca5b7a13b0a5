"""The stand-in VM: a local process that speaks the HTTP protocol of OSWorld's in-VM server.

OSWorld's `PythonController` and `SetupController` talk to a Flask server inside the VM on
port 5000. This process answers the same routes with the same payloads, over a "disk" that
is a folder (`--root`): the guest's home is `ROOT/home/user`, the desktop's state is
`ROOT/state.json` (see `pyautogui.py` beside this file). Commands really run, as local
processes with that HOME and this folder first on PYTHONPATH, so `python -c "import
pyautogui; pyautogui.click(...)"` drives the stand-in desktop.

    python server.py --root DIR --port-file FILE

Standard library only, like the `vmrun` stand-in that starts it.
"""

from __future__ import annotations

import argparse
import email.parser
import email.policy
import json
import os
import struct
import subprocess
import sys
import zlib
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import pyautogui  # noqa: E402 - the stand-in beside this file, for the screen geometry

GUEST_HOME = "/home/user"


def png(width: int, height: int, rows: list[bytes]) -> bytes:
    """An RGB PNG from raw rows (3 bytes a pixel); enough of the format for a screenshot."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))
    raw = b"".join(b"\x00" + row for row in rows)
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw))
            + chunk(b"IEND", b""))


class VM:
    def __init__(self, root: Path) -> None:
        self.root = root
        self.home = root / GUEST_HOME.lstrip("/")
        self.home.mkdir(parents=True, exist_ok=True)
        self.state_path = root / "state.json"

    def state(self) -> dict:
        if self.state_path.is_file():
            return json.loads(self.state_path.read_text())
        return {"focused": False, "text": "", "pointer": [0, 0], "events": []}

    def local(self, guest_path: str) -> Path:
        """A guest path (`/home/user/x`, `~/x`) as a path under the root."""
        if guest_path.startswith("~"):
            guest_path = GUEST_HOME + guest_path[1:]
        return self.root / guest_path.lstrip("/")

    def screenshot(self) -> bytes:
        """The desktop drawn as blocks: title bar, editor (lighter when focused), one dark
        cell per typed character, so the picture changes with the state."""
        state = self.state()
        width, height = pyautogui.WIDTH, pyautogui.HEIGHT
        left, top, right, bottom = pyautogui.EDITOR
        canvas = [bytearray(b"\x50\x50\x58" * width) for _ in range(height)]
        for y in range(0, 40):
            canvas[y][:] = b"\x20\x40\x90" * width
        paper = b"\xff\xff\xff" if state["focused"] else b"\xe8\xe8\xe0"
        for y in range(top, bottom):
            canvas[y][left * 3:right * 3] = paper * (right - left)
        col, row = 0, 0
        for char in state["text"]:
            if char == "\n" or col >= (right - left - 8) // 8:
                col, row = 0, row + 1
                if char == "\n":
                    continue
            x0, y0 = left + 4 + col * 8, top + 4 + row * 14
            if y0 + 10 < bottom and not char.isspace():
                for y in range(y0, y0 + 10):
                    canvas[y][x0 * 3:(x0 + 6) * 3] = b"\x10\x10\x10" * 6
            col += 1
        return png(width, height, [bytes(r) for r in canvas])

    def run(self, command: list[str] | str, shell: bool) -> dict:
        """Run a guest command here: `python` is this interpreter, HOME the guest home."""
        env = dict(os.environ, HOME=str(self.home), OSW_VM_STATE=str(self.state_path),
                   PYTHONPATH=str(HERE))
        if isinstance(command, list) and command and command[0] in ("python", "python3"):
            command = [sys.executable, *command[1:]]
        try:
            proc = subprocess.run(command, shell=shell, cwd=self.home, env=env, capture_output=True,
                                  text=True, timeout=60, stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return {"status": "error", "message": str(exc), "output": "", "error": str(exc),
                    "returncode": -1}
        return {"status": "success", "output": proc.stdout, "error": proc.stderr,
                "returncode": proc.returncode}


class Handler(BaseHTTPRequestHandler):
    server: Server

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def send(self, status: int, body: bytes | dict, content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def form(self) -> dict[str, bytes]:
        """Form fields: urlencoded (`requests.post(data=dict)`) or multipart (uploads)."""
        raw, kind = self.body(), self.headers.get("Content-Type", "")
        if kind.startswith("multipart/form-data"):
            message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
                f"Content-Type: {kind}\r\n\r\n".encode() + raw)
            return {part.get_param("name", header="content-disposition"):
                    part.get_payload(decode=True) for part in message.iter_parts()}
        return {k: v[0].encode() for k, v in parse_qs(raw.decode()).items()}

    def do_GET(self) -> None:  # noqa: N802
        vm = self.server.vm
        if self.path == "/screenshot":
            self.send(200, vm.screenshot(), "image/png")
        elif self.path == "/terminal":
            self.send(200, {"output": ""})
        elif self.path == "/accessibility":
            state = vm.state()
            tree = (f'<desktop-frame><application name="notes"><text name="editor" '
                    f'focused="{str(state["focused"]).lower()}">{state["text"]}</text>'
                    f'</application></desktop-frame>')
            self.send(200, {"AT": tree})
        else:
            self.send(404, {"status": "error", "message": f"no route GET {self.path}"})

    def do_POST(self) -> None:  # noqa: N802
        vm = self.server.vm
        if self.path in ("/execute", "/setup/execute"):
            payload = json.loads(self.body() or b"{}")
            self.send(200, vm.run(payload.get("command", []), bool(payload.get("shell"))))
        elif self.path == "/setup/launch":
            payload = json.loads(self.body() or b"{}")
            command = payload.get("command", [])
            if isinstance(command, list) and command and command[0] in ("python", "python3"):
                command = [sys.executable, *command[1:]]
            subprocess.Popen(command, shell=bool(payload.get("shell")), cwd=vm.home,
                             env=dict(os.environ, HOME=str(vm.home)), start_new_session=True,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            self.send(200, {"status": "success", "message": "launched"})
        elif self.path == "/file":
            target = vm.local(self.form().get("file_path", b"").decode())
            if target.is_file():
                self.send(200, target.read_bytes(), "application/octet-stream")
            else:
                self.send(404, {"status": "error", "message": "file not found"})
        elif self.path == "/setup/upload":
            fields = self.form()
            target = vm.local(fields["file_path"].decode())
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(fields["file_data"])
            self.send(200, {"status": "success", "message": "uploaded"})
        elif self.path == "/screen_size":
            self.send(200, {"width": pyautogui.WIDTH, "height": pyautogui.HEIGHT})
        elif self.path in ("/setup/open_file", "/setup/activate_window", "/setup/close_window",
                           "/setup/change_wallpaper"):
            self.body()
            self.send(200, {"status": "success", "message": "ok"})
        else:
            self.body()
            self.send(404, {"status": "error", "message": f"no route POST {self.path}"})


class Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, vm: VM) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.vm = vm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--root", type=Path, required=True)
    parser.add_argument("--port-file", type=Path, required=True)
    args = parser.parse_args()
    server = Server(VM(args.root))
    args.port_file.write_text(str(server.server_address[1]))
    server.serve_forever()


if __name__ == "__main__":
    main()
