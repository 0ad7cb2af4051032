"""A run's settings, resolved once: RunSettings, made by `resolve(config, corpus, cluster)` in the driver.

Changes when a decision about how a run trains changes: the segments of the block schedule, the token
path, the resident rows, the macro-batch, the handover, the kernel, the placement, and the warnings
they give.

config.py declares the settings and validates them one by one; what follows from them together with
the corpus and the cluster is decided here, once, and handed to the trainer, the workers, plan, tune
and warm-up, which decide nothing again. A checkpoint records the resolved settings (to_json), and a
resumed run resolves from them: its segments are the ones the checkpoint walked the corpus with.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from dataclasses import dataclass
from typing import Any

from .config import EVENT_SEGMENTS, ROUND_TOKENS, TEXT_SEGMENTS, TrainConfig, is_text
from .errors import UserError

log = logging.getLogger(__name__)

# "0": on the block schedule each block goes home through the servers at a round's end and its next
# holder pulls it (the path before the handover): for the tests that compare the two
HANDOVER_ENV = "DOC2VEC_DIST_HANDOVER"
# "1": workers without a GPU run the device (staged) path with the CPU as the device, as a GPU worker's
# bookkeeping runs: for the tests and measurements of that path where there is no GPU
STAGED_ENV = "DOC2VEC_DIST_STAGED_ON_CPU"

MIN_MACRO_BATCH = 4096
ROUNDS_PER_EPOCH = 16  # pull/push rounds a worker makes at least per epoch where rows are shared (macro_batch_for)
SHARED_MACRO_BATCH = 65536  # the default macro-batch where workers share rows (macro_batch_for)
SOLE_WRITER_MACRO_BATCH = 262144  # ... and where one worker writes every row it trains
DEVICE_MACRO_BATCH = 1048576  # ... and where it does with the examples drawn on its device


RESIDENT_AUTO_BYTES = 2 << 30  # resident words_out rows a single worker keeps by default (cache_rows None)


# -- what a config decides with the corpus's sizes (resolve stores it in RunSettings) -----------------

def exact_kernel(config: TrainConfig) -> bool:
    """Whether workers use cpu_kernel (each update applied at once) rather than kernels.train."""
    if config.kernel == "auto":
        return config.gpus_per_worker == 0 and not config.shared_negatives
    return config.kernel == "exact"


def blocks(config: TrainConfig) -> bool:
    """Whether several workers take turns at blocks of the URL rows (schedule.py): --schedule blocks,
    or auto for plain PV-DBOW with each example's own negatives and no --cache-rows. The windows of
    --dbow-words and PV-DM reach across blocks, so those modes share the rows instead."""
    if config.num_workers == 1 or config.schedule == "shared":
        return False
    plain = config.mode == "dbow" and not config.dbow_words
    return plain and not config.shared_negatives and (config.schedule == "blocks" or config.cache_rows is None)


def _segments(config: TrainConfig) -> int:
    if config.segments is None:  # the default depends on the corpus: resolve sets it
        raise ValueError("segments is not settled for the corpus yet (settings.resolve)")
    return config.segments


def default_segments(config: TrainConfig, corpus: Any) -> int:
    """--segments where not given: TEXT_SEGMENTS on text; on other corpora EVENT_SEGMENTS where CPU workers
    on the block schedule would each still hold ROUND_TOKENS tokens of the corpus a round (its tokens over
    workers² × segments), else 1 (a small corpus's rounds are a fixed cost it cannot pay; GPU workers compute
    a round's tokens too fast, unmeasured)."""
    if is_text(corpus):
        return TEXT_SEGMENTS
    workers = config.num_workers
    if blocks(config) and not config.gpus_per_worker and \
            getattr(corpus, "num_tokens", 0) >= ROUND_TOKENS * workers * workers * EVENT_SEGMENTS:
        return EVENT_SEGMENTS
    return 1


def rounds(config: TrainConfig) -> int:
    """Rounds in an epoch: on the block schedule, a rotation of the blocks (one per worker) for each
    segment of the workers' documents; else one."""
    return config.num_workers * _segments(config) if blocks(config) else 1


def plan(config: TrainConfig) -> str:
    """How the corpus is divided among the workers (units.plan_units): "interleaved" where several
    workers walk it in segments on the block schedule (piece W·s + i is worker i's segment s), else
    "runs" (each worker its own run of it). A checkpoint's data positions hold only under its plan."""
    return "interleaved" if blocks(config) and _segments(config) > 1 else "runs"


def resident_rows(config: TrainConfig, words_out_rows: int) -> int:
    """Rows of words_out each worker keeps resident: --cache-rows, or by default, with one worker
    (nothing else writes them, so they are never stale), every row within RESIDENT_AUTO_BYTES;
    on the block schedule, the block it holds (its largest)."""
    if config.cache_rows is not None:
        return min(config.cache_rows, words_out_rows)
    if blocks(config):
        return -(-words_out_rows // config.num_workers)
    if config.num_workers > 1:
        return 0
    row_bytes = 4 * config.table("words_out", words_out_rows).width
    return min(words_out_rows, RESIDENT_AUTO_BYTES // row_bytes)


def token_path(config: TrainConfig, words_out_rows: int) -> bool:
    """Whether a worker trains straight from the tokens, its examples drawn where the kernel runs
    (cpu_kernel.train_tokens for plain PV-DBOW, device_examples for the batched kernel in every
    mode): one worker (nothing else writes the URL rows), every URL row resident in it (words_out,
    and words where trained), and each example's own negatives. Shared negatives keep the host's
    examples: drawn for a device group's micro-batches (1,024 examples) they fell below popularity
    on the sample's MRR (0.279 against 0.291)."""
    plain = config.mode == "dbow" and not config.dbow_words
    if blocks(config):  # each worker the sole writer of the block it holds (schedule.py)
        return True
    return ((plain or not exact_kernel(config)) and config.num_workers == 1 and not config.shared_negatives
            and resident_rows(config, words_out_rows) == words_out_rows)


def resident_tables(config: TrainConfig, words_out_rows: int) -> dict[str, int]:
    """Rows of each URL table a worker keeps resident: words_out's (resident_rows), and on the
    token path, where words are trained, every words row too."""
    rows = resident_rows(config, words_out_rows)
    if token_path(config, words_out_rows) and config.trains_words():
        return {"words_out": rows, "words": rows}
    return {"words_out": rows}


def document_partitions(config: TrainConfig, num_docs: int, words_out_rows: int, share: int | None = None,
                        free_bytes: int | None = None) -> int:
    """How a worker keeps its share of the documents' rows (`share` rows; None: num_docs / workers)
    on the token path (the block schedule, or one worker holding every URL row), where no one else
    writes them: 1, resident for the run (pulled once, written back at checkpoints and at the end);
    P > 1, cut into P partitions that each fit, held one at a time and swapped where the worker's
    walk of its documents passes from one to the next; 0, pulled and pushed with each macro-batch.

    They fit --device-memory where it is given. Otherwise a GPU worker's fit `free_bytes` (what its
    device has free for them, which the worker measures; unknown, as to the driver: they fit), and
    a CPU worker's RESIDENT_AUTO_BYTES of its host's memory, beyond which they stream as before."""
    if not token_path(config, words_out_rows) or not config.resident_docs:
        return 0
    share = -(-num_docs // config.num_workers) if share is None else share
    need = share * 4 * config.table("docs", num_docs).width
    if config.device_memory is not None:
        room = int(config.device_memory * 2**30)
    elif config.gpus_per_worker > 0:
        room = need if free_bytes is None else free_bytes
    elif need > RESIDENT_AUTO_BYTES:
        return 0
    else:
        return 1
    return int(min(max(share, 1), max(1, -(-need // max(room, 1)))))


def resident_documents(config: TrainConfig, num_docs: int, words_out_rows: int) -> int:
    """Rows of docs each worker holds resident at once (document_partitions): its share of the
    documents, or of one partition of them; none where each macro-batch pulls and pushes its own."""
    partitions = document_partitions(config, num_docs, words_out_rows)
    share = -(-num_docs // config.num_workers)
    return -(-share // partitions) if partitions else 0


def half_on_device(config: TrainConfig, words_out_rows: int, staged: bool | None = None) -> bool:
    """Whether device workers keep their resident URL rows in the tables' 16-bit dtype (kernels.py):
    on the device (staged) path, where the token path holds every URL row there. staged: whether
    workers run that path (None: where they have a GPU)."""
    staged = config.gpus_per_worker > 0 if staged is None else staged
    return bool(staged and config.dtype != "float32" and config.device_rows == "dtype" and not exact_kernel(config)
                and token_path(config, words_out_rows))


def staged_on_cpu() -> bool:
    return os.environ.get(STAGED_ENV) == "1"


def macro_batch_for(macro_batch: int | None, tokens_per_epoch: int, sole_writer: bool = False,
                    on_device: bool = False) -> int:
    """A worker's macro-batch: `macro_batch` tokens (None: SOLE_WRITER_MACRO_BATCH for a sole writer,
    DEVICE_MACRO_BATCH if its examples are drawn on its device, else SHARED_MACRO_BATCH), and, where
    workers share rows, at least ROUNDS_PER_EPOCH pull/push rounds.

    Where rows are shared, on a small corpus one huge macro-batch would leave every worker training on
    a copy of words_out that is an epoch old (Lee corpus: -0.02 Pearson). A sole writer (one worker
    holding every words_out row resident, and its documents' rows its own) trains nothing another
    writes, so its rounds only cost calls, and fewer, larger rounds train faster (the push of a batch's
    document rows is a fixed cost per round); Lee trains an epoch in one round. With the examples drawn
    on the device the host only moves the documents' rows, and the rounds' fixed costs are most of its
    work, so its rounds are larger still (the figures: docs/benchmarks.md).
    """
    if sole_writer:
        return int(macro_batch or (DEVICE_MACRO_BATCH if on_device else SOLE_WRITER_MACRO_BATCH))
    macro_batch = macro_batch or SHARED_MACRO_BATCH
    return int(min(macro_batch, max(MIN_MACRO_BATCH, tokens_per_epoch // ROUNDS_PER_EPOCH)))


@dataclass(frozen=True)
class RunSettings:
    """What a run of `config` on a corpus (and a cluster) trains with, decided once (resolve)."""

    config: TrainConfig       # the run's config: its --segments settled, and as placed (resident_docs)
    words_out_rows: int       # the corpus's URLs: the rows of words_out (and of words where trained)
    segments: int             # --segments, settled: default_segments unless given
    blocks: bool              # the block schedule: several workers take turns at blocks of the URL rows
    rounds: int               # rounds in an epoch: a rotation of the blocks for each segment, else 1
    plan: str                 # how the corpus is divided among the workers: "interleaved" or "runs"
    token_path: bool          # workers train straight from the tokens, their examples drawn where the kernel runs
    resident_rows: int        # rows of words_out each worker keeps resident
    resident_tables: dict     # rows each URL table keeps resident in a worker, by name
    macro_batch: int          # tokens a worker reads per macro-batch, with an even share of the corpus
    handover: bool            # on the block schedule, a held block goes to its next holder (not through the servers)
    kernel: str               # "exact" (cpu_kernel), "batched" (kernels) or "fused" (triton_kernel)
    staged: bool | None       # workers run the device path (None: where they have a GPU; STAGED_ENV: on the CPU too)
    warnings: tuple[str, ...] = ()  # settings measured to lose quality, and other ways the run is not what was meant
    segments_from: str = "given"  # whence the segments: "given", "checkpoint" (a resumed run's), or the default
                                  # of "text" or of "events" (default_segments)

    @property
    def exact(self) -> bool:
        return self.kernel == "exact"

    def worker_macro_batch(self, tokens_per_epoch: int) -> int:
        """The macro-batch of a worker whose units hold `tokens_per_epoch` tokens (macro_batch_for)."""
        return macro_batch_for(self.config.macro_batch, tokens_per_epoch, sole_writer=self.token_path,
                               on_device=not self.exact)

    def half_on_device(self, staged: bool | None = None) -> bool:
        """Whether device workers keep their resident URL rows in the tables' 16-bit dtype (half_on_device)."""
        return half_on_device(self.config, self.words_out_rows, self.staged if staged is None else staged)

    def writes_back_at_end_of(self, epoch: int) -> bool:
        """Whether a worker writes the rows it keeps resident across epochs (its documents' on the token path;
        one worker's URL rows) back to the servers at the end of `epoch`: at the run's last, and with
        --checkpoint-every 0 at every one, so that a worker restarted from an epoch's start finds them
        there. Otherwise they stay in the worker into the next epoch, and the checkpoint the driver takes
        at each epoch's end fetches them (Worker.pause): moved once an epoch either way, on the
        checkpoint's clock rather than the epoch's."""
        return epoch >= self.config.epochs - 1 or self.config.checkpoint_every <= 0

    def placed(self, config: TrainConfig) -> RunSettings:
        """These settings with the config the placement chose (its workers' documents not resident)."""
        return dataclasses.replace(self, config=config)

    def to_json(self) -> dict:
        """What a checkpoint's manifest records of them (checkpoint.commit_training: "settings")."""
        return {"segments": self.segments, "blocks": self.blocks, "rounds": self.rounds, "plan": self.plan,
                "token_path": self.token_path, "resident_rows": self.resident_rows,
                "resident_tables": dict(self.resident_tables), "macro_batch": self.macro_batch,
                "handover": self.handover, "kernel": self.kernel, "resident_docs": self.config.resident_docs}

    def _segments_why(self) -> str:
        """Where the engine line's segments came from: a flag, a checkpoint, or the default for this corpus."""
        return {"given": "--segments", "checkpoint": "--segments, the checkpoint's",
                "text": "--segments' default on text",
                "events": f"--segments' default where each worker's round holds {ROUND_TOKENS:,} tokens or more"
                }[self.segments_from]

    def engine_line(self) -> str:
        """How the run trains, in one line: workers and threads, kernel, resident rows of words_out (and of
        words, which the token path holds too where they are trained), and their type where a device
        worker keeps them in the tables' 16 bits."""
        config, rows, resident = self.config, self.words_out_rows, self.resident_rows
        kernel = ("exact (each update applied at once, gensim's order"
                  + ("; examples drawn in the kernel)" if self.token_path else ")")
                  if self.exact else f"{self.kernel} (micro-batches of up to {config.micro_batch:,} examples, fewer "
                  "where a macro-batch holds few documents: about one example of each in one"
                  + ("; examples drawn on its device)" if self.token_path else ")"))
        where = (f"all {rows:,} rows" if resident == rows else
                 f"a block of ~{resident:,} rows, one of {config.num_workers} that rotate over the workers "
                 + ("each epoch" if self.segments == 1 else f"{self.segments} times an epoch ({self._segments_why()})")
                 if self.blocks else f"the {resident:,} hottest rows" if resident else "none")
        return (f"engine: {config.num_workers} worker(s) x {config.cpus_per_worker} CPU(s)"
                + (f" + {config.gpus_per_worker:g} GPU(s)" if config.gpus_per_worker else "")
                + f", {config.num_ps} parameter server(s); kernel {kernel}; words_out resident in each worker: {where}"
                + (f", kept in {config.dtype} on its device" if self.half_on_device() else "")
                + ("; words too" if "words" in self.resident_tables else ""))


def resolve(config: TrainConfig, corpus: Any, cluster: dict[str, float] | None = None,
            saved: dict | None = None) -> RunSettings:
    """The settings of a run of `config` on `corpus` (a corpus.Corpus, or anything with its sizes and
    meta), decided once. cluster: the resources the run will have (a local Ray's, known before starting
    it: placement.local_resources): a run that cannot fit them is refused here in one line, and one that
    fits only without its workers' resident documents runs without them, saying so; None: placed later,
    on the cluster joined (trainer.check_fit). saved: a checkpoint's resolved settings (to_json), which a
    resumed run walks the corpus with where the config does not say otherwise."""
    if config.kernel == "fused":
        from .triton_kernel import MISSING, available

        if not available():
            raise UserError(f"bad training config: {MISSING}")
    asked, ran = config.segments, (saved or {}).get("segments")
    # a resumed config carries its checkpoint's segments (trainer.resumed_config): those are the checkpoint's too
    segments_from = ("checkpoint" if ran and asked in (None, ran) else "given" if asked is not None
                     else "text" if is_text(corpus) else "events")
    if config.segments is None:
        config = dataclasses.replace(config, segments=int(ran or default_segments(config, corpus)))
    if cluster is not None:
        config = _fit(config, corpus, cluster)
    rows = corpus.vocab_size
    sole_writer = token_path(config, rows)
    exact = exact_kernel(config)
    settings = RunSettings(
        config=config, words_out_rows=rows, segments=config.segments, blocks=blocks(config), rounds=rounds(config),
        plan=plan(config), token_path=sole_writer, resident_rows=resident_rows(config, rows),
        resident_tables=resident_tables(config, rows),
        macro_batch=macro_batch_for(config.macro_batch, corpus.num_tokens // config.num_workers,
                                    sole_writer=sole_writer, on_device=not exact),
        handover=os.environ.get(HANDOVER_ENV) != "0",
        kernel="exact" if exact else "fused" if config.kernel == "fused" else "batched",
        staged=staged_on_cpu() or None, segments_from=segments_from)
    given = asked if segments_from == "given" else None  # not a checkpoint's own
    return dataclasses.replace(settings, warnings=tuple(_warnings(settings, corpus, given)))


def _fit(config: TrainConfig, corpus: Any, resources: dict[str, float]) -> TrainConfig:
    """The config placed on `resources`: as it is where it fits, without its workers' resident documents
    where only that makes it fit; else refused with the first reason, naming the flag to change."""
    from .placement import fit_problems, resident_documents_line, without_resident_documents
    from .ps import table_specs

    tables = table_specs(config, corpus)
    problems = fit_problems(config, tables, resources)
    if not problems:
        return config
    lighter = without_resident_documents(config, tables, resources)
    if lighter is None:
        raise UserError(problems[0])
    log.info(resident_documents_line(config, tables, resources))
    return lighter


# Settings measured to lose quality (200k users x 100k URLs, PV-DBOW, dim 100, 5 epochs, sample 0,
# recall@10 on held-out URLs; gensim 0.1625-0.1638; docs/benchmarks.md, "Stale rows and shared negatives"):
# - A worker trains rows of words_out as the other workers left them at its pull: as stale as the
#   tokens they train meanwhile, (workers - 1) x macro-batch. Held at 150k and below with 2 workers
#   (0.165); 4 workers: 0.1667 at 16k-token macro-batches (49k stale), 0.1596 at 32k (98k), 0.1505
#   at 65k (196k), 0.1446 at 75k (225k); 0.1613 at 65k with the 20,000 hottest rows resident.
# - A shared negative row takes the summed update of micro_batch x negative / shared_negatives
#   examples at once: 0.164 at 320 (1,024 x 5 / 16); 0.106 at 2,560 (8,192 x 5 / 16), below the
#   popularity baseline (0.127). Row-wise adagrad held up there (0.160).
STALE_TOKENS = 163840
SHARED_ROW_UPDATES = 640

# what --segments measured on text (benchmarks/quality.py, the engine, and benchmarks/schedule_lee.py, its
# in-process copy; docs/benchmarks.md, "Segments interleaved"): TEXT_SEGMENTS, --segments' default there
SEGMENTS_MEASURED = ("at --segments 16 Lee, test first / background first, against one worker: 2 workers "
                     "-0.001 / -0.004 Pearson over 16 seeds, 4 workers -0.001 / +0.003 over 3, 8 workers -0.005 / -0.002 "
                     "over 12 / 9 (the in-process copy over 24: -0.003 / -0.003 at 8); mini_newsgroup -0.002, 0.000, -0.002 "
                     "accuracy with 2, 4, 8 workers; 2 workers trained "
                     "Lee 8 times slower than one, its rounds a fixed cost on so small a corpus")


# what short documents measured at 4 and 8 workers (benchmarks/quality.py, docs/benchmarks.md, "The shortest
# summaries reproduce it"); at 6.6 tokens a document and more (pypi15k, pypi) every count held one worker's figure
SHORT_DOC_TOKENS = 6.0
SHORT_DOCS_MEASURED = ("the PyPI summaries of 3.5 tokens, PV-DBOW at the defaults, 3 seeds: 4 workers -0.0032 and 8 "
                       "workers -0.0038 recall@10 against one worker (gensim at its best: -0.0033), 2 workers -0.0006; "
                       "at --negative 10 4 and 8 workers were level with one worker; --segments 4 took 4 workers to "
                       "-0.0013 at a third of the speed, 8 workers to -0.0043; --num-workers 2 held it)")


def quality_warnings(settings: RunSettings, corpus: Any) -> list[str]:
    """Warnings for settings measured to lose quality, each naming the flags to change."""
    found = []
    config = settings.config
    if settings.blocks and is_text(corpus):
        if settings.segments < TEXT_SEGMENTS:
            found.append(f"{config.num_workers} workers on the block schedule were measured to lose quality on text "
                         f"corpora with --segments {settings.segments} (Lee at --segments 1: -0.018 and -0.020 Pearson "
                         "with 2 workers, -0.014 to -0.038 with 2 to 8, 3 seeds; in the in-process copy over 24 "
                         "seeds, -0.010 / -0.019 at --segments 2, -0.007 with 4 workers at 4 and -0.005 at 8): a "
                         "document meets its words one block a round, and the rounds lie far apart; use "
                         f"--segments {TEXT_SEGMENTS}, the default on text ({SEGMENTS_MEASURED})")
        elif config.num_workers >= 8:
            found.append(f"{config.num_workers} workers on the block schedule were measured at the edge of one "
                         f"worker's quality on text corpora ({SEGMENTS_MEASURED}); 4 workers held it")
    docs = getattr(corpus, "num_docs", 0)
    if settings.blocks and not is_text(corpus) and config.num_workers >= 4 and docs and \
            corpus.num_tokens / docs < SHORT_DOC_TOKENS:
        found.append(f"{config.num_workers} workers on the block schedule were measured below one worker's held-out "
                     f"recall on short documents (these: {corpus.num_tokens / docs:.1f} tokens a document; "
                     f"{SHORT_DOCS_MEASURED}")
    if config.num_workers > 1 and config.dbow_words:
        found.append(f"{config.num_workers} workers with --dbow-words share the URL rows (the block schedule trains plain "
                     "PV-DBOW only): measured on Lee with 2 workers, quality held (Pearson 0.4477 against one worker's "
                     "0.4472, 3 seeds) but the speed barely grew (+14% tokens/s); one worker on all "
                     "the machine's CPUs is as good")
    macro = settings.macro_batch
    stale = 0 if settings.blocks else (config.num_workers - 1) * macro  # on the block schedule nothing is stale
    if stale > STALE_TOKENS:
        found.append(f"{config.num_workers} workers x {macro:,}-token macro-batches: each worker trains rows "
                     f"up to {stale:,} tokens stale, and recall was measured to drop above {STALE_TOKENS:,} "
                     f"(4 workers: 0.167 at 16k-token macro-batches, 0.151 at 65k); lower --macro-batch to "
                     f"{STALE_TOKENS // (config.num_workers - 1):,} or fewer"
                     + ("" if settings.resident_rows else ", or keep the hottest rows in the workers with --cache-rows "
                        "(0.161 at 65k with --cache-rows 20000)"))
    if config.shared_negatives and config.optimizer == "sgd":
        updates = config.micro_batch * config.negative / config.shared_negatives
        if updates > SHARED_ROW_UPDATES:
            found.append(f"--shared-negatives {config.shared_negatives} with --micro-batch {config.micro_batch:,}: "
                         f"each shared row takes up to {updates:,.0f} summed updates at once, and training was "
                         f"measured to collapse at 2,560 (recall below the popularity baseline); keep "
                         f"micro_batch x negative / shared_negatives <= {SHARED_ROW_UPDATES}, or use own negatives "
                         f"(--shared-negatives 0) or --optimizer adagrad")
    return found


def _warnings(settings: RunSettings, corpus: Any, segments_given: int | None = None) -> list[str]:
    """Every warning a run of `settings` gives before it starts: quality_warnings, the fused kernel on CPU
    workers, and block-schedule settings a run without the block schedule ignores (--segments where given, not
    where it is the corpus's default or a resumed run's checkpoint's)."""
    found = quality_warnings(settings, corpus)
    config = settings.config
    if not settings.blocks:
        why = ("this run trains with one worker" if config.num_workers == 1 else
               "this run shares the URL rows among its workers (PV-DM, --dbow-words, --shared-negatives, "
               "--cache-rows or --schedule shared)")
        if config.schedule == "blocks":
            found.append(f"--schedule blocks does nothing here: {why}, so no worker takes turns at blocks")
        if segments_given is not None and segments_given > 1:
            found.append(f"--segments {segments_given} does nothing here: segments cut the corpus among "
                         f"several workers on the block schedule, and {why}")
    # settings of the batched kernel and the 16-bit tables that this run's path never reads: said, not taken silently
    if config.micro_batch != TrainConfig.micro_batch and settings.exact:
        found.append(f"--micro-batch {config.micro_batch:,} does nothing here: the exact kernel applies each update "
                     "at once (the batched kernel's micro-batches: --kernel batched, or GPU workers)")
    if config.rounding != TrainConfig.rounding and config.dtype == "float32":
        found.append(f"--rounding {config.rounding} does nothing with --dtype float32: no row is narrowed to 16 bits")
    if config.device_rows != TrainConfig.device_rows and not settings.half_on_device():
        found.append(f"--device-rows {config.device_rows} does nothing here: it keeps a GPU worker's resident URL "
                     "rows in the tables' 16-bit --dtype, on the batched kernel's token path, and this run "
                     + ("keeps float32 tables" if config.dtype == "float32" else "has no such worker"))
    if settings.kernel == "fused" and not settings.config.gpus_per_worker:
        found.append("--kernel fused on CPU workers runs Triton's interpreter, a stand-in for tests far slower than "
                     "--kernel exact: give the workers GPUs (--gpus-per-worker 1) or use --kernel auto")
    return found
