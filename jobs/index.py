"""Build a faiss index on Ray: the per-file work (normalise and stage the vectors, encode IVF-PQ
sub-indexes) runs as Ray tasks; training on a sample, merging and measuring recall run here. With
--update OLD_INDEX, staging the new source runs as Ray tasks and the update itself here.

    python jobs/index.py --model runs/sample/model --table docs --out runs/sample/users.index  # local Ray
    ray job submit --working-dir . -- python jobs/index.py --vectors /shared/users --out /shared/users.index
    python jobs/index.py --update runs/sample/users.index --model runs/sample/model --out runs/sample/users.index

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so the job joins the cluster; without it
a local Ray is started here. Sources and `--out` must be on storage every node sees.
"""

from __future__ import annotations

import argparse
import os
import runpy
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the checkout (or Ray's copy of it)
try:
    from doc2vec_dist.environment import require_packages
except ModuleNotFoundError:  # the project not installed in this Python: its environment.py needs only the stdlib
    require_packages = runpy.run_path(os.path.join(ROOT, "doc2vec_dist", "environment.py"))["require_packages"]
require_packages()  # one line, not a traceback, from a Python without the project's packages

from doc2vec_dist import pipeline


def parse(argv: list[str] | None) -> argparse.Namespace:
    return pipeline.parse_index(argv, __doc__)


def main(argv: list[str] | None = None) -> int:
    return pipeline.index_job(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
