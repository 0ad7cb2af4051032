"""gensim's Doc2Vec on the same prepared corpus, written in our model layout.

Changes when how gensim is driven or compared changes (its corpus modes, its settings, writing its
vectors into our layout).

gensim takes a corpus two ways, and `--gensim-mode` picks one:
  iterable     (the default) a stream of TaggedDocument, re-read every epoch: gensim at its most
               accurate, the reference our quality is measured against. Its producer thread feeds
               worker threads jobs of up to 10,000 words, and it cuts a longer document at 10,000
               tokens (gensim #2880): `baseline` counts such documents and says so.
  corpus_file  one line per document in a text file, each thread reading its own part: gensim's
               fastest mode, which its changelog measured losing accuracy on Doc2Vec (0.721 against
               0.683 on Wikipedia) and gensim #2757 reports skipping documents. Speed is compared
               against it.
Either way gensim's tag i is our doc id i, and each token is written as its word id so the mapping
back is exact. Vocabulary filtering already happened in `prepare`, so gensim keeps every token
(min_count=1) and sees the same counts, hence the same subsampling and negatives.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import tempfile
import time
from collections.abc import Iterator

import numpy as np

from . import checkpoint, outputs, storage
from .config import TrainConfig
from .corpus import Corpus, iter_shard
from .errors import UserError

log = logging.getLogger(__name__)

GENSIM_MODES = ("iterable", "corpus_file")
GENSIM_MAX_WORDS = 10_000  # gensim.models.word2vec_inner.MAX_WORDS_IN_BATCH: iterable mode cuts documents here


def documents(corpus: Corpus) -> Iterator[tuple[int, np.ndarray]]:
    """(doc id, word ids) of every document, in doc-id order, checked to be consecutive."""
    expected = 0
    for shard in corpus.shard_paths:
        for doc_ids, offsets, tokens in iter_shard(shard):
            for i, doc in enumerate(doc_ids):
                if doc != expected:
                    raise UserError(f"{corpus.path}: doc ids are not consecutive across shards "
                                    f"(found {doc}, expected {expected}); re-run prepare")
                yield int(doc), tokens[offsets[i]:offsets[i + 1]]
                expected += 1


def write_corpus_file(corpus: Corpus, path: str) -> None:
    """One line per document, in doc-id order, tokens as word ids."""
    with open(path, "w") as fh:
        for _, tokens in documents(corpus):
            fh.write(" ".join(map(str, tokens.tolist())))
            fh.write("\n")


class TaggedCorpus:
    """The corpus as gensim's iterable input: TaggedDocument(word ids as strings, [doc id]) in doc-id
    order, streamed from the shard files on every pass (gensim iterates once per epoch)."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self.names = np.array([str(i) for i in range(corpus.vocab_size)], dtype=object)

    def __iter__(self):
        from gensim.models.doc2vec import TaggedDocument

        for doc, tokens in documents(self.corpus):
            yield TaggedDocument(self.names[tokens].tolist(), [doc])


def train_gensim(corpus_path: str, out: str, config: TrainConfig, workers: int | None = None,
                 overwrite: bool = False, gensim_mode: str = "iterable") -> dict:
    """gensim's Doc2Vec with the model settings of `config`, in `gensim_mode` (module docstring),
    written to `out` in our model layout; returns the run's figures."""
    if gensim_mode not in GENSIM_MODES:
        raise UserError(f"unknown gensim mode {gensim_mode!r} (choose from {', '.join(GENSIM_MODES)})")

    config.validate()
    for bad, what in ((config.optimizer != "sgd", f"--optimizer {config.optimizer}"),
                      (config.shared_negatives > 0, "--shared-negatives")):
        if bad:
            raise UserError(f"gensim has no {what}; the baseline trains gensim's own SGD with per-example negatives")
    corpus = Corpus(corpus_path)
    out = storage.location(out)
    checkpoint.refuse_other_writer(out)  # another run writing it (train's lock) is named first
    checkpoint.refuse_existing_model(out, overwrite)  # what is there first, then whether we can write there
    outputs.check_writable(out, inside=True)
    with checkpoint.writing(out):  # one writer at a time, taken before anything is deleted or written
        made = checkpoint.start_model_dir(out, corpus.path, overwrite)
        try:
            return _train(corpus, out, config, workers or os.cpu_count() or 1, gensim_mode)
        except BaseException:
            if checkpoint.discard_unfinished(out, made):  # a model that never committed is removed, as train does
                log.warning(f"gensim stopped before its model was saved: removed what this run wrote to {out}")
            raise


def _train(corpus: Corpus, out: str, config: TrainConfig, workers: int, gensim_mode: str) -> dict:
    """gensim's training on a started model directory, then its tables saved as one checkpoint."""
    from gensim.models.doc2vec import Doc2Vec

    model = Doc2Vec(vector_size=config.dim, dm=1 if config.mode == "dm" else 0, dm_mean=1,
                    dbow_words=int(config.dbow_words), window=config.window, negative=config.negative,
                    hs=0, sample=config.sample, alpha=config.alpha, min_alpha=config.min_alpha,
                    ns_exponent=config.ns_exponent, min_count=1, seed=config.seed, workers=workers,
                    epochs=config.epochs)
    cut = 0
    if gensim_mode == "iterable":
        lengths = np.concatenate([np.diff(offsets) for shard in corpus.shard_paths
                                  for _, offsets, _ in iter_shard(shard)] or [np.zeros(0, np.int64)])
        cut = int((lengths > GENSIM_MAX_WORDS).sum())
        if cut:
            log.warning(f"baseline: gensim's iterable mode cuts {cut:,} document(s) longer than "
                        f"{GENSIM_MAX_WORDS:,} tokens at that length (gensim #2880); doc2vec-dist uses them whole")
        documents_ = TaggedCorpus(corpus)
        model.build_vocab(documents_)
        t0 = time.perf_counter()
        model.train(documents_, total_examples=model.corpus_count, total_words=model.corpus_total_words,
                    epochs=config.epochs)
        train_seconds = time.perf_counter() - t0
    else:
        # gensim reads a local text file: beside the model when it is local, else in the temp dir
        with tempfile.TemporaryDirectory(prefix="gensim-corpus-", dir=None if storage.is_uri(out) else out) as tmp:
            text = os.path.join(tmp, "corpus.txt")
            write_corpus_file(corpus, text)
            model.build_vocab(corpus_file=text)
            t0 = time.perf_counter()
            model.train(corpus_file=text, total_examples=model.corpus_count,
                        total_words=model.corpus_total_words, epochs=config.epochs)
            train_seconds = time.perf_counter() - t0
    if model.dv.vectors.shape[0] != corpus.num_docs:
        raise UserError(f"gensim produced {model.dv.vectors.shape[0]} doc vectors for {corpus.num_docs} documents")

    # gensim orders its vocabulary by its own rule; put rows back at our word ids
    word_ids = np.array([int(k) for k in model.wv.index_to_key], dtype=np.int64)
    tables = {"docs": model.dv.vectors, "words_out": _by_id(model.syn1neg, word_ids, corpus.vocab_size)}
    if config.trains_words():
        tables["words"] = _by_id(model.wv.vectors, word_ids, corpus.vocab_size)
    t1 = time.perf_counter()
    version = checkpoint.next_version(out)
    parts = {name: [checkpoint.write_slice(out, version, name, 0, 1, np.arange(len(m), dtype=np.int64), m)]
             for name, m in tables.items()}
    checkpoint.commit(out, version, parts, {name: config.dim for name in parts},
                      {"epoch": config.epochs, "num_ps": 1, "config": dataclasses.asdict(config),
                       "corpus": corpus.path, "trainer": "gensim"}, keep=config.keep_checkpoints)
    tokens = corpus.num_tokens * config.epochs
    summary = {"trainer": "gensim", "gensim_mode": gensim_mode, "docs_cut": cut, "workers": workers,
               "model": out, "version": version, "tokens": tokens, "epochs": config.epochs,
               "train_seconds": round(train_seconds, 3), "checkpoint_seconds": round(time.perf_counter() - t1, 3),
               "tokens_per_second": tokens / train_seconds if train_seconds else 0.0}
    checkpoint.write_config(out, config, corpus.path, trainer="gensim", summary=summary)
    return summary


def _by_id(matrix: np.ndarray, word_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """gensim's rows placed at our word ids; words gensim never saw (count 0) stay zero."""
    out = np.zeros((vocab_size, matrix.shape[1]), dtype=np.float32)
    out[word_ids] = matrix
    return out
