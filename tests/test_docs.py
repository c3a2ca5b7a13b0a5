"""What docs/ states is what the code does: the store schema, the scripted-policy format, the
`tasks` environment's example, the harness table of the README."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import pytest

from openforge.store import COMPRESS_OVER, Store

DOCS = Path(__file__).resolve().parents[1] / "docs"
README = Path(__file__).resolve().parents[1] / "README.md"


def fenced(page: Path, language: str) -> list[str]:
    """The page's fenced code blocks of `language`."""
    return re.findall(rf"```{language}\n(.*?)```", page.read_text(), re.S)


def test_every_table_and_column_of_the_store_is_documented(tmp_path: Path) -> None:
    Store(tmp_path / "store.sqlite").close()
    db = sqlite3.connect(tmp_path / "store.sqlite")
    page = (DOCS / "run-folder.md").read_text()
    tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
    assert set(tables) == {"schema_version", "sessions", "calls", "images", "results"}
    for table in tables:
        assert f"**{table}**" in page or f"`{table}`" in page, table
        for column in (r[1] for r in db.execute(f"PRAGMA table_info({table})")):
            if table != "schema_version":
                assert f"`{column}`" in page, f"{table}.{column} is not on docs/run-folder.md"
    assert COMPRESS_OVER == 4096 and "larger than 4096 bytes" in page


def test_the_scripted_policy_page_s_scripts_load(tmp_path: Path) -> None:
    from openforge.gateway.engines.scripted import load_script

    blocks = fenced(DOCS / "scripted-policies.md", "yaml")
    assert len(blocks) >= 2
    for n, block in enumerate(blocks):
        path = tmp_path / f"script{n}.yaml"
        path.write_text(block)
        assert load_script(path).entries, block


def test_the_tasks_page_s_example_is_a_task_set(tmp_path: Path) -> None:
    from openforge.builtin.tasks import TasksEnvironment

    [jsonl] = fenced(DOCS / "tasks.md", "jsonl")
    path = tmp_path / "tasks.jsonl"
    path.write_text(jsonl)
    tasks = list(TasksEnvironment(path=path).tasks())
    assert len(tasks) == len(jsonl.strip().splitlines()) >= 3
    kinds = {next(iter(t.data["check"])) for t in tasks if "check" in t.data}
    assert kinds == {"command", "files", "function"}


@pytest.mark.parametrize("page", sorted(p.name for p in DOCS.glob("*.md")) + ["README.md"])
def test_openforge_commands_in_the_docs_use_real_options(page: str) -> None:
    """Every `openforge COMMAND --flag` written in a page is a flag COMMAND has."""
    from click.testing import CliRunner

    from openforge.cli import cli

    text = (README if page == "README.md" else DOCS / page).read_text()
    flags: dict[str, set[str]] = {}
    for name, command in cli.commands.items():
        flags[name] = {opt for p in command.params for opt in p.opts if opt.startswith("-")}
        flags[name] |= {"--help"}
    for line in re.findall(r"openforge (\w[\w-]*)([^\n`]*)", text):
        command, rest = line
        if command not in flags:
            continue
        for flag in re.findall(r"(?<![\w.=/])(--[a-z][\w-]*)", rest):
            assert flag in flags[command], f"{page}: `openforge {command} ... {flag}`"
    assert CliRunner().invoke(cli, ["--help"]).exit_code == 0


def test_readme_opens_with_the_two_set_up_commands() -> None:
    blocks = fenced(README, "bash")
    text = README.read_text()
    assert text.index("```bash") < text.index("\n## ")  # before any section
    assert blocks[0].strip().startswith("python3 -m venv .venv")
    assert blocks[1].strip() == "pip install nox && nox -s tests"


def test_the_scaffold_page_names_the_pin_the_scaffold_writes() -> None:
    from openforge.scaffold import OPENFORGE_REQUIREMENT

    page = (DOCS / "writing-a-plugin.md").read_text()
    assert OPENFORGE_REQUIREMENT in page


def test_every_declared_pytest_marker_is_used() -> None:
    import tomllib

    root = README.parent
    config = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    sources = "".join(p.read_text() for p in (root / "tests").rglob("*.py"))
    for marker in config.get("markers", []):
        name = marker.split(":")[0].strip()
        assert f"mark.{name}" in sources, f"marker {name!r} is declared but no test uses it"


def test_every_test_the_sandboxing_page_cites_exists() -> None:
    """Each guarantee on docs/sandboxing.md names the tests that back it: `file.py::test` (or
    `::test`, of the last file named in the same paragraph). Every one of them exists."""
    root = README.parent
    sources = {p.name: p.read_text() for p in root.rglob("test_*.py") if ".nox" not in p.parts}
    cited, missing = 0, []
    for paragraph in (DOCS / "sandboxing.md").read_text().split("\n\n"):
        last = None
        for file, name in re.findall(r"`(?:tests/)?(test_\w+\.py)?::(test_\w+)`", paragraph):
            last = file or last
            cited += 1
            if last is None or not re.search(rf"def {name}\(", sources.get(last, "")):
                missing.append(f"{last}::{name}")
    assert cited >= 20 and missing == []
