"""The runner installs (or locates) the harness program once, before the rollouts start."""

from __future__ import annotations

from pathlib import Path

import pytest

from openforge.config import EngineConfig, RunConfig
from openforge.harness import HarnessMissingError
from openforge.runner import read_results, run_from_config

HERE = Path(__file__).parent


@pytest.fixture(autouse=True)
def _plugins_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PYTHONPATH", str(HERE))


def _config(tmp_path: Path, harness: str, **options: str) -> RunConfig:
    return RunConfig(engine=EngineConfig(name="scripted", options={"replies": [{"content": "ok"}]}),
                     runs_dir=tmp_path / "runs", harness=harness, harness_options=options,
                     environment="executor_plugins:OneTaskEnv", k=3, concurrency=3,
                     max_infra_retries=0)


def test_install_runs_once_and_its_options_reach_every_rollout(tmp_path: Path) -> None:
    counter = tmp_path / "installs.txt"
    summary = run_from_config(_config(tmp_path, "install_plugins:InstallingHarness",
                                      counter=str(counter)))
    records = read_results(summary.run_dir)
    assert [r.status for r in records] == ["ok"] * 3, [r.error for r in records]
    assert all(r.passed for r in records)
    assert len(counter.read_text().splitlines()) == 1


def test_uninstallable_harness_stops_the_run_with_one_message(tmp_path: Path) -> None:
    with pytest.raises(HarnessMissingError, match="run: npm install -g fakeprog@1.0.0"):
        run_from_config(_config(tmp_path, "install_plugins:UninstallableHarness"))
    # Nothing ran: no empty run directory is left behind.
    assert not any((tmp_path / "runs").glob("*/results.jsonl"))
