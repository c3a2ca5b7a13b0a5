"""Write the files of a fetched upstream repository's HEAD into a folder, for the tests that
take a real checkout (OPENFORGE_CLAW_EVAL_PATH, OPENFORGE_QCB_PATH).

    python3 .ci/upstream_checkout.py GIT_DIR DEST

The fetched git directories may lack their largest blobs (images the tests do not read), so
`git archive` and `git checkout` refuse them; this writes every file whose blob is present
and prints how many were absent. Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main(git_dir: str, dest: str) -> None:
    git = ["git", "--git-dir", git_dir]
    listing = subprocess.run([*git, "ls-tree", "-r", "-z", "HEAD"], check=True,
                             capture_output=True).stdout.split(b"\0")
    entries = []  # (object id, path, executable)
    for line in filter(None, listing):
        meta, path = line.split(b"\t", 1)
        mode, kind, obj = meta.split()
        if kind == b"blob":
            entries.append((obj.decode(), path.decode(), mode == b"100755"))
    # One `cat-file --batch` for all blobs: "<id> missing" for those the fetch left out.
    batch = subprocess.Popen([*git, "cat-file", "--batch"], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE)
    assert batch.stdin and batch.stdout
    batch.stdin.write(b"".join(f"{obj}\n".encode() for obj, _, _ in entries))
    batch.stdin.close()
    missing = 0
    for _obj, path, executable in entries:
        header = batch.stdout.readline().split()
        if header[-1] == b"missing":
            missing += 1
            continue
        data = batch.stdout.read(int(header[2]))
        batch.stdout.read(1)  # the newline after each object
        target = Path(dest, path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        if executable:
            target.chmod(0o755)
    batch.wait()
    print(f"{git_dir}: {len(entries) - missing} files into {dest}, {missing} absent from the fetch")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: python3 .ci/upstream_checkout.py GIT_DIR DEST")
    main(sys.argv[1], sys.argv[2])
