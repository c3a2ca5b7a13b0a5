"""Options as data: every plugin declares a pydantic model of the options it takes.

Each plugin kind's base class (`Harness`, `Environment`, `Reward`, `Executor`, `Engine`,
`Trainer`, `Recipe`) has a class attribute `options_model`, a `PluginOptions` subclass
(default `NoOptions`: the plugin takes none). The base class's `__init__` validates the
options it is built with against that model, so a misspelt or ill-typed option is refused
when the plugin is built, in one line that names the valid options, and `self.options` is
the validated model. `openforge plugins --options NAME` prints the model: names, types,
defaults and the docstring under each field.

The config file's own sections (`sampling`, `engine`, `gateway`, ...) are reported by the
same formatter, `describe_errors`.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError
from pydantic_core import PydanticUndefined

from openforge.errors import OpenforgeError

ModelT = TypeVar("ModelT", bound=BaseModel)


class PluginOptions(BaseModel):
    """Base of every plugin's options model: unknown names are refused; the docstring
    under a field is its description in `openforge plugins --options`. The validator is
    built when the plugin is first built (`defer_build`), not when its module is imported."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, defer_build=True)


class NoOptions(PluginOptions):
    """This plugin takes no options."""


class OptionsError(OpenforgeError):
    """Options that do not validate: one line naming each problem and the valid names."""

    def __init__(self, what: str, problems: list[str]) -> None:
        self.what, self.problems = what, problems
        super().__init__(f"{what} option " + "; option ".join(problems))

    def relabel(self, what: str) -> OptionsError:
        """The same problems, said of `what` (the registry knows the plugin's name)."""
        return OptionsError(what, self.problems)


def _model_at(model: type[BaseModel], path: Sequence[str | int]) -> type[BaseModel] | None:
    """The model that holds the field at `path` inside `model`, if it is one."""
    current: type[BaseModel] | None = model
    for part in path:
        if current is None or not isinstance(part, str) or part not in current.model_fields:
            return None
        current = _submodel(current.model_fields[part].annotation)
    return current


def _submodel(annotation: Any) -> type[BaseModel] | None:
    """The BaseModel inside an annotation such as `Model`, `Model | None`."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _submodel(arg)
            if found is not None:
                return found
    return None


def describe_errors(exc: ValidationError, model: type[BaseModel],
                    label: Callable[[tuple[str | int, ...]], str] = lambda loc: "") -> list[str]:
    """One phrase per problem: `<label>where: what is wrong`.

    An unknown name is reported with the names valid at that place; `label(loc)` prefixes
    each phrase with where its value came from (a file, a `--set`).
    """
    problems = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        where = ".".join(str(p) for p in loc) or "(top level)"
        if err["type"] == "extra_forbidden":
            holder = _model_at(model, loc[:-1])
            valid = sorted(holder.model_fields) if holder is not None else []
            hint = f"valid: {', '.join(valid)}" if valid else "it takes no options"
            problems.append(f"{label(loc)}{where}: not a known option ({hint})")
        elif err["type"] == "missing":
            holder = _model_at(model, loc[:-1])
            field = holder.model_fields.get(str(loc[-1])) if holder is not None else None
            about = f" ({field.description.strip().rstrip('.')})" if field and field.description else ""
            problems.append(f"{label(loc)}{where}: required, not given{about}")
        else:
            problems.append(f"{label(loc)}{where}: {err['msg']}")
    return problems


def check_options(model: type[ModelT], options: Mapping[str, Any] | BaseModel, what: str,
                  error: type[OptionsError] = OptionsError) -> ModelT:
    """`options` validated as `model`, or `error` naming every problem (`what`: "harness
    'mini'", "executor 'local'", ...). An instance of `model` is taken as it is."""
    if isinstance(options, model):
        return options
    if isinstance(options, BaseModel):
        options = options.model_dump()
    try:
        return model.model_validate(dict(options))
    except ValidationError as exc:
        raise error(what, describe_errors(exc, model)) from None


class OptionRow(BaseModel):
    """One option as `openforge plugins --options` prints it."""

    model_config = ConfigDict(defer_build=True)

    name: str
    type: str
    default: str
    description: str = ""


def _type_name(annotation: Any) -> str:
    if isinstance(annotation, type) and not typing.get_args(annotation):
        return annotation.__name__
    return str(annotation).replace("typing.", "").replace("pathlib.", "")


def describe_model(model: type[BaseModel]) -> list[OptionRow]:
    """The options of `model`: name, type, default (`required` when it has none), docstring."""
    rows = []
    for name, field in model.model_fields.items():
        if field.default is not PydanticUndefined:
            default = repr(field.default)
        elif field.default_factory is not None:
            default = repr(field.default_factory())  # type: ignore[call-arg]
        else:
            default = "required"
        rows.append(OptionRow(name=name, type=_type_name(field.annotation), default=default,
                              description=(field.description or "").strip()))
    return rows


def options_model_of(target: Any) -> type[BaseModel]:
    """The options model a plugin class (or a factory carrying `options_model`) declares."""
    model = getattr(target, "options_model", None)
    if isinstance(model, type) and issubclass(model, BaseModel):
        return model
    return NoOptions


class Plugin:
    """What every plugin kind's base class shares: options validated when it is built.

    A subclass sets `options_model` (and, for typed access, annotates `options` with it)::

        class MyOptions(PluginOptions):
            max_steps: int = 6
            \"\"\"Model calls at most.\"\"\"

        class MyHarness(Harness):
            options_model = MyOptions
            options: MyOptions
    """

    kind: ClassVar[str] = "plugin"
    options_model: ClassVar[type[BaseModel]] = NoOptions
    options: Any

    def __init__(self, **options: Any) -> None:
        self.options = check_options(self.options_model, options,
                                     f"{self.kind} {type(self).__qualname__}")
