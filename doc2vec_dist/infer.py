"""Vectors for users the model never saw: gensim's infer_vector, batched over many users at once.

Changes when how vectors for unseen users are computed or streamed changes.

    doc2vec-dist infer --model MODEL new_events/ --out new_users.parquet --time-col ts

    from doc2vec_dist.infer import infer
    keys, vectors = infer("runs/sample/model", ["new_events/"], time_col="ts")

    from doc2vec_dist import Model
    Model.load("runs/sample/model").infer({"alice": [url1, url2], "bob": [url3]})   # [2, dim]

The steps, in the order of the data flow:

1. Read. The inputs go through `corpus.prepare` into a temporary corpus (min_count=1, removed
   afterwards), so every input format, column flag, error message and time ordering is the one
   `prepare` has. Its tokens are then mapped to the MODEL's word ids through the model's vocab.arrow.
   The model's URL rule (urls.py, recorded in its vocab.arrow) normalises the inputs' URLs as it
   normalised the model's, so a page written another way is still the page.
   A URL the model never saw is given a row composed from its path, host or domain where the
   model knows one of them (compose.py: the count-weighted mean of the known rows that share the part),
   in words_out, and PV-DM's words, and counted ("composed vectors for N URLs the model never saw");
   the new page of a known site then counts as the site's pages do. `compose=False` (--no-compose)
   drops them instead, as infer did before. A URL of the model's vocabulary that no event trained (count 0
   in its vocab.arrow: all its events held out, or cut by max_tokens_per_doc) has a row that never moved
   from zero: it counts as a URL the model never saw (composed, or dropped), and is counted and named
   ("N URLs ... are in the model's vocabulary but no event trained them"). Events whose URL has no row
   nor a composed one (a site the model never saw) are dropped and counted ("skipped N events with URLs
   the model never saw"). A user left with no known URL (or none at all: every one null or empty, which
   prepare drops and keeps the key of, prepare(empty_keys=True)) gets no vector, and a warning names such users
   (the first few, and how many). They are not dropped: the Parquet that `infer` writes keeps their
   key with a null vector, and the arrays (`Model.infer`, `infer` without `out`) hold a row of NaN
   for them. A zero row would look like a vector: faiss scores it 0 against everything and answers
   with arbitrary rows. Every reader of such a file (`neighbors --vectors`, `index --vectors`) and
   `Model.neighbors` skip these rows and name them. Events none of whose URLs the model knows are
   refused before anything is written, with an example of each side (or, for a model that took its
   URLs as written, how many match once both are normalised); when under LOW_OVERLAP of the events or
   of the users can be placed, a warning gives the shares. What prepare itself skipped (duplicate events
   with a time column, rows with a null or empty key or URL, ...) is counted by its reason
   ("skipped while reading: duplicate_events 3").
2. Start. Each new user's vector starts uniform in [-1, 1)/dim, as training starts `docs`, drawn from
   a stream seeded by (seed, blake2b of the user key): a user starts from the same point whatever
   else is in the batch, in any process.
3. Train. Batches of `batch_users` users run `epochs` passes each. A pass builds PV-DBOW or PV-DM
   examples as a training worker's token path does (`device_examples.build`: the model's subsampling,
   reduced windows and unigram^ns_exponent negatives, fresh draws every pass; never skip-gram steps:
   they would only train frozen words), on the same compact layout: every `words` row (PV-DM) at the
   head of `inputs`, a word's row its id, the batch's users after them. `kernels.train` runs with
   learn_outputs=False and learn_context_words=False, so `words_out` (and PV-DM's `words`) stay frozen
   and only the new users' rows move. The learning rate decays linearly from alpha to min_alpha over
   the passes, as gensim's infer_vector does.

Inference is always plain SGD (gensim's update) with the model's alpha, also for a model trained
with row-wise Adagrad: a new row has no accumulator history worth continuing, and a handful of
passes over one user's URLs is the setting SGD's schedule was made for. Pass --alpha if an Adagrad
model's alpha is not a good SGD step size.

Deterministic: the random draws of batch b come from (seed, b), so the same inputs (the same users in
the same order), seed and batch_users give the same vectors bit for bit. A user's vector depends on its
batch's draws: in another batch it is another draw of the same inference. (gensim's infer_vector is not
repeatable: #447, #2847.)
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from . import device_examples, kernels, lr, modeldir, outputs, provenance
from .compose import SOURCES, Composed, UrlComposer, trained_only, untrained
from .config import PrepareConfig
from .corpus import Corpus, iter_shard
from .errors import UserError
from .ids import mix64
from .prepare import prepare
from .read_formats import _as_strings
from .readers import _stripped
from .sampling import NegativeTable, keep_probabilities
from .scoring import NAMED, ServingWarning, counted, named
from .shard_pass import EMPTY_KEYS_FILE
from .urls import UrlRule, normalize_distinct

log = logging.getLogger(__name__)

DEFAULT_BATCH_USERS = 4096
# Below this share of events with a URL the model knows (or of users with at least one), inference
# warns that the events hardly fit the model. A model of the same site loses events only to URLs it
# never saw: on the sample split in time (first 80% of events → vocabulary, last 20% inferred), 95%
# of the later events and 99% of their users kept a known URL with min_count 5, and still 64% and
# 92% with min_count 50 (a vocabulary of 333 of 4,989 URLs). Another site shares only its few
# global URLs, well under a tenth of its events.
LOW_OVERLAP = 0.10
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)  # splitmix64's increment


def initial_vectors(keys: list[str], dim: int, seed: int) -> np.ndarray:
    """[len(keys), dim] float32, uniform in [-1, 1)/dim (training's start for `docs`), one stream per key.

    Key k's stream is splitmix64 started at blake2b(k) keyed by the seed: stable across processes
    and machines (unlike Python's hash()), and independent of the other keys of the batch.
    """
    secret = str(int(seed)).encode()
    start = np.fromiter((int.from_bytes(hashlib.blake2b(k.encode(), digest_size=8, key=secret).digest(), "little")
                         for k in keys), dtype=np.uint64, count=len(keys))
    state = start[:, None] + _GOLDEN * np.arange(1, dim + 1, dtype=np.uint64)[None, :]  # wraps mod 2**64
    uniform = (mix64(state) >> np.uint64(40)).astype(np.float32) * np.float32(2.0 ** -24)  # [0, 1), exact
    return (uniform * 2.0 - 1.0) / np.float32(dim)


@dataclass
class Settings:
    """What inference needs from the model's TrainConfig (ModelDir.config), with the overrides applied."""

    mode: str
    dim: int
    negative: int
    sample: float
    ns_exponent: float
    window: int
    micro_batch: int
    alpha: float
    min_alpha: float
    epochs: int
    seed: int
    batch_users: int
    optimizer: str


def model_settings(model: str, epochs: int | None = None, alpha: float | None = None,
                   min_alpha: float | None = None, seed: int = 1, batch_users: int = DEFAULT_BATCH_USERS) -> Settings:
    """The model's training settings (ModelDir.config: config.json, else the manifest's copy) and the overrides."""
    if not os.path.isdir(model):
        raise UserError(f"{model}: no such model directory")
    found = modeldir.ModelDir(model)  # names the directory if it is not a trained model
    cfg = found.config()
    s = Settings(mode=cfg.mode, dim=cfg.dim, negative=cfg.negative, sample=cfg.sample, ns_exponent=cfg.ns_exponent,
                 window=cfg.window, micro_batch=cfg.micro_batch,
                 alpha=float(cfg.alpha if alpha is None else alpha),
                 min_alpha=float(cfg.min_alpha if min_alpha is None else min_alpha),
                 epochs=int(cfg.epochs if epochs is None else epochs), seed=int(seed), batch_users=int(batch_users),
                 optimizer=cfg.optimizer)
    checks = [(s.epochs > 0, f"epochs must be > 0, not {s.epochs}"),
              (math.isfinite(s.alpha), f"alpha must be a finite number, not {s.alpha}"),
              (math.isfinite(s.min_alpha), f"min_alpha must be a finite number, not {s.min_alpha}"),
              (s.alpha > 0, f"alpha must be > 0, not {s.alpha}"),
              (0 <= s.min_alpha <= s.alpha, f"min_alpha ({s.min_alpha}) must lie in [0, alpha={s.alpha}]"),
              (s.seed >= 0, f"seed must be >= 0, not {s.seed}"),
              (s.batch_users > 0, f"batch_users must be > 0, not {s.batch_users}")]
    for ok, message in checks:
        if not ok:
            raise UserError(message)
    needed = ("words_out", "words") if s.mode == "dm" else ("words_out",)
    for name in needed:
        if name not in found.manifest["tables"]:
            raise UserError(f"{model}: table {name!r} is missing from the checkpoint; cannot infer {s.mode} vectors")
        if found.spec(name)["dim"] != s.dim:
            raise UserError(f"{model}: table {name} has {found.spec(name)['dim']} dims, config.json says {s.dim}")
    return s


class Inferrer:
    """The frozen parts of a model (words_out, PV-DM's words, vocabulary counts) loaded once, and the
    batched training of new document rows against them."""

    def __init__(self, model: str, settings: Settings, table: Callable[[str], np.ndarray] | None = None):
        """table(name) gives a whole table as [rows, dim] float32 (default: read from the checkpoint);
        Model.infer passes its cached loader so repeated calls read the tables once."""
        self.model, self.s = model, settings
        found = modeldir.ModelDir(model)
        load = table or found.read_table
        vocab = found.vocab()
        vocab_path = found.store.show("vocab.arrow")
        self.vocab_tokens = vocab.column("token").combine_chunks()
        self.url_rule = UrlRule.of_schema(vocab.schema, vocab_path)  # the inputs' URLs are read by the model's rule
        counts = vocab.column("count").to_numpy().astype(np.int64)
        self.counts = counts
        self.words_out = torch.from_numpy(np.ascontiguousarray(load("words_out"), dtype=np.float32))
        words = load("words") if settings.mode == "dm" else np.zeros((0, settings.dim), np.float32)
        if len(counts) != self.words_out.shape[0]:
            raise UserError(f"{vocab_path}: {len(counts)} URLs but words_out has {self.words_out.shape[0]} rows")
        # a URL of the vocabulary no event trained (all its events held out, or cut by max_tokens_per_doc): its
        # words_out row never moved from zero, so it is a URL the model never saw, composed or dropped as one (a
        # row an --init-from model trained keeps its place, though its events here are gone)
        self.untrained = untrained(counts, lambda ids: self.words_out[torch.from_numpy(ids)].numpy())
        self.keep_prob = keep_probabilities(counts, settings.sample)
        self.negatives = NegativeTable(counts, settings.ns_exponent)
        self.tables = device_examples.DeviceTables(self.keep_prob, self.negatives, torch.device("cpu"))
        # `inputs` as a worker's token path lays it out: the frozen words rows first (PV-DM), then a batch's users
        self.head = len(words)
        self._inputs = torch.from_numpy(np.ascontiguousarray(words, dtype=np.float32))

    def model_ids(self, tokens: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """(int64 model word id of each token string, -1 for a URL the model never saw or never trained;
        bool: which are URLs of its vocabulary that it never trained)."""
        ids = pc.index_in(tokens, value_set=self.vocab_tokens).fill_null(-1).to_numpy(zero_copy_only=False)
        ids = ids.astype(np.int64)
        never = np.zeros(len(ids), bool)
        never[ids >= 0] = self.untrained[ids[ids >= 0]]
        ids[never] = -1
        return ids, never

    def add_composed(self, urls: pa.Array) -> tuple[Composed, np.ndarray]:
        """Rows composed for URLs the model never saw (compose.py), added after the model's own, frozen as
        they are: (how each was composed, the id each now has, -1 for one without a row). A new row is
        always kept by subsampling (its count is unknown, and it is rare: first seen now) and never drawn
        as a negative (the negatives stay the model's unigram table)."""
        # the URLs never trained are left out (null): neither a URL's own row nor a member of a part's mean
        composed = UrlComposer(trained_only(self.vocab_tokens, self.untrained), self.counts).compose(urls)
        has = composed.has_vector
        ids = np.full(len(urls), -1, np.int64)
        ids[has] = len(self.words_out) + np.arange(int(has.sum()))
        if has.any():
            out_rows = composed.vectors(self.words_out.numpy())[has]
            self.words_out = torch.cat([self.words_out, torch.from_numpy(out_rows)])
            self.keep_prob = np.concatenate([self.keep_prob, np.ones(int(has.sum()), self.keep_prob.dtype)])
            self.tables = device_examples.DeviceTables(self.keep_prob, self.negatives, torch.device("cpu"))
            if self.s.mode == "dm":  # a context word's row is its id in `inputs`: the composed words rows follow
                words = self._inputs[:self.head]
                self._inputs = torch.cat([words, torch.from_numpy(composed.vectors(words.numpy())[has])])
                self.head = len(self._inputs)
        return composed, ids

    def vectors(self, keys: list[str], offsets: np.ndarray, tokens: np.ndarray, batch: int) -> np.ndarray:
        """Trained [n, dim] float32 rows for a batch of n documents: tokens[offsets[i]:offsets[i+1]] are
        document i's model word ids, in order. `batch` numbers the batch: its draws come from (seed, batch)."""
        with _torch_threads(1):
            return self._vectors(keys, offsets, tokens, batch)

    def _vectors(self, keys: list[str], offsets: np.ndarray, tokens: np.ndarray, batch: int) -> np.ndarray:
        s = self.s
        n = len(offsets) - 1
        if len(self._inputs) < self.head + n:  # grown once for the largest batch; the words rows carried over
            grown = torch.empty((self.head + n, s.dim), dtype=torch.float32)
            grown[:self.head] = self._inputs[:self.head]
            self._inputs = grown
        inputs = self._inputs[:self.head + n]
        docs = inputs[self.head:]
        docs.copy_(torch.from_numpy(initial_vectors(keys, s.dim, s.seed)))
        gen = device_examples.generator(int(np.random.default_rng([s.seed, batch]).integers(1 << 63)), self.tables.device)
        shape = device_examples.Shape(mode=s.mode, window=s.window)
        rows = self.head + torch.arange(n)
        offsets_t, tokens_t = torch.from_numpy(offsets.astype(np.int64)), torch.from_numpy(tokens)
        raw = len(tokens)
        for epoch in range(s.epochs):
            ex = device_examples.build(rows, offsets_t, tokens_t, self.tables, s.negative, gen, s.micro_batch, shape)
            if len(ex) == 0:
                continue
            n_micro = -(-len(ex) // ex.micro_batch)
            alphas = torch.from_numpy(lr.micro_batch_rates(s.alpha, s.min_alpha, epoch * raw, raw, s.epochs * raw,
                                                           n_micro))
            kernels.train(inputs, self.words_out, ex.ctx, ex.target, ex.neg, ex.neg_mask, alphas, ex.micro_batch,
                          ctx_mask=ex.ctx_mask, scale=ex.scale, adagrad=False, learn_outputs=False,
                          learn_context_words=False)
        return docs.numpy().copy()


@contextlib.contextmanager
def _torch_threads(n: int):
    """One torch thread while a batch trains, as a training worker has: micro-batch ops are far too small
    to split (an index_add_ of 1,024 × 32 rows took 0.04 ms on one thread and 13 ms on two on a busy
    2-core machine), and the results must not depend on how work is split."""
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@dataclass
class Counts:
    """What was read and what could not be used: reported, never lost silently."""

    users_read: int = 0            # users in the temporary corpus (with at least one usable event)
    events_read: int = 0           # their events
    unknown_events: int = 0        # events whose URL the model never saw (dropped)
    unknown_urls: int = 0          # distinct such URLs
    untrained_events: int = 0      # events whose URL is in the vocabulary but was never trained: as never seen
    untrained_urls: int = 0        # distinct such URLs
    untrained_keys: list[str] = field(default_factory=list)  # the first NAMED of them, to name them
    composed_events: int = 0       # events whose URL the model never saw, given a composed row
    composed_urls: dict[str, int] = field(default_factory=dict)  # distinct such URLs, by source (path, host, domain)
    users_without_known_urls: int = 0  # users left with no event at all: no vector
    unplaced_keys: list[str] = field(default_factory=list)  # the first NAMED of them, to name them
    prepare_skipped: dict | None = None  # what prepare itself dropped (null/empty URLs, duplicate events, ...)

    @property
    def users_placed(self) -> int:
        """Users given a vector: those with at least one URL the model knows."""
        return self.users_read - self.users_without_known_urls

    def low_overlap(self) -> str | None:
        """A warning when few of the events or of the users could be placed (LOW_OVERLAP), else None."""
        known = self.events_read - self.unknown_events
        if not self.events_read or (known >= LOW_OVERLAP * self.events_read
                                    and self.users_placed >= LOW_OVERLAP * self.users_read):
            return None
        return (f"warning: only {known / self.events_read:.1%} of the events ({known:,} of {self.events_read:,}) have "
                f"a URL the model knows, and {self.users_placed / max(self.users_read, 1):.1%} of the users "
                f"({self.users_placed:,} of {self.users_read:,}) get a vector: these events hardly fit the model "
                "(another site, or another column read as the URL?)")

    def lines(self) -> list[str]:
        out = []
        if self.untrained_urls:
            n = self.untrained_urls
            out.append(f"{counted(n, 'URL')} ({self.untrained_events:,} events) {'is' if n == 1 else 'are'} in the "
                       f"model's vocabulary but no event trained {'it' if n == 1 else 'them'} (held out, or cut by "
                       f"max_tokens_per_doc; {'its row' if n == 1 else 'their rows'} never moved): read as URLs the "
                       f"model never saw ({named(self.untrained_keys, n)})")
        if self.composed_events:
            out.append(f"composed vectors for {sum(self.composed_urls.values()):,} URLs the model never saw "
                       f"({self.composed_events:,} events) from their "
                       + ", ".join(f"{source} ({n:,})" for source, n in self.composed_urls.items())
                       + " (compose.py; --no-compose drops them)")
        if self.unknown_events:
            out.append(f"skipped {self.unknown_events:,} events with URLs the model never saw "
                       f"({self.unknown_urls:,} distinct URLs)")
        lost = {k: v for k, v in (self.prepare_skipped or {}).items() if v}
        if lost:
            out.append("skipped while reading: " + ", ".join(f"{k} {v:,}" for k, v in lost.items()))
        return out


def unplaced_line(keys: list[str], total: int, place: str | None) -> str:
    """What a warning says of `total` users with no URL the model knows (`keys`: the first of them): their
    rows in the file `place` have a null vector, or (None) are rows of NaN in an array."""
    one = total == 1
    rows = ("its row" if one else "their rows") + (f" in {place} {'has' if one else 'have'} a null vector" if place
                                                  else f" {'is' if one else 'are'} NaN")
    return f"{counted(total, 'user')} {'has' if one else 'have'} no URL the model knows ({named(keys, total)}): {rows}"


def _batches(corpus: Corpus, id_map: np.ndarray, batch_users: int, counts: Counts,
             bar: tqdm) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray | None]]:
    """(temporary doc ids, offsets, model word ids) of at most batch_users users each, in doc-id order
    within each shard; unknown URLs dropped (counted). Users left with none come as (doc ids, None, None),
    to be marked as having no vector (and counted)."""
    for path in corpus.shard_paths:
        for doc_ids, offsets, tokens in iter_shard(path):
            mapped = id_map[tokens]
            known = mapped >= 0
            lengths = np.bincount(np.repeat(np.arange(len(doc_ids)), np.diff(offsets))[known],
                                  minlength=len(doc_ids))
            keep = lengths > 0
            counts.users_without_known_urls += int(np.count_nonzero(~keep))
            bar.update(int(np.count_nonzero(~keep)))
            unplaced = doc_ids[~keep]
            for start in range(0, len(unplaced), batch_users):
                yield unplaced[start:start + batch_users], None, None
            doc_ids, lengths, mapped = doc_ids[keep], lengths[keep], mapped[known]
            ends = np.cumsum(lengths)
            for start in range(0, len(doc_ids), batch_users):
                end = min(start + batch_users, len(doc_ids))
                lo = int(ends[start - 1]) if start else 0
                sub = np.concatenate([[0], ends[start:end] - lo]).astype(np.int64)
                yield doc_ids[start:end], sub, mapped[lo:int(ends[end - 1])]


def iter_inferred(model: str, inputs, *, format: str = "events", doc_col: str = "user_id", token_col: str = "url",
                  time_col: str | None = None, time_unit: str | None = None, delimiter: str | None = None,
                  epochs: int | None = None, alpha: float | None = None,
                  min_alpha: float | None = None, seed: int = 1, batch_users: int = DEFAULT_BATCH_USERS,
                  progress: bool = True, tmp_dir: str | None = None, counts: Counts | None = None,
                  table: Callable[[str], np.ndarray] | None = None,
                  name: str | None = None, compose: bool = True) -> Iterator[tuple[pa.Array, np.ndarray]]:
    """(keys, [n, dim] float32 vectors) batch by batch; `counts`, if given, is filled in as we go. A
    user with no URL the model knows comes in a batch of such users, as a row of NaN (no vector).

    The model is checked and its frozen tables loaded now, before anything is read; the inputs are
    read when the first batch is asked for, and refused then (before any batch) if none of their
    URLs is in the model's vocabulary. `name` names the inputs in that message (default: their paths).
    compose: give a URL the model never saw a row composed from its path, host or domain (else drop it).
    time_unit, delimiter: as prepare's (PrepareConfig).
    """
    model = os.fspath(model)
    if tmp_dir is not None and not os.path.isdir(tmp_dir):
        raise UserError(f"--tmp-dir {tmp_dir}: " + ("not a directory" if os.path.exists(tmp_dir)
                                                    else "no such directory"))
    settings = model_settings(model, epochs, alpha, min_alpha, seed, batch_users)
    inferrer = Inferrer(model, settings, table)
    read = {"format": format, "doc_col": doc_col, "token_col": token_col, "time_col": time_col,
            "time_unit": time_unit, "delimiter": delimiter}
    if name is None:
        name = ", ".join(map(os.fspath, [inputs] if isinstance(inputs, (str, os.PathLike)) else inputs))
    return _generate(inferrer, inputs, read, progress, tmp_dir, counts if counts is not None else Counts(), name,
                     compose)


def _generate(inferrer: Inferrer, inputs, read: dict, progress: bool, tmp_dir: str | None,
              counts: Counts, name: str, compose: bool) -> Iterator[tuple[pa.Array, np.ndarray]]:
    settings = inferrer.s
    with tempfile.TemporaryDirectory(prefix="doc2vec-infer-", dir=tmp_dir) as tmp:
        rule = inferrer.url_rule.settings() if read["format"] != "text" else {}
        corpus = prepare(inputs, os.path.join(tmp, "corpus"), PrepareConfig(min_count=1, **read, **rule),
                         progress=progress, empty_keys=read["format"] != "text")
        # users whose every event has a null or empty URL: no document, but a row without a vector like
        # those with no URL the model knows (text: a blank line is no user)
        empty = os.path.join(tmp, "corpus", EMPTY_KEYS_FILE)
        no_url = (pa.ipc.open_file(pa.memory_map(empty)).read_all().column("key").combine_chunks()
                  if os.path.exists(empty) else pa.array([], pa.string()))
        # all that prepare skipped (null or empty URLs and keys, duplicate events with a time column, ...), less
        # the users left without a URL, who are kept (rows without a vector) and counted as such
        counts.prepare_skipped = {k: v for k, v in corpus.meta.get("skipped", {}).items()
                                  if k != "docs_without_tokens" or read["format"] == "text"}
        vocab = corpus.vocab()
        id_map, untrained = inferrer.model_ids(vocab.column("token").combine_chunks())
        unknown = id_map < 0
        read_counts = vocab.column("count").to_numpy()
        counts.untrained_urls, counts.untrained_events = int(untrained.sum()), int(read_counts[untrained].sum())
        counts.untrained_keys = vocab.column("token").filter(pa.array(untrained)).slice(0, NAMED).to_pylist()
        if compose and unknown.any():
            composed, ids = inferrer.add_composed(vocab.column("token").combine_chunks().filter(pa.array(unknown)))
            id_map[unknown] = ids
            given = ids >= 0
            counts.composed_events = int(read_counts[unknown][given].sum())
            sources = pc.value_counts(composed.source.filter(pa.array(given))).to_pylist() if given.any() else []
            found = {entry["values"]: entry["counts"] for entry in sources}
            counts.composed_urls = {source: found[source] for source in SOURCES if source in found}
            unknown = id_map < 0
        counts.users_read, counts.events_read = corpus.num_docs + len(no_url), corpus.num_tokens
        counts.unknown_events = int(read_counts[unknown].sum())
        counts.unknown_urls = int(np.count_nonzero(unknown))
        if counts.unknown_events == counts.events_read:
            raise UserError(_no_known_url(name, counts, inferrer, vocab.column("token").combine_chunks(),
                                          read["token_col"]))
        keys = corpus.docs().column("key").combine_chunks()
        with tqdm(total=counts.users_read, desc="infer", unit=" users", unit_scale=True, disable=not progress,
                  dynamic_ncols=True, file=sys.stderr) as bar:
            trained = 0  # batches trained so far: batch b's draws come from (seed, b)
            for doc_ids, offsets, tokens in _batches(corpus, id_map, settings.batch_users, counts, bar):
                batch_keys = keys.take(pa.array(doc_ids)).cast(pa.string())
                if offsets is None:  # users with no URL the model knows: no vector, a row of NaN
                    counts.unplaced_keys += batch_keys.slice(0, NAMED - len(counts.unplaced_keys)).to_pylist()
                    yield batch_keys, np.full((len(doc_ids), settings.dim), np.nan, np.float32)
                    continue
                yield batch_keys, inferrer.vectors(batch_keys.to_pylist(), offsets, tokens, trained)
                trained += 1
                bar.update(len(doc_ids))
            counts.users_without_known_urls += len(no_url)
            for start in range(0, len(no_url), settings.batch_users):
                batch_keys = no_url.slice(start, settings.batch_users)
                counts.unplaced_keys += batch_keys.slice(0, max(0, NAMED - len(counts.unplaced_keys))).to_pylist()
                yield batch_keys, np.full((len(batch_keys), settings.dim), np.nan, np.float32)
                bar.update(len(batch_keys))


def _no_known_url(name: str, counts: Counts, inferrer: Inferrer, tokens: pa.Array, token_col: str) -> str:
    """What is true of events none of whose URLs the model knows: how they were compared, and either that
    the model took its URLs as written and these match them once both are normalised, or an example of
    each side, to tell another site or another column from a different way of writing the same URLs."""
    rule, known = inferrer.url_rule, inferrer.vocab_tokens
    line = (f"{name}: none of the {counts.events_read:,} events has a URL the model knows (their "
            f"{counts.unknown_urls:,} distinct URLs are not among the {len(known):,} of {inferrer.model}, "
            + ("compared after the model's URL rule" if rule.normalize else "compared as written") + ")")
    if counts.untrained_urls:  # in its vocabulary, but their rows never moved
        line = (line[:-1] + f"; {counts.untrained_urls:,} of them are, but no event trained them: held out, or cut by "
                f"max_tokens_per_doc: {named(counts.untrained_keys, counts.untrained_urls)})")
        if counts.untrained_urls == counts.unknown_urls:  # no other site, no other column: nothing to compare
            return line
    if not rule.normalize:
        ours = normalize_distinct(known, UrlRule())
        matched = pc.sum(pc.is_in(normalize_distinct(tokens, UrlRule()), value_set=ours)).as_py() or 0
        if matched:
            return (line + f": {matched:,} of them are its URLs once both are normalised, but the model took its URLs "
                    "as written (prepared with --no-normalize, or before URL normalisation); prepare and train it "
                    f"again without --no-normalize, or give the URLs exactly as its vocabulary writes them "
                    f"('{known[0]}')")
    return (line + f": '{tokens[0]}' against the model's '{known[0]}'; are these events of the site the model was "
            f"trained on, and does --token-col {token_col} hold their URLs?")


def infer(model: str, inputs, out: str | None = None, *, format: str = "events", doc_col: str = "user_id",
          token_col: str = "url", time_col: str | None = None, time_unit: str | None = None,
          delimiter: str | None = None, epochs: int | None = None,
          alpha: float | None = None, min_alpha: float | None = None, seed: int = 1,
          batch_users: int = DEFAULT_BATCH_USERS, progress: bool = True, tmp_dir: str | None = None,
          compose: bool = True):
    """Vectors for the users in `inputs` (files, directories or globs in any `prepare` format) from the
    trained model directory `model`, which stays unchanged.

    With out=None returns (keys pa.StringArray, vectors float32 [n, dim]); the order is that of the
    temporary corpus (for a small input, the order in which users first appear). With `out` writes the
    Parquet file `out` (columns key, vector fixed_size_list<float32>[dim], one row group per batch;
    written under a temporary name and renamed, an existing file is replaced) and returns a summary dict
    (`rows`: the vectors written, `null_vectors`: the rows without one).
    The file records the model and version it was inferred with (provenance), so neighbours and
    indexes made from it can be checked against the model.

    format, doc_col, token_col, time_col, time_unit, delimiter: as prepare's (PrepareConfig).
    epochs, alpha, min_alpha default to the model's (finite numbers); seed seeds the start vectors and
    every draw; batch_users bounds memory (users trained together); tmp_dir (an existing directory)
    stages the events. compose: a URL the model never saw gets a row composed from its path, host or
    domain (compose.py; False drops it); so does a URL of its vocabulary that no event trained (held
    out, or cut: its row never moved), counted apart. A user with no URL the model knows gets no
    vector: a null vector in the file, a row of NaN in the arrays, and a warning naming such users (a
    log line with `out`, else a ServingWarning); the events with unknown URLs are counted on stderr,
    and so is what prepare skipped while reading (duplicate events under a time column, null or empty
    keys and URLs: `prepare_skipped` in the summary). Inputs none of whose URLs the model knows are a
    UserError, and nothing is written.
    """
    t0 = time.perf_counter()
    counts = Counts()
    outputs.check_writable(out)  # where it writes and where it stages the events, before the model is read
    outputs.check_writable(tmp_dir or tempfile.gettempdir(), inside=True)
    # checks the model (and loads its frozen tables) before anything is read or written
    batches = iter_inferred(model, inputs, format=format, doc_col=doc_col, token_col=token_col, time_col=time_col,
                            time_unit=time_unit, delimiter=delimiter, epochs=epochs, alpha=alpha, min_alpha=min_alpha,
                            seed=seed, batch_users=batch_users, progress=progress, tmp_dir=tmp_dir, counts=counts,
                            compose=compose)
    dim = model_settings(model).dim
    if out is None:
        pieces = list(batches)
        _report(counts)
        if counts.users_without_known_urls:
            warnings.warn(unplaced_line(counts.unplaced_keys, counts.users_without_known_urls, None), ServingWarning,
                          stacklevel=2)
        keys = pa.concat_arrays([k for k, _ in pieces]) if pieces else pa.array([], pa.string())
        vectors = np.concatenate([v for _, v in pieces]) if pieces else np.zeros((0, dim), np.float32)
        return keys, vectors
    out = os.path.abspath(os.fspath(out))
    rows = nulls = 0
    # nothing there, or a (key, vector) file of ours; the folders made for it go again if anything fails
    with outputs.replacing(out, "vectors") as staged:
        # one schema for every batch, and for an empty result
        source = provenance.of_model(modeldir.ModelDir(model), "docs")  # the users are rows of its docs space
        schema = provenance.key_vector_table(pa.array([], pa.string()), np.zeros((0, dim), np.float32), source).schema
        with pq.ParquetWriter(staged.path, schema, **outputs.PARQUET_OPTIONS) as writer:
            for keys, vectors in batches:
                missing = np.isnan(vectors).all(axis=1)  # a user with no URL the model knows: a null vector
                writer.write_table(provenance.key_vector_table(keys, vectors, source, missing))
                nulls += int(missing.sum())
                rows += len(keys) - int(missing.sum())
    _report(counts)
    if counts.users_without_known_urls:
        log.warning("warning: " + unplaced_line(counts.unplaced_keys, counts.users_without_known_urls, out))
    seconds = time.perf_counter() - t0
    return {"path": out, "rows": rows, "null_vectors": nulls, "dim": dim, "seconds": seconds,
            "users_per_second": rows / seconds if seconds else 0.0, "users": counts.users_read,
            "events": counts.events_read,
            "unknown_events": counts.unknown_events, "unknown_urls": counts.unknown_urls,
            "untrained_events": counts.untrained_events, "untrained_urls": counts.untrained_urls,
            "composed_events": counts.composed_events, "composed_urls": sum(counts.composed_urls.values()),
            "users_without_known_urls": counts.users_without_known_urls,
            "prepare_skipped": counts.prepare_skipped}


def _report(counts: Counts) -> None:
    for line in counts.lines():
        log.info(line)
    if warning := counts.low_overlap():
        log.warning(warning)


def events_table(events, doc_col: str = "user_id",
                 token_col: str = "url") -> tuple[pa.Table, str, list[str], list[str]]:
    """In-memory events as (Arrow table, prepare format, the users as given, the same users' keys as
    prepare reads them), the users in the order they were given: one row of Model.infer's answer each.

    Accepts a dict user → list of URLs (in order; None: no URL), an iterable of (user, url) pairs (in
    order), a pyarrow Table (or pandas DataFrame) with doc_col and token_col (a URL per row, or a list of
    URLs). Keys are compared as strings (a dict's and pairs' by str(), a table's as prepare casts a
    column: 7.0 is "7"), and prepare reads them stripped of leading and trailing whitespace. So each
    user given keeps a row of its own: two keys that are one once so read (1 and "1" in a dict, " a"
    and "a" anywhere) are a UserError naming both, and so is a dict's or pair's key that is None or
    empty once stripped. A table's rows with a null or empty key are skipped and counted, as prepare
    skips a file's ("skipped while reading: null_keys 1").
    """
    if hasattr(events, "iloc") and hasattr(events, "columns"):  # pandas, without importing it
        events = pa.Table.from_pandas(events, preserve_index=False)
    if isinstance(events, pa.Table):
        for column in (doc_col, token_col):
            if column not in events.column_names:
                raise UserError(f"events table: column '{column}' not found (columns: {', '.join(events.column_names)})")
        typ = events.schema.field(token_col).type
        lists = pa.types.is_list(typ) or pa.types.is_large_list(typ)
        given = pc.unique(_as_strings(events.column(doc_col).combine_chunks(), "events table", doc_col)).drop_null()
        given = given.cast(pa.string()).to_pylist()
        return (events, "lists" if lists else "events", *_read_keys(given, [repr(k) for k in given], skip_empty=True))
    if isinstance(events, dict):
        keys = _key_strings(events, lambda i, k: "the events")
        urls = [_urls_of(k, v) for k, v in events.items()]
        table = pa.table({doc_col: pa.array(keys, pa.string()), token_col: pa.array(urls, pa.list_(pa.string()))})
        return (table, "lists", *_read_keys(keys, [repr(k) for k in events]))
    try:
        pairs = [(u, v) for u, v in events]
    except (TypeError, ValueError):
        raise UserError("events must be a dict user → list of URLs, (user, url) pairs, or a pyarrow Table") from None
    users = _key_strings([u for u, _ in pairs], lambda i, k: f"the events: pair {i} ({k!r}, {pairs[i][1]!r})")
    urls = pa.array([None if v is None else str(v) for _, v in pairs], pa.string())  # None: no URL (null_tokens)
    table = pa.table({doc_col: pa.array(users, pa.string()), token_col: urls})
    given = list(dict.fromkeys(users))
    return (table, "events", *_read_keys(given, [repr(k) for k in given]))


def _key_strings(keys, where: Callable[[int, object], str]) -> list[str]:
    """str() of each user key given; None is no key (it would be the user 'None')."""
    for i, k in enumerate(keys):
        if k is None:
            raise UserError(f"{where(i, k)}: a user's key is None; give each user a key")
    return [str(k) for k in keys]


def _urls_of(user, urls) -> list[str] | None:
    """A dict's value as its user's list of URLs: a string is one URL, None none (the user gets no vector)."""
    if urls is None or isinstance(urls, str):
        return urls if urls is None else [urls]
    try:
        return list(urls)
    except TypeError:
        raise UserError(f"the events: user {user!r}: its URLs are {type(urls).__name__} {urls!r}, not a list of "
                        "URLs") from None


def _read_keys(given: list[str], shown: list[str], skip_empty: bool = False) -> tuple[list[str], list[str]]:
    """(given, read) less the users whose key is empty once stripped (skip_empty: a table's rows, which
    prepare skips and counts; else a UserError): `read` is each key as prepare reads it, stripped of
    whitespace by readers._stripped itself. Two given keys read as one are a UserError naming both."""
    read = _stripped(pa.array(given, pa.string()), "key", "the events", 0, None).to_pylist()
    first: dict[str, int] = {}
    for i, key in enumerate(read):
        if not key and not skip_empty:
            raise UserError(f"the events: the key {shown[i]} is empty"
                            + (" once stripped of whitespace" if given[i] else "") + "; give each user a key")
        if key and key in first:
            raise UserError(f"the events: the keys {shown[first[key]]} and {shown[i]} are one user once read as "
                            f"prepare reads keys ({key!r}: as strings, stripped of whitespace); give each user one "
                            "key")
        first.setdefault(key, i)
    kept = [i for i, key in enumerate(read) if key]
    return [given[i] for i in kept], [read[i] for i in kept]


def _inferred_pieces(model: str, data: pa.Table, format: str, doc_col: str, token_col: str, time_col: str | None,
                     counts: Counts, table, options: dict) -> list:
    """iter_inferred's batches of in-memory events, staged as a Parquet file of a temporary directory."""
    with tempfile.TemporaryDirectory(prefix="doc2vec-infer-events-") as tmp:
        path = os.path.join(tmp, "events.parquet")
        pq.write_table(data, path)
        try:
            return list(iter_inferred(model, [path], format=format, doc_col=doc_col, token_col=token_col,
                                      time_col=time_col, counts=counts, table=table, name="the events", **options))
        except UserError as e:  # prepare names the file it read: ours, which the caller never saw
            if path not in str(e):
                raise
            raise type(e)(str(e).replace(path, "the events")) from None


def infer_events(model: str, events, *, doc_col: str = "user_id", token_col: str = "url", time_col: str | None = None,
                 table: Callable[[str], np.ndarray] | None = None, **options) -> np.ndarray:
    """Model.infer's work: in-memory events → [n_users, dim] float32 in the order users were given (see
    events_table: a row each, whatever prepare makes of the keys), a row of NaN for a user with no URL the
    model knows (or none at all), named in a ServingWarning; no users, no rows ([0, dim]).
    options: epochs, alpha, min_alpha, seed, batch_users, progress, compose, tmp_dir."""
    data, format, given, read = events_table(events, doc_col, token_col)
    options.setdefault("progress", False)
    checked = {k: options[k] for k in ("epochs", "alpha", "min_alpha", "seed", "batch_users") if k in options}
    dim = model_settings(model, **checked).dim  # the model and the overrides checked, even for no users
    if not read:  # no users (or only rows without a key, which prepare would skip): no rows
        return np.zeros((0, dim), np.float32)
    urls = data.column(token_col)
    urls = pc.list_flatten(urls) if format == "lists" else urls
    pieces = []
    counts = Counts()
    if pc.sum(pc.greater(pc.utf8_length(pc.utf8_trim_whitespace(urls.cast(pa.string()))), 0)).as_py():
        pieces = _inferred_pieces(model, data, format, doc_col, token_col, time_col, counts, table, options)
    # (else no user has a URL: each gets its row of NaN below, as one without a URL the model knows)
    _report(counts)
    result = np.full((len(read), dim), np.nan, np.float32)  # a user prepare left out (no URL at all) stays NaN
    position = {k: i for i, k in enumerate(read)}
    for keys, vectors in pieces:
        result[[position[k] for k in keys.to_pylist()]] = vectors
    unplaced = np.flatnonzero(np.isnan(result).all(axis=1))
    if len(unplaced):  # Model.infer's caller: warnings.warn points at their line
        warnings.warn(unplaced_line([given[i] for i in unplaced[:NAMED]], len(unplaced), None), ServingWarning,
                      stacklevel=3)
    return result
