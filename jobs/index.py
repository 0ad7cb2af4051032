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
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout or a Ray working_dir without installing the package

from doc2vec_dist.environment import require_packages

require_packages()  # one line, not a traceback, from a Python without the project's packages

from doc2vec_dist.runners import calm_openmp

calm_openmp()  # before faiss is imported

from doc2vec_dist.checkpoint import KEY_TABLES
from doc2vec_dist.errors import UserError
from doc2vec_dist.index import KINDS, build_index, summary_line
from doc2vec_dist.index_update import update_index
from doc2vec_dist.logs import to_terminal
from doc2vec_dist.runners import run_on_ray


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="model directory")
    ap.add_argument("--table", default="docs", choices=tuple(KEY_TABLES))
    ap.add_argument("--vectors", help="Parquet file or directory of key, vector (instead of --model)")
    ap.add_argument("--out", required=True, help="index directory")
    ap.add_argument("--kind", default=None, choices=KINDS,
                    help="auto: flat up to 1M rows, else ivfpq (default: auto; with --update, the old index's kind)")
    ap.add_argument("--update", metavar="OLD_INDEX", help="update this index to the new source (see `index --update`)")
    ap.add_argument("--recall-queries", type=int, default=1000, help="queries for recall@10 vs exact")
    ap.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    to_terminal()
    args = parse(argv)
    from doc2vec_dist.trainer import ray_connection

    try:
        with ray_connection(args.address):
            common = {"model": args.model, "table": args.table, "vectors_path": args.vectors, "runner": run_on_ray,
                      "progress": not args.no_progress, "report": False, "recall_queries": args.recall_queries}
            if args.update:
                params = update_index(args.update, args.out, kind=args.kind, **common)
            else:
                params = build_index(args.out, kind=args.kind or "auto", **common)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary_line(params))
    hosts = sorted({t["host"] for t in params["tasks"]})
    print(f"{len(params['tasks'])} Ray tasks on {', '.join(hosts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
