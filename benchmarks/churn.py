"""Expiry under churn (issue 51, part 2): daily refreshes of a population that comes and goes, with and without
--expire-days, measured against the truth of who is active.

    python benchmarks/churn.py                       # 4,000 active users, 10%/week churn, 30 daily refreshes
    python benchmarks/churn.py --days 5              # a short run
    python benchmarks/churn.py --json results.json   # the table as JSON too

Everything in one process and one local Ray (started once):

  generate  users over --base-days + --days days with --churn-per-week (synthetic.py): each week that share of
            the active users leaves for good and as many arrive; an active user has about --events-per-day
            events a day (lognormal across users, as synthetic's activity)
  base      the first --base-days days → prepare (--time-col ts) → train (--epochs, cold) → flat index
  refresh   each of the next --days days, in every arm from the arm's previous day: prepare(that day's
            events, --base the previous model [, --expire-days E]) → train (1 epoch from the previous model, the
            first on the changed users, as jobs/refresh.py does) → index --update of the previous index
  held out  the day after the last refresh: every (user, URL) of that day whose URL the user never visited
            before, for the users active then (the truth); no model trains on it
  measure   each day: the users table (the model's docs rows), the URLs table, the index's rows, and the active
            population (the truth: users whose active span covers the day's end); at the end held-out
            recall@10 (seen URLs excluded) of the held-out users every arm still holds, how many held-out
            users each arm lost (expired while active, not back since), and how many it holds with a
            history cut short (expired while active, then back as new users); the recall again over the
            held-out users whose history no arm cut short

Targets (the issue's): with --expire-days the users table stays within 10% of the active population every day,
where without it grows without bound; held-out recall@10 of the active users no worse (within 0.005).
docs/benchmarks.md ("Expiry under churn") has the figures of two seeds.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout without installing the package

from doc2vec_dist.runners import calm_openmp

calm_openmp()  # before faiss is imported

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

DAY_MS = 86_400_000
TABLE_SLACK = 0.10    # users table / active population within this of 1, every day (--expire-days)
RECALL_SLACK = 0.005  # held-out recall@10 with expiry ≥ without − this


def split_days(events: pa.Table, start_ms: int, base_days: int, days: int, out: str) -> list[str]:
    """The events as files: the first `base_days` days, then one file per day."""
    ms = pc.cast(events["ts"], pa.int64()).to_numpy()
    paths = []
    edges = [start_ms, start_ms + base_days * DAY_MS] + [start_ms + (base_days + d) * DAY_MS for d in range(1, days + 1)]
    for i, (lo, hi) in enumerate(itertools.pairwise(edges)):
        paths.append(os.path.join(out, "base.parquet" if i == 0 else f"day-{i:02d}.parquet"))
        pq.write_table(events.filter(pa.array((ms >= lo) & (ms < hi))), paths[-1])
    return paths


def active_at(truth: pa.Table, at_ms: int) -> pa.Array:
    """The users whose active span covers `at_ms` (the truth's active_from, active_until)."""
    start = pc.cast(truth["active_from"], pa.int64()).to_numpy()
    until = pc.cast(truth["active_until"], pa.int64()).to_numpy()
    return truth["user_id"].combine_chunks().filter(pa.array((start <= at_ms) & (until > at_ms)))


def heldout_pairs(day: str, before: list[str], active: pa.Array, out: str) -> str:
    """The (key, token) pairs of the users active on `day` (its file) whose URL no earlier file shows them visiting."""
    events = pq.read_table(day, columns=["user_id", "url"])
    theirs = events.filter(pc.is_in(events["user_id"], value_set=active))
    earlier = pa.concat_tables(pq.read_table(p, columns=["user_id", "url"]) for p in before)
    fresh = theirs.group_by(["user_id", "url"]).aggregate([]).join(
        earlier.group_by(["user_id", "url"]).aggregate([]), keys=["user_id", "url"], join_type="left anti")
    path = os.path.join(out, "heldout.parquet")
    pq.write_table(fresh.rename_columns(["key", "token"]).sort_by([("key", "ascending"), ("token", "ascending")]), path)
    return path


def run(args) -> dict:
    from doc2vec_dist.config import PrepareConfig, TrainConfig
    from doc2vec_dist.corpus import Corpus
    from doc2vec_dist.evaluate import heldout_metrics
    from doc2vec_dist.index import build_index
    from doc2vec_dist.index_update import update_index
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.synthetic import _WINDOW_START_MS, _Churn, generate
    from doc2vec_dist.trainer import train

    work = args.work
    total_days = args.base_days + args.days + 1  # the day after the last refresh is held out
    churn = _Churn(1, total_days, args.churn_per_week)
    users = round(args.active * (1 + churn.hazard * total_days))  # the active population stays about --active
    gen = os.path.join(work, f"generated-{users}-{args.urls}-{total_days}-{args.churn_per_week:g}-"
                             f"{args.events_per_day:g}-{args.seed}")  # reused by a run of the same data
    if not os.path.exists(gen):
        generate(gen, users, args.urls, seed=args.seed, events_per_user=args.events_per_day * total_days,
                 days=total_days, churn_per_week=args.churn_per_week, progress=False)
    events = pq.read_table(os.path.join(gen, "events"))
    truth = pq.read_table(os.path.join(gen, "truth", "users.parquet"))
    split = os.path.join(work, "days")
    shutil.rmtree(split, ignore_errors=True)
    os.makedirs(split)
    files = split_days(events, _WINDOW_START_MS, args.base_days, args.days + 1, split)
    end_ms = _WINDOW_START_MS + total_days * DAY_MS
    heldout = heldout_pairs(files[-1], files[:-1], active_at(truth, end_ms - 1), split)
    files = files[:-1]

    cfg = {"dim": args.dim, "sample": 0, "num_ps": 2, "cpus_per_worker": 1, "seed": args.seed, "progress": False}
    base = os.path.join(work, "base")
    shutil.rmtree(base, ignore_errors=True)
    t = time.perf_counter()
    corpus = prepare([files[0]], os.path.join(base, "corpus"), PrepareConfig(time_col="ts"), progress=False).path
    train(corpus, os.path.join(base, "model"), TrainConfig(epochs=args.epochs, **cfg))
    build_index(os.path.join(base, "index"), kind="flat", model=os.path.join(base, "model"), progress=False,
                report=False, recall_queries=100)
    base_seconds = time.perf_counter() - t
    arms = {"unbounded": None, **{f"expire {e:g}d": e for e in args.expire_days}}
    rows = {name: [] for name in arms}
    last = {name: base for name in arms}
    for d, day in enumerate(files[1:], start=1):
        at_ms = _WINDOW_START_MS + (args.base_days + d) * DAY_MS - 1
        active = len(active_at(truth, at_ms))
        for name, expire in arms.items():
            here = os.path.join(work, name.replace(" ", "-"), f"day-{d:02d}")
            shutil.rmtree(here, ignore_errors=True)
            t = time.perf_counter()
            corpus = prepare([day], os.path.join(here, "corpus"), PrepareConfig(
                time_col="ts", base=os.path.join(last[name], "model"), expire_days=expire), progress=False)
            train(corpus.path, os.path.join(here, "model"), TrainConfig(
                epochs=1, first_epoch="changed", init_from=os.path.join(last[name], "model"), **cfg))
            index = update_index(os.path.join(last[name], "index"), os.path.join(here, "index"),
                                 model=os.path.join(here, "model"), progress=False, report=False, recall_queries=100)
            seconds = time.perf_counter() - t
            refresh = corpus.meta["refresh"]
            rows[name].append({"day": d, "active": active, "users": corpus.num_docs, "urls": corpus.vocab_size,
                               "ratio": corpus.num_docs / active, "index_rows": index["rows"],
                               "expired": refresh.get("expired_users", 0), "seconds": round(seconds, 2)})
            if d > 1 and not args.keep:
                shutil.rmtree(os.path.join(last[name]), ignore_errors=True)
            last[name] = here
        print(f"day {d:2d}: active {active:,}; " + "; ".join(
            f"{n}: {r[-1]['users']:,} users ({r[-1]['ratio']:.3f})" for n, r in rows.items()), file=sys.stderr)

    # held-out recall@10 of the held-out users every arm still holds, each model against its own corpus
    pairs = pq.read_table(heldout)
    held = set(pc.unique(pairs["key"]).to_pylist())
    lengths = {}
    for name in arms:
        docs = Corpus(os.path.join(last[name], "corpus")).docs()
        lengths[name] = {k: n for k, n in zip(docs["key"].to_pylist(), docs["length"].to_pylist(), strict=True)
                         if k in held}
    every = set.intersection(*(set(found) for found in lengths.values()))
    shared = os.path.join(split, "heldout-shared.parquet")
    pq.write_table(pairs.filter(pc.is_in(pairs["key"], value_set=pa.array(sorted(every), pa.string()))), shared)
    recall = {name: heldout_metrics(os.path.join(last[name], "model"), shared, max_users=None)["model_recall@10"]
              for name in arms}
    full = lengths["unbounded"]
    # the same for those whose history no arm cut short: what expiry does to the model, apart from the users it cut
    whole = sorted(k for k in every if all(found[k] == full[k] for found in lengths.values()))
    uncut = os.path.join(split, "heldout-uncut.parquet")
    pq.write_table(pairs.filter(pc.is_in(pairs["key"], value_set=pa.array(whole, pa.string()))), uncut)
    recall_uncut = {name: heldout_metrics(os.path.join(last[name], "model"), uncut, max_users=None)["model_recall@10"]
                    for name in arms}
    return {"settings": vars(args), "generated_users": users, "base_seconds": round(base_seconds, 1), "rows": rows,
            "heldout_users": len(held), "heldout_users_kept": {n: len(found) for n, found in lengths.items()},
            "history_cut": {n: sum(1 for k, length in found.items() if length < full.get(k, 0))
                            for n, found in lengths.items()},
            "recall_users": len(every), "recall_at_10": recall, "uncut_users": len(whole),
            "recall_at_10_uncut": recall_uncut}


def table(result: dict) -> str:
    """The markdown tables docs/benchmarks.md shows: the users table by day (every fifth and the first), then
    each arm's figures against the targets."""
    names = list(result["rows"])
    days = result["rows"][names[0]]
    shown = [r["day"] for r in days if r["day"] % 5 == 0 or r["day"] in (1, len(days))]
    lines = ["| day | active users | " + " | ".join(f"{n}: users (÷ active)" for n in names) + " |",
             "|" + "---:|" * (2 + len(names))]
    for d in shown:
        r = {n: result["rows"][n][d - 1] for n in names}
        lines.append(f"| {d} | {r[names[0]]['active']:,} | "
                     + " | ".join(f"{r[n]['users']:,} ({r[n]['ratio']:.3f})" for n in names) + " |")
    rec, base = result["recall_at_10"], result["recall_at_10"][names[0]]
    lines += ["", "| | " + " | ".join(names) + " | target |", "|---|" + "---:|" * len(names) + "---|"]
    worst = {n: max((r["ratio"] for r in result["rows"][n]), key=lambda x: abs(x - 1)) for n in names}
    lines.append("| users table ÷ active population, the day furthest from 1 | "
                 + " | ".join(f"{worst[n]:.3f}" + (" ✓" if abs(worst[n] - 1) <= TABLE_SLACK else "") for n in names)
                 + f" | within {TABLE_SLACK:.0%} of 1 with expiry |")
    lines.append("| URLs on the last day | " + " | ".join(f"{result['rows'][n][-1]['urls']:,}" for n in names) + " | |")
    lines.append(f"| held-out recall@10, the {result['recall_users']:,} held-out users every arm holds | "
                 + " | ".join(f"{rec[n]:.4f}" + (" ✓" if n != names[0] and rec[n] >= base - RECALL_SLACK else "")
                              for n in names) + f" | ≥ unbounded − {RECALL_SLACK} |")
    lines.append(f"| the same, the {result['uncut_users']:,} of them whose history no arm cut short | "
                 + " | ".join(f"{result['recall_at_10_uncut'][n]:.4f}" for n in names) + " | |")
    lines.append(f"| held-out users held (of {result['heldout_users']:,} active the day after) | "
                 + " | ".join(f"{result['heldout_users_kept'][n]:,}" for n in names) + " | |")
    lines.append("| of those, with a history cut short (expired while active, back as new) | "
                 + " | ".join(f"{result['history_cut'][n]:,}" for n in names) + " | |")
    lines.append("| seconds per refresh (prepare + train + index update), mean | "
                 + " | ".join(f"{np.mean([r['seconds'] for r in result['rows'][n]]):.1f}" for n in names) + " | |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--active", type=int, default=4000, help="the active population kept level by arrivals")
    ap.add_argument("--urls", type=int, default=1000)
    ap.add_argument("--churn-per-week", type=float, default=0.1)
    ap.add_argument("--events-per-day", type=float, default=1.5, help="mean events of an active user a day")
    ap.add_argument("--base-days", type=int, default=30)
    ap.add_argument("--days", type=int, default=30, help="daily refreshes")
    ap.add_argument("--expire-days", type=float, nargs="+", default=[7.0, 10.0, 14.0],
                    help="an arm for each (beside the unbounded one)")
    ap.add_argument("--dim", type=int, default=16)
    ap.add_argument("--epochs", type=int, default=5, help="epochs of the base model")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one, removed)")
    ap.add_argument("--keep", action="store_true", help="keep every day's corpus, model and index")
    ap.add_argument("--json", help="write the results as JSON here too")
    args = ap.parse_args(argv)
    from doc2vec_dist.cluster import ray_connection

    temporary = args.work is None
    args.work = args.work or tempfile.mkdtemp(prefix="doc2vec-churn-")
    try:
        with ray_connection(None):
            t = time.perf_counter()
            result = run(args)
            result["seconds"] = round(time.perf_counter() - t, 1)
    finally:
        if temporary:
            shutil.rmtree(args.work, ignore_errors=True)
    print(table(result))
    print(f"\n{result['seconds']:.0f} s in all")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(result, fh, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
