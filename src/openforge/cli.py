"""The `openforge` command line. Each command is thin: it builds a config and calls a module."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from openforge import __version__
from openforge.errors import OpenforgeError
from openforge.plugins import KINDS


class _Group(click.Group):
    """Turns `OpenforgeError`s into one line on stderr and their exit code, never a traceback."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except OpenforgeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(exc.exit_code)


config_option = click.option(
    "--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
    help="A YAML or TOML config file.")
set_option = click.option(
    "--set", "overrides", multiple=True, metavar="KEY=VALUE",
    help="Override one config value, e.g. --set engine.name=scripted (repeatable).")


@click.group(cls=_Group)
@click.version_option(__version__, prog_name="openforge")
def cli() -> None:
    """openforge: train harness-native agents with reinforcement learning."""


@cli.command()
@click.option("--options", "options_of", metavar="NAME",
              help="Print the options plugin NAME takes: name, type, default, description.")
@click.option("--kind", type=click.Choice(list(KINDS)),
              help="With --options: only the plugin of this kind (for names several kinds use).")
def plugins(options_of: str | None, kind: str | None) -> None:
    """List installed plugins: kind, name, distribution, version, description.

    A name that two distributions register is listed for both and marked CLASH; a plugin
    that failed to import is listed as such (and explained on stderr).
    """
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from openforge.plugins import get_registry

    registry = get_registry()
    console = Console(width=200)
    if options_of is not None:
        _print_options(registry, options_of, kind, console)
        return
    table = Table("kind", "name", "distribution", "version", "description", box=None)
    for reg in registry.registrations():
        # Descriptions are plain text: "openforge[verl]" is not rich markup.
        note = (f"CLASH: also registered by {', '.join(reg.clashes_with)}; " if reg.clashes_with
                else "")
        table.add_row(reg.kind, reg.name, reg.distribution, reg.version,
                      escape(note + reg.description))
    for failure in registry.failures:
        table.add_row("?", failure.entry_point, failure.distribution, "",
                      escape(f"{failure.what.upper()}: {failure.error}"))
    console.print(table)


def _print_options(registry: Any, name: str, kind: str | None, console: Any) -> None:
    from rich.markup import escape
    from rich.table import Table

    from openforge.options import describe_model

    found = [r for r in registry.registrations(kind) if r.name == name]
    if not found:
        known = sorted({r.name for r in registry.registrations(kind)})
        raise OpenforgeError(f"no {kind or 'plugin'} named '{name}'; installed: {', '.join(known)}")
    for reg in found:
        model = reg.options_model()
        console.print(f"[bold]{reg.kind} {escape(reg.name)}[/bold] ({escape(reg.distribution)}): "
                      f"{escape(reg.description)}")
        rows = describe_model(model)
        if not rows:
            console.print("  takes no options\n")
            continue
        table = Table("option", "type", "default", "description", box=None, padding=(0, 2, 0, 2))
        for row in rows:
            table.add_row(row.name, escape(row.type), escape(row.default), escape(row.description))
        console.print(table)
        console.print()


@cli.command()
@config_option
@set_option
@click.option("--harness", help="Harness plugin name (default: mini).")
@click.option("--env", "environment", help="Environment plugin name (default: demo).")
@click.option("--reward", help="Reward plugin name (default: checker).")
@click.option("--executor", help="Executor plugin name (default: local).")
@click.option("--engine", help="Engine plugin name (default: local).")
@click.option("--model", help="Model directory for the engine (default: the tiny model).")
@click.option("--script", type=click.Path(path_type=Path), help="Reply script for the scripted engine.")
@click.option("--vllm-url", help="URL of a vLLM server, for --engine vllm.")
@click.option("-k", "k", type=int, help="Attempts per task (default: 1).")
@click.option("--concurrency", type=int, help="Rollouts at once (default: 4).")
@click.option("--limit", type=click.IntRange(min=1), help="Run at most this many tasks.")
@click.option("--task", "tasks", multiple=True, help="Run only this task id (repeatable).")
@click.option("--split", help="Run only the environment's tasks of this split (e.g. train, test).")
@click.option("--timeout", "timeout_s", type=float, help="Per-rollout timeout in seconds.")
@click.option("--runs-dir", type=click.Path(path_type=Path), help="Where run directories go (default: runs).")
@click.option("--resume", type=click.Path(path_type=Path, exists=True, file_okay=False),
              help="Finish an interrupted run directory without repeating what is done.")
def run(config_path: Path | None, overrides: tuple[str, ...], resume: Path | None,
        **flags: Any) -> None:
    """Run tasks x k attempts through a harness, record every call, score, report."""
    from openforge import plugins as plugin_registry
    from openforge.config import load_run_config

    flag_names = {p.name: p.opts[0] for p in click.get_current_context().command.params}
    given = [flag_names[name] for name, value in flags.items() if value not in (None, ())]
    given += ["--config"] * bool(config_path) + ["--set"] * bool(overrides)
    if resume is not None and given:
        # A resumed run must finish with the settings it started with, or its attempts
        # would not be comparable; say so rather than ignore the options.
        raise OpenforgeError(
            f"--resume finishes a run with the config it started with ({resume / 'config.yaml'}); "
            f"drop {', '.join(given)}, or start a new run")

    dotted: dict[str, Any] = {
        "harness": flags["harness"], "environment": flags["environment"],
        "reward": flags["reward"], "executor": flags["executor"],
        "engine.name": flags["engine"], "engine.model": flags["model"],
        "k": flags["k"], "concurrency": flags["concurrency"], "limit": flags["limit"],
        "tasks": list(flags["tasks"]) or None, "split": flags["split"],
        "timeout_s": flags["timeout_s"],
        "runs_dir": flags["runs_dir"],
    }
    if flags["script"]:
        dotted["engine.options.script"] = str(flags["script"])
    if flags["vllm_url"]:
        dotted["engine.options.url"] = flags["vllm_url"]
    config = load_run_config(config_path, overrides, dotted)
    # Every plugin's options checked now, before anything starts (each plugin checks them
    # again, the same way, when it is built).
    for kind, name, options in config.plugins():
        plugin_registry.check(kind, name, options)

    from openforge.runner import run_from_config

    run_from_config(config, resume=resume)


@cli.command()
@config_option
@set_option
@click.option("--host", help="Address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network).")
@click.option("--port", type=click.IntRange(0, 65535),
              help="Port (default: a free one, printed at start).")
@click.option("--engine", help="Engine plugin name (default: local).")
@click.option("--model", help="Model directory for the engine (default: the tiny model).")
@click.option("--store", "store_path", type=click.Path(path_type=Path), default=Path("gateway.sqlite"),
              show_default=True, help="SQLite file the calls are recorded in.")
@click.option("--workers", type=click.IntRange(1, 64),
              help="Gateway processes, one core each (default 1); each session is served by one.")
def serve(config_path: Path | None, overrides: tuple[str, ...], store_path: Path, **flags: Any) -> None:
    """Start the recording gateway on its own.

    The admin key comes from $OPENFORGE_ADMIN_KEY (or gateway.admin_key in a config file),
    never from the command line, where every process can read it; without one, a random key
    is written to STORE.admin-key (mode 0600).
    """
    from openforge.config import load_run_config
    from openforge.gateway.server import refuse_key_on_argv, serve_forever

    refuse_key_on_argv(list(overrides))
    config = load_run_config(config_path, overrides, {
        "gateway.host": flags["host"], "gateway.port": flags["port"],
        "engine.name": flags["engine"], "engine.model": flags["model"],
        "gateway.workers": flags["workers"],
    })
    serve_forever(config, store_path)


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True))  # a run directory or its .sqlite store
@click.option("--format", "fmt", type=click.Choice(["verl", "sft", "samples"]), default="samples",
              show_default=True)
@click.option("--out", type=click.Path(path_type=Path, file_okay=False), required=True,
              help="Directory to write parquet files into.")
def export(run_dir: Path, fmt: str, out: Path) -> None:
    """Export a run's recorded calls as training data (parquet)."""
    from openforge.export import export

    result = export(run_dir, fmt, out)
    click.echo(f"wrote {result.path} ({result.rows} rows)")
    note = result.note()
    if note:
        click.echo(f"note: {note}")


@cli.command()
@click.argument("runs_dir", type=click.Path(path_type=Path, file_okay=False), default=Path("runs"))
def runs(runs_dir: Path) -> None:
    """List the run folders under RUNS_DIR (default: runs) with their headline figures."""
    from rich.console import Console
    from rich.table import Table

    from openforge.report.runs import list_runs

    rows = list_runs(runs_dir)
    if not rows:
        click.echo(f"no runs in {runs_dir} (openforge run writes them there; "
                   "pass another folder: openforge runs DIR)")
        return
    table = Table("run", "started", "harness", "environment", "reward", "engine", "attempts",
                  "scored", "passed", "pass@1", "plugin errors", "infra", "mean reward",
                  "report", box=None)
    for r in rows:
        m = r.metrics
        table.add_row(r.run_id, r.started, r.setting("harness"), r.setting("environment"),
                      r.setting("reward"), r.setting("engine", "name"),
                      f"{m.attempts} ({m.tasks} tasks x k={r.setting('k')})", str(m.scored),
                      str(m.passed), "-" if 1 not in m.pass_at else f"{m.pass_at[1]:.3f}",
                      str(m.plugin_errors), str(m.infra_failures),
                      "-" if m.mean_reward is None else f"{m.mean_reward:.3f}",
                      "yes" if r.reported else "no")
    Console(width=220).print(table)


@cli.command()
@click.argument("run_dir", type=click.Path(path_type=Path, exists=True, file_okay=False))
def report(run_dir: Path) -> None:
    """Write report.json and a self-contained report.html for a run."""
    from openforge.report import write_report

    paths = write_report(run_dir)
    for path in paths:
        click.echo(f"wrote {path}")


@cli.command()
@config_option
@set_option
@click.option("--backend", help="Trainer plugin name (default: local).")
@click.option("--recipe", help="Run a whole training recipe (e.g. demo); --config/--set then "
              "set the recipe's fields.")
def train(config_path: Path | None, overrides: tuple[str, ...], backend: str | None,
          recipe: str | None) -> None:
    """Train the policy on recorded rollouts."""
    from openforge import plugins as plugin_registry
    from openforge.config import load_train_config

    if recipe is not None:
        from openforge.training.recipes import run_recipe

        run_recipe(recipe, config_path, overrides)
        return

    config = load_train_config(config_path, overrides, {"backend": backend})
    # Built with its options: a misspelt one is refused here, before any training.
    trainer = plugin_registry.create("trainer", config.backend, **config.options)
    trainer.train(config)


@cli.command("new-plugin")
@click.argument("name")
@click.option("--dir", "target", type=click.Path(path_type=Path, file_okay=False),
              help="Where to write the package (default: ./openforge-NAME).")
def new_plugin(name: str, target: Path | None) -> None:
    """Write a working plugin package NAME: a harness, an environment, a reward, tests."""
    from openforge.scaffold import OPENFORGE_REQUIREMENT
    from openforge.scaffold import new_plugin as write

    root = write(name, target)
    click.echo(f"wrote {root}: harness, environment and reward '{name}', tests")
    click.echo(f"it depends on {OPENFORGE_REQUIREMENT} (this repository's openforge; the name "
               "on the package index is another project's). Next:")
    click.echo(f"  pip install -e '{root}[test]' && (cd {root} && pytest)")


@cli.command("check-template")
@click.argument("model")
@click.option("--renderer", default="auto", show_default=True, help="Renderer config name.")
def check_template(model: str, renderer: str) -> None:
    """Check that MODEL's chat template is append-only across turns; report where it is not."""
    from openforge.gateway.template_check import check_template as run_check

    ok = run_check(model, renderer)
    sys.exit(0 if ok else 1)


def main() -> None:
    try:
        cli(prog_name="openforge")
    except Exception as exc:  # a bug of ours: one line, and the traceback on request
        if os.environ.get("OPENFORGE_DEBUG"):
            raise
        click.echo(f"internal error: {type(exc).__name__}: {exc} "
                   "(set OPENFORGE_DEBUG=1 for the traceback, and please report it)", err=True)
        sys.exit(1)


if __name__ == "__main__":
    main()
