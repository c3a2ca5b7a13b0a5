"""The `openforge` command line. Each command is thin: it builds a config and calls a module."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import click

from openforge import __version__
from openforge.errors import OpenforgeError


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
def plugins() -> None:
    """List installed plugins: kind, name, distribution, version, description."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    from openforge.plugins import get_registry

    table = Table("kind", "name", "distribution", "version", "description", box=None)
    for reg in get_registry().registrations():
        # Descriptions are plain text: "openforge[verl]" is not rich markup.
        table.add_row(reg.kind, reg.name, reg.distribution, reg.version, escape(reg.description))
    Console(width=200).print(table)


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
@click.option("--limit", type=int, help="Run at most this many tasks.")
@click.option("--task", "tasks", multiple=True, help="Run only this task id (repeatable).")
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
        "tasks": list(flags["tasks"]) or None, "timeout_s": flags["timeout_s"],
        "runs_dir": flags["runs_dir"],
    }
    if flags["script"]:
        dotted["engine.options.script"] = str(flags["script"])
    if flags["vllm_url"]:
        dotted["engine.options.url"] = flags["vllm_url"]
    config = load_run_config(config_path, overrides, dotted)
    for kind, name in (("harness", config.harness), ("environment", config.environment),
                       ("reward", config.reward), ("executor", config.executor),
                       ("engine", config.engine.name)):
        plugin_registry.lookup(kind, name)

    from openforge.runner import run_from_config

    run_from_config(config, resume=resume)


@cli.command()
@config_option
@set_option
@click.option("--host", help="Address to bind (default 127.0.0.1; 0.0.0.0 exposes it to the network).")
@click.option("--port", type=int, help="Port (default: a free one, printed at start).")
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
    from openforge.export import export_run

    written = export_run(run_dir, fmt, out)
    click.echo(f"wrote {written}")


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
    trainer = plugin_registry.create("trainer", config.backend)
    trainer.train(config)


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
