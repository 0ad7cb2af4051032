"""Lee corpus check: ours and gensim's doc2vec (PV-DBOW by default) on one corpus, against human ratings.

gensim ships the Lee corpus (300 background + 50 test news documents) and the human similarity
ratings of the 50 test documents. Both trainers see one text corpus: the 50 test documents first
(so their keys are 0..49, the rows of the ratings matrix), then the 300 background documents,
tokenised with gensim's simple_preprocess. The figure is the Pearson correlation between the cosine
similarity of the 50 learned document vectors and the human ratings (1,225 pairs).

    python benchmarks/lee.py [--seeds 1 2 3] [--epochs 40] [--work runs/lee]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import harness

from doc2vec_dist.baseline import train_gensim
from doc2vec_dist.config import PrepareConfig, TrainConfig
from doc2vec_dist.evaluate import pairs_metrics
from doc2vec_dist.logs import to_terminal
from doc2vec_dist.prepare import prepare
from doc2vec_dist.trainer import train


def write_lee_text(path: str) -> str:
    """Test documents then background documents, one per line, simple_preprocess tokens."""
    harness.write_lee_text(path)
    return path


def run(work: str, seeds: list[int], epochs: int = 40, dim: int = 100, min_count: int = 2,
        progress: bool = False, num_workers: int = 1, mode: str = "dbow", dbow_words: bool = False) -> dict:
    os.makedirs(work, exist_ok=True)
    text = write_lee_text(os.path.join(work, "lee.txt"))
    corpus = os.path.join(work, "corpus")
    prepare([text], corpus, PrepareConfig(format="text", min_count=min_count), overwrite=True, progress=progress)
    ratings = harness.lee_ratings_path()
    rows = {"doc2vec-dist": [], "gensim": []}
    speed = {"doc2vec-dist": [], "gensim": []}
    for seed in seeds:
        cfg = TrainConfig(dim=dim, epochs=epochs, mode=mode, dbow_words=dbow_words, seed=seed, progress=progress,
                          num_workers=num_workers)
        for who, fn in (("doc2vec-dist", train), ("gensim", train_gensim)):
            model = os.path.join(work, f"{who}-seed{seed}")
            summary = fn(corpus, model, cfg, overwrite=True)
            rows[who].append(pairs_metrics(model, ratings)["pearson"])
            speed[who].append(summary["tokens_per_second"])
    return {who: {"pearson": rows[who], "mean": statistics.mean(rows[who]),
                  "tokens_per_second": statistics.mean(speed[who])} for who in rows}


def main() -> None:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--work", default="runs/lee")
    args = ap.parse_args()
    result = run(args.work, args.seeds, args.epochs)
    print(f"{'trainer':<14} {'pearson (per seed)':<30} {'mean':>7} {'tokens/s':>10}")
    for who, r in result.items():
        per = " ".join(f"{p:.3f}" for p in r["pearson"])
        print(f"{who:<14} {per:<30} {r['mean']:>7.3f} {r['tokens_per_second'] / 1e6:>9.3f}M")
    diff = result["doc2vec-dist"]["mean"] - result["gensim"]["mean"]
    print(f"difference (ours - gensim): {diff:+.3f}")
    with open(os.path.join(args.work, "lee.json"), "w") as fh:
        json.dump(result, fh, indent=2)


if __name__ == "__main__":
    main()
