"""Export a model table on Ray: one task per checkpoint part, run where Ray places it.

    python jobs/export.py --model runs/sample/model --table docs --out runs/sample/users      # local Ray
    ray job submit --working-dir . -- python jobs/export.py --model /shared/model --out /shared/users

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so the job joins the cluster; without
it a local Ray is started here. Each task reads its part straight from the checkpoint and writes its
own output file, so `--model` and `--out` must be on storage every node sees. A directory `--out`
gets one Parquet file per part, written in parallel; `--out FILE.parquet` has one writer and runs in
this process.
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
    return pipeline.parse_export(argv, __doc__)


def main(argv: list[str] | None = None) -> int:
    return pipeline.export_job(argv, __doc__)


if __name__ == "__main__":
    sys.exit(main())
