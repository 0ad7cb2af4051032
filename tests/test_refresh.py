"""Daily refresh (issue 17): prepare --base keeps every id and joins new events to the documents;
train --init-from starts from the old model's rows. The bundled sample, split in time: its last 5
days are "today"."""

from __future__ import annotations

import glob
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist.config import PrepareConfig
from doc2vec_dist.corpus import Corpus, CorpusError, iter_shard
from doc2vec_dist.drift import after_training
from doc2vec_dist.prepare import prepare
from doc2vec_dist.sharding import shard_of

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAY = 86_400


@pytest.fixture(scope="module")
def days(tmp_path_factory):
    """The sample's events as three files: before its last 5 days (old), those days (new), all; a
    handful of URLs and users appear only in the new days."""
    root = tmp_path_factory.mktemp("days")
    events = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(os.path.join(ROOT, "data", "sample",
                                                                                        "events", "*.parquet"))))
    seconds = pc.cast(events["ts"], pa.int64()).to_numpy() / 1000
    cut = seconds.max() - 5 * DAY
    paths = {}
    for name, keep in (("old", seconds < cut), ("new", seconds >= cut), ("all", np.ones(len(seconds), bool))):
        paths[name] = str(root / f"{name}.parquet")
        pq.write_table(events.filter(pa.array(keep)), paths[name])
    paths["base"] = prepare([paths["old"]], str(root / "base"), PrepareConfig(time_col="ts"), progress=False).path
    return paths


def _documents(corpus: Corpus) -> dict[str, list[str]]:
    """Every document as its key → its tokens as strings, in order."""
    keys = corpus.docs().column("key").to_pylist()
    tokens = corpus.vocab().column("token").to_pylist()
    return {keys[d]: [tokens[t] for t in words[a:b]]
            for path in corpus.shard_paths for ids, offsets, words in iter_shard(path)
            for d, a, b in zip(ids, offsets, offsets[1:])}


@pytest.mark.parametrize("path", ["by shard", "by 4 shards", "re-bucketed"])
def test_a_refresh_keeps_every_id_and_its_documents_equal_a_cold_prepare(days, tmp_path, path):
    """Known users and URLs keep their ids, new ones come after; each user's document is its earlier
    tokens then its new events, which is what preparing all the days at once gives (the new days come
    after the old ones); counts are the new corpus's. Both ways of joining: each base shard rewritten
    with its users' new events (a base whose shards are by key hash), or everything bucketed again
    (a base from before corpus.json said so)."""
    import shutil

    base_path = days["base"]
    if path == "by 4 shards":
        base_path = prepare([days["old"]], str(tmp_path / "base4"), PrepareConfig(time_col="ts", num_shards=4), progress=False).path
    if path == "re-bucketed":
        base_path = str(tmp_path / "old-base")
        shutil.copytree(days["base"], base_path)
        with open(os.path.join(base_path, "corpus.json")) as fh:
            meta = json.load(fh)
        assert meta.pop("shards_by") == "key_hash"
        with open(os.path.join(base_path, "corpus.json"), "w") as fh:
            json.dump(meta, fh)
    base = Corpus(base_path)
    fresh = prepare([days["new"]], str(tmp_path / "refreshed"), PrepareConfig(time_col="ts", base=base_path, num_shards=3 if path == "re-bucketed" else None), progress=False)
    assert fresh.num_shards == (3 if path == "re-bucketed" else base.num_shards)
    cold = prepare([days["all"]], str(tmp_path / "cold"), PrepareConfig(time_col="ts"), progress=False)

    keys, old_keys = fresh.docs().column("key").to_pylist(), base.docs().column("key").to_pylist()
    assert keys[:len(old_keys)] == old_keys and fresh.docs().column("id").to_pylist() == list(range(len(keys)))
    urls, old_urls = fresh.vocab().column("token").to_pylist(), base.vocab().column("token").to_pylist()
    assert urls[:len(old_urls)] == old_urls
    assert set(keys) == set(cold.docs().column("key").to_pylist()) and len(keys) > len(old_keys)
    assert set(urls) == set(cold.vocab().column("token").to_pylist()) and len(urls) > len(old_urls)
    documents, before = _documents(fresh), _documents(base)
    assert documents == _documents(cold)
    assert dict(zip(urls, fresh.counts().tolist())) == dict(zip(cold.vocab()["token"].to_pylist(),
                                                               cold.counts().tolist()))
    lengths = dict(zip(keys, fresh.docs().column("length").to_pylist()))
    assert all(lengths[k] == len(tokens) for k, tokens in documents.items())

    refresh = fresh.meta["refresh"]
    new_users = len(keys) - len(old_keys)
    grown = [k for k in old_keys if len(documents[k]) > len(before[k])]
    assert refresh["new_docs"] == new_users and refresh["grown_docs"] == len(grown) > 0
    assert refresh["docs_without_new_events"] == len(old_keys) - len(grown)
    assert refresh["new_words"] == len(urls) - len(old_urls) and refresh["mode"] == "join"
    # changed.arrow: the new users and the grown ones, for train --first-epoch changed
    assert fresh.changed().tolist() == sorted([keys.index(k) for k in grown] + list(range(len(old_keys), len(keys))))
    assert base.changed() is None


def test_new_users_spread_evenly_over_the_servers(days, tmp_path):
    """Row r lives on server r % S: the appended (cold) rows go round the servers."""
    fresh = prepare([days["new"]], str(tmp_path / "c"), PrepareConfig(time_col="ts", base=days["base"]), progress=False)
    new_ids = np.arange(Corpus(days["base"]).num_docs, fresh.num_docs)
    for servers in (2, 3, 4):
        per_server = np.bincount(shard_of(new_ids, servers), minlength=servers)
        assert per_server.max() - per_server.min() <= 1, per_server


def test_a_window_keeps_the_ids_of_users_and_urls_that_no_longer_appear(days, tmp_path):
    """--window-days: documents are the last days' events only; a known user with none keeps its id
    and an empty row, a known URL with none keeps its id with count 0; both are reported."""
    base = Corpus(days["base"])
    fresh = prepare([days["all"]], str(tmp_path / "w"), PrepareConfig(time_col="ts", base=days["base"], window_days=2), progress=False)
    docs = fresh.docs()
    assert docs.column("key").to_pylist()[:base.num_docs] == base.docs().column("key").to_pylist()
    lengths = docs.column("length").to_numpy()
    gone = np.flatnonzero(lengths[:base.num_docs] == 0)
    assert len(gone) > 0 and fresh.meta["refresh"]["empty_base_docs"] == len(gone)
    in_shards = np.concatenate([ids for p in fresh.shard_paths for ids, _, _ in iter_shard(p)])
    assert not np.isin(gone, in_shards).any() and np.isin(np.flatnonzero(lengths), in_shards).all()
    counts = fresh.counts()
    vanished = np.flatnonzero(counts[:base.vocab_size] == 0)  # URLs no longer visited: their id stays
    assert len(vanished) > 0 and fresh.meta["refresh"]["words_without_tokens"] == len(vanished)
    assert fresh.vocab().column("token").to_pylist()[:base.vocab_size] == base.vocab().column("token").to_pylist()
    seconds = pc.cast(pq.read_table(days["all"])["ts"], pa.int64()).to_numpy() / 1000
    assert fresh.num_tokens == int((seconds >= seconds.max() - 2 * DAY).sum())
    assert fresh.meta["skipped"]["events_outside_window"] == int((seconds < seconds.max() - 2 * DAY).sum())
    # a user who appears only now
    new_users = docs.column("key").to_pylist()[base.num_docs:]
    assert new_users and not set(new_users) & set(base.docs().column("key").to_pylist())


def test_a_model_is_a_base_through_its_corpus(trained_model, sample_corpus, days, tmp_path):
    """--base MODEL takes the ids of the model's key tables, and the documents of its corpus. That corpus
    is the whole sample less its held-out pairs: of the new days' events, it has all but those held out,
    which alone join (the others are events it has, issue 47)."""
    fresh = prepare([days["new"]], str(tmp_path / "m"), PrepareConfig(time_col="ts", base=trained_model), progress=False)
    model_keys = pa.ipc.open_file(os.path.join(trained_model, "docs.arrow")).read_all().column("key").to_pylist()
    assert fresh.docs().column("key").to_pylist()[:len(model_keys)] == model_keys
    assert fresh.meta["refresh"]["base_kind"] == "model"
    held = set(zip(*pq.read_table(sample_corpus[1]).to_pydict().values()))
    new = pq.read_table(days["new"]).to_pydict()
    held_back = sum((u, t) in held for u, t in zip(new["user_id"], new["url"]))
    assert 0 < held_back < len(new["url"])
    assert fresh.meta["skipped"]["events_in_base"] == len(new["url"]) - held_back
    assert fresh.num_tokens == Corpus(sample_corpus[0]).num_tokens + held_back


@pytest.mark.parametrize("case, message", [
    ("text", "--base with --format text"),
    ("holdout", "--base with --holdout"),
    ("same", "--out is the --base"),
    ("neither", "is neither a corpus"),
    ("window without time", "--window-days needs a time column"),
])
def test_refusals_name_the_problem_and_write_nothing(days, tmp_path, case, message):
    out = tmp_path / "out"
    args = {"time_col": "ts", "base": days["base"]}
    if case == "text":
        args.update(format="text", time_col=None)
    elif case == "holdout":
        args.update(holdout=0.2, holdout_out=str(tmp_path / "h.parquet"))
    elif case == "same":
        out = Path(days["base"])
    elif case == "neither":
        (tmp_path / "folder").mkdir()
        args.update(base=str(tmp_path / "folder"))
    else:
        args.update(time_col=None, window_days=3)
    before = sorted(os.listdir(days["base"]))
    with pytest.raises(CorpusError, match=message):
        prepare([days["new"]], str(out), PrepareConfig(**args), progress=False)
    assert (case == "same" or not out.exists()) and sorted(os.listdir(days["base"])) == before


def test_joining_needs_the_models_corpus_and_a_window_does_not(trained_model, days, tmp_path):
    """A model whose corpus is gone can still be a base for a window (its ids are in the model); to
    join documents it needs the corpus, and says so."""
    import shutil

    from doc2vec_dist.modeldir import ModelDir

    model = str(tmp_path / "model")
    shutil.copytree(trained_model, model)
    with open(os.path.join(model, "config.json")) as fh:
        config = json.load(fh)
    config["corpus"] = str(tmp_path / "gone")
    with open(os.path.join(model, "config.json"), "w") as fh:
        json.dump(config, fh)
    assert ModelDir(model).corpus_path().endswith("gone")
    with pytest.raises(CorpusError, match="needs the corpus the model was trained on"):
        prepare([days["new"]], str(tmp_path / "join"), PrepareConfig(time_col="ts", base=model), progress=False)
    fresh = prepare([days["all"]], str(tmp_path / "window"), PrepareConfig(time_col="ts", base=model, window_days=3), progress=False)
    assert fresh.meta["refresh"]["mode"] == "window" and fresh.meta["refresh"]["base_kind"] == "model"


# -- train --init-from ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def old_model(ray_cluster, days, tmp_path_factory):
    """A model of the old days, on 2 servers."""
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.trainer import train

    model = str(tmp_path_factory.mktemp("old") / "model")
    train(days["base"], model, TrainConfig(dim=16, epochs=3, sample=0, num_ps=2, cpus_per_worker=1, progress=False))
    return model


@pytest.fixture(scope="module")
def refreshed(days, tmp_path_factory):
    return prepare([days["new"]], str(tmp_path_factory.mktemp("refreshed") / "corpus"), PrepareConfig(time_col="ts", base=days["base"]), progress=False).path


def _table(model: str, name: str) -> np.ndarray:
    from doc2vec_dist.modeldir import ModelDir

    return ModelDir(model).read_table(name)


def test_init_from_starts_every_table_from_the_old_rows(old_model, refreshed, tmp_path):
    """With a learning rate too small to move anything, the new model is the old one for the keys it
    knew (read from 2 servers' checkpoint by 3 servers) and a fresh start for the new keys."""
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.trainer import train

    model = str(tmp_path / "model")
    summary = train(refreshed, model, TrainConfig(dim=16, epochs=1, sample=0, num_ps=3, cpus_per_worker=1,
                                                 alpha=1e-9, min_alpha=1e-9, init_from=old_model, progress=False))
    after_training(summary, old_model, model)
    for name in ("docs", "words_out"):
        old, new = _table(old_model, name), _table(model, name)
        np.testing.assert_allclose(new[:len(old)], old, atol=1e-5)
        assert len(new) > len(old)
        fresh = new[len(old):]
        if name == "docs":  # gensim's start for input vectors: U[-1, 1) / dim
            assert np.abs(fresh).max() <= 1 / 16 and np.abs(fresh).mean() > 0.01
        else:  # words_out starts at zero
            assert np.abs(fresh).max() < 1e-4
    drift = summary["drift"]
    assert drift["docs"]["median"] > 0.999 and drift["docs"]["rows"] == len(_table(old_model, "docs"))
    assert set(drift) == {"docs", "words_out"}
    # a model of its own, that knows which model it started from (issue 26, item 2: an index of the old
    # model is then updated to it, and neighbours say the index is the old model's)
    from doc2vec_dist.modeldir import ModelDir

    old, new = ModelDir(old_model).manifest, ModelDir(model).manifest
    assert new["model_id"] != old["model_id"] and new["derived_from"] == [old["model_id"]]


def test_a_refresh_trains_on_from_the_old_vectors_and_they_stay_comparable(old_model, refreshed, tmp_path, logged):
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.trainer import train

    model = str(tmp_path / "model")
    summary = train(refreshed, model, TrainConfig(dim=16, epochs=1, sample=0, num_ps=2, cpus_per_worker=1,
                                                 init_from=old_model, progress=False))
    # the engine trains and reads no model back: how far the vectors moved is its caller's to measure (issue 49)
    assert "drift" not in summary and "moved since the --init-from model" not in logged.text
    after_training(summary, old_model, model)
    old, new = _table(old_model, "docs"), _table(model, "docs")
    assert np.abs(new[:len(old)] - old).mean() > 1e-4  # trained
    assert summary["drift"]["docs"]["median"] > 0.9, summary["drift"]  # started from the old vectors
    assert "moved since the --init-from model: users cosine(old, new) median" in logged.text
    assert "starting from" in logged.text
    with open(os.path.join(model, "config.json")) as fh:
        assert json.load(fh)["summary"]["drift"] == summary["drift"]


def test_init_from_refuses_a_corpus_whose_ids_moved_and_never_touches_the_old_model(old_model, days, tmp_path):
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.errors import UserError
    from doc2vec_dist.trainer import train

    before = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(old_model, "**"), recursive=True)}
    cold = prepare([days["all"]], str(tmp_path / "cold"), PrepareConfig(time_col="ts"), progress=False).path  # ids by frequency
    config = {"dim": 16, "epochs": 1, "sample": 0, "num_ps": 2, "cpus_per_worker": 1, "init_from": old_model,
              "progress": False}
    with pytest.raises(UserError, match=r"do not keep the ids they have in .*prepare it with .*--base"):
        train(cold, str(tmp_path / "m1"), TrainConfig(**config))
    with pytest.raises(UserError, match="--out is the --init-from model"):
        train(days["base"], old_model, TrainConfig(**config), overwrite=True)
    with pytest.raises(UserError, match="has dim 16, this run 8"):
        train(days["base"], str(tmp_path / "m2"), TrainConfig(**{**config, "dim": 8}))
    assert not os.path.exists(tmp_path / "m1") and not os.path.exists(tmp_path / "m2")
    assert before == {p: os.path.getmtime(p) for p in glob.glob(os.path.join(old_model, "**"), recursive=True)}


def test_train_init_from_takes_the_old_models_shape_and_refuses_a_contradiction(old_model, refreshed, tmp_path,
                                                                                capsys):
    """Issue 26, item 8: `train --init-from OLD` once failed with `--init-from needs the same --dim` unless the
    user repeated the old model's settings. Its dim, mode and dbow_words are taken from OLD; a flag or a YAML
    value that contradicts its dim or mode is one line naming it, its value and OLD's."""
    from doc2vec_dist.cli import main
    from doc2vec_dist.modeldir import ModelDir

    model = str(tmp_path / "model")
    base = ["train", "--corpus", refreshed, "--out", model, "--init-from", old_model, "--no-progress"]
    config = tmp_path / "c.yaml"
    config.write_text("dim: 8\n")
    for extra, line in ((["--dim", "8"], (f"--dim 8 contradicts the --init-from model {old_model}, trained with dim 16: "
                                          "a run from an earlier model keeps its dim and mode; leave --dim out")),
                        (["--vector-size", "8"], "--dim 8 contradicts"),
                        (["--mode", "dm"], "--mode dm contradicts the --init-from model"),
                        (["--config", str(config)], (f"{config}: dim: 8 contradicts the --init-from model {old_model}, "
                                                     f"trained with dim 16: a run from an earlier model keeps its dim "
                                                     f"and mode; leave dim out of {config}"))):
        assert main(base + extra) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and err.startswith(f"error: {line}"), err
    assert not os.path.exists(model)
    assert main(base + ["--epochs", "1", "--sample", "0", "--num-ps", "2", "--cpus-per-worker", "1"]) == 0, \
        capsys.readouterr().err
    saved = ModelDir(model).config()
    assert (saved.dim, saved.mode, saved.init_from) == (16, "dbow", old_model)


def test_the_settings_a_run_takes_from_an_earlier_model(old_model):
    from doc2vec_dist.warmstart import taken_settings

    assert taken_settings(old_model, []) == {"dim": 16, "mode": "dbow", "dbow_words": False, "dtype": "float32",
                                             "rounding": "stochastic"}  # a refresh keeps the tables' type
    # the same values are no contradiction, and dbow_words may change (a fresh `words` table)
    assert taken_settings(old_model, [("", {"dim": 16, "mode": "dbow", "dbow_words": True})])["dim"] == 16


def test_settings_taken_from_an_init_from_model_are_said(old_model, tmp_path, caplog):
    # a model trained with --dbow-words and --dtype float16: a run from it took both without a word, though
    # --dtype's help says float32 by default (and no flag turns dbow_words off)
    import json
    import shutil

    from doc2vec_dist.warmstart import taken_settings

    model = shutil.copytree(old_model, str(tmp_path / "old"))
    with open(os.path.join(model, "config.json")) as fh:
        saved = json.load(fh)
    with open(os.path.join(model, "config.json"), "w") as fh:
        json.dump({**saved, "dbow_words": True, "dtype": "float16"}, fh)
    with caplog.at_level("INFO"):
        assert taken_settings(model, [("", {"dim": None})])["dtype"] == "float16"
    assert (f"from the --init-from model {model}, as its tables were trained: dbow_words True, dtype float16 (a flag, "
            "or a --config key such as dbow_words: false, changes them)") in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):  # what a flag gives is the run's, not said as taken
        taken_settings(model, [("", {"dtype": "float32"})])
    assert "dbow_words True (" in caplog.text and "dtype float16" not in caplog.text
    caplog.clear()
    with caplog.at_level("INFO"):
        taken_settings(old_model, [])  # the defaults: nothing to say
    assert "as its tables were trained" not in caplog.text


def test_a_refresh_killed_mid_run_resumes_from_its_own_checkpoint(ray_cluster, old_model, refreshed, tmp_path,
                                                                  interrupt_when, capsys):
    """Ctrl-C after the refresh's first checkpoint, then --resume with 3 servers instead of 2: the
    servers load the refresh's own rows (not the old model's again) and the run completes."""
    import subprocess
    import sys

    from doc2vec_dist.modeldir import latest_version

    model = str(tmp_path / "model")
    address = ray_cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "doc2vec_dist", "train", "--corpus", refreshed, "--out", model, "--address", address,
           "--no-progress", "--dim", "16", "--sample", "0", "--cpus-per-worker", "1"]
    driver = subprocess.Popen(cmd + ["--epochs", "200", "--checkpoint-every", "0.3", "--init-from", old_model,
                                     "--num-ps", "2"], cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    err = interrupt_when(driver, lambda: os.path.exists(os.path.join(model, "LATEST")))
    assert driver.returncode == 130, err
    kept = latest_version(model)
    at_kill = _table(model, "docs")
    from doc2vec_dist.modeldir import load_manifest

    epoch = load_manifest(model)[1]["epoch"]  # resumed to the end of the epoch it stopped in
    # the resumed run in this process, on the session's Ray (only the interrupted one needed its own)
    from doc2vec_dist.cli import main

    capsys.readouterr()
    code = main(cmd[3:] + ["--resume", "--epochs", str(epoch + 1), "--num-ps", "3"])
    err = capsys.readouterr().err
    assert code == 0, err[-3000:]
    assert f"resumed from v{kept}" in err and "starting from" not in err
    with open(os.path.join(model, "config.json")) as fh:
        summary = json.load(fh)["summary"]
    assert summary["servers_loaded_from"] == [kept] * 3
    assert _table(model, "docs").shape == at_kill.shape


def test_a_first_epoch_of_changed_users_leaves_the_others_exactly_as_they_were(old_model, refreshed, tmp_path):
    """--first-epoch changed: users without new events keep their vectors bit for bit through it (so an
    index update replaces only the others), the changed ones train, and the learning rate still
    decays over what was planned: the last checkpoint's rate is min_alpha."""
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.modeldir import load_manifest
    from doc2vec_dist.trainer import train

    model = str(tmp_path / "model")
    summary = train(refreshed, model, TrainConfig(dim=16, epochs=1, sample=0, num_ps=2, cpus_per_worker=1,
                                                 init_from=old_model, first_epoch="changed", progress=False))
    corpus = Corpus(refreshed)
    old, new = _table(old_model, "docs"), _table(model, "docs")[:len(_table(old_model, "docs"))]
    changed = np.zeros(len(old), bool)
    changed[corpus.changed()[corpus.changed() < len(old)]] = True
    assert (~changed).sum() > 0 and changed.sum() > 0
    assert (new[~changed] == old[~changed]).all()
    assert (new[changed] != old[changed]).any(axis=1).all()
    lengths = corpus.docs().column("length").to_numpy()
    assert summary["tokens"] == int(lengths[corpus.changed()].sum()) < corpus.num_tokens
    assert load_manifest(model)[1]["lr"] == pytest.approx(1e-4)


def test_a_first_epoch_of_changed_users_needs_a_refreshed_corpus(days, tmp_path):
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.trainer import train

    with pytest.raises(CorpusError, match="--first-epoch changed needs a corpus from prepare --base"):
        train(days["base"], str(tmp_path / "m"), TrainConfig(dim=8, epochs=1, first_epoch="changed", progress=False))
    assert not (tmp_path / "m").exists()


def test_joining_onto_a_window_fills_the_documents_it_left_empty(days, tmp_path):
    """A window leaves known users with an empty document; joining the next day's events onto it gives
    each user its window's tokens then its new events, the empty ones included, ids kept."""
    window = prepare([days["old"]], str(tmp_path / "window"), PrepareConfig(time_col="ts", base=days["base"], window_days=3), progress=False)
    joined = prepare([days["new"]], str(tmp_path / "joined"), PrepareConfig(time_col="ts", base=window.path), progress=False)
    assert joined.docs().column("key").to_pylist()[:window.num_docs] == window.docs().column("key").to_pylist()
    before, after = _documents(window), _documents(joined)
    events = pq.read_table(days["new"]).sort_by([("ts", "ascending")])
    new_events: dict[str, list[str]] = {}
    for key, url in zip(events.column("user_id").to_pylist(), events.column("url").to_pylist()):
        new_events.setdefault(key, []).append(url)
    keys = joined.docs().column("key").to_pylist()
    empty_before = {k for k, n in zip(window.docs().column("key").to_pylist(),
                                      window.docs().column("length").to_pylist()) if n == 0}
    refilled = empty_before & set(new_events)
    assert refilled and empty_before - set(new_events)  # both kinds are there
    for key in keys:
        assert after.get(key, []) == before.get(key, []) + new_events.get(key, []), key
    assert joined.meta["refresh"]["events_not_after_base"] == 0


# -- one pass 3 for both ways of joining (issue 30, item 4) --------------------------------------------

def test_both_ways_of_joining_count_duplicates_early_events_and_single_tokens_alike(tmp_path):
    """The same refresh joined shard by shard and re-bucketed (a base from before corpus.json said
    "shards_by") gives the same documents and counts: an event logged twice at the base's latest time
    is one early event and one duplicate both ways (the re-bucketed path used to keep both copies and
    count two early events), and documents of a single token are counted alike."""

    def events(rows):
        return pa.table({"user_id": [r[0] for r in rows], "url": [r[1] for r in rows],
                         "ts": pa.array([r[2] for r in rows], pa.int64())})

    old, new = str(tmp_path / "old.parquet"), str(tmp_path / "new.parquet")
    t0 = 1_700_000_000
    pq.write_table(events([("u1", "a", t0), ("u1", "b", t0 + 2), ("u2", "c", t0 + 1), ("u3", "a", t0 + 3),
                           ("u5", "b", t0)]), old)
    pq.write_table(events([("u1", "c", t0 + 3), ("u1", "c", t0 + 3), ("u4", "d", t0 + 9), ("u2", "a", t0 + 5),
                           ("u6", "a", t0 + 7), ("u6", "a", t0 + 7)]), new)
    by_shard = prepare([old], str(tmp_path / "base"), PrepareConfig(time_col="ts", num_shards=2), progress=False).path
    unsaid = _unsaid(by_shard, str(tmp_path / "base-unsaid"))
    found = {}
    for name, base in (("joined", by_shard), ("re-bucketed", unsaid)):
        fresh = prepare([new], str(tmp_path / name), PrepareConfig(time_col="ts", base=base, num_shards=(
            None if name == "joined" else 2)), progress=False)
        found[name] = (_documents(fresh), fresh.meta["skipped"]["duplicate_events"], fresh.meta["docs_with_one_token"],
                       fresh.meta["refresh"]["events_not_after_base"])
    assert found["joined"][0] == {"u1": ["a", "b", "c"], "u2": ["c", "a"], "u3": ["a"], "u5": ["b"], "u4": ["d"],
                                  "u6": ["a"]}
    assert found["joined"][1:] == (2, 4, 1)  # u1's c and u6's a logged twice; u3, u4, u5, u6 of one token
    assert found["re-bucketed"] == found["joined"]


# -- a base that does not fit the inputs (issue 26, item 3) -------------------------------------------

def _renamed_users(source: str, path: str, keep: int) -> tuple[str, int, int]:
    """The events of `source` with every user renamed (another id scheme) but the first `keep` (in order
    of first appearance): (the file, its users, those kept)."""
    events = pq.read_table(source)
    users = list(dict.fromkeys(events["user_id"].to_pylist()))
    kept = set(users[:keep])
    renamed = [u if u in kept else f"other-{u}" for u in events["user_id"].to_pylist()]
    pq.write_table(events.set_column(events.schema.get_field_index("user_id"), "user_id", pa.array(renamed)), path)
    return path, len(users), len(kept)


@pytest.mark.parametrize("base_kind, window", [("corpus", None), ("model", None), ("model", 3)])
def test_a_base_that_knows_no_user_of_the_inputs_is_refused(trained_model, days, tmp_path, base_kind, window):
    """`prepare --base X events` where X knows none of the events' users (another site's corpus or model,
    another id scheme) is an error naming the base and the counts, not a refresh of only new users."""
    base = days["base"] if base_kind == "corpus" else trained_model
    events, users, _ = _renamed_users(days["all" if window else "new"], str(tmp_path / "other.parquet"), 0)
    inputs = "the inputs' window" if window else "the inputs"  # a window's users: those with events in it
    users = "[\\d,]+" if window else f"{users:,}"
    with pytest.raises(CorpusError, match=rf"{base}: --base shares no user with {inputs}: 0 of the {users} users in "
                                          rf"{inputs} and [\d,]+ of their [\d,]+ URLs are known to it \([\d,]+ users"):
        prepare([events], str(tmp_path / "out"), PrepareConfig(time_col="ts", base=base, window_days=window), progress=False)
    assert not (tmp_path / "out").exists()


def test_a_base_that_knows_few_users_of_the_inputs_is_a_warning_with_the_share(days, tmp_path, logged):
    events, users, kept = _renamed_users(days["new"], str(tmp_path / "few.parquet"), 3)
    fresh = prepare([events], str(tmp_path / "few"), PrepareConfig(time_col="ts", base=days["base"]), progress=False)
    assert fresh.meta["refresh"]["input_users"] == users and fresh.meta["refresh"]["known_input_users"] == kept
    assert (f"{days['base']}: --base knows only {kept / users:.1%} of the users in the inputs: {kept} of the "
            f"{users:,} users") in logged.text
    logged.clear()
    ordinary = prepare([days["new"]], str(tmp_path / "ordinary"), PrepareConfig(time_col="ts", base=days["base"]), progress=False, report=True)
    r = ordinary.meta["refresh"]
    assert r["known_input_users"] >= 0.1 * r["input_users"] and "--base knows only" not in logged.text
    assert f"of the inputs' {r['input_users']:,} users, {r['known_input_users']:,} known" in logged.text


# -- late events, events sent again, a base without times (issue 47, items 2 and 3) -------------------

def _unsaid(base: str, path: str) -> str:
    """A copy of corpus `base` whose corpus.json does not say its shards are by key hash (a corpus from
    before it did): a refresh re-buckets it with the events instead of joining shard by shard."""
    import shutil

    shutil.copytree(base, path)
    with open(os.path.join(path, "corpus.json")) as fh:
        meta = json.load(fh)
    del meta["shards_by"]
    with open(os.path.join(path, "corpus.json"), "w") as fh:
        json.dump(meta, fh)
    return path


@pytest.fixture(scope="module")
def late(days, tmp_path_factory):
    """The old days less 5% of their events, which arrive late, with the new days: (base of the rest,
    the new days with the late events, the late events, the base's users that have an event now)."""
    root = tmp_path_factory.mktemp("late")
    old = pq.read_table(days["old"])
    arrives_late = np.random.default_rng(0).random(old.num_rows) < 0.05
    paths = {"late": str(root / "late.parquet"), "new": str(root / "new.parquet")}
    pq.write_table(old.filter(pa.array(~arrives_late)), str(root / "early.parquet"))
    pq.write_table(old.filter(pa.array(arrives_late)), paths["late"])
    pq.write_table(pa.concat_tables([pq.read_table(days["new"]), pq.read_table(paths["late"])]), paths["new"])
    paths["base"] = prepare([str(root / "early.parquet")], str(root / "base"), PrepareConfig(time_col="ts"),
                            progress=False).path
    return paths


@pytest.mark.parametrize("path", ["by shard", "re-bucketed"])
def test_a_user_with_late_events_is_a_changed_user_and_they_join_in_time_order(days, late, tmp_path, logged, path):
    """Issue 47, item 2: events of the new day timed before the base's latest time were joined to the
    documents but not counted as new, so their users were "without new events" and train
    --first-epoch changed left them with their old vectors. A user with any event the base does not
    have is changed, whatever its time; the late events take their places in time order (the documents
    are a cold prepare's of all the days), and the report says how many, in a line of its own."""
    base = late["base"] if path == "by shard" else _unsaid(late["base"], str(tmp_path / "unsaid"))
    fresh = prepare([late["new"]], str(tmp_path / "fresh"), PrepareConfig(time_col="ts", base=base,
                    num_shards=None if path == "by shard" else 2), progress=False, report=True)
    keys = Corpus(base).docs().column("key").to_pylist()
    with_events = set(pq.read_table(late["new"], columns=["user_id"]).column("user_id").to_pylist())
    known_with_events = sorted(i for i, k in enumerate(keys) if k in with_events)
    late_users = set(pq.read_table(late["late"], columns=["user_id"]).column("user_id").to_pylist())
    changed = fresh.changed()
    assert changed[changed < len(keys)].tolist() == known_with_events
    r = fresh.meta["refresh"]
    assert r["grown_docs"] == len(known_with_events) and r["docs_without_new_events"] == len(keys) - len(known_with_events)
    assert r["events_not_after_base"] == pq.read_metadata(late["late"]).num_rows
    assert r["users_with_events_not_after_base"] == len(late_users)
    lengths = fresh.docs().column("length").to_numpy()
    assert fresh.epoch_tokens(0, "changed") == int(lengths[changed].sum())  # what --first-epoch changed trains
    cold = prepare([days["all"]], str(tmp_path / "cold"), PrepareConfig(time_col="ts"), progress=False)
    assert _documents(fresh) == _documents(cold)
    said = [rec.getMessage() for rec in logged.records]
    line = (f"{r['events_not_after_base']:,} input event(s) of {len(late_users):,} user(s) are at or before the "
            "base's latest time and not in it (late data): joined to their documents in time order, their users "
            "counted as changed")
    assert line in said
    assert any(m.startswith(f"refresh of {base} ") and f"{r['grown_docs']:,} with new events" in m and "at or before" not in m
               for m in said)


@pytest.mark.parametrize("path", ["by shard", "re-bucketed"])
def test_events_the_base_has_are_dropped_and_counted_so_a_cumulative_export_is_harmless(days, tmp_path, logged, path):
    """Issue 47, item 3: every event again (a cumulative export given as the day's events) with --base
    doubled every document. An input event the base has (the same user, URL and time) is dropped and
    counted; the corpus is then a cold prepare's of all the days, and a line of its own says the inputs
    look like a cumulative export. Yesterday's export sent again changes nothing at all."""
    base = days["base"] if path == "by shard" else _unsaid(days["base"], str(tmp_path / "unsaid"))
    cold = prepare([days["all"]], str(tmp_path / "cold"), PrepareConfig(time_col="ts"), progress=False)
    logged.clear()
    again = prepare([days["all"]], str(tmp_path / "again"), PrepareConfig(time_col="ts", base=base,
                    num_shards=None if path == "by shard" else 2), progress=False, report=True)
    old_events, all_events = pq.read_metadata(days["old"]).num_rows, pq.read_metadata(days["all"]).num_rows
    assert again.num_tokens == cold.num_tokens and _documents(again) == _documents(cold)
    assert again.meta["skipped"]["events_in_base"] == again.meta["refresh"]["events_in_base"] == old_events
    said = [rec.getMessage() for rec in logged.records]
    assert (f"{days['all']} looks like a cumulative export: {old_events:,} of its {all_events:,} events "
            f"({old_events / all_events:.0%}) were in the base already (the same user, URL and time): dropped, so "
            f"the documents hold each event once; {all_events - old_events:,} are new") in said
    assert (f"skipped {old_events:,} event(s) the base has already: the same 'user_id', 'url' and 'ts' as one of its "
            "own") in said
    logged.clear()
    same = prepare([days["old"]], str(tmp_path / "same"), PrepareConfig(time_col="ts", base=base,
                   num_shards=None if path == "by shard" else 2), progress=False, report=True)
    assert _documents(same) == _documents(Corpus(base)) and same.num_tokens == Corpus(base).num_tokens
    r = same.meta["refresh"]
    assert (r["grown_docs"], r["new_docs"], len(same.changed()), r["events_in_base"]) == (0, 0, 0, old_events)
    assert any(m.startswith(f"{days['old']} looks like a cumulative export: {old_events:,} of its "
                            f"{old_events:,} events (100%)") for m in (rec.getMessage() for rec in logged.records))


@pytest.mark.parametrize("path", ["by shard", "re-bucketed"])
def test_of_several_inputs_each_file_mostly_of_the_bases_events_is_named_with_its_own_figures(days, tmp_path,
                                                                                              logged, path):
    """Issue 47, item 3: day 1 again (every event in the base) given with day 2 (every event new). The
    whole-input line named both files (day 1 is 83% of the events), or would have named neither had day 2
    been the larger: the warning names day 1 alone, with its own figures, and corpus.json's
    refresh.files counts each file that had an event in the base."""
    base = days["base"] if path == "by shard" else _unsaid(days["base"], str(tmp_path / "unsaid"))
    old_events, new_events = pq.read_metadata(days["old"]).num_rows, pq.read_metadata(days["new"]).num_rows
    fresh = prepare([days["old"], days["new"]], str(tmp_path / "c"), PrepareConfig(
        time_col="ts", base=base, num_shards=None if path == "by shard" else 2), progress=False, report=True)
    r = fresh.meta["refresh"]
    assert r["events_in_base"] == old_events and r["input_events"] == old_events + new_events
    assert r["files"] == [{"file": days["old"], "events": old_events, "in_base": old_events, "not_after_base": 0}]
    warned = [rec.getMessage() for rec in logged.records if rec.levelname == "WARNING" and "cumulative" in rec.getMessage()]
    assert warned == [(f"{days['old']} looks like a cumulative export: {old_events:,} of its {old_events:,} events "
                      "(100%) were in the base already (the same user, URL and time): dropped, so the documents hold "
                      "each event once; 0 are new")]
    assert _documents(fresh) == _documents(prepare([days["all"]], str(tmp_path / "cold"), PrepareConfig(time_col="ts"),
                                                   progress=False))


def test_many_files_mostly_of_the_bases_events_are_named_a_few_then_counted():
    """Past a few files mostly of the base's events, the rest are one line of counts; a file mostly new is
    never named, nor, with a base that keeps times, one whose events are only at or before its latest time."""
    from doc2vec_dist.prepare_report import NAMED_FILES, refresh_report

    files = [{"file": f"d{i}.parquet", "events": 100, "in_base": 90, "not_after_base": 0} for i in range(NAMED_FILES + 2)]
    files += [{"file": "new.parquet", "events": 100, "in_base": 50, "not_after_base": 0},
              {"file": "late.parquet", "events": 100, "in_base": 0, "not_after_base": 80}]
    meta = {"window_days": None, "input_files": [f["file"] for f in files] + ["other.parquet"],
            "refresh": {"base": "b", "mode": "join", "base_docs": 1, "new_docs": 0, "grown_docs": 0,
                        "docs_without_new_events": 1, "empty_base_docs": 0, "base_vocab": 1, "new_words": 0,
                        "words_without_new_events": 0, "words_without_tokens": 0, "input_events": 900,
                        "events_in_base": 500, "events_not_after_base": 80, "base_keeps_times": True,
                        "base_tokens_without_time": 0, "files": files}}
    said = [text for _, text in refresh_report(meta) if "cumulative" in text]
    assert said == [f"d{i}.parquet looks like a cumulative export: 90 of its 100 events (90%) were in the base "
                    "already (the same user, URL and time): dropped, so the documents hold each event once; 10 are "
                    "new" for i in range(NAMED_FILES)] + [
        ("2 more input files look like cumulative exports: 180 of their 200 events (90%) were in the base already: "
        "dropped as well (corpus.json's refresh.files names each)")]


def test_a_base_without_times_joins_every_event_and_says_it_cannot_tell(days, tmp_path, logged):
    """A base prepared before corpora kept their events' times: an event it has cannot be told from a new
    one, so every input event is joined and its user counted as changed (no user is left untrained),
    and lines of their own say so: the base keeps no times, and each input file mostly at or before its
    latest time (a cumulative export would be in the documents twice) is named: day 1, not day 2."""
    from doc2vec_dist.corpus import SHARD_SCHEMA, write_shard

    base = str(tmp_path / "old-format")
    import shutil

    shutil.copytree(days["base"], base)
    corpus = Corpus(base)
    for b, shard_path in enumerate(corpus.shard_paths):  # the shards as this version wrote them before: no times
        ids, lengths, words = [], [], []
        for doc_ids, offsets, tokens in iter_shard(shard_path):
            ids.append(doc_ids.copy())
            lengths.append(np.diff(offsets))
            words.append(tokens.copy())
        write_shard(base, b, np.concatenate(ids), np.concatenate(lengths), np.concatenate(words))
        assert pa.ipc.open_file(shard_path).schema == SHARD_SCHEMA
    fresh = prepare([days["old"], days["new"]], str(tmp_path / "fresh"), PrepareConfig(time_col="ts", base=base),
                    progress=False, report=True)
    old_events, all_events = pq.read_metadata(days["old"]).num_rows, pq.read_metadata(days["all"]).num_rows
    assert fresh.num_tokens == corpus.num_tokens + all_events  # joined again: the base cannot tell
    r = fresh.meta["refresh"]
    assert r["base_keeps_times"] is False and r["base_tokens_without_time"] == corpus.num_tokens
    assert r["grown_docs"] == corpus.num_docs and r["events_in_base"] == 0
    said = [rec.getMessage() for rec in logged.records]
    assert (f"{base}: keeps no event times (prepared before corpora kept them, or without --time-col): an input event "
            "it already has cannot be told from a new one, and is joined again; prepare the base anew with --time-col "
            "to keep them") in said
    # each file on its own: day 1 (every event at or before the base's latest) is named, day 2 is not
    assert r["files"] == [{"file": days["old"], "events": old_events, "in_base": 0, "not_after_base": old_events}]
    assert [m for m in said if "cumulative" in m] == [
        (f"{days['old']} may be a cumulative export: {old_events:,} of its {old_events:,} events (100%) are at or "
        "before the base's latest time, and the base cannot say which it has: if so, the documents now hold those "
        "events twice; give the events since the base alone")]
    # its times are unknown (-inf) in the refreshed corpus, and sort first: the base's tokens, then the events
    after = _documents(fresh)
    assert all(after[key][:len(before)] == before for key, before in _documents(corpus).items())


def test_sent_again_finds_exactly_the_input_events_a_base_has():
    """shard_pass.sent_again against a set of triples, on events crowded into few values (so many share a
    hash prefix): an input event is the base's when its (doc, token, time) is one of the base's, and a
    time that is NaN or -inf matches nothing."""
    from doc2vec_dist.shard_pass import sent_again

    rng = np.random.default_rng(3)
    n = 20_000
    codes, tokens = rng.integers(0, 40, n), rng.integers(0, 30, n).astype(np.int32)
    times = rng.integers(0, 25, n).astype(np.float64) + 1.7e9
    times[rng.random(n) < 0.05] = np.nan
    times[rng.random(n) < 0.05] = -np.inf
    fresh = rng.random(n) < 0.5
    base = {(c, t, w) for c, t, w, f in zip(codes.tolist(), tokens.tolist(), times.tolist(), fresh.tolist())
            if not f and np.isfinite(w)}
    expected = [f and np.isfinite(w) and (c, t, w) in base
                for c, t, w, f in zip(codes.tolist(), tokens.tolist(), times.tolist(), fresh.tolist())]
    found = sent_again(codes, tokens, times, fresh)
    assert found.tolist() == expected and 0 < found.sum() < fresh.sum()


def test_the_daily_job_keeps_the_base_corpus_cap(tmp_path):
    """jobs/refresh.py reads today's events as the base corpus read yesterday's: its --max-tokens-per-doc
    too, unless a flag says otherwise."""
    from doc2vec_dist import pipeline

    events = str(tmp_path / "e.parquet")
    pq.write_table(pa.table({"user_id": ["u1", "u1", "u2"], "url": ["a", "b", "a"], "ts": [1_700_000_000] * 3}), events)
    base = prepare([events], str(tmp_path / "base"), PrepareConfig(time_col="ts", max_tokens_per_doc=7),
                   progress=False).path
    settings = pipeline.base_corpus_settings(pipeline.RefreshJob(events=[events], base_model=str(tmp_path / "none"),
                                                       out=str(tmp_path / "day"), base_corpus=base))
    assert settings["max_tokens_per_doc"] == 7 and settings["time_col"] == "ts"


# -- issue 51: users who leave (--expire-days) and users forgotten (the base's forget list) -----------------

def _last_seen(path: str) -> dict[str, float]:
    """Each user's latest event time (epoch seconds) in an events file."""
    events = pq.read_table(path, columns=["user_id", "ts"])
    seconds = pc.cast(events["ts"], pa.int64()).to_numpy() / 1000
    latest: dict[str, float] = {}
    for user, t in zip(events["user_id"].to_pylist(), seconds, strict=True):
        latest[user] = max(latest.get(user, -np.inf), t)
    return latest


def test_expire_days_drops_the_users_last_seen_before_the_cutoff_and_closes_up_their_ids(days, refreshed, tmp_path,
                                                                                       logged):
    """The users with no event in the last 2 days (by the data's own latest time) leave; those who stay keep
    their order and their documents; the base's rows that went are in dropped.arrow; every URL left is
    visited by someone; plan sizes the smaller tables."""
    from doc2vec_dist import compact
    from doc2vec_dist.cli import main

    corpus = prepare([days["new"]], str(tmp_path / "corpus"), PrepareConfig(time_col="ts", base=days["base"],
                                                                            expire_days=2), progress=False, report=True)
    seen = _last_seen(days["all"])
    cutoff = max(seen.values()) - 2 * DAY
    kept = {u for u, t in seen.items() if t >= cutoff}
    full = Corpus(refreshed)
    keys = corpus.docs().column("key").to_pylist()
    assert set(keys) == kept and 0 < len(kept) < full.num_docs
    assert keys == [k for k in full.docs().column("key").to_pylist() if k in kept]  # the order kept, ids closed up
    assert corpus.docs().column("id").to_pylist() == list(range(len(keys)))
    documents, before = _documents(corpus), _documents(full)
    assert documents == {k: before[k] for k in keys if before.get(k)}
    base_keys = Corpus(days["base"]).docs().column("key").to_pylist()
    assert compact.read_dropped(corpus.path)["docs"].tolist() == [i for i, k in enumerate(base_keys) if k not in kept]
    assert (corpus.counts() > 0).all() and corpus.vocab_size < full.vocab_size
    refresh = corpus.meta["refresh"]
    assert refresh["expired_users"] == full.num_docs - len(kept) and refresh["expired_urls"] == (
        full.vocab_size - corpus.vocab_size)
    assert any(r.message.startswith(f"expired: {refresh['expired_users']:,} user(s) with no event in the last 2 day(s)")
               for r in logged.records)
    assert main(["plan", "--corpus", corpus.path, "--no-calibrate", "--json", str(tmp_path / "plan.json")]) == 0
    with open(tmp_path / "plan.json") as fh:
        tables = json.load(fh)["tables"]
    assert tables["docs"]["rows"] == len(kept) and tables["words_out"]["rows"] == corpus.vocab_size


def test_init_from_a_corpus_that_expired_users_takes_each_kept_users_own_old_row(old_model, days, tmp_path):
    """With a learning rate too small to move anything, every user and URL that stays has its old row,
    though its id moved down past those that left (read by 3 servers from a checkpoint of 2)."""
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.modeldir import ModelDir
    from doc2vec_dist.trainer import train

    corpus = prepare([days["new"]], str(tmp_path / "corpus"), PrepareConfig(time_col="ts", base=old_model,
                                                                            expire_days=2), progress=False).path
    model = str(tmp_path / "model")
    summary = train(corpus, model, TrainConfig(dim=16, epochs=1, sample=0, num_ps=3, cpus_per_worker=1, alpha=1e-9,
                                               min_alpha=1e-9, init_from=old_model, progress=False))
    after_training(summary, old_model, model)
    for table in ("docs", "words_out"):
        old, new = ModelDir(old_model), ModelDir(model)
        was = dict(zip(old.keys(table).to_pylist(), old.read_table(table), strict=True))
        now = dict(zip(new.keys(table).to_pylist(), new.read_table(table), strict=True))
        stayed = [k for k in now if k in was]
        assert 0 < len(stayed) < len(was)
        np.testing.assert_allclose(np.array([now[k] for k in stayed]), np.array([was[k] for k in stayed]), atol=1e-5)
    assert summary["drift"]["docs"]["median"] > 0.999
    assert summary["drift"]["docs"]["rows"] == len([k for k in ModelDir(model).keys("docs").to_pylist()
                                                    if k in set(ModelDir(old_model).keys("docs").to_pylist())])


def test_the_bases_forgotten_users_are_left_out_of_the_inputs_and_the_base_and_counted(days, tmp_path, logged):
    """Users on the base's forget list: their new events are skipped (counted, with how many users), their
    documents in the base leave too (ids closed up), and the new corpus keeps the list."""
    import shutil

    from doc2vec_dist import compact, forgotten

    base = shutil.copytree(days["base"], str(tmp_path / "base"))
    new_users = set(pq.read_table(days["new"], columns=["user_id"]).column("user_id").to_pylist())
    base_keys = Corpus(base).docs().column("key").to_pylist()
    chosen = [k for k in base_keys if k in new_users][:2] + [k for k in base_keys if k not in new_users][:1]
    listed = forgotten.ForgetList()
    listed.add(chosen)
    listed.write(os.path.join(base, forgotten.FILE))
    corpus = prepare([days["new"]], str(tmp_path / "corpus"), PrepareConfig(time_col="ts", base=base),
                     progress=False, report=True)
    assert not set(chosen) & set(corpus.docs().column("key").to_pylist())
    events = pq.read_table(days["new"], columns=["user_id"]).column("user_id")
    assert corpus.meta["skipped"]["events_of_forgotten_users"] == pc.sum(pc.is_in(events, value_set=pa.array(
        chosen))).as_py() > 0
    refresh = corpus.meta["refresh"]
    assert refresh["forgotten_input_users"] == 2 and refresh["forgotten_base_users"] == 3
    assert compact.read_dropped(corpus.path)["docs"].tolist() == sorted(base_keys.index(k) for k in chosen)
    assert all(forgotten.of_corpus(corpus.path).holds(k) for k in chosen)
    assert any(r.message.startswith("forgotten users left out: 2 with ") for r in logged.records)
