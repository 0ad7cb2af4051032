"""gensim's Doc2Vec on the same prepared corpus, written in our model layout.

The corpus is handed to gensim in `corpus_file` mode (its fastest, scaling over all cores): one line
per document in doc-id order, so gensim's tag i is our doc id i, with each token written as its word
id so the mapping back is exact. Vocabulary filtering already happened in `prepare`, so gensim keeps
every token (min_count=1) and sees the same counts, hence the same subsampling and negatives.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
import time

import numpy as np

from . import checkpoint
from .config import TrainConfig
from .corpus import Corpus, iter_shard
from .errors import UserError


def write_corpus_file(corpus: Corpus, path: str) -> None:
    """One line per document, in doc-id order, tokens as word ids."""
    with open(path, "w") as fh:
        expected = 0
        for shard in corpus.shard_paths:
            for doc_ids, offsets, tokens in iter_shard(shard):
                for i, doc in enumerate(doc_ids):
                    if doc != expected:
                        raise UserError(f"{corpus.path}: doc ids are not consecutive across shards "
                                        f"(found {doc}, expected {expected}); re-run prepare")
                    fh.write(" ".join(map(str, tokens[offsets[i]:offsets[i + 1]].tolist())))
                    fh.write("\n")
                    expected += 1


def train_gensim(corpus_path: str, out: str, config: TrainConfig, workers: int | None = None,
                 overwrite: bool = False) -> dict:
    from gensim.models.doc2vec import Doc2Vec

    config.validate()
    for bad, what in ((config.optimizer != "sgd", f"--optimizer {config.optimizer}"),
                      (config.shared_negatives > 0, "--shared-negatives")):
        if bad:
            raise UserError(f"gensim has no {what}; the baseline trains gensim's own SGD with per-example negatives")
    corpus = Corpus(corpus_path)
    out = checkpoint.model_path(out)
    checkpoint.start_model_dir(out, corpus.path, overwrite)
    workers = workers or os.cpu_count() or 1
    # gensim reads a local text file: beside the model when it is local, else in the temp dir
    with tempfile.TemporaryDirectory(dir=None if checkpoint.is_uri(out) else out) as tmp:
        text = os.path.join(tmp, "corpus.txt")
        write_corpus_file(corpus, text)
        model = Doc2Vec(vector_size=config.dim, dm=1 if config.mode == "dm" else 0, dm_mean=1,
                        dbow_words=int(config.dbow_words), window=config.window, negative=config.negative,
                        hs=0, sample=config.sample, alpha=config.alpha, min_alpha=config.min_alpha,
                        ns_exponent=config.ns_exponent, min_count=1, seed=config.seed, workers=workers,
                        epochs=config.epochs)
        model.build_vocab(corpus_file=text)
        # gensim logs its own progress at INFO; show it when the user wants progress
        logger = logging.getLogger("gensim")
        if config.progress and not logger.handlers:
            logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="gensim: %(message)s")
        t0 = time.perf_counter()
        model.train(corpus_file=text, total_examples=model.corpus_count,
                    total_words=model.corpus_total_words, epochs=config.epochs)
        train_seconds = time.perf_counter() - t0
    if model.dv.vectors.shape[0] != corpus.num_docs:
        raise UserError(f"gensim produced {model.dv.vectors.shape[0]} doc vectors for {corpus.num_docs} documents")

    # gensim orders its vocabulary by its own rule; put rows back at our word ids
    word_ids = np.array([int(k) for k in model.wv.index_to_key], dtype=np.int64)
    tables = {"docs": model.dv.vectors, "words_out": _by_id(model.syn1neg, word_ids, corpus.vocab_size)}
    if config.dbow_words or config.mode == "dm":
        tables["words"] = _by_id(model.wv.vectors, word_ids, corpus.vocab_size)
    t1 = time.perf_counter()
    version = checkpoint.next_version(out)
    parts = {name: [checkpoint.write_slice(out, version, name, 0, 1, np.arange(len(m), dtype=np.int64), m)]
             for name, m in tables.items()}
    checkpoint.commit(out, version, parts, {name: config.dim for name in parts},
                      {"epoch": config.epochs, "num_ps": 1, "config": dataclasses.asdict(config),
                       "corpus": corpus.path, "trainer": "gensim"}, keep=config.keep_checkpoints)
    tokens = corpus.num_tokens * config.epochs
    summary = {"trainer": "gensim", "workers": workers, "tokens": tokens, "epochs": config.epochs,
               "train_seconds": round(train_seconds, 3), "checkpoint_seconds": round(time.perf_counter() - t1, 3),
               "tokens_per_second": tokens / train_seconds if train_seconds else 0.0}
    checkpoint.write_json(out, "config.json", {**dataclasses.asdict(config), "corpus": corpus.path,
                                               "trainer": "gensim", "summary": summary})
    return summary


def _by_id(matrix: np.ndarray, word_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """gensim's rows placed at our word ids; words gensim never saw (count 0) stay zero."""
    out = np.zeros((vocab_size, matrix.shape[1]), dtype=np.float32)
    out[word_ids] = matrix
    return out
