"""A stand-in for VMware's `vmrun` that "runs" the stand-in VM (vm/server.py) instead.

OSWorld's `vmware` provider manages its VM only through `vmrun -T ws|fusion COMMAND VMX ...`
(start, list, getGuestIPAddress, snapshot, revertToSnapshot, stop). Put a `vmrun` that runs
this file first on PATH and DesktopEnv(provider_name="vmware", path_to_vm=VMX) drives the
stand-in VM with its own, unmodified provider and controllers.

A "VM" is the folder holding VMX: `disk/` is its disk (the stand-in's root), `run/` its
running process, `snapshots/NAME/` its snapshots. `getGuestIPAddress` prints
`127.0.0.1:SERVER_PORT:CHROMIUM:VNC:VLC`, the host:ports form DesktopEnv accepts from a
provider (its docker provider answers the same way). Running VMs are listed in the file
named by $OSW_VMRUN_REGISTRY. Standard library only.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REGISTRY = Path(os.environ.get("OSW_VMRUN_REGISTRY", HERE / ".vmrun-registry"))


def pid_of(vm: Path) -> int | None:
    pid_file = vm / "run" / "pid"
    if not pid_file.is_file():
        return None
    pid = int(pid_file.read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return None
    return pid


def registered() -> list[Path]:
    if not REGISTRY.is_file():
        return []
    return [Path(line) for line in REGISTRY.read_text().splitlines() if line.strip()]


def start(vmx: Path) -> None:
    vm = vmx.parent
    if pid_of(vm):
        return
    (vm / "disk").mkdir(exist_ok=True)
    run = vm / "run"
    shutil.rmtree(run, ignore_errors=True)
    run.mkdir()
    log = open(run / "server.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen([sys.executable, str(HERE / "vm" / "server.py"), "--root",
                             str(vm / "disk"), "--port-file", str(run / "port")],
                            stdout=log, stderr=log, stdin=subprocess.DEVNULL,
                            start_new_session=True)
    (run / "pid").write_text(str(proc.pid))
    for _ in range(200):
        if (run / "port").is_file() and (run / "port").read_text():
            break
        time.sleep(0.05)
    else:
        sys.exit("Error: the stand-in VM did not come up")
    if str(vmx) not in map(str, registered()):
        with REGISTRY.open("a") as f:
            f.write(f"{vmx}\n")


def stop(vmx: Path) -> None:
    pid = pid_of(vmx.parent)
    if pid:
        os.killpg(pid, signal.SIGTERM)
    shutil.rmtree(vmx.parent / "run", ignore_errors=True)


def main(argv: list[str]) -> int:
    if argv[:1] == ["-T"]:
        argv = argv[2:]
    command, args = argv[0], argv[1:]
    if command == "list":
        running = [vmx for vmx in registered() if pid_of(vmx.parent)]
        print(f"Total running VMs: {len(running)}")
        for vmx in running:
            print(vmx)
        return 0
    vmx = Path(os.path.abspath(args[0]))
    vm = vmx.parent
    if command == "start":
        start(vmx)
    elif command == "stop":
        stop(vmx)
    elif command == "getGuestIPAddress":
        if not pid_of(vm):
            print("Error: The virtual machine is not powered on")
            return 1
        print(f"127.0.0.1:{(vm / 'run' / 'port').read_text()}:9222:8006:8080")
    elif command == "snapshot":
        target = vm / "snapshots" / args[1]
        shutil.rmtree(target, ignore_errors=True)
        shutil.copytree(vm / "disk", target)
    elif command == "revertToSnapshot":
        # The VM keeps running; its disk goes back (a fresh one without such a snapshot).
        source = vm / "snapshots" / args[1]
        shutil.rmtree(vm / "disk", ignore_errors=True)
        if source.is_dir():
            shutil.copytree(source, vm / "disk")
        (vm / "disk" / "home" / "user").mkdir(parents=True, exist_ok=True)
    else:
        print(f"Error: unknown command {command}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
