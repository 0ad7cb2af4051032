"""The daily refresh as one job: today's events on top of yesterday's model, trained from it, exported,
and yesterday's index updated (issue 17).

    python jobs/refresh.py --events today.parquet --base-model runs/day1/model --index runs/day1/index \\
        --out runs/day2
    ray job submit --working-dir . -- python jobs/refresh.py --events /shared/events/2026-12-02 \\
        --base-model /shared/days/2026-12-01/model --index /shared/days/2026-12-01/index \\
        --out /shared/days/2026-12-02

Steps, each a library call in this process (the per-part work of export and index as Ray tasks when
the job runs on a cluster):

  1. prepare  --events on top of --base-corpus, else the base model's corpus: every known user and URL
              keeps its id, new ones come after, a user's new events join its document
              (--window-days N: the last N days instead)                       → DAY_DIR/corpus
  2. train    from the base model's rows (init_from), with its settings: its config.json, then
              --config, then flags; epochs 1 unless one of those says otherwise  → DAY_DIR/model
  3. export   users (docs) and URLs (words_out), Parquet (key, vector), a file per checkpoint part
                                                          → DAY_DIR/exports/users, DAY_DIR/exports/urls
  4. index    --index OLD_INDEX updated to the new users' vectors, else a new one → DAY_DIR/index
  5. report   one summary block (what is new, how far known users moved, the index's changes and
              recall, the time of each step), also written as DAY_DIR/refresh.json; and the page
              (doc2vec-dist report: the run, the space, the known users' drift)   → DAY_DIR/report.html

DAY_DIR must be new or empty: a refresh never writes over anything, not even an earlier refresh (remove
a failed one to run that day again). Yesterday's DAY_DIR/model and DAY_DIR/index are today's
--base-model and --index; the base model and index are only read.

A refresh whose training stopped after a checkpoint (a node died, Ctrl-C) names the command that resumes
it: the same command with --resume, which trains DAY_DIR/model on from its last checkpoint on the corpus
already prepared there, then exports and indexes.

Under `ray job submit` the job supervisor sets RAY_ADDRESS, so training joins the cluster; every path
must then be on storage every node sees. A relative --out there needs --root (see jobs/train.py).
"""

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
    return pipeline.parse_refresh(argv, __doc__)


def main(argv: list[str] | None = None) -> int:
    return pipeline.refresh_job(argv, ROOT, __doc__)


if __name__ == "__main__":
    sys.exit(main())
