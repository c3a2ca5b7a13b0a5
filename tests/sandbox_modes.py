"""The local sandbox modes this machine offers, as pytest parameters.

bubblewrap runs where it is installed (CI installs it: .ci/run), namespaces where the kernel
lets this user create user, mount and PID namespaces, none everywhere; a mode that cannot run
here is skipped with the reason.
"""

from __future__ import annotations

import pytest

from openforge.sandbox.modes import bwrap_path, bwrap_works, namespaces_available

NO_BWRAP = "bubblewrap is not installed or cannot run here (apt-get install bubblewrap; CI installs it)"
NO_NAMESPACES = "this kernel does not allow unprivileged user, mount and PID namespaces"


def mode_params(*modes: str) -> list[object]:
    params: list[object] = []
    for mode in modes or ("bwrap", "namespaces", "none"):
        marks = []
        if mode == "bwrap":
            bwrap = bwrap_path()
            marks.append(pytest.mark.skipif(bwrap is None or not bwrap_works(bwrap),
                                            reason=NO_BWRAP))
        if mode == "namespaces":
            marks.append(pytest.mark.skipif(not namespaces_available(), reason=NO_NAMESPACES))
        params.append(pytest.param(mode, marks=marks, id=mode))
    return params


ALL_MODES = mode_params()
ISOLATING_MODES = mode_params("bwrap", "namespaces")
