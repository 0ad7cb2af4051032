"""gensim's Doc2Vec on the same prepared corpus, written in our model layout.

Changes when how gensim is driven or compared changes (its corpus modes, its settings, writing its
vectors into our layout).

gensim takes a corpus two ways, and `--gensim-mode` picks one:
  iterable     (the default) a stream of TaggedDocument, re-read every epoch: gensim at its most
               accurate, the reference our quality is measured against.
  corpus_file  one line per document in a text file, each thread reading its own part: gensim's
               fastest mode, which its changelog measured losing accuracy on Doc2Vec (0.721 against
               0.683 on Wikipedia) and gensim #2757 reports skipping documents. Speed is compared
               against it.
Both modes stop reading a document once 10,000 of its tokens are kept after subsampling (gensim #2880:
MAX_DOCUMENT_LEN in doc2vec_inner.pyx and doc2vec_corpusfile.pyx); doc2vec-dist trains documents whole.
Which documents that cut cannot be seen (gensim's subsampling draws are its own), so `baseline` counts
those it certainly cut (more than 10,000 tokens before their last that subsampling never drops) and
those it may have (longer than 10,000 tokens): the same count without subsampling.
Documents reach gensim in the order the shards hold them (a refresh's shards hold doc ids out of order).
In iterable mode gensim's tag is our doc id; in corpus_file mode it is the line number, and the rows are
put back at the doc ids afterwards. Each token is written as its word id so the mapping back is exact.
Vocabulary filtering already happened in `prepare`, so gensim keeps every token (min_count=1) and sees
the same counts, hence the same subsampling and negatives.
The tokens/s counts what gensim reports reading (its raw words: the documents it read, whole) less the
tokens past its cut it certainly did not read; `tokens_unread_up_to` says how many more it may not have.
"""

from __future__ import annotations

import dataclasses
import inspect
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
GENSIM_MAX_WORDS = 10_000  # MAX_DOCUMENT_LEN of gensim's doc2vec_inner.pyx and doc2vec_corpusfile.pyx
ALWAYS_KEPT = 2**32 - 1  # a word's sample_int in gensim when subsampling never drops it


def documents(corpus: Corpus) -> Iterator[tuple[int, np.ndarray]]:
    """(doc id, word ids) of every document, in the order the shards hold them (check_doc_ids first)."""
    for shard in corpus.shard_paths:
        for doc_ids, offsets, tokens in iter_shard(shard):
            for i, doc in enumerate(doc_ids):
                yield int(doc), tokens[offsets[i]:offsets[i + 1]]


@dataclasses.dataclass
class LongDocs:
    """The documents longer than GENSIM_MAX_WORDS tokens: their doc ids and lengths, and the shards holding them."""
    ids: np.ndarray
    lengths: np.ndarray
    shards: list[str]


def check_doc_ids(corpus: Corpus) -> LongDocs:
    """The shards checked to hold each doc id from 0 to num_docs - 1 once, in any order (a refresh's shards
    hold them out of order), and the documents gensim may cut. Reads doc ids and offsets, not tokens."""
    seen = np.zeros(corpus.num_docs, dtype=bool)
    count, ids, lengths, shards = 0, [], [], []
    for shard in corpus.shard_paths:
        for doc_ids, offsets, _ in iter_shard(shard):
            count += len(doc_ids)
            if len(doc_ids) and (doc_ids.min() < 0 or doc_ids.max() >= corpus.num_docs):
                bad = doc_ids[(doc_ids < 0) | (doc_ids >= corpus.num_docs)][0]
                raise UserError(f"{shard}: doc id {bad} is outside the corpus's {corpus.num_docs:,} documents; "
                                "re-run prepare")
            seen[doc_ids] = True
            long = np.diff(offsets) > GENSIM_MAX_WORDS
            if long.any():
                ids.append(doc_ids[long].astype(np.int64))
                lengths.append(np.diff(offsets)[long])
                if shard not in shards:
                    shards.append(shard)
    if count != corpus.num_docs or not seen.all():
        raise UserError(f"{corpus.path}: its shards hold {count:,} documents and {int(seen.sum()):,} distinct doc ids, "
                        f"not each of 0..{corpus.num_docs - 1} once; re-run prepare")
    empty = np.zeros(0, np.int64)
    return LongDocs(np.concatenate(ids) if ids else empty, np.concatenate(lengths) if lengths else empty, shards)


def write_corpus_file(corpus: Corpus, path: str) -> np.ndarray:
    """One line per document, in the order the shards hold them, tokens as word ids; returns the doc id
    of each line (gensim's tag is the line number)."""
    order = np.empty(corpus.num_docs, dtype=np.int64)
    with open(path, "w") as fh:
        for line, (doc, tokens) in enumerate(documents(corpus)):
            order[line] = doc
            fh.write(" ".join(map(str, tokens.tolist())))
            fh.write("\n")
    return order


class TaggedCorpus:
    """The corpus as gensim's iterable input: TaggedDocument(word ids as strings, [doc id]) in the order the
    shards hold them, streamed from the shard files on every pass (gensim iterates once per epoch); gensim
    gives an int tag the row of that number."""

    def __init__(self, corpus: Corpus):
        self.corpus = corpus
        self.names = np.array([str(i) for i in range(corpus.vocab_size)], dtype=object)

    def __iter__(self):
        from gensim.models.doc2vec import TaggedDocument

        for doc, tokens in documents(self.corpus):
            yield TaggedDocument(self.names[tokens].tolist(), [doc])


def cut_bounds(long: LongDocs, always_kept: np.ndarray) -> dict:
    """What can be known of gensim's cut without its subsampling draws, per epoch: the documents it certainly
    cuts (more than GENSIM_MAX_WORDS tokens before their last that are never dropped, so that many are kept
    before the end), those it may cut (longer than GENSIM_MAX_WORDS), and the tokens past the cut it
    certainly does not read and may not read. `always_kept`: by our word id, whether subsampling never
    drops the word. Without subsampling every word is kept and the bounds meet."""
    cut = unread = 0
    for shard in long.shards:
        for _, offsets, tokens in iter_shard(shard):
            for i in np.flatnonzero(np.diff(offsets) > GENSIM_MAX_WORDS):
                kept = np.flatnonzero(always_kept[tokens[offsets[i]:offsets[i + 1] - 1]])
                if len(kept) >= GENSIM_MAX_WORDS:  # gensim's 10,000th kept token comes at or before this one
                    cut += 1
                    unread += int(offsets[i + 1] - offsets[i]) - int(kept[GENSIM_MAX_WORDS - 1]) - 1
    return {"cut": cut, "cut_up_to": len(long.ids), "unread": unread,
            "unread_up_to": int((long.lengths - GENSIM_MAX_WORDS).sum())}


def train_gensim(corpus_path: str, out: str, config: TrainConfig, workers: int | None = None,
                 overwrite: bool = False, gensim_mode: str = "iterable") -> dict:
    """gensim's Doc2Vec with the model settings of `config`, in `gensim_mode` (module docstring),
    written to `out` in our model layout; returns the run's figures. `workers`: gensim's threads, at least 1;
    None: all cores."""
    if gensim_mode not in GENSIM_MODES:
        raise UserError(f"unknown gensim mode {gensim_mode!r} (choose from {', '.join(GENSIM_MODES)})")
    if workers is not None and workers < 1:  # gensim trains nothing with fewer; None: all cores
        raise UserError(f"--workers {workers}: gensim's threads must be at least 1 (leave it out for all cores)")

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
            return _train(corpus, out, config, workers or os.cpu_count() or 1, gensim_mode)  # None: all cores
        except BaseException:
            if checkpoint.discard_unfinished(out, made):  # a model that never committed is removed, as train does
                log.warning(f"gensim stopped before its model was saved: removed what this run wrote to {out}")
            raise


def _train(corpus: Corpus, out: str, config: TrainConfig, workers: int, gensim_mode: str) -> dict:
    """gensim's training on a started model directory, then its tables saved as one checkpoint."""
    from gensim.models.doc2vec import Doc2Vec

    long = check_doc_ids(corpus)
    model = Doc2Vec(vector_size=config.dim, dm=1 if config.mode == "dm" else 0, dm_mean=1,
                    dbow_words=int(config.dbow_words), window=config.window, negative=config.negative,
                    hs=0, sample=config.sample, alpha=config.alpha, min_alpha=config.min_alpha,
                    ns_exponent=config.ns_exponent, min_count=1, seed=config.seed, workers=workers,
                    epochs=config.epochs)
    counts = _EpochCounts(model)
    if gensim_mode == "iterable":
        documents_ = TaggedCorpus(corpus)
        model.build_vocab(documents_)
        t0 = time.perf_counter()
        model.train(documents_, total_examples=model.corpus_count, total_words=model.corpus_total_words,
                    epochs=config.epochs)
        train_seconds = time.perf_counter() - t0
        order = None  # gensim's tag is the doc id: its row
    else:
        # gensim reads a local text file: beside the model when it is local, else in the temp dir
        with tempfile.TemporaryDirectory(prefix="gensim-corpus-", dir=None if storage.is_uri(out) else out) as tmp:
            text = os.path.join(tmp, "corpus.txt")
            order = write_corpus_file(corpus, text)
            model.build_vocab(corpus_file=text)
            t0 = time.perf_counter()
            model.train(corpus_file=text, total_examples=model.corpus_count,
                        total_words=model.corpus_total_words, epochs=config.epochs)
            train_seconds = time.perf_counter() - t0
    if model.dv.vectors.shape[0] != corpus.num_docs:
        raise UserError(f"gensim produced {model.dv.vectors.shape[0]} doc vectors for {corpus.num_docs} documents")
    docs = model.dv.vectors
    if order is not None and not np.array_equal(order, np.arange(len(order))):
        docs = np.empty_like(model.dv.vectors)  # gensim's tag is the line number: each row back at its line's doc id
        docs[order] = model.dv.vectors

    # gensim orders its vocabulary by its own rule; put rows back at our word ids
    word_ids = np.array([int(k) for k in model.wv.index_to_key], dtype=np.int64)
    # (its subsampling's draws, fixed by build_vocab: which words it never drops, for what its cut certainly took)
    always_kept = (np.ones(corpus.vocab_size, bool) if not model.sample else
                   _by_id(np.asarray(model.wv.expandos["sample_int"]) == ALWAYS_KEPT, word_ids, corpus.vocab_size))
    bounds = cut_bounds(long, always_kept)
    tables = {"docs": docs, "words_out": _by_id(model.syn1neg, word_ids, corpus.vocab_size)}
    if config.trains_words():
        tables["words"] = _by_id(model.wv.vectors, word_ids, corpus.vocab_size)
    t1 = time.perf_counter()
    version = checkpoint.next_version(out)
    parts = {name: [checkpoint.write_slice(out, version, name, 0, 1, np.arange(len(m), dtype=np.int64), m)]
             for name, m in tables.items()}
    checkpoint.commit(out, version, parts, {name: config.dim for name in parts},
                      {"epoch": config.epochs, "num_ps": 1, "config": dataclasses.asdict(config),
                       "corpus": corpus.path, "trainer": "gensim",  # its sizes: model.model_corpus checks them
                       "corpus_stats": {k: getattr(corpus, k) for k in ("num_docs", "num_tokens", "vocab_size")}},
                      keep=config.keep_checkpoints)
    summary = {"trainer": "gensim", "gensim_mode": gensim_mode, "workers": workers, "model": out, "version": version,
               **_figures(corpus, config.epochs, counts, bounds, gensim_mode), "epochs": config.epochs,
               "train_seconds": round(train_seconds, 3), "checkpoint_seconds": round(time.perf_counter() - t1, 3)}
    summary["tokens_per_second"] = summary["tokens"] / train_seconds if train_seconds else 0.0
    checkpoint.write_config(out, config, corpus.path, trainer="gensim", summary=summary)
    return summary


class _EpochCounts:
    """gensim's own counts, summed over the epochs as it logs each one's end (Doc2Vec.train returns nothing):
    the documents it read, their raw words (whole documents, its cut included) and its effective words (the
    tokens it kept after subsampling and its cut, plus one per document for its tag)."""

    NAMES = ("example_count", "raw_word_count", "trained_word_count")  # gensim 4's _log_epoch_end arguments

    def __init__(self, model):
        self.epochs = self.examples = self.raw = self.effective = 0
        original = getattr(model, "_log_epoch_end", None)
        if original is None:
            return  # nothing recorded: the summary counts the corpus's tokens, and says so
        signature = inspect.signature(original)

        def recorded(*args, **kwargs):
            try:
                got = signature.bind(*args, **kwargs).arguments
                examples, raw, effective = (int(got[name]) for name in self.NAMES)
            except (TypeError, KeyError, ValueError):
                pass
            else:
                self.epochs += 1
                self.examples, self.raw, self.effective = (self.examples + examples, self.raw + raw,
                                                           self.effective + effective)
            return original(*args, **kwargs)

        model._log_epoch_end = recorded


def _figures(corpus: Corpus, epochs: int, counts: _EpochCounts, bounds: dict, gensim_mode: str) -> dict:
    """The run's tokens as gensim counted them, less the tokens past its cut that it certainly did not read,
    and what is known of its cut; a warning when it cut, or may have cut, documents."""
    if counts.epochs == epochs:
        raw, trained = counts.raw, counts.effective - counts.examples  # one tag a document
    else:  # a gensim that logs its epochs otherwise: the corpus's tokens, said so
        raw, trained = corpus.num_tokens * epochs, None
        log.warning("baseline: gensim did not report its word counts; its tokens/s counts the corpus's tokens "
                    "each epoch")
    unread, unread_more = epochs * bounds["unread"], epochs * (bounds["unread_up_to"] - bounds["unread"])
    cut, up_to = bounds["cut"], bounds["cut_up_to"]
    if up_to:
        which = (f"cut {cut:,} document(s)" if cut == up_to else
                 f"cut up to {up_to:,} document(s) (those longer than {GENSIM_MAX_WORDS:,} tokens; {cut:,} certainly)")
        more = (f"; its tokens/s leaves out the {unread:,} tokens past the cut it did not read" if not unread_more else
                f"; its tokens/s leaves out the {unread:,} tokens past the cut it certainly did not read, and counts up "
                f"to {unread_more:,} more it may not have read")
        log.warning(f"baseline: gensim's {gensim_mode} mode {which}: it stops reading a document once "
                    f"{GENSIM_MAX_WORDS:,} of its tokens are kept after subsampling (gensim #2880); doc2vec-dist "
                    f"trains them whole{more}")
    return {"docs_cut": cut, "docs_cut_up_to": up_to, "tokens": raw - unread, "tokens_unread_up_to": unread_more,
            "trained_tokens": trained}


def _by_id(matrix: np.ndarray, word_ids: np.ndarray, vocab_size: int) -> np.ndarray:
    """gensim's rows (or values) placed at our word ids; words gensim never saw (count 0) stay zero (False)."""
    out = np.zeros((vocab_size, *matrix.shape[1:]), dtype=matrix.dtype)
    out[word_ids] = matrix
    return out
