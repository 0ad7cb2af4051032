"""benchmarks/quality.py: the real and skewed sets it scores, and one short run of it end to end.

The figures themselves come from running the job (README, "Quality"); here it is checked that the sets
are what they claim, that gensim runs in its iterable mode, and that the tables and JSON come out.
"""

import importlib.util
import json
import os
import pickle
import sys
import zlib

import numpy as np
import pytest

from doc2vec_dist.errors import UserError

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def load_quality():
    spec = importlib.util.spec_from_file_location("quality_job", os.path.join(ROOT, "benchmarks", "quality.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass resolves annotations through sys.modules
    spec.loader.exec_module(module)
    return module


def test_newsgroups_are_read_without_running_anything_from_the_pickle(monkeypatch, tmp_path):
    quality = load_quality()
    texts, groups = quality.newsgroup_documents()
    assert len(texts) == len(groups) == 200 and sorted(set(groups)) == ["alt.atheism", "sci.space"]
    assert all(isinstance(t, str) and t for t in texts)
    # a pickle that would call a function is refused, not run
    evil = tmp_path / "evil"
    evil.write_bytes(zlib.compress(pickle.dumps(os.system, protocol=0)))  # GLOBAL posix system
    import gensim.test.utils

    monkeypatch.setattr(gensim.test.utils, "datapath", lambda name: str(evil))
    with pytest.raises(UserError, match="refusing to load"):
        quality.newsgroup_documents()


def test_lee_pairs_follow_the_test_documents_in_either_order(tmp_path):
    import pyarrow.parquet as pq

    quality = load_quality()
    first, reversed_ = (quality.make_set(name, str(tmp_path), quick=True) for name in ("lee", "lee-reversed"))
    a = pq.read_table(os.path.join(tmp_path, "lee", "pairs.parquet")).to_pydict()
    b = pq.read_table(os.path.join(tmp_path, "lee-reversed", "pairs.parquet")).to_pydict()
    assert len(a["score"]) == len(b["score"]) == 50 * 49 // 2 and a["score"] == b["score"]
    assert (a["key1"][0], a["key2"][0], b["key1"][0], b["key2"][0]) == ("0", "1", "300", "301")
    lines = {}
    for name in ("lee", "lee-reversed"):
        with open(os.path.join(tmp_path, name, "lee.txt")) as fh:
            lines[name] = fh.read().splitlines()
    assert lines["lee"][:50] == lines["lee-reversed"][300:] and len(lines["lee"]) == 350
    assert first.metric == reversed_.metric == "pearson" and first.settings["epochs"] == 10  # quick


def test_a_short_run_prints_both_trainers_and_saves_json(ray_cluster, tmp_path, capsys):
    quality = load_quality()
    out = tmp_path / "q.json"
    assert quality.main(["--sets", "newsgroups", "--seeds", "1", "2", "--quick", "--work", str(tmp_path),
                         "--json", str(out), "--gensim-workers", "2"]) == 0
    printed = capsys.readouterr().out
    assert "doc2vec-dist" in printed and "gensim (iterable)" in printed and "ours − gensim:" in printed
    (result,) = json.loads(out.read_text())["results"]
    assert result["set"] == "newsgroups" and result["metric"] == "knn_accuracy@10"
    for who in ("doc2vec-dist", "gensim"):
        figures = [r["figure"] for r in result["runs"][who]]
        assert len(figures) == 2 and all(0.5 < f <= 1.0 for f in figures), result  # 2 groups: chance is 0.5
        assert result[who]["spread"] == pytest.approx(max(figures) - min(figures))
    assert result["difference"] == pytest.approx(result["doc2vec-dist"]["mean"] - result["gensim"]["mean"])
    gensim_model = os.path.join(tmp_path, "models", "newsgroups-dbow-gensim-seed1")
    with open(os.path.join(gensim_model, "config.json")) as fh:
        assert json.load(fh)["summary"]["gensim_mode"] == "iterable"


def test_leave_one_out_accuracy_counts_every_document(tmp_path):
    """Two tight clusters with their own labels: every document's neighbours share its label; labels
    unrelated to the clusters score near chance."""
    from doc2vec_dist import checkpoint
    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    quality = load_quality()
    (tmp_path / "t.txt").write_text("".join(f"w{i % 2} w{i % 2 + 2}\n" for i in range(24)))
    corpus = prepare([str(tmp_path / "t.txt")], str(tmp_path / "c"), PrepareConfig(format="text"), progress=False)
    model = str(tmp_path / "m")
    checkpoint.start_model_dir(model, corpus.path, overwrite=False)
    rng = np.random.default_rng(0)
    line = np.array([int(k) for k in corpus.docs()["key"].to_pylist()])  # row id -> line number (the key)
    vectors = np.where(line[:, None] % 2 == 0, 1.0, -1.0) + 0.01 * rng.standard_normal((24, 4))
    version = checkpoint.next_version(model)
    part = checkpoint.write_slice(model, version, "docs", 0, 1, np.arange(24, dtype=np.int64),
                                  vectors.astype(np.float32))
    checkpoint.commit(model, version, {"docs": [part]}, {"docs": 4}, {"epoch": 1}, keep=1)
    labels = ["even" if i % 2 == 0 else "odd" for i in range(24)]
    assert quality.leave_one_out_accuracy(model, labels, k=5) == 1.0
    halves = ["first" if i < 12 else "second" for i in range(24)]  # labels the vectors know nothing of
    assert 0.2 < quality.leave_one_out_accuracy(model, halves, k=5) < 0.8


def test_pypi_sets_hold_out_one_word_of_every_document(tmp_path):
    """A slice of summaries in the shared file's columns: the set keeps the documents of 3+ distinct
    words seen twice or more, hides exactly one such word of each (every copy of it), trains on the
    rest, and the 15k set takes the ranked packages only."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from doc2vec_dist.corpus import Corpus, iter_shard

    quality = load_quality()
    rows = [("alpha", "Fast JSON parser for Python and Python tools", 1),
            ("beta", "JSON schema tools for Python", None),
            ("gamma", "Parser for fast JSON", 2),
            ("delta", "Python tools", 3),                        # two words: nothing to train on once one is hidden
            ("epsilon", "Zygomorphic quixotic flummox python", 4),  # one word seen twice: dropped
            ("zeta", "Fast tools for schema parser", 5)]
    path = tmp_path / "pypi.parquet"
    pq.write_table(pa.table({"package": [r[0] for r in rows], "summary": [r[1] for r in rows],
                             "download_rank": pa.array([r[2] for r in rows], pa.int64())}), path)
    for name, expected in (("pypi", {"alpha", "beta", "gamma", "zeta"}), ("pypi15k", {"alpha", "gamma", "zeta"})):
        data = quality.make_set(name, str(tmp_path / "work"), quick=True, pypi_summaries=str(path))
        assert data.metric == "recall@10" and data.name == f"{name}-quick"
        corpus = Corpus(data.corpus)
        words = corpus.vocab().column("token").to_pylist()
        keys = corpus.docs().column("key").to_pylist()
        trained = {}
        for shard in corpus.shard_paths:
            for doc_ids, offsets, tokens in iter_shard(shard):
                for i, doc in enumerate(doc_ids):
                    trained[keys[doc]] = [words[t] for t in tokens[offsets[i]:offsets[i + 1]]]
        hidden = pq.read_table(data.tune_target["heldout"]).to_pylist()
        assert set(trained) == expected and sorted(r["key"] for r in hidden) == sorted(expected), (trained, hidden)
        packages, kept = quality.pypi_documents(str(path), name == "pypi15k")
        for row in hidden:
            summary = kept[packages.index(row["key"])]
            assert row["token"] in summary and row["token"] not in trained[row["key"]]  # every copy hidden
            assert sorted(trained[row["key"]] + [row["token"]] * summary.count(row["token"])) == sorted(summary)
    with pytest.raises(UserError, match="--pypi-summaries"):
        quality.make_set("pypi", str(tmp_path / "none"), pypi_summaries=str(tmp_path / "missing.parquet"))


def test_the_short_pypi_set_takes_every_5th_summary_of_at_most_6_words_counted_among_themselves(tmp_path,
                                                                                                monkeypatch):
    """pypi-short (issue 50: the real catalogue's documents of about 4.6 words lost at 4 workers, the PyPI
    summaries of median 8 did not): of the summaries left as the pypi set keeps them, those of at most
    PYPI_SHORT_WORDS words, every PYPI_SHORT_EVERY-th, then the words seen fewer than twice among these
    dropped, and the documents left with fewer than 3 distinct words."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    quality = load_quality()
    monkeypatch.setattr(quality, "PYPI_SHORT_EVERY", 2)
    rows = [("a", "red green blue"), ("b", "red green blue yellow orange purple black"),  # b: 7 words, too long
            ("c", "red green yellow"), ("d", "red blue yellow"), ("e", "green blue orange"),
            ("f", "orange purple black"), ("g", "red green blue black")]
    path = tmp_path / "pypi.parquet"
    pq.write_table(pa.table({"package": [r[0] for r in rows], "summary": [r[1] for r in rows],
                             "download_rank": pa.array([None] * len(rows), pa.int64())}), path)
    packages, kept = quality.pypi_documents(str(path), False)
    assert packages == list("abcdefg")  # every word seen twice in the whole set
    packages, kept = quality.pypi_documents(str(path), False, short=True)
    # the short ones a c d e f g, every 2nd: a d f; among them red, blue seen twice, green, yellow, orange,
    # purple, black once: a keeps red, blue (2 distinct: dropped), d the same; f none
    assert (packages, kept) == ([], [])
    monkeypatch.setattr(quality, "PYPI_SHORT_EVERY", 1)
    packages, kept = quality.pypi_documents(str(path), False, short=True)
    assert packages == list("acdeg") and kept[-1] == ["red", "green", "blue", "black"]
    assert all(len(doc) <= quality.PYPI_SHORT_WORDS for doc in kept)


def test_worker_counts_train_as_asked(monkeypatch, tmp_path):
    """--workers measures each count as given: train's own choice of fewer workers (plan's model, on a
    small corpus) would measure one worker under another's name."""
    from doc2vec_dist import trainer

    quality = load_quality()
    asked = []
    monkeypatch.setattr(trainer, "train", lambda corpus, out, config, overwrite: asked.append(config)
                        or {"tokens_per_second": 1.0})
    data = quality.Set("tiny", str(tmp_path), {"dim": 8, "epochs": 1}, "recall@10", lambda model: 0.5, "tiny")
    result = quality.run_set(data, "dbow", [1], {}, str(tmp_path), 1, workers=[1, 2, 4], gensim=False)
    assert [(c.num_workers, c.cpus_per_worker, c.force_workers) for c in asked] == [(1, 1, True), (2, 1, True),
                                                                                   (4, 1, True)]
    assert result["differences"] == {"2 workers": 0.0, "4 workers": 0.0}


def test_a_held_out_sets_table_gives_the_popularity_prior_and_says_when_no_trainer_beats_it(monkeypatch, tmp_path):
    """On the PyPI sets every model, ours and gensim's, ranked below evaluate's most-popular ranking (pypi-short
    0.1985 against 0.2278): a margin between trainers there says little of the vectors. The table says so."""
    from doc2vec_dist import trainer

    quality = load_quality()
    monkeypatch.setattr(trainer, "train", lambda corpus, out, config, overwrite: {"tokens_per_second": 1.0})
    for prior, beaten in ((0.6, False), (0.4, True)):
        data = quality.Set("tiny", str(tmp_path), {"dim": 8, "epochs": 1}, "recall@10", lambda model: 0.5, "tiny",
                           prior=lambda model, prior=prior: prior)
        result = quality.run_set(data, "dbow", [1, 2], {}, str(tmp_path), 1, workers=[1, 2], gensim=False)
        assert result["prior"] == prior
        text = quality.format_result(result)
        assert f"the popularity prior alone (evaluate's most-popular, no vectors): {prior:.4f}" in text
        assert ("no trainer beats it (0.5000 at best)" in text) == (not beaten), text
    no_prior = quality.run_set(quality.Set("tiny", str(tmp_path), {"dim": 8, "epochs": 1}, "recall@10",
                                           lambda model: 0.5, "tiny"), "dbow", [1], {}, str(tmp_path), 1,
                               workers=[1], gensim=False)
    assert "prior" not in no_prior and "popularity" not in quality.format_result(no_prior)


def test_a_held_out_sets_table_gives_the_long_tails_recall_without_the_hub_words(monkeypatch, tmp_path):
    """On pypi-short a fifth of the hidden words are among its 10 most common, and whether they stay in
    everyone's top 10 decided the figure (and its gap at 4 workers): each held-out table also gives every
    trainer's recall without those words (evaluate's without_top), each worker count against the first,
    and the prior's, from the models it trained."""
    from doc2vec_dist import trainer

    quality = load_quality()
    monkeypatch.setattr(trainer, "train", lambda corpus, out, config, overwrite: {"tokens_per_second": 1.0})
    asked = []

    def tail(model: str) -> tuple[float, float]:
        asked.append(os.path.basename(model))
        return (0.08 if "-1-worker-" in model else 0.075), 0.09

    data = quality.Set("tiny", str(tmp_path), {"dim": 8, "epochs": 1}, "recall@10", lambda model: 0.5, "tiny",
                       prior=lambda model: 0.6, tail=tail)
    result = quality.run_set(data, "dbow", [1, 2], {}, str(tmp_path), 1, workers=[1, 4], gensim=False)
    assert sorted(asked) == sorted(f"tiny-dbow-{w}-seed{s}" for w in ("1-worker", "4-workers") for s in (1, 2))
    assert result["tail_prior"] == 0.09 and result["4 workers"]["tail_mean"] == pytest.approx(0.075)
    text = quality.format_result(result)
    assert ("without the 10 most common words (neither hidden nor ranked): 1 worker 0.0800, "
            "4 workers 0.0750 (-0.0050); the prior alone 0.0900") in text, text
    plain = quality.run_set(quality.Set("tiny", str(tmp_path), {"dim": 8, "epochs": 1}, "recall@10",
                                        lambda model: 0.5, "tiny"), "dbow", [1], {}, str(tmp_path), 1,
                            workers=[1], gensim=False)
    assert "tail_prior" not in plain and "most common words" not in quality.format_result(plain)
