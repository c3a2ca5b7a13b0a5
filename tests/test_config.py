"""Run/train configuration: YAML and TOML files, --set overrides, flags, clear errors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from openforge.config import ConfigError, load_run_config, load_train_config

YAML = """
harness: codex
k: 3
engine:
  name: vllm
  options: {url: "http://127.0.0.1:8000"}
sampling:
  temperature: 0.7
"""

TOML = """
harness = "codex"
k = 3
[engine]
name = "vllm"
options = { url = "http://127.0.0.1:8000" }
[sampling]
temperature = 0.7
"""


@pytest.mark.parametrize("suffix,text", [(".yaml", YAML), (".toml", TOML)])
def test_yaml_and_toml_load_the_same_config(tmp_path: Path, suffix: str, text: str) -> None:
    path = tmp_path / f"run{suffix}"
    path.write_text(text)
    config = load_run_config(path)
    assert config.harness == "codex"
    assert config.k == 3
    assert config.engine.name == "vllm"
    assert config.engine.options == {"url": "http://127.0.0.1:8000"}
    assert config.sampling.temperature == 0.7
    assert config.environment == "demo"  # untouched defaults stay


def test_defaults_are_the_embedded_main_job() -> None:
    config = load_run_config()
    assert (config.harness, config.environment, config.reward, config.executor) == (
        "mini", "demo", "checker", "local")
    assert config.engine.name == "local" and config.engine.model == "tiny"
    assert config.gateway.host == "127.0.0.1"


def test_set_overrides_beat_the_file_and_flags_beat_set(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text(YAML)
    config = load_run_config(path, ["k=5", "engine.options.api=completions", "sampling.top_p=0.9"],
                             {"k": 7, "harness": None})
    assert config.k == 7
    assert config.harness == "codex"  # a flag that was not given changes nothing
    assert config.engine.options["api"] == "completions"
    assert config.sampling.top_p == 0.9


def test_wrong_type_reports_file_field_path_and_problem(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text('k = 2\n[sampling]\ntemperature = "hot"\n')
    with pytest.raises(ConfigError) as err:
        load_run_config(path)
    message = str(err.value)
    assert str(path) in message
    assert "sampling.temperature" in message
    assert "valid number" in message


def test_unknown_field_is_rejected_with_its_path(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("engine:\n  nmae: local\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml: engine\.nmae: not a known option "
                       r"\(valid: model, name, options, renderer\)"):
        load_run_config(path)


def test_set_errors_name_the_set_not_the_file(tmp_path: Path) -> None:
    path = tmp_path / "run.yaml"
    path.write_text("k: 2\n")
    with pytest.raises(ConfigError) as info:
        load_run_config(path, ["sampling.temprature=0.5"])
    assert str(info.value) == ("--set sampling.temprature=0.5: sampling.temprature: not a known "
                               "option (valid: max_tokens, seed, stop, temperature, top_p)")
    path.write_text("k: none\n")
    with pytest.raises(ConfigError, match=r"^.*run\.yaml: k: "):
        load_run_config(path, ["sampling.temperature=0.5"])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "openforge.cli", *args], capture_output=True,
                          text=True, timeout=120, cwd=cwd)


# (command line, the option's place in the error, a name the error must list as valid)
MISSPELT = [
    (["run", "--set", "harness_optionz.x=1"], "harness_optionz", "harness_options"),
    (["run", "--set", "engine.nmae=local"], "engine.nmae", "name"),
    (["run", "--set", "gateway.prot=8000"], "gateway.prot", "port"),
    (["run", "--set", "sampling.temprature=0.5"], "sampling.temprature", "temperature"),
    (["run", "--engine", "scripted", "--set", "engine.options.scrpt=s.yaml"],
     "engine 'scripted' option scrpt", "script"),
    (["run", "--engine", "local", "--set", "engine.options.dtpye=float16"],
     "engine 'local' option dtpye", "dtype"),
    (["run", "--set", "harness_options.max_stepz=2"], "harness 'mini' option max_stepz",
     "max_steps"),
    (["run", "--set", "executor_options.sandbx=none"], "executor 'local' option sandbx",
     "sandbox"),
    (["run", "--set", "environment_options.foo=1"], "environment 'demo' option foo", None),
    (["run", "--set", "reward_options.foo=1"], "reward 'checker' option foo", None),
    (["train", "--set", "stepz=3"], "stepz", "steps"),
    (["train", "--set", "options.batch_sze=2"], "trainer 'local' option batch_sze", "batch_size"),
    (["train", "--set", "run.sampling.top_q=0.5"], "run.sampling.top_q", "top_p"),
]


@pytest.mark.parametrize("args,where,valid", MISSPELT, ids=[m[1] for m in MISSPELT])
def test_a_misspelt_option_in_any_section_is_refused_in_one_line(
        tmp_path: Path, args: list[str], where: str, valid: str | None) -> None:
    out = _cli(*args, "--set", f"runs_dir={tmp_path / 'runs'}" if args[0] == "run"
               else f"run.runs_dir={tmp_path / 'runs'}", cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert f"{where}: not a known option" in lines[0]
    if valid is None:
        assert "(it takes no options)" in lines[0]
    else:
        listed = lines[0].split("(valid: ")[1].split(")")[0].split(", ")
        assert valid in listed
    assert not (tmp_path / "runs").exists()  # refused before anything started


def test_plugins_options_prints_names_types_and_defaults(tmp_path: Path) -> None:
    out = _cli("plugins", "--options", "mini", cwd=tmp_path)
    assert out.returncode == 0, out.stderr
    rows = {line.split()[0]: line.split() for line in out.stdout.splitlines()[2:] if line.strip()}
    assert rows["max_steps"][1:3] == ["int", "6"]
    assert rows["max_tokens"][1:3] == ["int", "256"]
    assert "Model calls at most" in out.stdout  # the field's docstring is its description
    engine = _cli("plugins", "--options", "scripted", "--kind", "engine", cwd=tmp_path)
    assert "script " in engine.stdout and "Path | None" in engine.stdout
    none = _cli("plugins", "--options", "checker", cwd=tmp_path)
    assert "takes no options" in none.stdout
    unknown = _cli("plugins", "--options", "nope", cwd=tmp_path)
    assert unknown.returncode == 2 and "no plugin named 'nope'" in unknown.stderr


def test_malformed_files_and_overrides_are_one_line_errors(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("k: [1,\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_run_config(path)
    with pytest.raises(ConfigError, match="expected key=value"):
        load_run_config(None, ["k"])
    with pytest.raises(ConfigError, match="no such config file"):
        load_run_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="unknown config format"):
        (tmp_path / "x.ini").write_text("")
        load_run_config(tmp_path / "x.ini")


def test_train_config_nests_a_run_config(tmp_path: Path) -> None:
    path = tmp_path / "train.yaml"
    path.write_text("backend: local\nsteps: 3\nrun:\n  k: 4\n")
    config = load_train_config(path, ["run.harness=codex"])
    assert config.steps == 3 and config.run.k == 4 and config.run.harness == "codex"


def test_cli_prints_one_line_for_a_bad_config(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("k: many\n")
    out = subprocess.run([sys.executable, "-m", "openforge.cli", "run", "--config", str(path)],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"error: {path}: k: ")


def test_resume_refuses_options_it_would_ignore(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-m", "openforge.cli", "run", "--resume", str(tmp_path),
                          "--harness", "codex", "-k", "3"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "--resume finishes a run with the config it started with" in lines[0]
    assert "--harness, -k" in lines[0]


def test_a_port_outside_0_to_65535_is_a_config_error_not_a_crash() -> None:
    with pytest.raises(ConfigError, match=r"gateway.port: Input should be less than or equal "
                                          r"to 65535"):
        load_run_config(None, ["gateway.port=70000"])
    assert load_run_config(None, ["gateway.port=0"]).gateway.port == 0


def test_a_limit_of_no_tasks_is_refused_as_such() -> None:
    with pytest.raises(ConfigError, match="limit: Input should be greater than or equal to 1"):
        load_run_config(None, ["limit=0"])


@pytest.mark.parametrize(("args", "said"), [
    (["--port", "99999"], "Invalid value for '--port': 99999 is not in the range 0<=x<=65535"),
    (["--host", "nonexistent.invalid"],
     "cannot bind the gateway to nonexistent.invalid: Name or service not known; give an "
     "address of this machine as --host"),
])
def test_serve_says_which_option_is_wrong(tmp_path: Path, args: list[str], said: str) -> None:
    out = subprocess.run([sys.executable, "-m", "openforge.cli", "serve", "--engine", "scripted",
                          "--set", 'engine.options={"replies": [{"content": "ok"}]}',
                          "--store", str(tmp_path / "s.sqlite"), *args],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert said in " ".join(out.stderr.split())


@pytest.mark.parametrize(("override", "said"), [
    ("steps=0", "steps: Input should be greater than or equal to 1"),
    ("steps=-1", "steps: Input should be greater than or equal to 1"),
    ("learning_rate=-1", "learning_rate: Input should be greater than or equal to 0"),
])
def test_train_refuses_steps_and_learning_rates_it_cannot_use(override: str, said: str) -> None:
    with pytest.raises(ConfigError, match=said):
        load_train_config(None, [override])
    assert load_train_config(None, ["learning_rate=0"]).learning_rate == 0
