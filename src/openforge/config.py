"""Run and train configuration: pydantic models loaded from YAML or TOML, overridable from the CLI.

Precedence, lowest first: the embedded defaults below, the config file (`--config FILE`),
`--set key.path=value` overrides, explicit CLI flags (`--harness codex`).
"""

from __future__ import annotations

import tomllib
import typing
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from openforge.errors import OpenforgeError
from openforge.options import describe_errors
from openforge.types import SamplingParams

T = TypeVar("T", bound=BaseModel)


class ConfigError(OpenforgeError):
    """A config file or override that does not validate."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class EngineConfig(_Strict):
    """Where the policy's tokens come from."""

    name: str = "local"
    # A model directory, or "tiny" for the untrained tiny Qwen3 built offline on first use.
    model: str = "tiny"
    # The renderer config name (renderers' typed config), e.g. "qwen3"; "auto" detects.
    renderer: str = "auto"
    options: dict[str, Any] = Field(default_factory=dict)


class GatewayConfig(_Strict):
    """The recording gateway."""

    host: str = "127.0.0.1"
    port: int = Field(default=0, ge=0, le=65535)  # 0: pick a free port
    admin_key: str | None = None  # None: a random key per process
    max_body_bytes: int = 32 * 1024 * 1024
    keepalive_s: float = 5.0
    # Name the harness uses for the policy model (served from /v1/models).
    served_model_name: str = "policy"
    # `file://` image URLs are read only under this folder (None: refused; default from
    # $OPENFORGE_IMAGE_ROOT). Data URLs are always accepted; http(s) images never fetched.
    image_root: Path | None = None
    max_image_bytes: int = Field(default=20 * 1024 * 1024, ge=1)
    # A request body must arrive within this many seconds (408 otherwise).
    body_timeout_s: float = Field(default=30.0, gt=0)
    # How a call that extends a session's conversation is rendered: "append" keeps every
    # sampled id and appends the new messages (one sample per rollout); "exact" follows the
    # chat template and opens a branch where it rewrites earlier turns (docs/internals.md).
    render_policy: Literal["append", "exact"] = "append"
    # Gateway processes (`openforge serve --workers N`); each session is served by one.
    workers: int = Field(default=1, ge=1, le=64)
    # The model's context window in tokens; None: the model's config.json says.
    context_tokens: int | None = Field(default=None, ge=1)


class RunConfig(_Strict):
    """`openforge run`: tasks x k attempts through a harness, scored by a reward."""

    harness: str = "mini"
    harness_options: dict[str, Any] = Field(default_factory=dict)
    environment: str = "demo"
    environment_options: dict[str, Any] = Field(default_factory=dict)
    split: str | None = None
    tasks: list[str] = Field(default_factory=list)  # only these task ids (empty: all)
    limit: int | None = Field(default=None, ge=1)  # at most this many tasks
    reward: str = "checker"
    reward_options: dict[str, Any] = Field(default_factory=dict)
    executor: str = "local"
    executor_options: dict[str, Any] = Field(default_factory=dict)
    engine: EngineConfig = Field(default_factory=EngineConfig)
    gateway: GatewayConfig = Field(default_factory=GatewayConfig)
    sampling: SamplingParams = Field(default_factory=SamplingParams)
    k: int = Field(default=1, ge=1)  # attempts per task
    concurrency: int = Field(default=4, ge=1)
    timeout_s: float = Field(default=300.0, gt=0)  # per rollout
    max_infra_retries: int = Field(default=2, ge=0)
    runs_dir: Path = Path("runs")
    run_id: str | None = None

    def plugins(self) -> list[tuple[str, str, dict[str, Any]]]:
        """(kind, name, options) of every plugin the run builds."""
        return [("harness", self.harness, self.harness_options),
                ("environment", self.environment, self.environment_options),
                ("reward", self.reward, self.reward_options),
                ("executor", self.executor, self.executor_options),
                ("engine", self.engine.name, self.engine.options)]


class TrainConfig(_Strict):
    """`openforge train`: the trainer backend and its knobs."""

    backend: str = "local"
    run: RunConfig = Field(default_factory=RunConfig)
    algorithm: str = "grpo"  # grpo | sft
    steps: int = Field(default=10, ge=1)
    learning_rate: float = Field(default=1e-5, ge=0)  # 0: an ablation that leaves the policy as is
    options: dict[str, Any] = Field(default_factory=dict)


def read_config_file(path: Path) -> dict[str, Any]:
    """Parse a YAML (.yaml/.yml) or TOML (.toml) file into a dict."""
    if not path.exists():
        raise ConfigError(f"{path}: no such config file")
    text = path.read_text()
    try:
        if path.suffix == ".toml":
            data = tomllib.loads(text)
        elif path.suffix in (".yaml", ".yml", ".json"):
            data = yaml.safe_load(text) or {}
        else:
            raise ConfigError(f"{path}: unknown config format; use .yaml, .yml or .toml")
    except (yaml.YAMLError, tomllib.TOMLDecodeError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise ConfigError(f"{path}: not valid {path.suffix[1:].upper()}: {first}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping of settings")
    return data


def apply_override(data: dict[str, Any], assignment: str) -> str:
    """Apply one `key.path=value` override in place (the value is parsed as YAML); return
    the dotted key."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected key=value, e.g. --set engine.name=scripted")
    key, raw = assignment.split("=", 1)
    parts = [p for p in key.strip().split(".") if p]
    if not parts:
        raise ConfigError(f"--set {assignment!r}: empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError:
        value = raw
    apply_override_value(data, ".".join(parts), value)
    return ".".join(parts)


def _source_of(loc: tuple[str | int, ...], path: Path | None, overrides: dict[str, str]) -> str:
    """Where the value at `loc` came from: the `--set` that set it (or a parent of it), else
    the config file, else the defaults."""
    dotted = ".".join(str(p) for p in loc)
    for key, assignment in overrides.items():
        if dotted == key or dotted.startswith(key + ".") or key.startswith(dotted + "."):
            return f"--set {assignment}: "
    return f"{path}: " if path else "config: "


def build_config(
    model: type[T],
    path: Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    flags: dict[str, Any] | None = None,
) -> T:
    """Validate defaults + file + `--set` overrides + explicit flags into `model`.

    `flags` maps dotted keys to values; None values (flags not given) are ignored.
    """
    data: dict[str, Any] = read_config_file(path) if path else {}
    given: dict[str, str] = {}  # dotted key -> the override that set it, for error labels
    for assignment in overrides:
        given[apply_override(data, assignment)] = assignment
    for key, value in (flags or {}).items():
        if value is not None:
            apply_override_value(data, key, value)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = describe_errors(exc, model, lambda loc: _source_of(loc, path, given))
        raise ConfigError("; ".join(problems)) from None


def apply_override_value(data: dict[str, Any], key: str, value: Any) -> None:
    """Set an already-typed value at a dotted key."""
    parts = key.split(".")
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if not isinstance(child, dict):
            child = {}
            node[part] = child
        node = child
    node[parts[-1]] = value


def load_run_config(path: Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                    flags: dict[str, Any] | None = None) -> RunConfig:
    return build_config(RunConfig, path, overrides, flags)


def load_train_config(path: Path | None = None, overrides: list[str] | tuple[str, ...] = (),
                      flags: dict[str, Any] | None = None) -> TrainConfig:
    return build_config(TrainConfig, path, overrides, flags)


# -- paths ---------------------------------------------------------------------------------

def _is_path_field(annotation: Any) -> bool:
    if annotation is Path:
        return True
    return any(_is_path_field(arg) for arg in typing.get_args(annotation))


def _absolute(value: Any, base: Path) -> Any:
    if isinstance(value, str | Path) and str(value) and not Path(value).expanduser().is_absolute():
        return str((base / Path(value).expanduser()).resolve())
    return str(Path(value).expanduser()) if isinstance(value, Path) else value


def resolve_paths(config: RunConfig, base: Path) -> RunConfig:
    """`config` with every relative path made absolute against `base`.

    `openforge run` stores config.yaml this way (`base`: the working directory), so that
    `--resume` works from any folder; paths still relative in a config.yaml (written by
    hand) are read relative to the run folder. A path is a `Path` field of the config or of
    a plugin's options model, or `engine.model` when it names an existing folder.
    """
    from openforge import plugins

    data = config.model_dump(mode="json")
    data["runs_dir"] = _absolute(data["runs_dir"], base)
    if data["gateway"].get("image_root"):
        data["gateway"]["image_root"] = _absolute(data["gateway"]["image_root"], base)
    model = data["engine"]["model"]
    if not Path(model).expanduser().is_absolute() and (base / model).exists():
        data["engine"]["model"] = _absolute(model, base)
    resolved = RunConfig.model_validate(data)
    for kind, name, options in resolved.plugins():
        try:
            fields = plugins.options_model(kind, name).model_fields
        except OpenforgeError:
            continue  # an unknown plugin: `openforge run` says so on its own
        for key, value in options.items():
            if key in fields and value is not None and _is_path_field(fields[key].annotation):
                options[key] = _absolute(value, base)
    return resolved

