"""The whole job: prepare (if needed) → train on Ray → export → faiss index → evaluate → the report page.

    python jobs/train.py                                   # the bundled sample, a local Ray started here
    python jobs/train.py --input events/ --out runs/mine/model   # your events, the library's defaults
    python jobs/train.py --config my.yaml --epochs 20      # flags override the YAML, same names
    ray job submit --working-dir . -- python jobs/train.py --config jobs/configs/sample.yaml

Which config: --config FILE; with none, the bundled sample's (jobs/configs/sample.yaml) when no --input,
--corpus or --out is given, else none: the library's defaults and the flags. The first line says which.

With --input and no corpus configured, the corpus is prepared beside the model, in OUT-corpus (and the
held-out pairs of --holdout in OUT-heldout.parquet); --input without --out is refused. A corpus found at
the corpus path is used only if corpus.json says it was prepared from the same input files with the same
settings; else the job refuses in one line, or, where it chose that path itself (OUT-corpus, the
sample's) and --overwrite is given, prepares it again.

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so the same code joins the cluster; the
paths in the config must then be on storage every node sees.
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

from doc2vec_dist import pipeline


def parse(argv: list[str] | None):
    return pipeline.parse_job(argv, ROOT, __doc__)


def main(argv: list[str] | None = None) -> int:
    return pipeline.train_job(argv, ROOT, __doc__)


if __name__ == "__main__":
    sys.exit(main())
