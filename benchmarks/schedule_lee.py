"""Why several workers lose quality on text, measured on an in-process copy of the schedules.

    python benchmarks/schedule_lee.py --workers 2 --segments 1 16 64 --seeds 1 2 3 4 5 6 7 8

Trains PV-DBOW on gensim's Lee corpus (in both document orders) with the engine's own kernel
(cpu_kernel.train_tokens), block deal (schedule.Blocks), subsampling and negative tables, one thread,
in this process: no Ray, no servers. Each worker's documents and the rounds are those of the block
schedule, its workers run one after another within a round (they write disjoint rows, so the order
changes nothing), which makes hundreds of rounds an epoch cheap to try. Scores: Pearson with the human
ratings of the 50 test documents, as benchmarks/quality.py scores Lee.

Schedules (--schedules):
  one            one worker, one block: today's sole writer of every row (the reference)
  blocks         the block schedule: in each round a worker trains its tokens in the block it holds,
                 negatives from that block, negative x Q/P of them (schedule.Blocks)
  doc-negatives  the same, but each (document, block) draws negative x n_d x Q / n_db negatives, so that
                 each document meets gensim's count of negatives from every block, not only overall
  local-sgd      no blocks: each worker trains all its segment's tokens, negatives from the whole
                 vocabulary, on its own copy of the URL rows taken at the round's start; the copies'
                 changes are summed at its end (synchronous averaging of updates, a measured period)
  delayed        blocks' positives, negatives from the whole vocabulary: a worker trains on its own copy of
                 every row, the held block live, the others as it last held them; its changes to rows
                 outside the block wait in the worker and are added to that block when it next holds it,
                 or to every row at the epoch's end, after which each worker copies every row afresh (no
                 row written by two workers at once). The engine's version of it, which has not yet
                 shown what this copy gains, is on the branch negatives-from-vocabulary (docs/benchmarks.md)
  sequential     blocks' positives with negatives from the whole vocabulary, every row written at once:
                 what no parallel schedule can do (two workers would write the same rows), an upper bound

--segments S cuts each worker's documents into S segments, each trained through all its rounds before
the next (TrainConfig.segments): W x S rounds an epoch on the block schedules, S on local-sgd.

--split: which documents are worker i's segment s (split()):
  interleaved    the engine's plan (units.plan_units) since 2026-11-28: the corpus cut into W x S pieces of
                 about equal tokens, piece W*s + i is worker i's segment s (the rounds walk the corpus in order)
  halves         the engine's plan before: each worker a run of about 1/W of the tokens, cut into S segments
                 of about equal tokens
  by-count       this copy's split before 2026-11-28 (the tables in docs/benchmarks.md until then): runs and
                 segments of equal numbers of documents
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

SCHEDULES = ("one", "blocks", "doc-negatives", "local-sgd", "sequential", "delayed")


def lee_corpus(work: str, background_first: bool) -> tuple[list[np.ndarray], np.ndarray, np.ndarray]:
    """Lee prepared as benchmarks/quality.py prepares it (min_count 2): each document's token ids in
    line order, the vocabulary's counts, and the rows of the 50 test documents."""
    import harness

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.corpus import Corpus, iter_shard
    from doc2vec_dist.prepare import prepare

    root = os.path.join(work, "lee-reversed" if background_first else "lee")
    text = os.path.join(root, "lee.txt")
    first_test = harness.write_lee_text(text, background_first=background_first)
    out = os.path.join(root, "corpus")
    if not os.path.exists(os.path.join(out, "corpus.json")):  # prepared once and kept, as quality.py keeps its sets
        prepare([text], out, PrepareConfig(format="text", min_count=2), progress=False)
    corpus = Corpus(out)
    table = corpus.docs()
    by_id = {}
    for path in corpus.shard_paths:
        for doc_ids, offsets, tokens in iter_shard(path):
            for i, d in enumerate(doc_ids):
                by_id[int(d)] = np.array(tokens[offsets[i]:offsets[i + 1]], np.int32)
    # rows in line order (a document's key is its line number); a document min_count emptied has no tokens
    line_of = dict(zip(table["id"].to_pylist(), (int(k) for k in table["key"].to_pylist())))
    docs = [by_id.get(d, np.zeros(0, np.int32)) for d in sorted(line_of, key=line_of.get)]
    return docs, corpus.counts().astype(np.float64), np.arange(first_test, first_test + 50)


SPLITS = ("interleaved", "halves", "by-count")


def split(lengths: np.ndarray, workers: int, segments: int, how: str = "interleaved") -> list[list[np.ndarray]]:
    """Each worker's segments: the documents (indices, in corpus order) of worker i's segment s (--split)."""
    from doc2vec_dist.units import _even_cuts

    def cut(docs: np.ndarray, pieces: int) -> list[np.ndarray]:
        if how == "by-count":
            return np.array_split(docs, pieces)
        cuts = _even_cuts(np.concatenate([[0], np.cumsum(lengths[docs])]), pieces)
        return [docs[a:b] for a, b in itertools.pairwise(cuts)]

    everything = np.arange(len(lengths))
    if how == "interleaved" and workers > 1 and segments > 1:  # as plan_units' interleaved plan
        pieces = cut(everything, workers * segments)
        return [pieces[i::workers] for i in range(workers)]
    return [cut(own, segments) for own in cut(everything, workers)]


def call_seed(seed: int, call: int, hashed: bool) -> int:
    """The kernel's seed for a call: consecutive integers (the tables in docs/benchmarks.md before
    2026-11-28), or hashed from (seed, call), as the engine's per-batch seeds are drawn. The choice
    alone moved a paired 8-seed comparison by 0.011 (docs/benchmarks.md, "Negatives from the whole
    vocabulary"): read one set of seeds' figures with that spread."""
    if hashed:
        return int(np.random.default_rng([seed, call]).integers(1 << 63))
    return seed * 1_000_003 + call


def train(docs: list[np.ndarray], counts: np.ndarray, workers: int, schedule: str, seed: int, segments: int = 1,
          dim: int = 100, epochs: int = 40, negative: int = 5, alpha: float = 0.025, min_alpha: float = 0.0001,
          sample: float = 1e-3, ns_exponent: float = 0.75, hashed_seeds: bool = False,
          how: str = "interleaved") -> np.ndarray:
    """The document vectors after training with `schedule` on `workers` workers (see the docstring)."""
    from doc2vec_dist.cpu_kernel import train_tokens
    from doc2vec_dist.lr import rate_at
    from doc2vec_dist.ps import _fill_uniform
    from doc2vec_dist.sampling import NegativeTable, keep_probabilities
    from doc2vec_dist.schedule import MAX_NEGATIVE_RATIO, Blocks

    if schedule == "one":
        workers = 1
    inputs = np.empty((len(docs), dim), np.float32)
    _fill_uniform(inputs, np.random.default_rng(seed))  # the servers' (gensim 4's) U[-1, 1) / dim
    outputs = np.zeros((len(counts), dim), np.float32)
    keep = keep_probabilities(counts, sample)
    everything = NegativeTable(counts, ns_exponent)
    q = counts ** ns_exponent
    q /= q.sum()
    segmented = split(np.array([len(d) for d in docs]), workers, segments, how)  # worker i's segment s
    owned = [np.concatenate(own) for own in segmented]  # each worker's documents, in corpus order
    planned = [epochs * sum(len(docs[d]) for d in own) for own in owned]
    done = [0] * workers
    calls = [0]

    def run(i: int, rows: np.ndarray, doc_of: np.ndarray, tokens: np.ndarray, keep_of, table, count: float) -> None:
        # worker i's tokens, its learning rate decaying over its own planned tokens (as a worker's does)
        if len(tokens) == 0:
            return
        start = rate_at(alpha, min_alpha, done[i], planned[i])
        done[i] += len(tokens)
        end = rate_at(alpha, min_alpha, done[i], planned[i])
        calls[0] += 1
        train_tokens(inputs, rows, doc_of, tokens, keep_of, table.accept, table.alias, count, start, end,
                     call_seed(seed, calls[0], hashed_seeds), threads=1)

    if schedule == "delayed":  # each worker's copy of every row, and its changes waiting to go home
        views = [outputs.copy() for _ in range(workers)]
        pending = [np.zeros_like(outputs) for _ in range(workers)]
    for epoch in range(epochs):
        if schedule == "local-sgd":
            for s in range(segments):
                start_rows, change = outputs.copy(), np.zeros_like(outputs)
                for i in range(workers):
                    mine = segmented[i][s]
                    copy = start_rows.copy()
                    run(i, copy, np.repeat(mine, [len(docs[d]) for d in mine]),
                        np.concatenate([docs[d] for d in mine] or [np.zeros(0, np.int32)]), keep, everything, negative)
                    change += copy - start_rows
                outputs += change
            continue
        blocks = Blocks(counts, keep, workers, seed, epoch, negative, ns_exponent)
        held = [blocks.block(b, keep, counts, ns_exponent, everything if workers == 1 else None)
                for b in range(workers)]  # each block's keep and negatives' table, once an epoch
        in_block = [[d[blocks.block_of[d] == b] for b in range(workers)] for d in docs]
        for r in range(workers * segments):
            for i in range(workers):
                b = Blocks.held(i, r % workers, workers)
                ids = blocks.ids(b)
                mine = segmented[i][r // workers]
                parts = [(d, in_block[d][b]) for d in mine]
                parts = [(d, t) for d, t in parts if len(t)]
                if schedule == "delayed":  # it holds the block, trained or not
                    view, wait = views[i], pending[i]
                    outputs[ids] += wait[ids]  # the changes it made to this block while another held it
                    wait[ids] = 0
                    view[ids] = outputs[ids]
                if not parts:
                    continue
                doc_of = np.concatenate([np.full(len(t), d) for d, t in parts])
                tokens = np.concatenate([t for _, t in parts])  # global rows
                if schedule == "delayed":
                    before = view.copy()
                    run(i, view, doc_of, tokens, keep, everything, negative)
                    wait += view - before
                    wait[ids] = 0
                    outputs[ids] = view[ids]
                    continue
                if schedule == "sequential":
                    run(i, outputs, doc_of, tokens, keep, everything, negative)
                    continue
                block = held[b]
                rows = outputs[ids]
                if schedule == "doc-negatives":
                    share = q[ids].sum()
                    for d, t in parts:
                        count = negative * keep[docs[d]].sum() * share / max(keep[t].sum(), 1e-12)
                        run(i, rows, np.full(len(t), d), blocks.local_of[t].astype(np.int32), block.keep,
                            block.negatives, float(np.clip(count, negative / MAX_NEGATIVE_RATIO,
                                                           negative * MAX_NEGATIVE_RATIO)))
                else:
                    run(i, rows, doc_of, blocks.local_of[tokens].astype(np.int32), block.keep, block.negatives,
                        block.negative)
                outputs[ids] = rows
        if schedule == "delayed":  # the epoch's end: what waits goes home, worker after worker, and every
            for i in range(workers):  # worker goes on from the servers' rows (Worker.settle_waiting, refresh_rows)
                outputs += pending[i]
                pending[i][:] = 0
            views = [outputs.copy() for _ in range(workers)]
    return inputs


def pearson(vectors: np.ndarray, test_rows: np.ndarray) -> float:
    """Pearson of the test documents' cosine similarities with the human ratings."""
    import harness
    from scipy.stats import pearsonr

    from doc2vec_dist.scoring import unit_rows

    ratings = np.loadtxt(harness.lee_ratings_path())
    v = unit_rows(vectors[test_rows])
    i, j = np.triu_indices(len(test_rows), 1)
    return float(pearsonr((v[i] * v[j]).sum(1), ratings[i, j])[0])


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workers", type=int, nargs="+", default=[2])
    ap.add_argument("--segments", type=int, nargs="+", default=[1])
    ap.add_argument("--schedules", nargs="+", default=list(SCHEDULES), choices=SCHEDULES)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=40, help="benchmarks/quality.py's Lee setting")
    ap.add_argument("--hashed-seeds", action="store_true",
                    help="seed the kernel's calls from a hash of (seed, call), not consecutive integers (call_seed)")
    ap.add_argument("--split", default="interleaved", choices=SPLITS,
                    help="which documents are each worker's segments (see above; default: the engine's plan)")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "schedule_lee"))
    ap.add_argument("--json", help="default: WORK/schedule_lee.json")
    args = ap.parse_args(argv)
    from harness import save_json

    result: dict = {"epochs": args.epochs, "seeds": args.seeds, "split": args.split, "runs": []}
    print("| order | schedule | workers | segments | Pearson, mean | spread | against one worker |")
    print("|---|---|---|---|---|---|---|")
    for background_first in (False, True):
        order = "background first" if background_first else "test first"
        docs, counts, test_rows = lee_corpus(args.work, background_first)
        one = None
        combos = [("one", 1, 1)] + [(s, w, g) for s in args.schedules if s != "one"
                                    for w in args.workers for g in args.segments]
        for schedule, workers, segments in combos:  # one worker first: the reference of every other row
            values = [pearson(train(docs, counts, workers, schedule, seed, segments, epochs=args.epochs,
                                    hashed_seeds=args.hashed_seeds, how=args.split), test_rows)
                      for seed in args.seeds]
            mean = float(np.mean(values))
            one = mean if schedule == "one" else one
            result["runs"].append({"order": order, "schedule": schedule, "workers": workers, "segments": segments,
                                   "pearson": values, "mean": mean})
            print(f"| {order} | {schedule} | {workers} | {segments} | {mean:.4f} | {max(values) - min(values):.4f} | "
                  + ("-" if schedule == "one" else f"{mean - one:+.4f}") + " |", flush=True)
    os.makedirs(args.work, exist_ok=True)
    save_json(result, args.json or os.path.join(args.work, "schedule_lee.json"))
    return result


if __name__ == "__main__":
    main()
