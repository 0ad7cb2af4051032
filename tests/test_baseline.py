"""gensim's Doc2Vec on the same corpus, written in our model layout: later steps run on it unchanged."""

from __future__ import annotations

import json
import os

import gensim.models.doc2vec
import numpy as np
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import modeldir, storage
from doc2vec_dist.baseline import train_gensim
from doc2vec_dist.config import PrepareConfig, TrainConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.errors import UserError
from doc2vec_dist.export import export
from doc2vec_dist.model import neighbors
from doc2vec_dist.modeldir import ModelDir

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRUTH_USERS = os.path.join(ROOT, "data", "sample", "truth", "users.parquet")
DIM = 32


@pytest.fixture(scope="module")
def gensim_run(sample_corpus, tmp_path_factory):
    """(model dir, summary, the gensim model object itself), captured as train_gensim trains it."""
    seen = []
    original_train = gensim.models.doc2vec.Doc2Vec.train

    def recording_train(self, *args, **kwargs):
        seen.append(self)
        return original_train(self, *args, **kwargs)

    out = str(tmp_path_factory.mktemp("gensim") / "model")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gensim.models.doc2vec.Doc2Vec, "train", recording_train)
        # sample=0 as in the trained_model fixture: this small vocabulary loses most tokens to 1e-3
        summary = train_gensim(sample_corpus[0], out, TrainConfig(dim=DIM, epochs=5, sample=0, progress=False),
                               workers=2)
    assert len(seen) == 1
    return out, summary, seen[0]


def test_writes_our_model_layout(gensim_run, sample_corpus):
    model, summary, _ = gensim_run
    assert sorted(os.listdir(model)) == [".doc2vec-dist.json", "LATEST", "checkpoints", "config.json", "docs.arrow",
                                         "vocab.arrow"]
    with open(os.path.join(model, "LATEST")) as fh:
        assert fh.read().strip() == "v1"
    _, manifest = modeldir.load_manifest(model)
    assert set(manifest["tables"]) == {"docs", "words_out"}  # no word vectors without dbow_words
    corpus = Corpus(sample_corpus[0])
    assert manifest["tables"]["docs"]["rows"] == corpus.num_docs
    assert manifest["tables"]["words_out"]["rows"] == corpus.vocab_size
    assert manifest["tables"]["docs"]["dim"] == DIM
    assert manifest["trainer"] == "gensim"

    with open(os.path.join(model, "config.json")) as fh:
        config = json.load(fh)
    assert (config["trainer"], config["dim"], config["epochs"]) == ("gensim", DIM, 5)
    assert config["summary"]["tokens_per_second"] > 0
    assert config["summary"]["tokens"] == corpus.num_tokens * 5 == summary["tokens"]


def test_docs_rows_are_gensims_doc_vectors_in_doc_id_order(gensim_run):
    model, _, gensim_model = gensim_run
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), gensim_model.dv.vectors)


def test_words_out_rows_are_gensims_syn1neg_at_our_word_ids(gensim_run):
    model, _, gensim_model = gensim_run
    words_out = modeldir.ModelDir(model).read_table("words_out")
    for word_id in (0, 1, 17, 400):
        np.testing.assert_array_equal(words_out[word_id],
                                      gensim_model.syn1neg[gensim_model.wv.key_to_index[str(word_id)]])


def test_export_gives_each_user_its_gensim_vector(gensim_run, sample_corpus, tmp_path):
    model, _, gensim_model = gensim_run
    out = str(tmp_path / "docs.parquet")
    export(model, "docs", out, progress=False)
    table = pq.read_table(out)
    doc_keys = Corpus(sample_corpus[0]).docs().column("key").to_pylist()
    assert table.column("key").to_pylist() == doc_keys  # one part: rows in doc-id order
    vectors = modeldir.matrix_of(table.column("vector"), DIM)
    for doc_id in (0, 123, len(doc_keys) - 1):  # gensim's tag i is our doc id i
        np.testing.assert_array_equal(vectors[doc_id], gensim_model.dv[doc_id])


def test_neighbors_on_the_gensim_model_find_the_planted_communities(gensim_run):
    model, _, _ = gensim_run
    truth = pq.read_table(TRUTH_USERS, columns=["user_id", "community"])
    community = dict(zip(truth.column("user_id").to_pylist(), truth.column("community").to_pylist()))
    users = ModelDir(model).keys("docs").to_pylist()[::100][:50]
    result = neighbors(model, users, k=10).to_pydict()
    assert result["rank"][:10] == list(range(1, 11))
    share = np.mean([community[q] == community[n] for q, n in zip(result["key"], result["neighbor"])])
    # about 0.6 here; if doc tags were off by a row it would be chance (1/8)
    assert share > 0.4


def test_a_gensim_model_composes_vectors_for_urls_it_never_saw_as_ours_does(gensim_run):
    """Issue 51, part 3: a new page of a known site gets its host's row, the count-weighted mean of gensim's
    syn1neg rows (words_out) of that site's pages, and says so."""
    from doc2vec_dist import Model

    model, _, _ = gensim_run
    found = ModelDir(model)
    vocab = found.vocab()
    tokens, counts = vocab.column("token").to_pylist(), vocab.column("count").to_numpy().astype(np.float64)
    host = tokens[0].split("/")[2]
    rows = [i for i, t in enumerate(tokens) if t.split("/")[2] == host]
    table = found.read_table("words_out").astype(np.float64)
    answer = Model.load(model).url_vectors([f"https://{host}/a-page-first-seen-today"])
    assert answer.column("source").to_pylist() == ["host"] and answer.column("part").to_pylist() == [host]
    np.testing.assert_allclose(answer.column("vector")[0].as_py(),
                               (table[rows] * counts[rows, None]).sum(0) / counts[rows].sum(), rtol=1e-5, atol=1e-6)


def test_an_existing_model_is_not_overwritten_without_overwrite(gensim_run, sample_corpus):
    model, _, _ = gensim_run
    with pytest.raises(UserError, match="already holds a model; pass --overwrite to replace it") as err:
        train_gensim(sample_corpus[0], model, TrainConfig(dim=8, epochs=1, progress=False))
    assert model in str(err.value)
    _, manifest = modeldir.load_manifest(model)
    assert manifest["tables"]["docs"]["dim"] == DIM


@pytest.mark.parametrize("flags, gensim_params", [
    ({"mode": "dm", "window": 3}, {"dm": 1, "cbow_mean": 1, "window": 3}),
    ({"dbow_words": True, "window": 2}, {"dm": 0, "dbow_words": 1, "window": 2}),
])
def test_flags_map_to_gensim_parameters_and_word_vectors_are_written(sample_corpus, tmp_path, flags, gensim_params):
    seen = []
    original_train = gensim.models.doc2vec.Doc2Vec.train

    def recording_train(self, *args, **kwargs):
        seen.append(self)
        return original_train(self, *args, **kwargs)

    out = str(tmp_path / "m")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gensim.models.doc2vec.Doc2Vec, "train", recording_train)
        train_gensim(sample_corpus[0], out, TrainConfig(dim=8, epochs=1, negative=3, progress=False, **flags), workers=2)
    model = seen[0]
    for name, value in {**gensim_params, "negative": 3, "vector_size": 8}.items():
        assert getattr(model, name) == value, name
    words = modeldir.ModelDir(out).read_table("words")
    ids = np.array([int(k) for k in model.wv.index_to_key])
    np.testing.assert_array_equal(words[ids], model.wv.vectors)


@pytest.mark.parametrize("flags", [{"optimizer": "adagrad"}, {"shared_negatives": 32}])
def test_options_gensim_lacks_are_refused(sample_corpus, tmp_path, flags):
    with pytest.raises(UserError, match="gensim has no"):
        train_gensim(sample_corpus[0], str(tmp_path / "m"), TrainConfig(dim=8, epochs=1, progress=False, **flags))
    assert not os.path.exists(tmp_path / "m")


# --- issue 13, item 13: baseline takes gensim's flags only; a config shared with train still works ---------

def _engine_only_flags() -> list[str]:
    import dataclasses

    from doc2vec_dist.config import TrainConfig

    return ["--" + f.name.replace("_", "-") for f in dataclasses.fields(TrainConfig)
            if f.metadata.get("engine") and f.metadata.get("flag", True)]


MODEL_FLAGS = ["--dim", "--vector-size", "--epochs", "--mode", "--dbow-words", "--window", "--negative", "--sample",
               "--alpha", "--min-alpha", "--ns-exponent", "--seed", "--corpus", "--out", "--config", "--overwrite",
               "--workers"]


def test_engine_only_fields_are_marked_in_the_config():
    assert {"--num-ps", "--num-workers", "--cpus-per-worker", "--gpus-per-worker", "--cache-rows", "--macro-batch",
            "--micro-batch", "--max-inflight-pushes", "--checkpoint-every", "--keep-checkpoints", "--max-restarts",
            "--address", "--resume", "--resume-from", "--shared-negatives", "--optimizer", "--kernel", "--init-from",
            "--first-epoch", "--wait-for-resources", "--schedule", "--segments", "--dtype", "--rounding",
            "--device-rows", "--device-memory", "--force-workers"} == set(_engine_only_flags())


def test_baseline_help_lists_only_the_flags_gensim_uses(capsys):
    from doc2vec_dist.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["baseline", "--help"])
    assert exit_info.value.code == 0
    listed = {word.strip(",[]") for word in capsys.readouterr().out.split() if word.strip("[").startswith("--")}
    assert not listed & set(_engine_only_flags()), sorted(listed & set(_engine_only_flags()))
    assert set(MODEL_FLAGS) <= listed, sorted(set(MODEL_FLAGS) - listed)


@pytest.mark.parametrize("argv", [["--num-ps", "3"], ["--cache-rows", "100"], ["--address", "auto"], ["--resume"],
                                  ["--shared-negatives", "16"], ["--optimizer", "adagrad"], ["--num-workers=4"]])
def test_an_engine_flag_given_to_baseline_is_refused_in_one_line(sample_corpus, tmp_path, capsys, argv):
    from doc2vec_dist.cli import main

    code = main(["baseline", "--corpus", sample_corpus[0], "--out", str(tmp_path / "m"), *argv])
    err = capsys.readouterr().err
    flag = argv[0].split("=")[0]
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {flag} is a doc2vec-dist engine option"), err
    assert "gensim's baseline does not use it" in lines[0]
    assert not os.path.exists(tmp_path / "m")


@pytest.mark.parametrize("name", ["gpu.yaml", "sample.yaml"])
def test_a_config_shared_with_train_works_for_baseline(sample_corpus, tmp_path, capsys, name):
    """Engine-only keys of a config written for train (num_ps, cache_rows, shared_negatives ...) are ignored."""
    from doc2vec_dist.cli import main

    config = os.path.join(ROOT, "jobs", "configs", name)
    out = str(tmp_path / "m")
    code = main(["baseline", "--corpus", sample_corpus[0], "--out", out, "--config", config, "--dim", "8",
                 "--epochs", "1", "--workers", "2", "--no-progress"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    assert captured.out.startswith("gensim (iterable mode): ")
    with open(os.path.join(out, "config.json")) as fh:
        saved = json.load(fh)
    assert (saved["trainer"], saved["dim"], saved["epochs"]) == ("gensim", 8, 1)
    assert (saved["gpus_per_worker"], saved["cache_rows"], saved["optimizer"]) == (0, None, "sgd")
    # one note names the engine options the file set that gensim does not use (sample.yaml's are the defaults)
    notes = [line for line in captured.err.splitlines() if "ignoring" in line]
    expected = (["cpus_per_worker, gpus_per_worker, micro_batch"] if name == "gpu.yaml"
                else [])
    assert [line.split(": ")[-1] for line in notes] == expected


def test_yaml_vector_size_sets_the_baselines_dim(sample_corpus, tmp_path, capsys):
    from doc2vec_dist.cli import main

    config = tmp_path / "gensim.yaml"
    config.write_text("vector_size: 12\nepochs: 1\nsample: 0\n")
    out = str(tmp_path / "m")
    assert main(["baseline", "--corpus", sample_corpus[0], "--out", out, "--config", str(config), "--workers", "2",
                 "--no-progress"]) == 0, capsys.readouterr().err
    _, manifest = modeldir.load_manifest(out)
    assert manifest["tables"]["docs"]["dim"] == 12


def test_a_configs_workers_key_points_baseline_to_its_own_flag(sample_corpus, tmp_path, capsys):
    """baseline --config with gensim's `workers:` pointed to train's num_workers and cpus_per_worker, which
    baseline then ignored (gensim ran on every core); it points to baseline's own --workers now."""
    from doc2vec_dist.cli import main

    config = tmp_path / "gensim.yaml"
    config.write_text("dim: 8\nepochs: 1\nworkers: 1\n")
    assert main(["baseline", "--corpus", sample_corpus[0], "--out", str(tmp_path / "m"), "--config", str(config),
                 "--no-progress"]) == 2
    assert capsys.readouterr().err.strip() == (f"error: {config}: workers is gensim's name; doc2vec-dist uses "
                                               "baseline's --workers N (gensim's threads), on its command line")
    assert not (tmp_path / "m").exists()


def test_a_baseline_that_fails_removes_what_it_wrote(sample_corpus, tmp_path, logged):
    """A fresh run that stops before its model is saved leaves nothing half-made (issue 13, item 2)."""
    import shutil

    from doc2vec_dist.corpus import CorpusError

    corpus = shutil.copytree(sample_corpus[0], str(tmp_path / "corpus"))
    os.truncate(os.path.join(corpus, "shards", "part-00000.arrow"), 100)  # damaged after prepare
    out = tmp_path / "new" / "gensim"
    with pytest.raises(CorpusError, match="part-00000.arrow: cannot read shard"):
        train_gensim(corpus, str(out), TrainConfig(dim=8, epochs=1, progress=False))
    assert not (tmp_path / "new").exists()
    assert f"removed what this run wrote to {out}" in logged.text


@pytest.mark.parametrize("gensim_mode", ["iterable", "corpus_file"])
def test_both_gensim_modes_train_every_document_and_say_which_ran(sample_corpus, tmp_path, capsys, gensim_mode):
    """iterable (the default, gensim's most accurate) and corpus_file (its fastest) both end in our layout,
    each row at its doc id, and the summary, config.json and the CLI name the mode."""
    from doc2vec_dist.cli import main

    out = str(tmp_path / "m")
    assert main(["baseline", "--corpus", sample_corpus[0], "--out", out, "--dim", "16", "--epochs", "3", "--sample",
                 "0", "--workers", "2", "--gensim-mode", gensim_mode, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert f"gensim ({gensim_mode} mode): " in printed and f"model: {out} (checkpoint v1)" in printed
    summary = storage.Store.of(out).read_json("config.json")["summary"]
    assert summary["gensim_mode"] == gensim_mode and summary["docs_cut"] == 0
    docs = modeldir.ModelDir(out).read_table("docs")
    assert docs.shape == (Corpus(sample_corpus[0]).num_docs, 16)
    # every document was trained: none is left at its random start (gensim's init is tiny: |x| < 0.5/dim)
    assert (np.abs(docs).max(axis=1) > 0.5 / 16).mean() > 0.99


def _text_corpus(tmp_path, lines: list[str]):
    from doc2vec_dist.prepare import prepare

    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n")
    return prepare([str(tmp_path / "t.txt")], str(tmp_path / "c"), PrepareConfig(format="text"), progress=False)


@pytest.mark.parametrize("gensim_mode", ["iterable", "corpus_file"])
def test_both_modes_cut_at_10000_kept_tokens_and_say_so(tmp_path, logged, gensim_mode):
    """gensim (both modes: MAX_DOCUMENT_LEN of doc2vec_inner.pyx and doc2vec_corpusfile.pyx) stops reading a
    document once 10,000 of its tokens are kept after subsampling. Here 11,000 words seen once are never
    dropped, after 1,000 of a word subsampling thins: the document is certainly cut, 1,000 to 2,000 tokens
    from its end; the short documents' words (20 each) are never dropped either, so gensim's own count of the
    tokens it trained is exactly 10,000 + 80 an epoch, and its tokens/s leaves out what it did not read."""
    lines = [" ".join(["hub"] * 1000 + [f"r{i}" for i in range(11_000)])] + ["w1 w2 w3 w4"] * 20
    corpus = _text_corpus(tmp_path, lines)
    summary = train_gensim(corpus.path, str(tmp_path / "m"), TrainConfig(dim=8, epochs=2, progress=False), workers=1,
                           gensim_mode=gensim_mode)
    assert summary["docs_cut"] == 1
    assert summary["tokens"] == 2 * (corpus.num_tokens - 1000)  # the 1,000 after the 11,000th kept are never read
    assert summary["docs_cut_up_to"] == 1
    assert summary["trained_tokens"] == 2 * (10_000 + 80)  # gensim's effective words, less one tag a document
    assert summary["tokens_unread_up_to"] == 2 * 1000  # and up to 1,000 more: where the 10,000th kept falls
    rate = summary["tokens_per_second"]  # train_seconds is rounded to the millisecond
    assert rate * summary["train_seconds"] == pytest.approx(summary["tokens"], abs=0.0006 * rate)
    assert f"gensim's {gensim_mode} mode cut 1 document(s)" in logged.text


@pytest.mark.parametrize("gensim_mode", ["iterable", "corpus_file"])
def test_without_subsampling_the_cut_and_the_tokens_read_are_exact(tmp_path, logged, gensim_mode):
    lines = [" ".join(f"w{i % 50}" for i in range(12_000))] + ["w1 w2 w3 w4"] * 20
    corpus = _text_corpus(tmp_path, lines)
    summary = train_gensim(corpus.path, str(tmp_path / "m"), TrainConfig(dim=8, epochs=1, sample=0, progress=False),
                           workers=1, gensim_mode=gensim_mode)
    assert summary["docs_cut"] == 1
    assert summary["tokens"] == corpus.num_tokens - 2000
    assert (summary["docs_cut_up_to"], summary["tokens_unread_up_to"]) == (1, 0)
    assert summary["trained_tokens"] == corpus.num_tokens - 2000  # gensim's own count: it cut at 10,000
    assert "leaves out the 2,000 tokens past the cut it did not read" in logged.text


@pytest.mark.parametrize("gensim_mode", ["iterable", "corpus_file"])
def test_a_long_document_subsampling_brings_under_10000_is_not_said_to_be_cut(tmp_path, logged, gensim_mode):
    """12,000 tokens of 50 words, each seen 240 times: subsampling keeps about a quarter, so gensim reads the
    document to its end. That cannot be seen from here, so it is 'up to 1', none certain."""
    lines = [" ".join(f"w{i % 50}" for i in range(12_000))] + ["w1 w2 w3 w4"] * 20
    corpus = _text_corpus(tmp_path, lines)
    summary = train_gensim(corpus.path, str(tmp_path / "m"), TrainConfig(dim=8, epochs=1, progress=False), workers=1,
                           gensim_mode=gensim_mode)
    assert summary["docs_cut"] == 0
    assert "cut 1 document" not in logged.text
    assert summary["trained_tokens"] < 10_000  # gensim kept fewer than 10,000 tokens in all: it cut nothing
    assert summary["docs_cut_up_to"] == 1
    assert summary["tokens"] == corpus.num_tokens and summary["tokens_unread_up_to"] == 2000
    assert "cut up to 1 document(s) (those longer than 10,000 tokens; 0 certainly)" in logged.text


@pytest.mark.parametrize("workers", ["-2", "0"])
def test_fewer_than_one_worker_is_refused_in_one_line(sample_corpus, tmp_path, capsys, workers):
    """gensim given fewer than 1 thread trains nothing (and 0 is not documented as all cores: leaving
    --workers out is)."""
    from doc2vec_dist.cli import main

    code = main(["baseline", "--corpus", sample_corpus[0], "--out", str(tmp_path / "m"), "--dim", "8", "--epochs",
                 "1", "--workers", workers, "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.strip().splitlines() == [(f"error: --workers {workers}: gensim's threads must be at least 1 "
                                         "(leave it out for all cores)")]
    assert not os.path.exists(tmp_path / "m")


# --- a refresh's shards hold doc ids out of order --------------------------------------------------------------

@pytest.fixture(scope="module")
def refresh_corpus(tmp_path_factory):
    """A base of 40 users, then a day of events of 20 of them and 20 new ones, prepared into 3 shards: each
    user stays in its base shard's hash bucket, so the shards hold doc ids out of order."""
    import pyarrow as pa

    from doc2vec_dist.prepare import prepare

    root = tmp_path_factory.mktemp("refresh")
    rng = np.random.default_rng(7)

    def events(users: range, day: int) -> str:
        rows = [(f"u{u:03d}", f"https://s{u % 4}.example/p{rng.integers(0, 30)}", day * 86_400_000 + i)
                for u in users for i in range(12)]
        path = str(root / f"day{day}.parquet")
        pq.write_table(pa.table({"user_id": [r[0] for r in rows], "url": [r[1] for r in rows],
                                 "ts": pa.array([r[2] for r in rows], pa.timestamp("ms", tz="UTC"))}), path)
        return path

    base = prepare([events(range(40), 1)], str(root / "base"), PrepareConfig(time_col="ts"), progress=False)
    return prepare([events(range(20, 60), 2)], str(root / "fresh"),
                   PrepareConfig(time_col="ts", base=base.path, num_shards=3), progress=False).path


def _shard_documents(corpus: Corpus) -> list[tuple[int, list[str]]]:
    """(doc id, word ids as strings) of every document, read from the shard files in their order."""
    import pyarrow as pa

    found = []
    for path in corpus.shard_paths:
        table = pa.ipc.open_file(pa.memory_map(path)).read_all()
        found += [(doc, [str(t) for t in tokens]) for doc, tokens in
                  zip(table.column("doc_id").to_pylist(), table.column("tokens").to_pylist())]
    return found


@pytest.mark.parametrize("gensim_mode", ["iterable", "corpus_file"])
def test_a_multi_shard_refresh_puts_each_documents_vector_on_its_own_row(refresh_corpus, tmp_path, gensim_mode):
    """Each document reaches gensim in the shards' order under its own doc id (iterable: its tag; corpus_file:
    its line, put back at its doc id): the rows are those of gensim driven directly on the same documents,
    and after export each user's key has its own document's vector."""
    from gensim.models.doc2vec import Doc2Vec, TaggedDocument

    corpus = Corpus(refresh_corpus)
    docs = _shard_documents(corpus)
    order = np.array([doc for doc, _ in docs])
    assert corpus.num_shards == 3 and sorted(order.tolist()) == list(range(corpus.num_docs))
    assert (np.diff(order) < 0).any()  # out of order, as a refresh's shards are
    config = TrainConfig(dim=8, epochs=2, sample=0, seed=5, progress=False)
    out = str(tmp_path / "m")
    train_gensim(corpus.path, out, config, workers=1, gensim_mode=gensim_mode)

    gensim_model = Doc2Vec(vector_size=8, dm=0, dm_mean=1, dbow_words=0, window=config.window, negative=config.negative,
                           hs=0, sample=0, alpha=config.alpha, min_alpha=config.min_alpha, ns_exponent=config.ns_exponent,
                           min_count=1, seed=5, workers=1, epochs=2)
    if gensim_mode == "iterable":
        tagged = [TaggedDocument(words, [doc]) for doc, words in docs]
        gensim_model.build_vocab(tagged)
        gensim_model.train(tagged, total_examples=len(tagged), total_words=corpus.num_tokens, epochs=2)
        expected = gensim_model.dv.vectors
    else:
        text = tmp_path / "corpus.txt"
        text.write_text("".join(" ".join(words) + "\n" for _, words in docs))
        gensim_model.build_vocab(corpus_file=str(text))
        gensim_model.train(corpus_file=str(text), total_examples=len(docs), total_words=corpus.num_tokens, epochs=2)
        expected = np.empty_like(gensim_model.dv.vectors)
        expected[order] = gensim_model.dv.vectors  # line i is document order[i]
    np.testing.assert_array_equal(modeldir.ModelDir(out).read_table("docs"), expected)

    export(out, "docs", str(tmp_path / "docs.parquet"), progress=False)
    table = pq.read_table(str(tmp_path / "docs.parquet"))
    vectors = dict(zip(table.column("key").to_pylist(), modeldir.matrix_of(table.column("vector"), 8)))
    keys = corpus.docs().column("key").to_pylist()
    for line in (0, 1, len(docs) // 2, len(docs) - 1):  # documents of each shard, first and last
        doc = int(order[line])
        np.testing.assert_array_equal(vectors[keys[doc]], expected[doc])
