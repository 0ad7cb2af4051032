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
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout or a Ray working_dir without installing the package

from doc2vec_dist.environment import require_packages

require_packages()  # one line, not a traceback, from a Python without the project's packages

from doc2vec_dist.errors import UserError
from doc2vec_dist.export import FORMATS, export
from doc2vec_dist.logs import to_terminal
from doc2vec_dist.modeldir import KEY_TABLES
from doc2vec_dist.runners import run_on_ray


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model directory")
    ap.add_argument("--table", default="docs", choices=tuple(KEY_TABLES))
    ap.add_argument("--out", required=True, help="output directory (or FILE.parquet, FILE.txt for word2vec)")
    ap.add_argument("--format", default="parquet", choices=FORMATS)
    ap.add_argument("--normalize", action="store_true", help="scale vectors to unit length")
    ap.add_argument("--dtype", default="float32", choices=("float32", "float16"))
    ap.add_argument("--address", default=None, help="Ray address (default: RAY_ADDRESS, else a local Ray)")
    ap.add_argument("--no-progress", action="store_true", help="no progress bars")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    to_terminal()
    args = parse(argv)
    from doc2vec_dist.cluster import ray_connection

    try:
        with ray_connection(args.address):
            r = export(args.model, args.table, args.out, format=args.format, normalize=args.normalize, dtype=args.dtype,
                       progress=not args.no_progress, runner=run_on_ray)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    hosts = sorted({t["host"] for t in r["tasks"]})
    print(f"exported {r['rows']:,} rows of {r['table']} to {r['path']} in {r['seconds']:.2f}s "
          f"({r['rows_per_second']:,.0f} rows/s) by {len(r['tasks'])} tasks on {', '.join(hosts)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
