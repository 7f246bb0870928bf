"""Whether the template can start a rank exactly as `python -u SCRIPT` would.

Each rule names what would differ, so that the probe can say once why the
ranks start the plain way. A forked rank shares what the template did at
start-up: the interpreter's flags and paths, the libraries it loaded and
how they read their environment, the modules it imported. So a rank is
forked only when none of that could have come out otherwise for it.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

IMPORT_TIME_PREFIXES = (
    "PYTHON",
    "LD_",
    "OMP_",
    "MKL_",
    "KMP_",
    "GOMP_",
    "OPENBLAS_",
    "MALLOC_",
    "GLIBC_",
    "LC_",
    "LANG",
    "TORCH",
    "PYTORCH_",
)
"""Variables read while the interpreter starts or torch loads: a rank whose
value differs from the template's would have started differently."""

PER_WORKER_PREFIXES = ("TORCHELASTIC_", "TORCH_NCCL_")
"""What torchrun sets for each worker (read when the script runs, not at import)."""


@dataclass(frozen=True)
class Command:
    """The part of a worker's command line the template understands: `python -u SCRIPT ARGS` or `python -u -m MODULE ARGS`."""

    target: str
    args: list[str]
    module: bool

    def folder(self, cwd: str) -> str:
        """What Python puts first on sys.path for it: the script's real folder, or the working directory."""
        return cwd if self.module else os.path.dirname(os.path.realpath(os.path.join(cwd, self.target)))


def command(argv: Sequence[str]) -> Command | None:
    if len(argv) < 3 or argv[0] != sys.executable or argv[1] != "-u":
        return None
    if argv[2] == "-m":
        return Command(argv[3], list(argv[4:]), True) if len(argv) > 3 else None
    return None if argv[2].startswith("-") else Command(argv[2], list(argv[3:]), False)


def misfit(argv: Sequence[str], env: Mapping[str, str], cwd: str, template_env: Mapping[str, str], imported: Iterable[str]) -> str | None:
    """Why this worker must start the plain way, or None when the template can start it.

    imported: the top-level modules the template imported after its own start-up.
    """
    found = command(argv)
    if found is None:
        return f"torchrun starts `{' '.join(argv[:3])} ...`, which is not this Python running a script"
    changed = sorted(
        name
        for name in env.keys() | template_env.keys()
        if env.get(name) != template_env.get(name) and name.startswith(IMPORT_TIME_PREFIXES) and not name.startswith(PER_WORKER_PREFIXES)
    )
    if changed:
        return f"the ranks' environment differs from the template's in {', '.join(changed)}"
    folder = found.folder(cwd)
    if not found.module and not os.path.isfile(os.path.join(cwd, found.target)):
        return f"{found.target} is not a file"
    shadowed = sorted(set(imported) & _top_level_names(folder))
    if shadowed:
        return f"{folder} has its own {', '.join(shadowed)}, which the template imported from elsewhere"
    return None


def _top_level_names(folder: str) -> set[str]:
    """Modules and regular packages a script in folder would import from there
    (a folder without __init__.py loses to a module found anywhere else)."""
    try:
        entries = os.listdir(folder)
    except OSError:
        return set()
    names = set()
    for entry in entries:
        stem, dot, _ = entry.partition(".")
        if dot and entry.endswith((".py", ".pyc", ".so", ".pyd")):
            names.add(stem)
        elif not dot and os.path.isfile(os.path.join(folder, entry, "__init__.py")):
            names.add(entry)
    return names
