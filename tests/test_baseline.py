"""gensim's Doc2Vec on the same corpus, written in our model layout: later steps run on it unchanged."""

from __future__ import annotations

import json
import os

import gensim.models.doc2vec
import numpy as np
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import checkpoint
from doc2vec_dist.baseline import train_gensim
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.errors import UserError
from doc2vec_dist.export import export, keys_of
from doc2vec_dist.index import neighbors

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
    assert sorted(os.listdir(model)) == ["LATEST", "checkpoints", "config.json", "docs.arrow", "vocab.arrow"]
    with open(os.path.join(model, "LATEST")) as fh:
        assert fh.read().strip() == "v1"
    _, manifest = checkpoint.load_manifest(model)
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
    np.testing.assert_array_equal(checkpoint.read_table(model, "docs"), gensim_model.dv.vectors)


def test_words_out_rows_are_gensims_syn1neg_at_our_word_ids(gensim_run):
    model, _, gensim_model = gensim_run
    words_out = checkpoint.read_table(model, "words_out")
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
    vectors = checkpoint.matrix_of(table.column("vector"), DIM)
    for doc_id in (0, 123, len(doc_keys) - 1):  # gensim's tag i is our doc id i
        np.testing.assert_array_equal(vectors[doc_id], gensim_model.dv[doc_id])


def test_neighbors_on_the_gensim_model_find_the_planted_communities(gensim_run):
    model, _, _ = gensim_run
    truth = pq.read_table(TRUTH_USERS, columns=["user_id", "community"])
    community = dict(zip(truth.column("user_id").to_pylist(), truth.column("community").to_pylist()))
    users = keys_of(model, "docs").to_pylist()[::100][:50]
    result = neighbors(model, users, k=10).to_pydict()
    assert result["rank"][:10] == list(range(1, 11))
    share = np.mean([community[q] == community[n] for q, n in zip(result["key"], result["neighbor"])])
    # about 0.6 here; if doc tags were off by a row it would be chance (1/8)
    assert share > 0.4


def test_an_existing_model_is_not_overwritten_without_overwrite(gensim_run, sample_corpus):
    model, _, _ = gensim_run
    with pytest.raises(UserError, match="already exists") as err:
        train_gensim(sample_corpus[0], model, TrainConfig(dim=8, epochs=1, progress=False))
    assert model in str(err.value)
    _, manifest = checkpoint.load_manifest(model)
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
    words = checkpoint.read_table(out, "words")
    ids = np.array([int(k) for k in model.wv.index_to_key])
    np.testing.assert_array_equal(words[ids], model.wv.vectors)


@pytest.mark.parametrize("flags", [{"optimizer": "adagrad"}, {"shared_negatives": 32}])
def test_options_gensim_lacks_are_refused(sample_corpus, tmp_path, flags):
    with pytest.raises(UserError, match="gensim has no"):
        train_gensim(sample_corpus[0], str(tmp_path / "m"), TrainConfig(dim=8, epochs=1, progress=False, **flags))
    assert not os.path.exists(tmp_path / "m")
