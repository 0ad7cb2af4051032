"""Search the training settings of a corpus on Ray Tune, as a Ray job: `doc2vec-dist tune` with the
same flags (see doc2vec_dist/tune.py).

    python jobs/tune.py --corpus runs/synth/corpus --heldout runs/synth/heldout.parquet --out runs/synth/tune
    ray job submit --working-dir . -- python jobs/tune.py --corpus /shared/corpus --heldout /shared/h.parquet \\
        --out /shared/tune --budget 8

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so the search and every trial's servers
and workers run on the cluster; without it a local Ray is started here. The corpus, the metric's
file and --out must be on storage every node sees.
"""

from __future__ import annotations

import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (or Ray's copy of it)
try:
    from doc2vec_dist.environment import require_packages
except ModuleNotFoundError:  # the project not installed in this Python: its environment.py needs only the stdlib
    require_packages = runpy.run_path(os.path.join(ROOT, "doc2vec_dist", "environment.py"))["require_packages"]
require_packages()  # one line, not a traceback, from a Python without the project's packages

from doc2vec_dist.cli import main

if __name__ == "__main__":
    sys.exit(main(["tune", *sys.argv[1:]]))
