"""Plugin discovery through real installed distributions and real entry points.

Each test installs distributions with pip into a private target folder and runs the real
`openforge` CLI in a subprocess with that folder on PYTHONPATH: importlib.metadata then
finds their dist-info and entry points exactly as it would in site-packages. Removing the
folder from the path is the uninstall.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from harness_plugins import pip_install

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "plugins" / "openforge-example"


def openforge(*args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if path is not None:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(path), env.get("PYTHONPATH")]))
    return subprocess.run([sys.executable, "-m", "openforge.cli", *args], capture_output=True,
                          text=True, env=env, timeout=120)


def make_distribution(root: Path, dist: str, module: str, body: str) -> Path:
    """Write a one-module plugin distribution declaring the `openforge` entry point."""
    project = root / dist
    (project / module).mkdir(parents=True)
    (project / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"
        [project]
        name = "{dist}"
        version = "1.2.3"
        [project.entry-points.openforge]
        {module} = "{module}.plugin"
        [tool.setuptools]
        packages = ["{module}"]
    """))
    (project / module / "__init__.py").write_text("")
    (project / module / "plugin.py").write_text(textwrap.dedent(body))
    return project


HARNESS_PLUGIN = """
    from openforge.hookspecs import hookimpl
    from openforge.harness import Command, Harness

    class Dup(Harness):
        '''A harness named dup.'''
        def command(self, ctx):
            return Command(argv=["true"])

    @hookimpl
    def register_harnesses(register):
        register("dup", Dup)
"""


@pytest.fixture(scope="module")
def example_target(tmp_path_factory: pytest.TempPathFactory) -> Path:
    target = tmp_path_factory.mktemp("site")
    pip_install(target, EXAMPLE)
    return target


def test_builtin_plugins_come_from_openforge_distribution() -> None:
    out = openforge("plugins")
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert ["harness", "mini", "openforge"] in [row[:3] for row in rows]
    assert ["executor", "local", "openforge"] in [row[:3] for row in rows]


LOADS_ONLY_PLUGIN_MODULES = """
import importlib.metadata, sys
import openforge.plugins
before = set(sys.modules)
openforge.plugins.get_registry()
plugin_modules = {ep.module for ep in importlib.metadata.entry_points(group="openforge")}
allowed = plugin_modules | {m.rsplit(".", 1)[0] for m in plugin_modules}
# A plugin's own modules, and the parts of openforge its built-in plugin registers; a
# plugin may import openforge's small base modules (as plugins/openforge-example does).
own = {m.split(".")[0] for m in plugin_modules} - {"openforge"}
heavy = ("openforge.builtin.", "openforge.gateway", "openforge.executors", "openforge.training")
print(sorted(plugin_modules))
print(sorted(m for m in set(sys.modules) - before if m not in allowed
             and (m.split(".")[0] in own or m.startswith(heavy))))
"""


def test_loading_the_plugins_imports_only_their_plugin_modules() -> None:
    """Every rollout's supervisor and every CLI command loads the registry: a plugin module
    that imports its implementations (instead of registering them with `lazy`) costs each of
    them its imports. Checked on whatever plugins are installed here (`nox -s gui_plugins`
    checks the GUI benchmark plugins the same way)."""
    out = subprocess.run([sys.executable, "-c", LOADS_ONLY_PLUGIN_MODULES], capture_output=True,
                         text=True, check=True)
    loaded, extra = out.stdout.strip().splitlines()
    assert "openforge.builtin.plugin" in loaded
    assert extra == "[]", f"imported while loading the plugins: {extra}"


def test_an_agent_program_starts_without_the_plugin_machinery() -> None:
    """Every rollout's sandbox starts `python -m openforge.builtin.mini_agent`: importing it
    must not register the built-in plugins (pydantic models, entry points), which cost each
    rollout 0.35 s of CPU before its first model call."""
    probe = ("import sys, openforge.builtin.mini_agent; "
             "print(sorted(m for m in ('openforge.hookspecs', 'openforge.plugins', "
             "'openforge.builtin.plugin', 'pydantic', 'importlib.metadata') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout


def test_installed_example_plugin_is_listed_and_uninstall_removes_it(example_target: Path) -> None:
    installed = openforge("plugins", path=example_target)
    assert installed.returncode == 0, installed.stderr
    lines = installed.stdout.splitlines()
    one_shot = [line for line in lines if " one-shot " in line]
    assert one_shot and "openforge-example" in one_shot[0] and "0.1.0" in one_shot[0]
    assert any(" arithmetic " in line for line in lines)
    assert any(" exact-answer " in line for line in lines)

    uninstalled = openforge("plugins")
    assert " one-shot " not in uninstalled.stdout


def test_unknown_plugin_name_lists_installed_choices(example_target: Path) -> None:
    out = openforge("run", "--harness", "codx", path=example_target)
    assert out.returncode == 2
    line = out.stderr.strip()
    assert line.startswith("error: unknown harness 'codx'; installed: ") and "\n" not in line
    # Whatever else a developer's venv holds, the built-in and the just-installed one show.
    assert {"mini", "one-shot"} <= set(line.split("installed: ")[1].split(", "))


def test_a_name_two_distributions_register_is_listed_marked_and_refused_only_when_used(
        tmp_path: Path) -> None:
    first = make_distribution(tmp_path, "dup-one", "dup_one", HARNESS_PLUGIN)
    second = make_distribution(tmp_path, "dup-two", "dup_two", HARNESS_PLUGIN)
    target = tmp_path / "site"
    pip_install(target, first, second)
    out = openforge("plugins", path=target)
    assert out.returncode == 0, out.stderr
    dup = [line for line in out.stdout.splitlines() if " dup " in line]
    assert len(dup) == 2  # both listed, each marked
    assert "dup-one" in dup[0] and "CLASH: also registered by dup-two" in dup[0]
    assert "dup-two" in dup[1] and "CLASH: also registered by dup-one" in dup[1]
    assert " mini " in out.stdout  # everything else still listed
    used = openforge("run", "--harness", "dup", path=target)
    assert used.returncode == 2
    lines = used.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in used.stderr
    assert lines[0] == ("error: harness 'dup' is registered by both 'dup-one' and 'dup-two'; "
                        "uninstall one of them (`openforge plugins` lists both)")
    other = openforge("plugins", "--options", "mini", path=target)  # other names still work
    assert other.returncode == 0 and "max_steps" in other.stdout


def test_a_plugin_module_without_hooks_is_explained_in_one_line(tmp_path: Path) -> None:
    """An entry point that names a module with no @hookimpl (a package instead of its plugin
    module, or an install whose metadata predates a move) would otherwise add nothing,
    silently."""
    empty = make_distribution(tmp_path, "empty-plugin", "empty_plugin", "VERSION = 1\n")
    target = tmp_path / "site"
    pip_install(target, empty)
    out = openforge("plugins", path=target)
    assert out.returncode == 0
    assert out.stderr.strip().splitlines() == [
        "warning: openforge plugin 'empty_plugin' from distribution 'empty-plugin' registers "
        "nothing and is skipped (empty_plugin.plugin implements no openforge hook: point the entry "
        "point at the module with the @hookimpl functions, or reinstall the package if it "
        "moved them); fix it or `pip uninstall empty-plugin`"]
    assert " mini " in out.stdout


def test_plugin_that_fails_to_import_is_explained_in_one_line(tmp_path: Path) -> None:
    broken = make_distribution(tmp_path, "broken-plugin", "broken_plugin",
                               "import a_module_that_does_not_exist\n")
    target = tmp_path / "site"
    pip_install(target, broken)
    out = openforge("plugins", path=target)
    assert out.returncode == 0
    warning = ("warning: openforge plugin 'broken_plugin' from distribution 'broken-plugin' "
               "failed to import and is skipped (ModuleNotFoundError: No module named "
               "'a_module_that_does_not_exist'); fix it or `pip uninstall broken-plugin`")
    assert out.stderr.strip().splitlines() == [warning]  # no UserWarning, no source line
    assert " mini " in out.stdout  # the rest still works
    listed = [line for line in out.stdout.splitlines() if "broken-plugin" in line]
    assert len(listed) == 1 and "FAILED TO IMPORT" in listed[0]
    # The later "unknown harness" says why it may be unknown.
    used = openforge("run", "--harness", "broken", path=target)
    assert used.returncode == 2
    error = used.stderr.strip().splitlines()[-1]
    assert error.startswith("error: unknown harness 'broken'; installed: ")
    assert "note: plugin 'broken_plugin' from 'broken-plugin' failed to import " \
           "(ModuleNotFoundError: No module named 'a_module_that_does_not_exist')" in error


def test_misspelt_option_of_an_installed_plugin_is_refused(example_target: Path) -> None:
    out = openforge("run", "--harness", "one-shot", "--env", "arithmetic", "--reward",
                    "exact-answer", "--set", "harness_options.max_tokns=64", path=example_target)
    assert out.returncode == 2
    assert out.stderr.strip() == ("error: harness 'one-shot' option max_tokns: not a known "
                                  "option (valid: max_tokens)")
