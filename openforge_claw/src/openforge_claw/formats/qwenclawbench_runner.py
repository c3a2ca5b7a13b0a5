"""Runs one QwenClawBench grader in its own process (`grader_process.command`: an isolated
interpreter, so nothing in the workspace, its cwd, can shadow a module it imports).

The job (`grader_process`: JSON on stdin, the result back after the nonce) is `{code,
transcript, workspace}`. The code is executed in a fresh namespace and its
`grade(transcript, workspace)` called, as the benchmark's runner does. The workspace is not
on `sys.path` (it is not in the benchmark either): a grader that imports the agent's module
puts the workspace on the path itself. The result is `{"ok": true, "scores": ...}` or
`{"ok": false, "kind": ..., "error": ...}` with kind

- `no_grade`: the code defines no grade();
- `grader_import`: the grader's own code imports a module this Python lacks, looked for
  only outside the workspace: the grader could not run here (an error, not the agent's);
- `workspace_import`: a module the grader's own code looked for in the workspace (a
  workspace folder was on `sys.path` when the import failed) is not there: the agent did
  not write it, scored 0;
- `exception`: grade() raised, or agent code it ran did: the benchmark scores that 0.

While grade() runs, the first time it touches what the agent controls (opens or lists
something in the workspace, runs code from it, starts a program) this process tells the
trusted side at once (`grader_process.note`): a grader process that then dies without a
result died, as far as anyone can tell, of the agent's doing, and is scored 0. Running code
from the workspace (CODE) is told before that code runs: executing code compiled from a
workspace file, opening a compiled module there (bytecode, whose code can name any file,
or an extension module), importing an extension module from it, loading a library from it.
After that, the agent's code runs in this process and could write any result: the trusted
side does not take the result as the agent's score (`qwenclawbench_grading`).
"""

from __future__ import annotations

import importlib.machinery
import os
import sys
import traceback
from typing import Any

from openforge_claw.grader_process import inside, note, serve

GRADER_FILE = "<automated checks>"
# Audit events that start a program (which may be, or run, the agent's code).
_PROGRAM_EVENTS = frozenset({"subprocess.Popen", "os.system", "os.exec", "os.posix_spawn",
                             "os.spawn", "os.fork", "os.forkpty", "pty.spawn"})
# Audit events whose first argument is a path (None: the cwd, for a listing).
_PATH_EVENTS = frozenset({"open", "os.listdir", "os.scandir"})
# Files whose opening loads compiled code: bytecode (a sourceless module, or a cached one)
# and extension modules. The code a .pyc holds names any file it likes, so the `exec` of
# it cannot be told apart by its file name; its opening can.
_COMPILED_SUFFIXES = tuple({*importlib.machinery.BYTECODE_SUFFIXES,
                            *importlib.machinery.EXTENSION_SUFFIXES})
PROGRAM, CODE, TOUCH = "started a program", "ran workspace code", "touched the workspace"


class _Watch:
    """What grade() does with the agent's workspace, seen through audit events (`audit`
    tells the trusted side the first time of each kind: PROGRAM, CODE, TOUCH) and the
    import system (`missed`: for each module no finder found, whether the search went
    through the workspace)."""

    def __init__(self, workspace: str) -> None:
        self.workspace = os.path.realpath(workspace)
        self.noted: set[str] = set()
        self.missed: dict[str, bool] = {}
        self._busy = False

    def _in_workspace(self, path: Any) -> bool:
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        if not isinstance(path, str | os.PathLike):
            return False
        return inside(os.path.abspath(path), self.workspace)

    def _from_workspace(self, code: Any) -> bool:
        """True for a code object compiled from a file in the workspace (not for
        `<automated checks>` or other `<...>` names, which are no files)."""
        filename = getattr(code, "co_filename", "")
        return not filename.startswith("<") and self._in_workspace(filename)

    def _compiled_in_workspace(self, path: Any) -> bool:
        # The import system asks for a cached .pyc that may not exist (the event comes
        # before the failure): only one that exists is code that can run.
        if not isinstance(path, str | bytes | os.PathLike):
            return False
        path = os.fsdecode(path)
        return (path.endswith(_COMPILED_SUFFIXES) and self._in_workspace(path)
                and os.path.isfile(path))

    def _note(self, kind: str, what: str) -> None:
        if kind not in self.noted:
            self.noted.add(kind)
            note(f"{kind}: {what}")

    def audit(self, event: str, args: tuple[Any, ...]) -> None:
        """sys.addaudithook's hook. It must never raise (that would fail the audited call)
        nor re-enter itself; once every kind is told, it costs one comparison."""
        if self._busy or len(self.noted) == 3:
            return
        self._busy = True
        try:
            self._see(event, args)
        except Exception:  # noqa: BLE001, S110 - a hook that raises breaks the grader
            pass
        finally:
            self._busy = False

    def _see(self, event: str, args: tuple[Any, ...]) -> None:
        if event in _PROGRAM_EVENTS:
            self._note(PROGRAM, f"{event} {str(args[:2])[:300]}")
        elif event == "exec" and self._from_workspace(args[0]):
            self._note(CODE, args[0].co_filename)
        elif event == "open" and args and self._compiled_in_workspace(args[0]):
            self._note(CODE, f"opened compiled code {args[0]!s}")
        elif event == "import" and len(args) > 1 and args[1] and self._in_workspace(args[1]):
            self._note(CODE, f"imported {args[0]} from {args[1]!s}")  # an extension module
        elif event == "ctypes.dlopen" and args and args[0] and self._in_workspace(args[0]):
            self._note(CODE, f"loaded the library {args[0]!s}")
        elif event in _PATH_EVENTS and args:
            path = "." if args[0] is None else args[0]
            if self._in_workspace(path):
                self._note(TOUCH, f"{event} {path!s}")

    # The import system: a finder at the end of sys.meta_path is asked only about modules
    # every other finder failed to find.
    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        searched = list(path) if path is not None else list(sys.path)
        self.missed[name] = any(self._in_workspace(entry or ".") for entry in searched
                                if isinstance(entry, str))
        return None

    def install(self) -> None:
        sys.addaudithook(self.audit)
        sys.meta_path.append(self)


def _jsonable(scores: Any) -> Any:
    if not isinstance(scores, dict):
        return None
    out: dict[str, Any] = {}
    for key, value in scores.items():
        out[str(key)] = value if isinstance(value, bool | int | float) else str(value)
    return out


def _failed_in_grader(exc: BaseException) -> bool:
    """True when the innermost frame of `exc`, the import machinery's own frames left out
    (`importlib.import_module`), is the grader's own code (not agent code it ran)."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__)
              if not f.filename.startswith("<frozen importlib")
              and os.sep + "importlib" + os.sep not in f.filename]
    return bool(frames) and frames[-1].filename == GRADER_FILE


def _missing_module(exc: ModuleNotFoundError, watch: _Watch) -> dict[str, Any]:
    """The result for a module that could not be imported: whose failure it is."""
    name = exc.name or ""
    failure = {"ok": False, "module": name, "error": f"ModuleNotFoundError: {exc}"}
    if not _failed_in_grader(exc):  # agent code (or a library) it ran failed to import
        return {**failure, "kind": "exception"}
    if watch.missed.get(name):
        return {**failure, "kind": "workspace_import",
                "error": f"the grader looked for the module {name!r} in the workspace and "
                         f"the agent did not provide it (ModuleNotFoundError: {exc})"}
    return {**failure, "kind": "grader_import"}


def run(job: dict[str, Any]) -> dict[str, Any]:
    watch = _Watch(job["workspace"])
    watch.install()
    namespace: dict[str, Any] = {}
    try:
        exec(compile(job["code"], GRADER_FILE, "exec"), namespace)  # noqa: S102
        grade = namespace.get("grade")
        if not callable(grade):
            return {"ok": False, "kind": "no_grade", "error": "the code defines no grade()"}
        scores = grade(job["transcript"], job["workspace"])
    except ModuleNotFoundError as exc:
        return _missing_module(exc, watch)
    except BaseException as exc:  # noqa: BLE001 - SystemExit from a grader is a failure too
        tail = "".join(traceback.format_exception(exc)[-3:])[-1500:]
        return {"ok": False, "kind": "exception", "error": f"{type(exc).__name__}: {exc}"[:500],
                "traceback": tail}
    return {"ok": True, "scores": _jsonable(scores)}


if __name__ == "__main__":
    serve(run)
