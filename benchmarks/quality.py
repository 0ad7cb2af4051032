"""Quality on real and skewed data: ours against gensim at its best (its iterable mode), over seeds.

    python benchmarks/quality.py                                  # every set, PV-DBOW, seeds 1 2 3, the defaults
    python benchmarks/quality.py --sets lee lee-reversed --modes dbow dbow_words --config my.yaml
    python benchmarks/quality.py --sets skewed --seeds 1 --quick  # a smoke run: smaller sets, fewer epochs
    python benchmarks/quality.py --tune 8                         # tune each set, then tuned vs its settings vs gensim
    python benchmarks/quality.py --tune 8 --searcher optuna       # the same with Optuna's TPE drawing the trials
    python benchmarks/quality.py --workers 1 2 4 8 --ray-cpus 8 --no-gensim   # more workers against one worker
    python benchmarks/quality.py --sets pypi15k pypi --workers 1 2 4 8 --ray-cpus 12   # real short documents

Each set is trained by ours (`train`, the defaults plus the set's own model settings plus --config)
and by gensim (`baseline --gensim-mode iterable`, its most accurate mode, all cores) with the same
model settings and seed, and scored the same way:

  lee            gensim's Lee corpus, the 50 test documents first, then the 300 background ones;
                 Pearson of cosine similarity with the human ratings of the test documents
                 (dbow, dim 100, 40 epochs, min_count 2, as the issues measure it)
  lee-reversed   the same, background documents first: the order in which a trainer meets them
  newsgroups     gensim's mini_newsgroup test data (20 groups); k-NN label accuracy (k 10, fixed split)
  skewed         `generate --hub-share 0.8 --events-per-user 5`: short documents, one URL in 80% of them,
                 as in real catalogues; held-out recall@10 (one hidden URL per document)
  synth200k      the 200k-user × 100k-URL synthetic corpus; held-out recall@10
  pypi           the Python Package Index's one-line summaries (--pypi-summaries): 794k real short
                 documents (median 8 words), a heavy-tailed vocabulary; simple_preprocess words seen
                 twice or more, documents of 3+ distinct such words, one word of each held out
                 (every copy of it); held-out recall@10 (dbow, dim 100, 20 epochs, as issue 50 measures)
  pypi15k        the same, of the 15,000 most downloaded packages only
  pypi-short     the same, of documents of 3 to 6 such words only (about 4.6 each, as issue 50's real
                 catalogue): every 5th of them in the file's order, words seen twice or more among these

Prints one table per set and mode: each seed's figure, the mean and spread (max − min) of each
trainer, tokens/s, and ours − gensim against the target (≥ −0.002 on recall and accuracy, ≥ −0.005
on Lee). Everything is saved as JSON (--json). Prepared corpora are kept in --work and reused.

With --workers, ours trains once per worker count (each worker on 1 CPU), and each count is held to
the same margins against the first count (one worker) instead of against gensim. Their quality, not
their speed, is the figure: on a small machine give Ray more logical CPUs than it has cores
(--ray-cpus), so that every worker gets its actor.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import pickle
import statistics
import sys
import time
import zlib
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # runs from a checkout without installing the package
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from doc2vec_dist.config import PrepareConfig, TrainConfig, build, load_yaml
from doc2vec_dist.errors import UserError
from doc2vec_dist.logs import to_terminal

SETS = ("lee", "lee-reversed", "newsgroups", "skewed", "synth200k", "pypi15k", "pypi", "pypi-short")
MODES = {"dbow": {}, "dbow_words": {"dbow_words": True}, "dm": {"mode": "dm"}}
# the margin by which our mean may trail gensim's (iterable) mean: the targets
MARGIN = {"pearson": 0.005, "knn_accuracy@10": 0.002, "recall@10": 0.002}


@dataclasses.dataclass
class Set:
    """A prepared data set: its corpus, the model settings it is trained with, and how it is scored."""

    name: str
    corpus: str
    settings: dict
    metric: str                      # the figure reported: pearson, knn_accuracy@10, recall@10
    score: Callable[[str], float]    # model dir -> the figure
    about: str
    tune_target: dict = dataclasses.field(default_factory=dict)  # tune.search's metric file and its split
    test_score: Callable[[str], float] | None = None  # --tune: the figure on what the search never saw
    # held-out recall's floor: the same figure of evaluate's most-popular ranking (the counts, seen URLs out), which
    # needs no vectors; a model below it has learnt less than the counts know (model dir -> the figure)
    prior: Callable[[str], float] | None = None
    # held-out recall of the long tail (evaluate's without_top=TAIL_WITHOUT): model dir -> (the model's, the
    # prior's). On short documents the hub words are a fifth of the hidden ones and decide recall@10 by
    # themselves (pypi-short: 22% are among its 10 most common words, and the prior's 0.2278 is about that)
    tail: Callable[[str], tuple[float, float]] | None = None


TAIL_WITHOUT = 10  # the long tail's recall: the 10 most common words neither hidden nor ranked


def _heldout_recall(heldout: str) -> tuple[Callable[[str], float], Callable[[str], float],
                                           Callable[[str], tuple[float, float]]]:
    """A held-out set's (score, prior, tail): the model's recall@10 on `heldout` (its popularity ranking left
    out, as tune leaves it out of every trial), the popularity ranking's own, once a set, and both of the
    long tail (the TAIL_WITHOUT most common words neither hidden nor ranked)."""
    from doc2vec_dist.evaluate import heldout_metrics

    def score(model: str) -> float:
        return heldout_metrics(model, heldout, k=10, baseline=False)["model_recall@10"]

    def prior(model: str) -> float:
        return heldout_metrics(model, heldout, k=10)["popularity_recall@10"]

    def tail(model: str) -> tuple[float, float]:
        found = heldout_metrics(model, heldout, k=10, without_top=TAIL_WITHOUT)
        return found["model_recall@10"], found["popularity_recall@10"]

    return score, prior, tail


# -- the sets ----------------------------------------------------------------------------------------

def _lee(work: str, reverse: bool, quick: bool) -> Set:
    """Lee: one document per line, simple_preprocess tokens; the ratings as (key1, key2, score) pairs
    keyed by the test documents' line numbers in this order."""
    import harness

    from doc2vec_dist.prepare import prepare

    name = "lee-reversed" if reverse else "lee"
    root = os.path.join(work, name)
    order = ("background", "test") if reverse else ("test", "background")
    text = os.path.join(root, "lee.txt")
    first_test = harness.write_lee_text(text, background_first=reverse)
    ratings = np.loadtxt(harness.lee_ratings_path())
    i, j = np.triu_indices(len(ratings), 1)
    pairs = os.path.join(root, "pairs.parquet")
    pq.write_table(pa.table({"key1": [str(first_test + a) for a in i], "key2": [str(first_test + b) for b in j],
                             "score": ratings[i, j]}), pairs)
    corpus = _prepared(os.path.join(root, "corpus"), lambda out: prepare([text], out, PrepareConfig(format="text", min_count=2),
                                                                         overwrite=True, progress=False))

    def score(model: str) -> float:
        from doc2vec_dist.evaluate import pairs_metrics

        return pairs_metrics(model, pairs)["pearson"]

    def test_score(model: str) -> float:  # the half of the pairs tune --test-fraction 0.5 keeps from its search
        from doc2vec_dist.evaluate import pairs_metrics

        return pairs_metrics(model, pairs, test_fraction=TUNE_TEST_FRACTION)["pearson"]

    return Set(name, corpus, {"dim": 100, "epochs": 10 if quick else 40}, "pearson", score,
               f"Lee, {order[0]} documents first; Pearson with human ratings of the 50 test documents",
               {"pairs": pairs, "test_fraction": TUNE_TEST_FRACTION}, test_score)


def newsgroup_documents() -> tuple[list[str], list[str]]:
    """gensim's mini_newsgroup test data: (texts, group names).

    The file is a zlib-compressed Python 2 pickle of scikit-learn's `Bunch`, shipped inside gensim's
    package. It is read with an unpickler that builds only plain dicts, lists, strings and numpy
    arrays and refuses every other global, so nothing in it can run code (never load user files
    this way: doc2vec-dist itself reads only Arrow, Parquet and JSON)."""
    from gensim.test.utils import datapath

    allowed = {("copy_reg", "_reconstructor"), ("__builtin__", "dict"), ("sklearn.datasets.base", "Bunch"),
               ("numpy", "ndarray"), ("numpy", "dtype"), ("numpy.core.multiarray", "_reconstruct")}

    class Bunch(dict):
        pass

    class Restricted(pickle.Unpickler):
        def find_class(self, module, name):
            if (module, name) not in allowed:
                raise UserError(f"mini_newsgroup: refusing to load {module}.{name}")
            if name == "Bunch":
                return Bunch
            if name == "dict":
                return dict
            if name == "_reconstructor":
                import copyreg

                return copyreg._reconstructor
            if name == "_reconstruct":
                return _np_reconstruct()
            return getattr(np, name)

    import io

    with open(datapath("mini_newsgroup"), "rb") as fh:
        data = Restricted(io.BytesIO(zlib.decompress(fh.read())), encoding="latin1").load()
    names = list(data["target_names"])
    return [str(t) for t in data["data"]], [names[int(t)] for t in data["target"]]


def _np_reconstruct():
    try:
        from numpy._core.multiarray import _reconstruct
    except ImportError:  # numpy < 2
        from numpy.core.multiarray import _reconstruct
    return _reconstruct


def _newsgroups(work: str, quick: bool) -> Set:
    from gensim.utils import simple_preprocess

    from doc2vec_dist.prepare import prepare

    root = os.path.join(work, "newsgroups")
    os.makedirs(root, exist_ok=True)
    texts, groups = newsgroup_documents()
    text = os.path.join(root, "docs.txt")
    with open(text, "w", encoding="utf-8") as fh:
        fh.writelines(" ".join(simple_preprocess(t)) + "\n" for t in texts)
    corpus = _prepared(os.path.join(root, "corpus"), lambda out: prepare([text], out, PrepareConfig(format="text", min_count=2),
                                                                         overwrite=True, progress=False))

    labels = os.path.join(root, "labels.parquet")  # for tune --labels: key (line number), label (group)
    pq.write_table(pa.table({"key": [str(i) for i in range(len(groups))], "label": groups}), labels)

    def score(model: str) -> float:
        return leave_one_out_accuracy(model, groups, k=10)

    def test_score(model: str) -> float:  # evaluate --labels --test-fraction 0.5: the posts tune never scored
        from doc2vec_dist.evaluate import labels_metrics

        return labels_metrics(model, labels, k=10, test_fraction=TUNE_TEST_FRACTION)["knn_accuracy@10"]

    return Set("newsgroups", corpus, {"dim": 100, "epochs": 5 if quick else 20}, "knn_accuracy@10", score,
               f"gensim's mini_newsgroup ({len(texts):,} posts, {len(set(groups))} groups); 10-NN label accuracy, "
               "each post against all the others", {"labels": labels, "test_fraction": TUNE_TEST_FRACTION}, test_score)


def leave_one_out_accuracy(model: str, labels: list[str], k: int = 10) -> float:
    """Share of documents whose k nearest others (cosine) carry their label by majority. With 200
    posts, evaluate --labels' fixed 80/20 split would score 40 (steps of 0.025); this scores all 200."""
    from doc2vec_dist.evaluate import knn_vote
    from doc2vec_dist.modeldir import ModelDir
    from doc2vec_dist.scoring import unit_rows

    found = ModelDir(model)
    vectors = unit_rows(found.read_table("docs"))
    truth = np.array([labels[int(key)] for key in found.keys("docs").to_pylist()])  # text keys are line numbers
    names, codes = np.unique(truth, return_inverse=True)
    return float((knn_vote(vectors, codes, vectors, k, len(names), leave_one_out=True) == codes).mean())


def _generated(work: str, name: str, users: int, urls: int, epochs: int, about: str, **generate_args) -> Set:
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.synthetic import generate

    root = os.path.join(work, name)
    events = os.path.join(root, "generated")
    heldout = os.path.join(root, "heldout.parquet")
    if not os.path.exists(os.path.join(events, "generate.json")):
        generate(events, users, urls, seed=1, progress=False, **generate_args)
    corpus = _prepared(os.path.join(root, "corpus"), lambda out: prepare(
        [events], out, PrepareConfig(time_col="ts", holdout=0.2, holdout_out=heldout), overwrite=True, progress=False))

    score, prior, tail = _heldout_recall(heldout)
    return Set(name, corpus, {"dim": 100, "epochs": epochs, "sample": 0}, "recall@10", score, about,
               {"heldout": heldout}, score, prior, tail)


PYPI_SUMMARIES = os.environ.get("PYPI_SUMMARIES", os.path.join(os.path.dirname(ROOT), "shared", "data",
                                                                "pypi_summaries.parquet"))
PYPI_MIN_COUNT = 2    # a word seen once cannot be learnt, nor found when held out
PYPI_MIN_WORDS = 3    # distinct kept words a document needs: one is held out, two or more are trained on
PYPI_QUICK_DOCS = 2000  # --quick: the first summaries of the set
PYPI_SHORT_WORDS = 6    # pypi-short: documents of at most this many kept words (issue 50's catalogue: 4.6 a document)
PYPI_SHORT_EVERY = 5    # pypi-short: every 5th such document (~60k: the catalogue's 63k)


def pypi_documents(summaries: str, ranked_only: bool, limit: int | None = None,
                   short: bool = False) -> tuple[list[str], list[list[str]]]:
    """The packages and their summaries' words: gensim's simple_preprocess (as Lee and newsgroups are
    read), less the words seen fewer than PYPI_MIN_COUNT times in the set, and only the documents left
    with PYPI_MIN_WORDS distinct words or more. ranked_only: the most downloaded packages (download_rank
    not null); limit: the first that many summaries read (before the counts); short: of those, every
    PYPI_SHORT_EVERY-th of at most PYPI_SHORT_WORDS words, their words counted again among themselves."""
    import pyarrow.compute as pc
    from gensim.utils import simple_preprocess

    if not os.path.exists(summaries):
        raise UserError(f"{summaries}: no PyPI summaries there; give --pypi-summaries PATH (or PYPI_SUMMARIES), "
                        "the Parquet of package, summary and download_rank")
    table = pq.read_table(summaries, columns=["package", "summary", "download_rank"])
    if ranked_only:
        table = table.filter(pc.is_valid(table.column("download_rank")))
    if limit is not None:
        table = table.slice(0, limit)
    words = [simple_preprocess(text or "") for text in table.column("summary").to_pylist()]
    packages, kept = _frequent_words(table.column("package").to_pylist(), words)
    if short:
        chosen = [(p, d) for p, d in zip(packages, kept) if len(d) <= PYPI_SHORT_WORDS][::PYPI_SHORT_EVERY]
        packages, kept = _frequent_words([p for p, _ in chosen], [d for _, d in chosen])
    return packages, kept


def _frequent_words(packages: list[str], words: list[list[str]]) -> tuple[list[str], list[list[str]]]:
    """Each document less the words seen fewer than PYPI_MIN_COUNT times among these documents, and only
    those left with PYPI_MIN_WORDS distinct words or more: (their packages, their words)."""
    counts: dict[str, int] = {}
    for doc in words:
        for word in doc:
            counts[word] = counts.get(word, 0) + 1
    kept_packages, kept = [], []
    for package, doc in zip(packages, words):
        doc = [w for w in doc if counts[w] >= PYPI_MIN_COUNT]
        if len(set(doc)) >= PYPI_MIN_WORDS:
            kept_packages.append(package)
            kept.append(doc)
    return kept_packages, kept


def _pypi(work: str, ranked_only: bool, quick: bool, summaries: str, short: bool = False) -> Set:
    """The PyPI summaries as token lists keyed by package, one word of every document held out by
    prepare --holdout itself: at a fraction this small its round(F × distinct) is 0 and its floor of
    one hidden word applies (every copy of the word goes, and at least one other word stays)."""
    from doc2vec_dist.prepare import prepare

    name = ("pypi15k" if ranked_only else "pypi-short" if short else "pypi") + ("-quick" if quick else "")
    root = os.path.join(work, name)
    heldout = os.path.join(root, "heldout.parquet")
    lists = os.path.join(root, "summaries.parquet")

    def make(out: str) -> None:
        packages, words = pypi_documents(summaries, ranked_only, PYPI_QUICK_DOCS * (PYPI_SHORT_EVERY if short else 1)
                                         if quick else None, short=short)
        os.makedirs(root, exist_ok=True)
        pq.write_table(pa.table({"package": packages, "words": pa.array(words, pa.list_(pa.string()))}), lists)
        prepare([lists], out, PrepareConfig(format="lists", doc_col="package", token_col="words", holdout=1e-9,
                                            holdout_out=heldout), overwrite=True, progress=False)

    corpus = _prepared(os.path.join(root, "corpus"), make)

    score, prior, tail = _heldout_recall(heldout)
    which = ("the 15,000 most downloaded packages'" if ranked_only else
             f"every {PYPI_SHORT_EVERY}th package's of at most {PYPI_SHORT_WORDS} words" if short else "every package's")
    return Set(name, corpus, {"dim": 100, "epochs": 5 if quick else 20}, "recall@10", score,
               f"PyPI summaries, {which}; one word of each held out; held-out recall@10", {"heldout": heldout}, score,
               prior, tail)


def _prepared(out: str, make) -> str:
    """A corpus made once and kept: prepared again only when it is missing."""
    if not os.path.exists(os.path.join(out, "corpus.json")):
        make(out)
    return out


def make_set(name: str, work: str, quick: bool = False, pypi_summaries: str = PYPI_SUMMARIES) -> Set:
    if name in ("lee", "lee-reversed"):
        return _lee(work, name == "lee-reversed", quick)
    if name == "newsgroups":
        return _newsgroups(work, quick)
    if name == "skewed":
        users, urls = (6000, 2000) if quick else (60000, 20000)
        return _generated(work, "skewed-quick" if quick else "skewed", users, urls, 5 if quick else 20,
                          f"{users:,} users, {urls:,} URLs, ~5 events each, one URL in 80% of users; held-out "
                          "recall@10", events_per_user=5, hub_share=0.8)
    if name == "synth200k":
        users, urls = (20000, 10000) if quick else (200000, 100000)
        return _generated(work, "synth-quick" if quick else "synth200k", users, urls, 5,
                          f"{users:,} users × {urls:,} URLs, 8 communities; held-out recall@10")
    if name in ("pypi", "pypi15k", "pypi-short"):
        return _pypi(work, name == "pypi15k", quick, pypi_summaries, short=name == "pypi-short")
    raise UserError(f"unknown set {name!r} (choose from {', '.join(SETS)})")


# -- the runs ----------------------------------------------------------------------------------------

def workers_label(count: int) -> str:
    return f"{count} worker" + ("s" if count > 1 else "")


def run_set(data: Set, mode: str, seeds: list[int], overrides: dict, work: str, gensim_workers: int,
            workers: list[int] | None = None, gensim: bool = True) -> dict:
    """Train ours and gensim (iterable) once per seed; each run's figure, speed and wall time.

    With `workers`, ours trains once per worker count (1 CPU each), and every count after the first is
    held to the margin against the first ("differences"); gensim runs beside them unless gensim is False.
    """
    from doc2vec_dist.baseline import train_gensim
    from doc2vec_dist.trainer import train

    ours_runs = {"doc2vec-dist": {}} if not workers else {
        # as asked: train's own choice of fewer workers (plan.choose_workers) would measure another count
        workers_label(w): {"num_workers": w, "cpus_per_worker": 1, "force_workers": True} for w in workers}
    runs = {who: [] for who in list(ours_runs) + (["gensim"] if gensim else [])}
    for seed in seeds:
        model_settings = {**data.settings, **MODES[mode], "seed": seed, "progress": False}
        theirs = build(TrainConfig, model_settings, {k: v for k, v in overrides.items() if k in MODEL_KEYS})
        trainers = [(who, build(TrainConfig, model_settings, overrides, engine).validate())
                    for who, engine in ours_runs.items()] + ([("gensim", theirs)] if gensim else [])
        for who, config in trainers:
            out = os.path.join(work, "models", f"{data.name}-{mode}-{who.replace(' ', '-')}-seed{seed}")
            t0 = time.perf_counter()
            if who == "gensim":
                summary = train_gensim(data.corpus, out, config.validate(), workers=gensim_workers, overwrite=True,
                                       gensim_mode="iterable")
            else:
                summary = train(data.corpus, out, config, overwrite=True)
            wall = time.perf_counter() - t0
            runs[who].append({"seed": seed, "figure": data.score(out), "tokens_per_second": summary["tokens_per_second"],
                              "wall_seconds": round(wall, 2)})
            if data.tail is not None:
                runs[who][-1]["tail"], tail_prior = data.tail(out)
    result = {"set": data.name, "about": data.about, "mode": mode, "metric": data.metric,
              "settings": data.settings, "overrides": overrides, "runs": runs}
    if data.prior is not None:  # the counts' own figure, the same for every model of the set
        result["prior"] = data.prior(out)
    if data.tail is not None:
        result["tail_prior"] = tail_prior
    for who, rows in runs.items():
        figures = [r["figure"] for r in rows]
        result[who] = {"mean": statistics.mean(figures), "spread": max(figures) - min(figures),
                       "tokens_per_second": statistics.mean(r["tokens_per_second"] for r in rows)}
        if data.tail is not None:
            result[who]["tail_mean"] = statistics.mean(r["tail"] for r in rows)
    result["target"] = -MARGIN[data.metric]
    if workers:  # each worker count against the first
        first = workers_label(workers[0])
        result["reference"] = first
        result["differences"] = {who: result[who]["mean"] - result[first]["mean"] for who in list(ours_runs)[1:]}
        result["met"] = all(d >= result["target"] for d in result["differences"].values())
    else:
        result["difference"] = result["doc2vec-dist"]["mean"] - result["gensim"]["mean"]
        result["met"] = result["difference"] >= result["target"]
    return result


TUNE_TEST_FRACTION = 0.5  # --tune on Lee and newsgroups: half the pairs / posts kept from the search


def tune_set(data: Set, mode: str, seeds: list[int], budget: float, work: str, gensim_workers: int,
             searcher: str = "random") -> dict:
    """--tune: `doc2vec-dist tune` on the set (its settings as the base, seed of the first run), then,
    per seed, the tuned settings, the set's settings (ours and gensim's), and gensim at the tuned
    epochs, each scored on what the search never measured (Set.test_score)."""
    import yaml

    from doc2vec_dist.baseline import train_gensim
    from doc2vec_dist.trainer import train
    from doc2vec_dist.tune import search

    base = build(TrainConfig, {**data.settings, **MODES[mode], "seed": seeds[0], "progress": False})
    out = os.path.join(work, "tune", f"{data.name}-{mode}-{searcher}")
    found = search(data.corpus, out, budget=budget, base=base, compare=False, progress=False, searcher=searcher,
                   **data.tune_target)
    with open(os.path.join(out, "best.yaml")) as fh:
        tuned = yaml.safe_load(fh)
    recipes = {"tuned": ("ours", tuned), "defaults": ("ours", {}), "gensim": ("gensim", {}),
               "gensim, tuned epochs": ("gensim", {"epochs": tuned.get("epochs", base.epochs)})}
    runs: dict[str, list] = {name: [] for name in recipes}
    for seed in seeds:
        for name, (who, overrides) in recipes.items():
            config = build(TrainConfig, dataclasses.asdict(base), overrides, {"seed": seed})
            model = os.path.join(work, "models", f"tune-{data.name}-{mode}-{name.replace(', ', '-').replace(' ', '-')}-seed{seed}")
            t0 = time.perf_counter()
            summary = (train_gensim(data.corpus, model, config, workers=gensim_workers, overwrite=True,
                                    gensim_mode="iterable") if who == "gensim" else train(data.corpus, model, config,
                                                                                         overwrite=True))
            runs[name].append({"seed": seed, "figure": data.test_score(model),
                               "tokens_per_second": summary["tokens_per_second"],
                               "wall_seconds": round(time.perf_counter() - t0, 2)})
    result = {"set": data.name, "about": data.about, "mode": mode, "metric": data.metric, "budget": budget,
              "searcher": searcher,
              "search": {k: found[k] for k in ("trials", "failed", "seconds", "estimated_seconds", "estimate", "best",
                                               "base", "base_is_best", "measured_on", "overhead_seconds_per_trial")},
              "settings": tuned, "runs": runs, "summary": {}}
    for name, rows in runs.items():
        figures = [r["figure"] for r in rows]
        result["summary"][name] = {"mean": statistics.mean(figures), "spread": max(figures) - min(figures),
                                   "tokens_per_second": statistics.mean(r["tokens_per_second"] for r in rows)}
    return result


def format_tuned(r: dict) -> str:
    search, summary = r["search"], r["summary"]
    lines = [f"{r['set']} — tune (budget {r['budget']:g}, {r.get('searcher', 'random')}): {search['trials']} trials, "
             f"{search['failed']} failed, "
             f"{search['seconds']:.0f} s (estimated {(search['estimate'] or {}).get('search_seconds', 0):.0f} s; "
             f"Ray Tune's own {search['overhead_seconds_per_trial']:.1f} s a trial); best on "
             f"{search['measured_on']}: " + ", ".join(f"{k} {v}" for k, v in r["settings"].items())
             + (" (the base: nothing beat it)" if search.get("base_is_best") else "")]
    seeds = [row["seed"] for row in r["runs"]["tuned"]]
    header = ["run"] + [f"seed {s}" for s in seeds] + ["mean", "spread", "tokens/s"]
    lines.append("  ".join(f"{h:>10}" if i else f"{h:<22}" for i, h in enumerate(header)))
    for name, rows in r["runs"].items():
        cells = [f"{row['figure']:.4f}" for row in rows]
        cells += [f"{summary[name]['mean']:.4f}", f"{summary[name]['spread']:.4f}",
                  f"{summary[name]['tokens_per_second'] / 1e6:.3f}M"]
        lines.append("  ".join([f"{name:<22}"] + [f"{c:>10}" for c in cells]))
    tuned = summary["tuned"]["mean"]
    lines.append("tuned against: " + ", ".join(
        f"{name} {tuned - summary[name]['mean']:+.4f} ({(tuned / summary[name]['mean'] - 1) * 100:+.1f}%)"
        for name in summary if name != "tuned") + f"; {r['metric']} on what the search never measured")
    return "\n".join(lines)


# model settings gensim shares with us; the rest of a --config (num_ps, cache_rows, ...) is ours alone
MODEL_KEYS = ("dim", "epochs", "mode", "dbow_words", "window", "negative", "sample", "alpha", "min_alpha",
              "ns_exponent", "seed")


def format_result(r: dict) -> str:
    first = next(iter(r["runs"].values()))
    lines = [f"{r['set']} — {r['about']}; {r['mode']}, {len(first)} seed(s)"]
    seeds = [row["seed"] for row in first]
    header = ["trainer"] + [f"seed {s}" for s in seeds] + ["mean", "spread", "tokens/s"]
    lines.append("  ".join(f"{h:>10}" if i else f"{h:<18}" for i, h in enumerate(header)))
    for who in r["runs"]:
        label = "gensim (iterable)" if who == "gensim" else who
        cells = [f"{row['figure']:.4f}" for row in r["runs"][who]]
        cells += [f"{r[who]['mean']:.4f}", f"{r[who]['spread']:.4f}", f"{r[who]['tokens_per_second'] / 1e6:.3f}M"]
        lines.append("  ".join([f"{label:<18}"] + [f"{c:>10}" for c in cells]))
    if "differences" in r:
        for who, d in r["differences"].items():
            lines.append(f"{who} − {r['reference']}: {d:+.4f} (target ≥ {r['target']:+.3f}: "
                         f"{'met' if d >= r['target'] else 'MISSED'}); {r['metric']}")
    else:
        lines.append(f"ours − gensim: {r['difference']:+.4f} (target ≥ {r['target']:+.3f}: "
                     f"{'met' if r['met'] else 'MISSED'}); {r['metric']}")
    if r.get("prior") is not None:
        best = max(r[who]["mean"] for who in r["runs"])
        lines.append(f"the popularity prior alone (evaluate's most-popular, no vectors): {r['prior']:.4f}"
                     + ("" if best > r["prior"] else f"; no trainer beats it ({best:.4f} at best): this set's "
                        f"{r['metric']} says little of the vectors"))
    if r.get("tail_prior") is not None:
        reference = r.get("reference")
        cells = []
        for who in r["runs"]:
            cell = f"{who} {r[who]['tail_mean']:.4f}"
            if reference and who not in (reference, "gensim"):
                cell += f" ({r[who]['tail_mean'] - r[reference]['tail_mean']:+.4f})"
            cells.append(cell)
        lines.append(f"without the {TAIL_WITHOUT} most common words (neither hidden nor ranked): " + ", ".join(cells)
                     + f"; the prior alone {r['tail_prior']:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    to_terminal()
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", nargs="+", default=list(SETS), choices=SETS, help="data sets (default: all)")
    ap.add_argument("--modes", nargs="+", default=["dbow"], choices=list(MODES), help="training modes (default: dbow)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3], help="seeds (default: 1 2 3)")
    ap.add_argument("--config", help="YAML of training keys for ours (and the model keys for gensim too), "
                                     "over the defaults and each set's settings")
    ap.add_argument("--work", default=os.path.join(ROOT, "runs", "quality"),
                    help="where corpora and models go (default: runs/quality)")
    ap.add_argument("--pypi-summaries", default=PYPI_SUMMARIES,
                    help="the PyPI summaries Parquet for the pypi sets (default: $PYPI_SUMMARIES, else "
                         "../shared/data/pypi_summaries.parquet beside this checkout)")
    ap.add_argument("--json", help="write the results here (default: WORK/quality.json)")
    ap.add_argument("--gensim-workers", type=int, default=os.cpu_count() or 1, help="gensim threads (default: all)")
    ap.add_argument("--tune", type=float, metavar="BUDGET",
                    help="search each set's settings with doc2vec-dist tune (this budget, in full trainings), then "
                         "compare the tuned settings, the set's own and gensim over the seeds, on what the search "
                         "never measured (Lee: half the pairs; newsgroups: half the posts; others: the held-out file)")
    ap.add_argument("--searcher", nargs="+", default=["random"], choices=("random", "optuna"),
                    help="with --tune: how the search draws its trials (tune --searcher); several run one search "
                         "each at the same budget, each then compared over the seeds")
    ap.add_argument("--quick", action="store_true", help="smaller sets and fewer epochs: a smoke run, not a figure")
    ap.add_argument("--workers", type=int, nargs="+", metavar="W",
                    help="train ours with each of these worker counts (1 CPU each), each against the first")
    ap.add_argument("--no-gensim", action="store_true", help="with --workers: ours alone")
    ap.add_argument("--ray-cpus", type=int, help="logical CPUs of the local Ray (default: this machine's cores); "
                                                 "more than the cores for --workers runs that measure quality")
    args = ap.parse_args(argv)
    if args.no_gensim and not args.workers:
        ap.error("--no-gensim needs --workers (the other runs are measured against gensim)")
    try:
        overrides = load_yaml(args.config) if args.config else {}
        import ray

        from doc2vec_dist.cluster import connect

        started = False
        if args.ray_cpus and not ray.is_initialized():
            from harness import local_ray

            started = local_ray(args.ray_cpus)
        else:
            started = connect(None)  # one local Ray for every run (each train() would start its own)
        results = []
        try:
            for name in args.sets:
                data = make_set(name, args.work, args.quick, args.pypi_summaries)
                for mode in args.modes:
                    if args.tune:
                        for searcher in args.searcher:
                            result = tune_set(data, mode, args.seeds, args.tune, args.work, args.gensim_workers,
                                              searcher)
                            print(format_tuned(result) + "\n", flush=True)
                            results.append(result)
                    else:
                        result = run_set(data, mode, args.seeds, overrides, args.work, args.gensim_workers,
                                         args.workers, gensim=not args.no_gensim)
                        print(format_result(result) + "\n", flush=True)
                        results.append(result)
        finally:
            if started:
                ray.shutdown()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    path = args.json or os.path.join(args.work, "quality.json")
    with open(path, "w") as fh:
        json.dump({"results": results, "seeds": args.seeds, "quick": args.quick}, fh, indent=2)
    missed = [f"{r['set']}/{r['mode']}" for r in results if not r.get("met", True)]
    print(f"saved {path}; " + (f"below target: {', '.join(missed)}" if missed else "every set within its target"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
