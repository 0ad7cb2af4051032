"""The plan's measurements: a calibration run through the real engine on a slice of the corpus (calibrate,
make_slice), an empty server's bytes and its rows' init time, and the corpus that stands for one not made yet
(EstimatedCorpus: zipf_corpus, scaled_corpus).

Changes when how a plan measures a run before it, or the shape it assumes of a corpus not made yet, changes.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
import os
import shutil
import tempfile
import time
from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .config import TableSpec, TrainConfig
from .corpus import Corpus, iter_shard, write_shard
from .errors import UserError
from .memwatch import MemoryWatch, proc_status
from .plan_model import SCALING_SAMPLE_DOCS, shard_table_bytes
from .ps import table_specs
from .settings import ROUNDS_PER_EPOCH, resolve

# Sizes the calibration slice before anything is measured: tokens/s of one CPU worker, a low guess (a
# slower worker calibrates on a few more tokens than it needs). The measured rate replaces it.
GUESS_TOKENS_PER_SECOND_PER_WORKER = 200_000
MAX_CALIBRATION_EPOCHS = 5


# -- a slice of the corpus for calibration ------------------------------------------------------------------

def make_slice(corpus: Corpus, out: str, tokens: int, files: int) -> Corpus:
    """A corpus of the first documents of `corpus` (about `tokens` tokens, in `files` shard files)
    with its whole vocabulary and counts, so that subsampling, negatives and the rows a macro-batch
    touches are those of the full corpus. The slice's documents are numbered 0..n-1 in shard order
    (a refreshed corpus, prepare --base, holds its new users' ids after every earlier one's)."""
    ids, sizes, words, taken = [], [], [], 0
    for doc_ids, offsets, chunk in itertools.chain.from_iterable(map(iter_shard, corpus.shard_paths)):
        n = min(int(np.searchsorted(offsets[1:], tokens - taken, side="left")) + 1, len(doc_ids))
        ids.append(doc_ids[:n])
        sizes.append(np.diff(offsets[:n + 1]))
        words.append(chunk[:offsets[n]])
        taken += int(offsets[n])
        if taken >= tokens:
            break
    original, lengths, words = np.concatenate(ids), np.concatenate(sizes), np.concatenate(words)
    n_docs = len(original)
    doc_ids = np.arange(n_docs, dtype=np.int64)
    cum = np.concatenate([[0], np.cumsum(lengths)])
    cuts = np.unique(np.searchsorted(cum, np.linspace(0, cum[-1], max(1, files) + 1), side="left"))
    cuts[0], cuts[-1] = 0, n_docs
    shards = [write_shard(out, i, doc_ids[a:b], lengths[a:b], words[cum[a]:cum[b]])
              for i, (a, b) in enumerate(itertools.pairwise(cuts))]
    docs = corpus.docs().take(pa.array(original))
    docs = docs.set_column(docs.schema.get_field_index("id"), "id", pa.array(doc_ids))
    with pa.OSFile(os.path.join(out, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, docs.schema) as writer:
        writer.write_table(docs)
    shutil.copyfile(os.path.join(corpus.path, "vocab.arrow"), os.path.join(out, "vocab.arrow"))
    meta = {**corpus.meta, "num_docs": n_docs, "num_tokens": int(cum[-1]), "num_shards": len(shards),
            "shards": shards, "sliced_from": corpus.path, "shards_by": None}  # cut by tokens, not by key
    with open(os.path.join(out, "corpus.json"), "w") as fh:
        json.dump(meta, fh, indent=2)
    return Corpus(out)


# -- measurements on Ray ---------------------------------------------------------------------------------

def empty_ps_bytes() -> int | None:
    """Private memory of a parameter-server process holding no rows, measured in a probe actor."""
    import ray

    from .ps import ParameterServer

    class PsProbe(ParameterServer):  # named apart so memory watches do not take it for a server
        def private_bytes(self) -> int | None:
            return proc_status(os.getpid(), ("RssAnon",)).get("RssAnon")

    probe = ray.remote(PsProbe).options(num_cpus=0).remote(0, 1, {}, 0)
    try:
        return ray.get(probe.private_bytes.remote(), timeout=120)
    finally:
        ray.kill(probe)


def ps_init_seconds_per_row(dim: int, rows: int = 100_000) -> float:
    """Seconds a parameter server takes to initialise one uniform row, timed here on its own code."""
    from .ps import ParameterServer

    t0 = time.perf_counter()
    ParameterServer(0, 1, {"docs": TableSpec("docs", rows, dim, init="uniform")}, 0)
    return (time.perf_counter() - t0) / rows


def calibration_tokens(corpus: Corpus, config: TrainConfig, seconds: float) -> tuple[int, int]:
    """(tokens of the slice, epochs) for a calibration of about `seconds`: the full run's macro-batch
    needs ROUNDS_PER_EPOCH × macro-batch tokens per worker; a smaller corpus is trained whole."""
    want = int(seconds * GUESS_TOKENS_PER_SECOND_PER_WORKER * config.num_workers)
    floor = ROUNDS_PER_EPOCH * resolve(config, corpus).macro_batch * config.num_workers
    want = max(want, floor)
    if want >= corpus.num_tokens:
        return corpus.num_tokens, int(min(MAX_CALIBRATION_EPOCHS, max(1, want // max(corpus.num_tokens, 1))))
    return want, 1


def calibrate(corpus: Corpus, config: TrainConfig, seconds: float, workdir: str,
              measure: Callable[[str], dict] | None = None) -> dict:
    """Train on slices of the corpus through the real engine; tokens/s, stage times and each
    process's peak private memory (when its processes are children of this one: a local Ray).

    An epoch has fixed costs besides its tokens (the first pulls, resident rows synced at its start
    and end, the last pushes drained) that a full epoch of hundreds of seconds hides and a short
    calibration does not (on 20M users a single short slice overestimated the epoch by about a third).
    So when the first slice trains in under half of `seconds`, a second
    slice sized from its rate to fill `seconds` is trained too, and tokens/s is taken from the
    difference of the two, (tokens₂ − tokens₁) / (time₂ − time₁), in which the fixed costs cancel.
    """
    first = _calibrate_once(corpus, config, *calibration_tokens(corpus, config, seconds), workdir, measure)
    s1 = first["summary"]
    if not first["sliced"] or s1["train_seconds"] <= 0 or s1["train_seconds"] >= seconds / 2:
        return first
    tokens = int(min(corpus.num_tokens, first["corpus_tokens"] * seconds / s1["train_seconds"]))
    if tokens < 1.5 * first["corpus_tokens"]:
        return first
    second = _calibrate_once(corpus, config, tokens, 1, workdir, measure)
    s2 = second["summary"]
    dt = s2["train_seconds"] - s1["train_seconds"]
    if dt > 0:
        marginal = (s2["tokens"] - s1["tokens"]) / dt
        second["summary"] = {**s2, "tokens_per_second": marginal, "slice_tokens_per_second": s2["tokens_per_second"]}
        second["two_point"] = {"tokens": [s1["tokens"], s2["tokens"]],
                               "seconds": [s1["train_seconds"], s2["train_seconds"]]}
    return second


def _calibrate_once(corpus: Corpus, config: TrainConfig, tokens: int, epochs: int, workdir: str,
                    measure: Callable[[str], dict] | None = None) -> dict:
    from .trainer import train

    os.makedirs(workdir, exist_ok=True)
    work = tempfile.mkdtemp(prefix="calibration-", dir=workdir)
    try:
        target = corpus if tokens >= corpus.num_tokens else make_slice(
            corpus, os.path.join(work, "corpus"), tokens, config.num_workers)
        # a slice's ids are not an --init-from model's, nor does it list changed users: time a fresh start
        cfg = dataclasses.replace(config, epochs=epochs, progress=False, resume=False, checkpoint_every=0,
                                  keep_checkpoints=1, init_from=None, first_epoch="all")
        with MemoryWatch(os.getpid(), interval=0.25) as watch:
            summary = train(target.path, os.path.join(work, "model"), cfg, overwrite=True)
        procs = watch.processes()
        measured = None
        if measure is not None:  # what the caller does with a trained model (tune: a trial's evaluation), timed
            t0 = time.perf_counter()
            measured = {"result": measure(os.path.join(work, "model")), "seconds": time.perf_counter() - t0}
        cal_tables = shard_table_bytes(table_specs(config, target), config.num_ps)
        return {"corpus_tokens": target.num_tokens, "corpus_docs": target.num_docs, "epochs": epochs,
                "sliced": target is not corpus, "summary": summary, "processes": procs, "measured": measured,
                "table_bytes": [sum(t.values()) for t in cal_tables],
                "macro_batch": resolve(config, target).macro_batch}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _object_store_bytes(started_here: bool) -> int:
    import ray

    from .cluster import local_object_store_bytes

    if started_here:
        return local_object_store_bytes()
    return int(ray.cluster_resources().get("object_store_memory", 0)) or local_object_store_bytes()


# -- a corpus you do not have yet ------------------------------------------------------------------------

# The shape an estimate assumes where no corpus is given (plan --users N --urls M --tokens-per-user T):
# URL visits Zipf-distributed over the URLs ranked by count, exponent ESTIMATE_ZIPF_S, and a user's number
# of events 1 + Poisson(λ), λ lognormal of σ ESTIMATE_LENGTH_SIGMA with mean T − 1, each event a URL drawn
# from that Zipf law: the shape of the browsing logs `generate` makes, the bundled sample's (less its
# communities, which make a user's URLs more alike: the estimate counts a few more distinct rows).
ESTIMATE_ZIPF_S = 1.0
ESTIMATE_LENGTH_SIGMA = 1.0
# The users written down to stand for all of them: enough for the counts a plan makes on real ones
# (macro_batch_profile's macro-batches, bytes_per_token's SCALING_SAMPLE_DOCS, the calibration's slices),
# at most this many tokens (more would take longer to write than they change the figures).
ESTIMATE_SAMPLE_MAX_TOKENS = 16 << 20


class EstimatedCorpus(Corpus):
    """A corpus of `num_docs` users and `num_tokens` tokens of which a sample lies on disk (`sample`, a
    Corpus of its own, what a calibration trains): its users stand for all of them, and its vocabulary is
    the whole one, its counts times `count_scale` (1 where the sample was written with the whole's)."""

    def __init__(self, sample_path: str, num_docs: int, num_tokens: int, count_scale: float, estimate: dict):
        super().__init__(sample_path)
        self.sample = Corpus(sample_path)
        self.num_docs, self.num_tokens, self.count_scale = int(num_docs), int(num_tokens), count_scale
        self.estimate = estimate

    def counts(self) -> np.ndarray:
        counts = super().counts()
        return counts if self.count_scale == 1 else np.maximum(1, np.rint(counts * self.count_scale)).astype(np.int64)


def check_estimate(users: int | None, urls: int | None, tokens_per_user: float | None, corpus_given: bool) -> None:
    """Refuse an estimate's sizes that do not make one, naming the flag."""
    if corpus_given:
        for flag, value in (("--urls", urls), ("--tokens-per-user", tokens_per_user)):
            if value is not None:
                raise UserError(f"{flag} estimates a corpus you do not have (with --users and no --corpus); "
                                "--corpus CORPUS --users N scales that corpus to N users, its URLs and its users' "
                                "lengths as they are")
    else:
        missing = [flag for flag, value in (("--users", users), ("--urls", urls), ("--tokens-per-user", tokens_per_user))
                   if value is None]
        if missing:
            raise UserError("plan needs --corpus CORPUS, or --users N --urls M --tokens-per-user T to estimate a corpus "
                            f"you do not have yet (missing: {' '.join(missing)})")
    for flag, value, least in (("--users", users, 1), ("--urls", urls, 1), ("--tokens-per-user", tokens_per_user, 1)):
        if value is not None and not value >= least:
            raise UserError(f"{flag} must be at least {least} (given {value:g})")


def estimate_sample_tokens(config: TrainConfig, cal_config: TrainConfig | None, num_tokens: int, vocab: int,
                           tokens_per_user: float, calibrate_seconds: float) -> int:
    """Tokens of the sample an estimate writes: three of the full run's macro-batches
    (macro_batch_profile), SCALING_SAMPLE_DOCS users (bytes_per_token), and where it calibrates
    (cal_config) twice the calibration's first slice (the second slice of a two-point calibration is
    larger), within the corpus and ESTIMATE_SAMPLE_MAX_TOKENS."""
    want = max(3 * resolve(config, _Sizes(num_tokens, vocab)).macro_batch, int(SCALING_SAMPLE_DOCS * tokens_per_user))
    if cal_config is not None:
        want = max(want, 2 * calibration_tokens(_Sizes(num_tokens, vocab), cal_config, calibrate_seconds)[0])
    return int(min(num_tokens, want, ESTIMATE_SAMPLE_MAX_TOKENS))


@dataclasses.dataclass
class _Sizes:  # a corpus's sizes, all that calibration_tokens, table_specs and settings.resolve read of one
    num_tokens: int
    vocab_size: int
    num_docs: int = 0
    meta: dict = dataclasses.field(default_factory=dict)


def zipf_corpus(out: str, users: int, urls: int, tokens_per_user: float, sample_tokens: int, seed: int) -> EstimatedCorpus:
    """An EstimatedCorpus of `users` × `tokens_per_user` tokens over `urls` URLs in the shape the estimate
    assumes (ESTIMATE_ZIPF_S, ESTIMATE_LENGTH_SIGMA), its sample of about `sample_tokens` tokens written
    at `out` as prepare writes a corpus; the vocabulary's counts are the whole corpus's expected ones."""
    from .corpus import DOCS_SCHEMA, FORMAT_VERSION, VOCAB_SCHEMA

    rng = np.random.default_rng([seed, 0xE57])
    total = round(users * tokens_per_user)
    share = 1.0 / np.power(np.arange(1, urls + 1, dtype=np.float64), ESTIMATE_ZIPF_S)
    share /= share.sum()
    counts = np.maximum(1, np.rint(share * total)).astype(np.int64)
    n = int(min(users, max(1, math.ceil(sample_tokens / tokens_per_user))))
    sigma = ESTIMATE_LENGTH_SIGMA
    lengths = 1 + rng.poisson((tokens_per_user - 1) * rng.lognormal(-sigma**2 / 2, sigma, size=n)).astype(np.int64)
    tokens = np.searchsorted(np.cumsum(share), rng.random(int(lengths.sum())), side="right")
    tokens = np.minimum(tokens, urls - 1).astype(np.int32)  # (the cumulative sum's last may round below 1)
    os.makedirs(out)
    doc_ids = np.arange(n, dtype=np.int64)
    shard = write_shard(out, 0, doc_ids, lengths, tokens)

    def named(prefix: str, count: int) -> pa.Array:  # prefix0, prefix1, … (millions of them: in Arrow)
        return pc.binary_join_element_wise(prefix, pa.array(np.arange(count)).cast(pa.string()), "")

    for name, schema, columns in (
            ("vocab.arrow", VOCAB_SCHEMA, [named("url", urls), pa.array(counts), pa.array(np.arange(urls, dtype=np.int32))]),
            ("docs.arrow", DOCS_SCHEMA, [named("user", n), pa.array(doc_ids), pa.array(lengths)])):
        with pa.OSFile(os.path.join(out, name), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(pa.table(dict(zip(schema.names, columns)), schema=schema))
    estimate = {"users": users, "urls": urls, "tokens_per_user": tokens_per_user, "from": "zipf",
                "assumption": f"URL visits Zipf with exponent {ESTIMATE_ZIPF_S:g} over the URLs by rank; a user's "
                              f"events 1 + Poisson(lognormal, σ {ESTIMATE_LENGTH_SIGMA:g}) with mean {tokens_per_user:g}",
                "sample_docs": n, "sample_tokens": int(lengths.sum())}
    with open(os.path.join(out, "corpus.json"), "w") as fh:
        json.dump({"format_version": FORMAT_VERSION, "num_docs": n, "num_tokens": int(lengths.sum()),
                   "vocab_size": urls, "num_shards": 1, "shards": [shard], "format": "events",
                   "estimate": estimate}, fh, indent=2)
    return EstimatedCorpus(out, users, total, 1.0, estimate)


def scaled_corpus(corpus: Corpus, users: int) -> EstimatedCorpus:
    """`corpus` as if it had `users` users of the same shape: its users stand for all of them, its
    vocabulary (URLs) as it is, the counts and tokens times users / its users."""
    scale = users / max(corpus.num_docs, 1)
    estimate = {"users": users, "urls": corpus.vocab_size, "tokens_per_user": corpus.num_tokens / max(corpus.num_docs, 1),
                "from": corpus.path,
                "assumption": f"{corpus.path}'s {corpus.num_docs:,} users, their lengths and its {corpus.vocab_size:,} "
                              f"URLs' shares, for {users:,} users",
                "sample_docs": corpus.num_docs, "sample_tokens": corpus.num_tokens}
    return EstimatedCorpus(corpus.path, users, round(corpus.num_tokens * scale), scale, estimate)
