"""`openforge new-plugin NAME`: a working plugin package to start from.

The package (`openforge-NAME`, module `openforge_NAME`) registers a harness, an environment
and a reward, all named NAME, with tests that run one `openforge run` end to end on the
scripted engine. Its templates are `scaffold_template/` (`$name`, `$module`, `$dist`,
`$requirement` are filled in; `PACKAGE` in a path becomes the module's name).

Its dependency on openforge is `OPENFORGE_REQUIREMENT`: the distribution name "openforge"
on the package index belongs to an unrelated project (versions 0.1.0 and 0.2026MMDD.N in
`pip index versions openforge`), so a bare "openforge" would install that project in a
fresh environment; this range matches this repository's openforge and none of those.
"""

from __future__ import annotations

import re
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from string import Template

from openforge.errors import OpenforgeError

OPENFORGE_REQUIREMENT = "openforge>=0.1.1,<0.2"
_NAME = re.compile(r"^[a-z][a-z0-9]*(-[a-z0-9]+)*$")


class ScaffoldError(OpenforgeError):
    """The plugin package cannot be written as asked."""


def _files(folder: Traversable, prefix: str = "") -> list[tuple[str, str]]:
    out = []
    for entry in sorted(folder.iterdir(), key=lambda e: e.name):
        rel = f"{prefix}{entry.name}"
        if entry.is_dir():
            out += _files(entry, rel + "/")
        elif entry.name.endswith(".tmpl"):
            out.append((rel[: -len(".tmpl")], entry.read_text()))
    return out


def new_plugin(name: str, target: Path | None = None) -> Path:
    """Write the plugin package for `name` into `target` (default ./openforge-NAME)."""
    if not _NAME.match(name):
        raise ScaffoldError(f"plugin name {name!r}: use lowercase letters, digits and single "
                            "hyphens, starting with a letter (e.g. my-agent)")
    from openforge.plugins import get_registry

    taken = sorted({r.kind for r in get_registry().registrations() if r.name == name})
    if taken:
        raise ScaffoldError(f"the name {name!r} is already registered ({', '.join(taken)}); "
                            "choose another, or two plugins would clash")
    dist, module = f"openforge-{name}", f"openforge_{name.replace('-', '_')}"
    root = Path(target) if target is not None else Path(dist)
    if root.exists() and any(root.iterdir()):
        raise ScaffoldError(f"{root} exists and is not empty; choose another folder (--dir)")
    values = {"name": name, "module": module, "dist": dist, "requirement": OPENFORGE_REQUIREMENT}
    for rel, text in _files(resources.files("openforge").joinpath("scaffold_template")):
        path = root / rel.replace("PACKAGE", module)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(Template(text).substitute(values))
    return root
