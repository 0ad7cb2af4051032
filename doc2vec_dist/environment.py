"""Whether this Python has the packages doc2vec-dist needs, asked before any of them is imported.

Changes when a dependency is added or renamed (pyproject.toml's; a test checks that the two agree).

`ray job submit -- python jobs/train.py` runs the `python` on the PATH of the process that started the
head: a head started as `.venv/bin/ray start` without the venv active runs the system's Python, and
the job ended in `ModuleNotFoundError: No module named 'pyarrow'`. The entry points a user runs (the
jobs/*.py scripts, `python -m doc2vec_dist`) call require_packages() first, so the first line says
which Python it is, what it lacks and how to fix it. Only the standard library here, and `logs` (which
is the standard library alone): it runs before anything else can be imported.
"""

from __future__ import annotations

import importlib.util
import sys

if __package__:
    from . import logs
else:  # run by path (runpy) by a job whose Python cannot import the package: logs.py by path, stdlib alone
    import runpy as _runpy
    from types import SimpleNamespace as _Namespace

    logs = _Namespace(**_runpy.run_path(__file__.replace("environment.py", "logs.py")))

# The packages of pyproject.toml's dependencies: the name they are imported by → the name pip knows.
REQUIRED = {"torch": "torch", "gensim": "gensim", "pyarrow": "pyarrow", "ray": "ray", "numpy": "numpy",
            "faiss": "faiss-cpu", "tqdm": "tqdm", "yaml": "PyYAML", "psutil": "psutil", "numba": "numba",
            "matplotlib": "matplotlib"}


def missing_packages() -> list[str]:
    """The import names of REQUIRED that this Python cannot find (found on sys.path, not imported)."""
    lacking = []
    for name in REQUIRED:
        try:
            found = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            lacking.append(name)
    return lacking


def require_packages() -> None:
    """Exit with status 2 and one line when this Python lacks any of the packages: which Python, what it
    lacks, and the two ways to give the job the project's venv."""
    lacking = missing_packages()
    if not lacking:
        return
    logs.error(f"this Python ({sys.executable}) lacks {', '.join(lacking)}: a job runs the `python` on the PATH "
               "of the process that started Ray; start Ray with the project's venv active (`source .venv/bin/activate`, "
               "then `ray start ...`), or name the venv's Python in the command (`ray job submit ... -- "
               "/path/to/.venv/bin/python jobs/train.py ...`)")
    sys.exit(2)
