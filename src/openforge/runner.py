"""The rollout loop of `openforge run`: tasks x k attempts -> sessions -> executor -> reward -> store.

A run lives in `runs/<run-id>/`:

- `config.yaml`   the full resolved `RunConfig` (what `--resume` reads back);
- `store.sqlite`  every session and recorded call (the gateway writes it);
- `results.jsonl` one `AttemptRecord` per finished attempt, appended as attempts finish
                  (the source of truth for what is done);
- `logs/`         the agent's stdout and stderr of each attempt (its last try);
- `report.json`, `report.html` written at the end (`openforge report` rewrites them).

docs/run-folder.md describes each file and the store's schema.

Attempts run through the shared rollout stack (`openforge.attempts.RolloutStack`): a fresh
gateway session per try, the executor's result checked against the attempt, stored with its
reward. Infrastructure failures (timeout, sandbox died, harness missing, engine down) are
retried with a new session up to `max_infra_retries` times, unless the executor says another
try cannot help (`RolloutResult.permanent`: an image that does not exist); if they persist
the attempt is recorded as an infra failure, which pass rates exclude and the report shows
apart. Never as a reward of 0. A plugin error is neither retried nor scored, and counted apart
too. Statuses and which are scored: `openforge.types`.

An attempt is identified by (run id, task, attempt index). On `--resume`, an attempt whose
last try's sandbox outlived the old process (a Kubernetes Pod) continues that try (the
stack's `resume`): same rollout id, same open session, so the sandbox's model calls keep
landing and its result is collected (`Executor.find_attempt`, `Executor.adoptable`).
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import secrets
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, Field, ValidationError
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.table import Table

from openforge.attempts import Attempt, RolloutStack
from openforge.config import RunConfig, resolve_paths
from openforge.errors import OpenforgeError
from openforge.executor import Executor
from openforge.metrics import AttemptOutcome, MetricsSummary, summarize
from openforge.rollout import build_plugin
from openforge.types import StatusFlags, Task

CONFIG_FILE = "config.yaml"
RESULTS_FILE = "results.jsonl"
STORE_FILE = "store.sqlite"
LOGS_DIR = "logs"
_TABLE_ROWS = 40  # per-task rows printed at the end; the report has them all


class RunError(OpenforgeError):
    """A run that cannot start or resume (bad run directory, unknown task ids...)."""


class RunInterrupted(OpenforgeError):
    """Ctrl-C: the run stopped cleanly and can be resumed."""

    exit_code = 130


class AttemptRecord(StatusFlags, BaseModel):
    """One finished attempt: a line of results.jsonl."""

    task_id: str
    attempt: int
    rollout_id: str
    session_id: str
    status: str
    reward: float | None = None
    passed: bool = False
    reward_details: dict[str, Any] = Field(default_factory=dict)
    final_answer: str | None = None
    error: str | None = None
    duration_s: float = 0.0
    tries: int = 1
    infra_errors: list[str] = Field(default_factory=list)
    session_ids: list[str] = Field(default_factory=list)  # every try's session, last = this one
    prompt: str = ""
    sandbox: str = ""  # how the agent was isolated: bwrap, namespaces, none (in a Pod: inside it)
    limits_reached: dict[str, int] = Field(default_factory=dict)  # RolloutResult's
    # The agent's stdout / stderr as files of the run folder (`logs/...`), relative to it.
    logs: dict[str, str] = Field(default_factory=dict)
    finished_at: float = Field(default_factory=time.time)

    @classmethod
    def of(cls, task: Task, attempt_no: int, attempt: Attempt,
           logs: dict[str, str] | None = None) -> AttemptRecord:
        """The record of one finished attempt of the stack."""
        result, reward = attempt.result, attempt.result.reward
        return cls(
            task_id=task.id, attempt=attempt_no, rollout_id=attempt.rollout_id,
            session_id=attempt.session.id, status=result.status,
            reward=reward.score if reward else None, passed=bool(reward and reward.passed),
            reward_details=reward.details if reward else {}, final_answer=result.final_answer,
            error=result.error, duration_s=result.duration_s, tries=attempt.tries,
            infra_errors=attempt.infra_errors, session_ids=attempt.session_ids,
            prompt=task.prompt, sandbox=result.sandbox, limits_reached=result.limits_reached,
            logs=logs or {})

    def outcome(self) -> AttemptOutcome:
        return AttemptOutcome(task_id=self.task_id, attempt=self.attempt, status=self.status,
                              reward=self.reward, passed=self.passed)


class RunSummary(BaseModel):
    """What `run_from_config` returns."""

    run_id: str
    run_dir: Path
    metrics: MetricsSummary
    report_paths: list[Path] = Field(default_factory=list)
    attempts_run: int = 0  # attempts finished by this invocation (not counting resumed ones)
    elapsed_s: float = 0.0


def write_agent_logs(run_dir: Path, rollout_id: str, harness_output: dict[str, Any]) -> dict[str, str]:
    """Keep the agent's stdout and stderr as `logs/<rollout id>.<stream>.txt`; return the
    paths written, relative to the run folder (what report.html links to)."""
    written: dict[str, str] = {}
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", rollout_id)
    for stream in ("stdout", "stderr"):
        text = harness_output.get(stream)
        if not isinstance(text, str):
            continue
        rel = f"{LOGS_DIR}/{safe}.{stream}.txt"
        (run_dir / LOGS_DIR).mkdir(exist_ok=True)
        (run_dir / rel).write_text(text)
        written[stream] = rel
    return written


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(3)


def read_results(run_dir: Path) -> list[AttemptRecord]:
    """The finished attempts of a run; a line torn by a crash is skipped."""
    path = run_dir / RESULTS_FILE
    records: list[AttemptRecord] = []
    seen: set[tuple[str, int]] = set()
    if not path.exists():
        return records
    for line in path.read_text().splitlines():
        if not line.strip():
            continue
        try:
            record = AttemptRecord.model_validate_json(line)
        except ValidationError:
            continue
        key = (record.task_id, record.attempt)
        if key not in seen:
            seen.add(key)
            records.append(record)
    return records


def open_results_for_append(path: Path) -> Any:
    """Open results.jsonl for appending, first ending a line torn by a crash."""
    if path.exists() and path.stat().st_size:
        with open(path, "rb") as f:
            f.seek(-1, os.SEEK_END)
            torn = f.read(1) != b"\n"
        if torn:
            with open(path, "a") as f:
                f.write("\n")
    return open(path, "a")


def load_run_dir_config(run_dir: Path) -> RunConfig:
    """The config a run was started with (for `--resume`)."""
    path = run_dir / CONFIG_FILE
    if not path.exists():
        raise RunError(f"{run_dir} is not a run directory (no {CONFIG_FILE}); "
                       "pass the directory `openforge run` printed, e.g. runs/<run-id>")
    try:
        return RunConfig.model_validate(yaml.safe_load(path.read_text()) or {})
    except (yaml.YAMLError, ValidationError) as exc:
        raise RunError(f"{path}: not a valid run config: {str(exc).splitlines()[0]}") from None


def select_tasks(config: RunConfig, all_tasks: list[Task]) -> list[Task]:
    tasks = all_tasks
    if config.tasks:
        known = {t.id for t in all_tasks}
        unknown = [t for t in config.tasks if t not in known]
        if unknown:
            raise RunError(f"unknown task id(s) {', '.join(unknown)} in environment "
                           f"'{config.environment}'; known: {', '.join(sorted(known)[:20])}")
        wanted = set(config.tasks)
        tasks = [t for t in all_tasks if t.id in wanted]
    if config.limit is not None:
        tasks = tasks[: config.limit]
    if not tasks:
        raise RunError(f"environment '{config.environment}' yielded no tasks"
                       + (f" for split '{config.split}'" if config.split else ""))
    return tasks


class Runner:
    """Runs one run directory to completion (or until cancelled)."""

    def __init__(self, config: RunConfig, run_dir: Path, console: Console | None = None) -> None:
        self.config = config
        self.run_dir = run_dir
        self.run_id = config.run_id or run_dir.name
        self.console = console or Console()
        self.records: list[AttemptRecord] = read_results(run_dir)
        self.attempts_run = 0
        self._results_file: Any = None
        self._summarize_progress()
        self._environment: Any = None  # built in run(); the stack reads task data paths
        # The run's harness options plus what `Harness.install` resolved (binary paths).
        self._harness_options: dict[str, Any] = dict(config.harness_options)

    # -- set-up ----------------------------------------------------------------------------

    def _header(self, executor: Executor, tasks: list[Task], pending: int) -> None:
        cfg = self.config
        c = self.console
        c.print(f"[bold]openforge run[/bold] {self.run_id}  ->  {self.run_dir}")
        c.print(f"engine: {cfg.engine.name} (model: {cfg.engine.model})")
        if cfg.engine.name == "local" and cfg.engine.model == "tiny":
            c.print("[yellow]note: the default model 'tiny' is an untrained model built offline: low "
                    "scores are expected. Point at a real model with --model PATH, or at a vLLM "
                    "server with --engine vllm --vllm-url URL.[/yellow]")
        describe = getattr(executor, "describe_sandbox", None)
        if callable(describe):
            c.print(describe())
        c.print(f"harness: {cfg.harness}  environment: {cfg.environment}  reward: {cfg.reward}  "
                f"executor: {cfg.executor}")
        c.print(f"{len(tasks)} tasks x k={cfg.k}: {pending} attempts to run "
                f"({len(self.records)} already done), concurrency {cfg.concurrency}, "
                f"timeout {cfg.timeout_s:g}s per rollout")

    def _write_record(self, record: AttemptRecord) -> None:
        self.records.append(record)
        self._summarize_progress()
        self._results_file.write(record.model_dump_json() + "\n")
        self._results_file.flush()
        os.fsync(self._results_file.fileno())

    async def _install_harness(self) -> None:
        """Locate or install the harness program once, here, before the rollouts start.

        Only for executors whose sandboxes see this machine's files (`shares_filesystem`);
        a Pod's image must ship the program itself.
        """
        cfg = self.config
        harness = build_plugin("harness", cfg.harness, cfg.harness_options)

        def log(line: str) -> None:
            self.console.print(f"harness {cfg.harness}: {line}", markup=False, highlight=False)

        try:
            with self.console.status(f"locating the {cfg.harness} harness program..."):
                extra = await asyncio.to_thread(harness.install, log)
        except OpenforgeError:
            raise
        except Exception as exc:  # a plugin bug: one line, not a traceback
            raise RunError(f"harness '{cfg.harness}' could not be installed: "
                           f"{type(exc).__name__}: {exc}") from None
        self._harness_options = {**cfg.harness_options, **(extra or {})}

    # -- one attempt -----------------------------------------------------------------------

    def stack(self, gateway: Any, executor: Executor) -> RolloutStack:
        """The rollout stack this run's attempts go through (see `openforge.attempts`)."""
        executor.protect(self.run_dir)
        return RolloutStack(gateway, executor, self.config, self._harness_options,
                            self._environment, resume=True)

    async def attempt(self, stack: RolloutStack, task: Task, attempt: int) -> AttemptRecord:
        """One attempt of `task` through a started stack, as a results.jsonl record."""
        done = await stack.attempt(task, attempt, self.run_id)
        logs = write_agent_logs(self.run_dir, done.rollout_id, done.result.harness_output)
        return AttemptRecord.of(task, attempt, done, logs)

    # -- the loop --------------------------------------------------------------------------

    def _summarize_progress(self) -> None:
        """The progress line's figures, from the run's one `summarize`: once per finished
        attempt, not on every refresh of the bar."""
        self._progress = summarize([r.outcome() for r in self.records], self.config.k).progress()

    def _stats(self, executor: Executor | None = None) -> str:
        waiting = executor.progress() if executor is not None else ""
        return self._progress + (f"  ({waiting})" if waiting else "")

    async def run(self) -> RunSummary:
        from openforge.gateway.server import Gateway
        from openforge.store import Store

        cfg = self.config
        started = time.monotonic()
        environment = self._environment = build_plugin("environment", cfg.environment,
                                                       cfg.environment_options)
        tasks = select_tasks(cfg, list(environment.tasks(cfg.split)))
        done = {(r.task_id, r.attempt) for r in self.records}
        pending = [(t, a) for t in tasks for a in range(cfg.k) if (t.id, a) not in done]
        # Build harness and reward once here so that bad options fail now, in one line,
        # rather than as an infra failure in every sandbox.
        built: dict[str, Any] = {}
        for kind, name, options in (("harness", cfg.harness, cfg.harness_options),
                                    ("reward", cfg.reward, cfg.reward_options)):
            try:
                built[kind] = build_plugin(kind, name, options)
            except OpenforgeError:
                raise
            except Exception as exc:
                raise RunError(f"{kind} '{name}' cannot be built from its options: "
                               f"{type(exc).__name__}: {exc}") from None
        executor: Executor = build_plugin("executor", cfg.executor, cfg.executor_options)
        self._header(executor, tasks, len(pending))
        if pending and getattr(executor, "shares_filesystem", False):
            await self._install_harness()
        store = Store(self.run_dir / STORE_FILE)
        gateway = Gateway(cfg.gateway, cfg.engine, store)
        self._results_file = open_results_for_append(self.run_dir / RESULTS_FILE)
        semaphore = asyncio.Semaphore(cfg.concurrency)
        progress = Progress(TextColumn("[bold]rollouts"), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[stats]}"), TimeElapsedColumn(),
                            TextColumn("ETA"), TimeRemainingColumn(), console=self.console,
                            transient=False)
        try:
            with self.console.status("starting the gateway and engine..."):
                await gateway.start()
            bundle = gateway.bundle
            if built["harness"].sends_images and bundle is not None and not bundle.multimodal:
                raise RunError(f"harness '{cfg.harness}' sends screenshots, but model "
                               f"'{cfg.engine.model}' takes text only: use a vision-language "
                               "model (--model tiny-vl for a test run)")
            self.console.print(f"gateway: {gateway.url}")
            total = len(tasks) * cfg.k
            with progress:
                bar: TaskID = progress.add_task("rollouts", total=total, completed=len(done),
                                                stats=self._stats())

                stack = self.stack(gateway, executor)
                pending_ids = {t.id for t, _ in pending}
                stack.guard([t for t in tasks if t.id in pending_ids])

                async def one(task: Task, attempt: int) -> None:
                    async with semaphore:
                        record = await self.attempt(stack, task, attempt)
                    self._write_record(record)
                    self.attempts_run += 1
                    progress.update(bar, advance=1, stats=self._stats(executor))

                async def refresh() -> None:  # what the executor waits for (a quota...)
                    while True:
                        await asyncio.sleep(1.0)
                        progress.update(bar, stats=self._stats(executor))

                jobs = [asyncio.create_task(one(t, a)) for t, a in pending]
                refresher = asyncio.create_task(refresh())
                try:
                    await asyncio.gather(*jobs)
                except BaseException:
                    # Ctrl-C or a failure: stop the others (their executors kill the sandboxes).
                    for job in jobs:
                        job.cancel()
                    await asyncio.gather(*jobs, return_exceptions=True)
                    raise
                finally:
                    refresher.cancel()
        finally:
            self._results_file.close()
            await executor.close()
            await gateway.stop()
            environment.close()
            store.close()
        from openforge.report import write_report

        paths = write_report(self.run_dir)
        metrics = summarize([r.outcome() for r in self.records], cfg.k, [t.id for t in tasks])
        self.print_summary(metrics, paths)
        return RunSummary(run_id=self.run_id, run_dir=self.run_dir, metrics=metrics,
                          report_paths=paths, attempts_run=self.attempts_run,
                          elapsed_s=time.monotonic() - started)

    def print_summary(self, metrics: MetricsSummary, paths: list[Path]) -> None:
        tasks = Table("task", "scored", "passed", "plugin errors", "infra", "mean reward",
                      box=None, title="per task")
        shown = metrics.rows[:_TABLE_ROWS]
        for row in shown:
            mean = "-" if row.mean_reward is None else f"{row.mean_reward:.2f}"
            tasks.add_row(row.task_id, str(row.n), str(row.passed), str(row.plugin_errors),
                          str(row.infra_failures), mean)
        self.console.print(tasks)
        if len(metrics.rows) > len(shown):
            self.console.print(f"... and {len(metrics.rows) - len(shown)} more tasks in the report")
        table = Table("k", "pass@k", "pass^k", box=None, title="pass@k")
        for k in sorted(metrics.pass_at):
            table.add_row(str(k), f"{metrics.pass_at[k]:.3f}", f"{metrics.pass_hat[k]:.3f}")
        self.console.print(table)
        self.console.print(metrics.headline(), markup=False, highlight=False)
        errors = [r for r in self.records if r.is_plugin_failure]
        if errors:
            # A bug in a plugin, not the agent's doing: say so where it cannot be missed.
            self.console.print(f"[bold red]{len(errors)} attempts ended in a plugin error "
                               "(not scored, not retried); fix the plugin. First:[/bold red]")
            self.console.print(f"  {errors[0].task_id}.{errors[0].attempt}: {errors[0].error}",
                               markup=False, highlight=False)
        limited = collections.Counter(name for r in self.records for name in r.limits_reached)
        if limited:
            # The agent's doing, in its score: shown so that a limit set too low is noticed.
            self.console.print(
                "attempts that reached their rollout's limits: " + ", ".join(
                    f"{name} {n}" for name, n in sorted(limited.items())) +
                " (limits_reached in results.jsonl, executor options: docs/sandboxing.md)",
                markup=False, highlight=False)
        report_json = next((p for p in paths if p.suffix == ".json"), None)
        trajectories = json.loads(report_json.read_text()).get("trajectories") if report_json else None
        if trajectories:
            branches = ", ".join(f"{reason} {n}" for reason, n in
                                 sorted(trajectories["branches_opened"].items())) or "none"
            left = ", ".join(f"{why} {n}" for why, n in
                             sorted((trajectories.get("sessions_left_out") or {}).items()))
            self.console.print(
                f"training data (what openforge export writes): "
                f"{trajectories['calls_recorded']} recorded calls -> "
                f"{trajectories['samples']} samples ({trajectories['samples_per_session']:.2f} per "
                f"session; extra branches: {branches}; exact token ids on "
                f"{100 * trajectories['exact_token_fraction']:.0f}% of calls); sessions left "
                f"out: {left or 'none'}")
        for path in paths:
            self.console.print(f"report: {path}")


def prepare_run_dir(config: RunConfig, resume: Path | None) -> tuple[RunConfig, Path]:
    """Create the run directory (or reopen it for `--resume`) and write config.yaml.

    config.yaml holds absolute paths; on `--resume`, a relative one is read relative to the
    run folder, so a run resumes from whatever the working directory.
    """
    if resume is not None:
        run_dir = resume.resolve()
        config = resolve_paths(load_run_dir_config(run_dir), run_dir)
        config = config.model_copy(update={"run_id": config.run_id or run_dir.name})
        return config, run_dir
    config = resolve_paths(config, Path.cwd())
    run_id = config.run_id or new_run_id()
    run_dir = (Path(config.runs_dir) / run_id).resolve()
    if (run_dir / RESULTS_FILE).exists():
        raise RunError(f"{run_dir} already holds a run; use --resume {run_dir} to finish it, "
                       "or choose another run_id")
    run_dir.mkdir(parents=True, exist_ok=True)
    config = config.model_copy(update={"run_id": run_id})
    (run_dir / CONFIG_FILE).write_text(yaml.safe_dump(config.model_dump(mode="json"), sort_keys=False))
    return config, run_dir


async def _run_cancellable(runner: Runner) -> RunSummary:
    """Run, turning SIGTERM into the same clean cancellation as Ctrl-C."""
    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    try:
        if task is not None:
            loop.add_signal_handler(signal.SIGTERM, task.cancel)
    except (NotImplementedError, RuntimeError):
        pass
    try:
        return await runner.run()
    finally:
        try:
            loop.remove_signal_handler(signal.SIGTERM)
        except (NotImplementedError, RuntimeError):
            pass


def run_from_config(config: RunConfig, resume: Path | None = None,
                    console: Console | None = None) -> RunSummary:
    """`openforge run`: run (or resume) tasks x k attempts and write the report."""
    config, run_dir = prepare_run_dir(config, resume)
    runner = Runner(config, run_dir, console)
    try:
        return asyncio.run(_run_cancellable(runner))
    except OpenforgeError:
        if resume is None and not read_results(run_dir):
            # Nothing ran (bad task id, engine cannot start...): leave no empty run behind.
            shutil.rmtree(run_dir, ignore_errors=True)
        raise
    except (KeyboardInterrupt, asyncio.CancelledError):
        done = len(runner.records)
        raise RunInterrupted(
            f"interrupted after {done} finished attempts; nothing was lost. Resume with: "
            f"openforge run --resume {run_dir}") from None


def results_as_json(run_dir: Path) -> list[dict[str, Any]]:
    """results.jsonl as plain dicts (for reports and tests)."""
    return [json.loads(r.model_dump_json()) for r in read_results(run_dir)]
