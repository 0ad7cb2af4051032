"""Typed configuration: every field carries its default, one line of help and its checks, and the
tables a training config makes (TableSpec: their rows, and the width of a row).

Changes when a setting is added, or its default, help or check changes.

The command line and the YAML files use the same names (`--min-alpha` on the command line is
`min_alpha` in YAML). The command line builds its flags from these dataclasses, so a field added
here is a flag and a YAML key at once. Precedence: defaults < YAML file < flags.
"""

from __future__ import annotations

import dataclasses
import difflib
import numbers
import os
import re
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import UserError


def _f(default: Any, help: str, choices: tuple | None = None, flag: bool = True, engine: bool = False,
       aliases: tuple[str, ...] = ()):
    """A dataclass field with its help text (and allowed values) kept as metadata.

    The command line appends each flag's default to its help (cli._help), so a help text names its
    default only where that is None and being unset means something worth saying. engine: an option of
    our Ray engine alone, which gensim has no use for: `baseline` has no flag for it and ignores it in a
    YAML file shared with `train`. aliases: other names of the same setting (gensim's), taken as flags
    and YAML keys alike.
    """
    return field(default=default, metadata={"help": help, "choices": choices, "flag": flag, "engine": engine,
                                            "aliases": aliases})


@dataclass
class PrepareConfig:
    """How raw events become a corpus (see corpus.prepare)."""

    format: str = _f("events", "input format: events rows, one list per document, or plain text lines",
                     ("events", "lists", "text"))
    doc_col: str = _f("user_id", "column holding the document key (the user)")
    token_col: str = _f("url", "column holding the token (the URL), or the list of tokens with --format lists")
    time_col: str | None = _f(None, "column to order each user's events by (default: none; the order they are read in)")
    time_unit: str | None = _f(None, "unit of a numeric time column, epoch seconds to nanoseconds (default: each "
                                     "file's by the size of its numbers, e.g. 1.7e12 is milliseconds)",
                               ("s", "ms", "us", "ns"))
    delimiter: str | None = _f(None, "field separator of CSV input, e.g. ';' ('\\t' for a tab) (default: ',' for "
                                     ".csv, a tab for .tsv)")
    no_normalize: bool = _f(False, "take the token column's URLs as written; by default absolute http(s) URLs are "
                                   "normalised so that one page is one token: scheme and host lower-cased, default "
                                   "port, fragment and trailing slash dropped, unreserved %%-escapes decoded, query "
                                   "kept less --drop-params (docs/commands.md); never text; with --base, the base's "
                                   "rule")
    drop_query: bool = _f(False, "drop each URL's query string whole (default: kept, less --drop-params)")
    drop_params: str | None = _f(None, "query parameters dropped from URLs: names, comma-separated, with * and ? "
                                       "globs; '' drops none (default: utm_*; with --base, the base's)")
    merge_www: bool = _f(False, "merge a host with its www. form (www.a.com is a.com); off by default, as the two "
                                "may be different sites")
    min_count: int = _f(1, "drop tokens seen fewer times than this")
    max_vocab: int | None = _f(None, "keep at most this many most frequent tokens (default: no limit)")
    holdout: float = _f(0.0, "fraction of each user's distinct URLs hidden for evaluation")
    holdout_out: str | None = _f(None, "Parquet file that receives the hidden (key, token) pairs")
    base: str | None = _f(None, "an earlier corpus or model: its users and URLs keep their ids, new ones come "
                                "after, new events join each user's document (daily refresh)")
    window_days: float | None = _f(None, "documents are the events of the last N days before the latest one "
                                         "(needs --time-col; with --base, instead of joining)")
    expire_days: float | None = _f(None, "in a refresh (prepare --base, jobs/refresh.py): users with no event in "
                                         "the last N days (by the data's own time: the latest event of the inputs "
                                         "and base) leave the new corpus and model, and URLs that no user left "
                                         "visits leave with them; needs event times (default: no one expires)")
    max_tokens_per_doc: int | None = _f(None, "a document keeps its most recent N events (by time, else the last N "
                                              "read), the rest counted as skipped: caps a bot's or crawler's weight "
                                              "(default: no cap, every document whole)")
    num_shards: int | None = _f(None, "shard files to write (default: enough that one shard's documents are built "
                                      "within --memory-budget-bytes)")
    memory_budget_bytes: int = _f(1 << 30, "memory one bucket of events may take while its documents are built: "
                                           "more, smaller shards when less; each Ray task of --parallel reserves "
                                           "about this much")
    parallel: int | None = _f(None, "processes that run prepare's passes: N > 1 runs them as Ray tasks, N at a "
                                    "time, on a local Ray started here or on the cluster at --address or "
                                    "RAY_ADDRESS; 0: one per CPU of that cluster, or this process alone where the "
                                    "input is too small for tasks to pay (under 96 MiB); the corpus is the same "
                                    "(default: "
                                    "1, this process alone; jobs/train.py and jobs/refresh.py on a cluster: 0)")
    engine: str = _f("tasks", "what runs --parallel's pass 2 (map and bucket): Ray tasks, or Ray Data (read_parquet/"
                              "read_csv and map_batches; Parquet and uncompressed CSV, other inputs run as tasks); the "
                              "corpus is the same", ("tasks", "data"))
    seed: int = _f(1, "seed of the held-out split", flag=False)  # prepare's --seed, a job's seed
    address: str | None = _f(None, "Ray address for --parallel (default: RAY_ADDRESS, else a local Ray started "
                                   "here)", flag=False)  # prepare's --address, a job's address

    def __post_init__(self) -> None:
        _check_types(self)
        _check_choices(self)


# bytes of one value of a table's vectors, by --dtype (precision.py holds the conversions; config.py
# imports nothing of ours but errors)
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}



@dataclass(frozen=True)
class TableSpec:
    """One table a run trains, as the parameter servers hold it, sizing counts it and workers lay out
    its rows: `rows` global rows of `dim` floats, then `state` optimiser columns (row-wise Adagrad's
    accumulator: TrainConfig.table). init: "uniform" is gensim 4's initialisation of input vectors,
    U[-1, 1) / dim; "zeros" its initialisation of the output weights (syn1neg).

    It lives here, not in ps.py: TrainConfig makes them (TrainConfig.table) and sizes resident rows by
    their width, and ps.py imports checkpoint, which imports this module, so config.py taking
    it from ps.py would be an import cycle. config.py imports nothing of ours but errors: placement,
    plan, worker and the trainer take a TableSpec from here without pulling in a server's imports.
    """

    name: str
    rows: int
    dim: int
    state: int = 0
    init: str = "uniform"
    dtype: str = "float32"

    @property
    def width(self) -> int:
        """Floats a row takes in a worker's matrices (float32, whatever the dtype): the vector and its state."""
        return self.dim + self.state

    @property
    def row_bytes(self) -> int:
        """Bytes of a row in a server's table, a pull and a push: the vector in the table's dtype
        (precision.py), its optimiser state float32."""
        return self.dim * DTYPE_BYTES[self.dtype] + 4 * self.state

    def to_json(self) -> dict:
        """What a plan's JSON lists under the table's name (a dtype other than float32 too)."""
        listed = {"rows": self.rows, "dim": self.dim, "init": self.init, "state": self.state}
        return listed if self.dtype == "float32" else {**listed, "dtype": self.dtype}

    @classmethod
    def from_json(cls, name: str, data: dict) -> TableSpec:
        return cls(name, data["rows"], data["dim"], state=data.get("state", 0), init=data.get("init", "uniform"),
                   dtype=data.get("dtype", "float32"))


@dataclass
class TrainConfig:
    """The model and the engine that trains it."""

    dim: int = _f(100, "vector size", aliases=("vector_size",))
    epochs: int = _f(10, "passes over the corpus")
    mode: str = _f("dbow", "training mode: PV-DBOW or PV-DM", ("dbow", "dm"))
    dbow_words: bool = _f(False, "also train word vectors with skip-gram (PV-DBOW only)")
    window: int = _f(5, "skip-gram / PV-DM context window")
    negative: int = _f(5, "negative samples per positive pair")
    sample: float = _f(1e-3, "frequent-token subsampling threshold (0 disables), gensim's definition")
    alpha: float = _f(0.025, "initial learning rate")
    min_alpha: float = _f(0.0001, "final learning rate; linear decay over all planned tokens")
    ns_exponent: float = _f(0.75, "exponent of the unigram distribution negatives are drawn from")
    shared_negatives: int = _f(0, "share this many negatives among all examples of a micro-batch, scored as "
                                  "one matrix product (for GPU workers; 0: each example draws its own)", engine=True)
    dtype: str = _f("float32", "type the parameter servers hold the tables' vectors in, that pulls, pushes and "
                               "checkpoints carry: 16-bit types halve their bytes; the math stays float32 and "
                               "Adagrad's accumulator float32", tuple(DTYPE_BYTES), engine=True)
    rounding: str = _f("stochastic", "how a 16-bit --dtype rounds updated rows: stochastic (seeded, so that an update "
                                     "below half a unit in the last place still lands on average) or to nearest",
                       ("stochastic", "nearest"), engine=True)
    device_rows: str = _f("float32", "type a GPU worker keeps its resident URL rows in where it holds them all (the "
                                     "token path): float32, or dtype, the tables' --dtype, which halves the device "
                                     "memory they take (for a --cache-rows beyond the default 2 GiB) at about half "
                                     "the speed on a GPU, each micro-batch's update rounded as --rounding says",
                          ("float32", "dtype"), engine=True)
    optimizer: str = _f("sgd", "sgd (gensim's update) or row-wise adagrad", ("sgd", "adagrad"), engine=True)
    num_ps: int = _f(2, "parameter-server actors; row r lives on server r %% num_ps", engine=True)
    num_workers: int = _f(1, "training worker actors (one per machine: a worker uses all its CPUs' threads)",
                          engine=True)
    force_workers: bool = _f(False, "train with --num-workers as given, even where plan's model predicts fewer "
                                    "workers to train faster (a small corpus, whose rounds' Ray calls cost more than "
                                    "a worker more computes); without it train takes the faster count and says so "
                                    "in one line", engine=True)
    cpus_per_worker: int = _f(2, "CPUs each worker reserves, and the threads it trains with", engine=True)
    gpus_per_worker: float = _f(0, "GPUs each worker reserves; > 0 runs the math on CUDA", engine=True)
    schedule: str = _f("auto", "how several workers share the URL rows: blocks: each holds its own block of them "
                               "per round and the blocks rotate, so no row is trained by two workers at once "
                               "(PV-DBOW); shared: every worker trains every row from copies it pulls, summing "
                               "their updates (any mode; costs quality as workers are added); auto: blocks where "
                               "the mode allows", ("auto", "blocks", "shared"), engine=True)
    segments: int | None = _f(None, "on the block schedule, the corpus is cut in order into workers x this many "
                                    "pieces, worker i's segment s being piece workers x s + i, each trained through "
                                    "a whole rotation of the blocks: the workers walk the corpus together as one "
                                    "worker would, a document's rounds follow one another instead of spreading over "
                                    "the epoch, and the blocks move once per segment (default: 16 on text corpora, "
                                    "where Lee measured it to keep one worker's quality; else 4 where each CPU "
                                    "worker's round still holds 250,000 tokens or more, which kept the long tail "
                                    "of URLs better, and 1 on smaller corpora and GPU workers, which moves the "
                                    "blocks least)", engine=True)
    cache_rows: int | None = _f(None, "hottest words_out rows kept resident in each worker (on its GPU, if any) "
                                      "between macro-batches: neither pulled nor pushed every step; synced every "
                                      "few batches (default: every row that fits 2 GiB with one worker, none with "
                                      "several)", engine=True)
    macro_batch: int | None = _f(None, "tokens read per pull/compute/push cycle of a worker (default: 262,144 "
                                       "for one worker with every words_out row resident, 1,048,576 if its "
                                       "examples are drawn on its device, else 65,536)",
                                 engine=True)
    micro_batch: int = _f(1024, "(doc, word) pairs per in-cache update step inside a macro-batch (batched "
                                "kernel)", engine=True)
    kernel: str = _f("auto", "exact: each example's update applied before the next, gensim's order, compiled "
                             "(CPU workers); batched: micro-batches of summed updates in torch (GPU workers, "
                             "shared negatives); fused: the batched kernel's micro-batch as two Triton launches "
                             "(GPU workers, PV-DBOW with float32 device rows; needs triton); auto: exact on CPU "
                             "workers, batched on GPU workers",
                     ("auto", "exact", "batched", "fused"), engine=True)
    max_inflight_pushes: int = _f(2, "pushes a worker may have outstanding before it waits", engine=True)
    checkpoint_every: float = _f(600, "seconds between checkpoints, taken mid-epoch, plus one at each epoch end "
                                      "(0: only at the end of training)", engine=True)
    keep_checkpoints: int = _f(2, "checkpoint versions kept on disk", engine=True)
    max_restarts: int = _f(3, "times Ray restarts a crashed parameter server or worker before the run stops",
                           engine=True)
    seed: int = _f(1, "random seed for initialisation, subsampling and negatives")
    first_epoch: str = _f("all", "changed: the first epoch trains only the users a refresh made new or gave new "
                                 "events (prepare --base's changed.arrow), the others keep their vectors through "
                                 "it; all: every user", ("all", "changed"), engine=True)
    resume: bool = _f(False, "continue from the model directory's LATEST checkpoint, verified first; if it is "
                             "damaged, from the newest intact one, saying so", engine=True)
    resume_from: str | None = _f(None, "continue from this checkpoint version of the model directory (e.g. v9; "
                                       "implies --resume), verified first", engine=True)
    init_from: str | None = _f(None, "an earlier model: every table starts from its rows for the users and URLs it "
                                     "knows (a corpus from prepare --base keeps their ids), new rows fresh; the "
                                     "run has its own learning-rate schedule and never changes that model",
                               engine=True)
    address: str | None = _f(None, "Ray address (default: RAY_ADDRESS, else a local Ray started here)", engine=True)
    wait_for_resources: float = _f(600, "seconds to wait for the autoscaler to add the nodes a run needs before it is "
                                        "refused (0: refuse at once); a cluster that cannot grow is refused at once",
                                   engine=True)
    device_memory: float | None = _f(None, "GiB a worker may keep its documents' rows in across epochs (a GPU worker "
                                           "on its device): where its share of them needs more, they are cut "
                                           "into partitions that fit, each held in turn and swapped as the worker "
                                           "passes from one to the next (default: on a GPU worker three quarters "
                                           "of its share of its device's free memory at its start, less its URL "
                                           "rows; on a CPU "
                                           "worker 2 GiB, beyond which each macro-batch pulls and pushes its "
                                           "documents' rows)", engine=True)
    progress: bool = _f(True, "show a progress bar", flag=False)
    resident_docs: bool = _f(True, "on the token path (the block schedule, or one worker holding every URL row), each "
                                   "worker keeps its documents' rows for the run; the trainer turns it off where "
                                   "only that makes the run fit the cluster's memory",
                             flag=False, engine=True)

    def __post_init__(self) -> None:
        """Refuse a config no run could train, at construction: a library caller building one gets
        the same one-line errors as the command line and YAML."""
        self.validate()

    def resume_version(self) -> int | None:
        """The version --resume-from names, as a number (None: LATEST, or the newest intact version)."""
        return None if self.resume_from is None else int(self.resume_from.lstrip("v"))

    def table(self, name: str, rows: int, init: str = "uniform") -> TableSpec:
        """A table of this run: `rows` rows of dim floats, and row-wise Adagrad's accumulator column."""
        return TableSpec(name, rows, self.dim, state=int(self.optimizer == "adagrad"), init=init, dtype=self.dtype)

    def trains_words(self) -> bool:
        """Whether the `words` table (input vectors of URLs) is trained: PV-DM, and dbow_words."""
        return self.mode == "dm" or self.dbow_words

    def _check_fused(self) -> None:
        """--kernel fused (triton_kernel.py) trains what its kernels do: one input row an example, each
        its own negatives, float32 rows on the device. Whether triton is there is the run's to find
        (settings.resolve): a declaration is valid on a machine without it."""
        unsupported = ("--mode dm (several input rows an example)" if self.mode == "dm"
                       else "--shared-negatives" if self.shared_negatives
                       else f"--device-rows dtype with --dtype {self.dtype} (16-bit device rows)"
                       if self.dtype != "float32" and self.device_rows == "dtype" else "")
        if unsupported:
            raise UserError(f"bad training config: --kernel fused does not train {unsupported}: use --kernel batched")

    def validate(self) -> TrainConfig:
        """Check every field, and the fields against each other: what __post_init__ runs, and what
        train() and plan() run again on a config whose fields were assigned since. Returns self."""
        _check_types(self)
        checks = [
            (self.dim > 0, "dim must be > 0"),
            (self.epochs > 0, "epochs must be > 0"),
            (self.negative > 0, "negative must be > 0 (negative sampling is the only loss)"),
            (self.window > 0, "window must be > 0"),
            (self.shared_negatives >= 0, "shared_negatives must be >= 0"),
            (not (self.dbow_words and self.mode == "dm"),
             "dbow_words applies to --mode dbow only (PV-DM trains word vectors anyway)"),
            (self.sample >= 0, "sample must be >= 0"),
            (0 < self.alpha, "alpha must be > 0"),
            (0 <= self.min_alpha <= self.alpha, "min_alpha must lie in [0, alpha]"),
            (self.num_ps > 0, "num_ps must be > 0"),
            (self.num_workers > 0, "num_workers must be > 0"),
            (self.segments is None or self.segments > 0, "segments must be > 0"),
            (self.cpus_per_worker > 0, "cpus_per_worker must be > 0"),
            (self.gpus_per_worker >= 0, "gpus_per_worker must be >= 0"),
            ((self.macro_batch is None or self.macro_batch > 0) and self.micro_batch > 0,
             "macro_batch and micro_batch must be > 0"),
            (self.max_inflight_pushes > 0, "max_inflight_pushes must be > 0"),
            (self.checkpoint_every >= 0, "checkpoint_every must be >= 0"),
            (self.keep_checkpoints > 0, "keep_checkpoints must be > 0"),
            (self.max_restarts >= 0, "max_restarts must be >= 0"),
            (self.wait_for_resources >= 0, "wait_for_resources must be >= 0"),
            (self.cache_rows is None or self.cache_rows >= 0, "cache_rows must be >= 0"),
            (self.resume_from is None or bool(re.fullmatch(r"v?[1-9][0-9]*", self.resume_from)),
             f"resume_from must be a checkpoint version like v9, not {self.resume_from!r}"),
            (self.device_memory is None or self.device_memory > 0, "device_memory must be > 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise UserError(f"bad training config: {message}")
        if self.resume_from is not None:
            self.resume = True  # resuming from a version named is resuming
        _check_choices(self)
        if self.kernel == "exact" and self.gpus_per_worker > 0:
            raise UserError("bad training config: kernel exact runs on CPU workers; GPU workers use the batched "
                            "kernel (--kernel auto or batched)")
        if self.kernel == "exact" and self.shared_negatives:
            raise UserError("bad training config: shared_negatives needs the batched kernel (--kernel batched)")
        if self.kernel == "fused":
            self._check_fused()
        if self.schedule == "blocks" and (self.mode != "dbow" or self.dbow_words or self.shared_negatives):
            raise UserError("bad training config: --schedule blocks trains plain PV-DBOW with each example's own "
                            "negatives (the windows of --dbow-words and PV-DM, and shared negatives, reach across "
                            "blocks); use --schedule shared or auto")
        if self.mode == "dm" and self.num_workers > 1:
            # measured: Lee, 3 seeds, Pearson 0.272 with one worker, 0.077 with two sharing the rows
            raise UserError("bad training config: PV-DM with several workers lost most of its quality (Lee: Pearson "
                            "0.272 with one worker, 0.077 with two, which share the URL rows); train PV-DM with "
                            "--num-workers 1 (on all the machine's CPUs: --cpus-per-worker N)")
        if self.schedule == "blocks" and self.cache_rows is not None:
            raise UserError("bad training config: --cache-rows is for --schedule shared: on the block schedule each "
                            "worker keeps the whole block it holds resident")
        if self.cache_rows and self.num_workers > 1 and self.trains_words():
            # with `words` trained too, the hot rows' deltas of several workers need the weighting of
            # client.ParameterClient.push_weights, which resident rows do not get yet: refuse rather than diverge
            raise UserError("--cache-rows applies to PV-DBOW without --dbow-words for now")
        return self


@dataclass
class JobConfig:
    """What jobs/train.py does around training: where data comes from and where results go."""

    input: list[str] = field(default_factory=list, metadata={
        "help": "raw inputs for prepare (files, dirs, globs)", "choices": None, "flag": False})
    corpus: str | None = _f(None, "prepared corpus directory (made from input if it does not exist)")
    out: str | None = _f(None, "model directory")
    exports: str | None = _f(None, "directory for Parquet exports and the faiss index (default: OUT/exports)")
    overwrite: bool = _f(False, "retrain into an existing model directory, replacing it")
    root: str | None = _f(None, "directory that relative corpus, out, exports and holdout_out paths are taken "
                                "from; inside `ray job submit --working-dir` it must be given (storage every node "
                                "sees), since the working dir is a temporary copy (default: the checkout for the "
                                "sample config, else the current directory)")

    def __post_init__(self) -> None:
        _check_types(self)


def _check_choices(obj: Any) -> None:
    """Every field of a config section declared with choices (_f) holds one of them."""
    for f in dataclasses.fields(obj):
        choices = f.metadata.get("choices")
        if choices and getattr(obj, f.name) not in choices and not (f.default is None and getattr(obj, f.name) is None):
            raise UserError(f"bad value for {f.name}: {getattr(obj, f.name)!r} (choose from {', '.join(choices)})")


# --segments' default on text corpora (settings.resolve): what Lee and mini_newsgroup measured to hold one
# worker's quality with several workers (settings.SEGMENTS_MEASURED, docs/benchmarks.md)
TEXT_SEGMENTS = 16
# --segments' default on other corpora trained by CPU workers where a worker's round still holds ROUND_TOKENS
# tokens of the corpus or more (settings.default_segments; else 1): one segment's rounds last half an epoch at
# 2 workers, and the long tail loses (synth200k, 3 seeds: recall@10 without the 10 most common URLs -0.0038 at
# 2 workers, -0.0014 at 4 segments; the whole PyPI set at 2 workers +0.0011 overall at 1 segment, +0.0039 at 4,
# at 1.60x one worker's tokens/s where 1 segment ran 1.85x; 16 segments cost a third of the speed for no more;
# docs/benchmarks.md, "The rounds' length on events")
EVENT_SEGMENTS = 4
ROUND_TOKENS = 250_000


def is_text(corpus: Any) -> bool:
    """Whether a corpus (corpus.Corpus) was prepared from text (prepare --format text): documents of words."""
    return (getattr(corpus, "meta", None) or {}).get("format") == "text"


def _check_types(obj: Any) -> None:
    """Every field of a config section holds a value of its declared type (typed()), stored as that type."""
    for f in dataclasses.fields(obj):
        setattr(obj, f.name, typed(f, getattr(obj, f.name)))


_EXPONENT = re.compile(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+")
_EXPECTED = {"int": "a whole number", "float": "a number", "bool": "true or false", "str": "text",
             "list[str]": "a path or a list of paths"}


def typed(f: dataclasses.Field, value: Any, where: str = "") -> Any:
    """`value` as field `f` holds it, or a UserError naming the field (after `where`, a file and ": ").

    Nothing is guessed: 100.7 is not an int, true is not 1, 'ture' is not a bool. What is converted
    loses nothing: an int where a float is wanted, a number in exponent notation that PyYAML reads as
    text (1e-4), numpy's numbers (a Ray Tune sample) as Python's, a path object as its string, one
    path as a list of one; and 0 / 1 where a bool is wanted, gensim's way of writing a switch
    (dbow_words: 1).
    """
    kinds = [k.strip() for k in str(f.type).split("|")]
    kind = kinds[0]
    if value is None and "None" in kinds:
        return None
    if kind == "bool" and (isinstance(value, bool) or (isinstance(value, numbers.Integral) and value in (0, 1))):
        return bool(value)
    if kind == "int" and isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)
    if kind == "float" and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if kind == "float" and isinstance(value, str) and _EXPONENT.fullmatch(value.strip()):
        return float(value)  # 1e-4: a number in YAML 1.2, text to PyYAML (YAML 1.1 wants 1.0e-4)
    if kind == "str" and isinstance(value, (str, os.PathLike)):
        choices = f.metadata.get("choices")
        if choices and os.fspath(value) not in choices:  # said here, so that a YAML file's line names the file
            raise UserError(f"{where}bad value for {f.name}: {os.fspath(value)!r} (choose from {', '.join(choices)})")
        return os.fspath(value)
    if kind == "list[str]":
        values = [value] if isinstance(value, (str, os.PathLike)) else value
        if isinstance(values, (list, tuple)) and all(isinstance(v, (str, os.PathLike)) for v in values):
            return [os.fspath(v) for v in values]
    choices = f.metadata.get("choices")
    expected = f"one of {', '.join(choices)}" if choices else _EXPECTED.get(kind, kind)
    raise UserError(f"{where}bad value for {f.name}: {value!r} ({expected}{' or null' if 'None' in kinds else ''} "
                    "expected)")


SECTIONS = (PrepareConfig, TrainConfig, JobConfig)


def field_names(cls) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def engine_only(cls=TrainConfig) -> set[str]:
    """The fields of our Ray engine alone (marked engine=True above), which gensim's baseline does not use."""
    return {f.name for f in dataclasses.fields(cls) if f.metadata.get("engine")}


def _aliases() -> dict[str, str]:
    """Another name of a setting (gensim's `vector_size`) → the field's own name (`dim`)."""
    return {alias: f.name for cls in SECTIONS for f in dataclasses.fields(cls)
            for alias in f.metadata.get("aliases", ())}


# gensim's Doc2Vec parameters (and Word2Vec's, which gensim users bring along) that are spelled otherwise
# here or have no counterpart, and what to use instead: <name> is one of our settings, <name=value> one
# with its value, written as flags on the command line (--mode dm) and as keys in a YAML file (mode: dm).
# One table for both: cli._misplaced_flag and load_yaml answer with the same pointer.
GENSIM_NAMES = {
    "size": "<dim>",
    "iter": "<epochs>",
    "workers": "<num_workers> (worker actors) and <cpus_per_worker> (threads each)",
    "dm": "<mode=dm> (or <mode=dbow>)",
    "sg": "<mode=dbow> (PV-DBOW, doc2vec's skip-gram; <dbow_words> trains URL vectors by skip-gram beside it)",
    "dm_mean": "<mode=dm>, which always averages the context vectors (gensim's dm_mean=1)",
    "dm_concat": "<mode=dm>, which averages the context vectors (gensim's dm_mean=1); concatenation is not offered",
    "hs": "<negative> (negative sampling is the only loss)",
    "max_vocab_size": "prepare's <max_vocab> (the most frequent URLs are kept when the corpus is made)",
    "max_final_vocab": "prepare's <max_vocab> (the most frequent URLs are kept when the corpus is made)",
}


def gensim_pointer(name: str, as_flags: bool) -> str | None:
    """What to use instead of gensim's parameter `name` (GENSIM_NAMES; dashes or underscores), written as
    flags or as YAML keys; None when `name` is none of them."""
    text = GENSIM_NAMES.get(name.lstrip("-").replace("-", "_"))
    if text is None:
        return None

    def setting(match: re.Match) -> str:
        key, _, value = match.group(1).partition("=")
        if as_flags:
            return "--" + key.replace("_", "-") + (f" {value}" if value else "")
        return key + (f": {value}" if value else "")

    return re.sub(r"<([a-z_]+(?:=[a-z]+)?)>", setting, text)


def load_yaml(path: str, pointers: dict[str, str] | None = None) -> dict:
    """Read a flat YAML mapping of config keys, each checked against its field's type (typed()).

    Refused in one line naming the file: a key that is gensim's name of a setting (GENSIM_NAMES:
    the pointer the flag gets, or the command's own in `pointers`), an unknown key, a value of the
    wrong type."""
    try:
        with open(path) as fh:
            data = yaml.safe_load(fh) or {}
    except FileNotFoundError:
        raise UserError(f"{path}: config file not found") from None
    except yaml.YAMLError as exc:
        raise UserError(f"{path}: not valid YAML: {exc}".replace("\n", " ")) from None
    if not isinstance(data, dict):
        raise UserError(f"{path}: expected a mapping of config keys at the top level")
    data = {str(k).replace("-", "_"): v for k, v in data.items()}
    for alias, name in _aliases().items():
        if alias in data:
            value = data.pop(alias)
            if name in data and data[name] != value:
                raise UserError(f"{path}: {name}: {data[name]!r} and {alias}: {value!r} disagree ({alias} is gensim's "
                                f"name for {name}); give one")
            data[name] = value
    fields = {f.name: f for cls in SECTIONS for f in dataclasses.fields(cls)}
    for key in data:
        pointer = None if key in fields else (pointers or {}).get(key) or gensim_pointer(key, as_flags=False)
        if pointer:
            raise UserError(f"{path}: {key} is gensim's name; doc2vec-dist uses {pointer}")
    unknown = sorted(set(data) - set(fields))
    if unknown:
        known = [*fields, *_aliases()]
        raise UserError(f"{path}: unknown config key(s): {', '.join(k + did_you_mean(k, known, ' (', ')') for k in unknown)}")
    return {key: typed(fields[key], value, where=f"{path}: ") for key, value in data.items()}


def did_you_mean(name: str, known, before: str = "; ", after: str = "") -> str:
    """`(did you mean 'epochs'?)` for a name given that is none of `known` but close to one (difflib's
    measure, as argparse uses for a mistyped choice), between `before` and `after`; "" when none is close."""
    close = difflib.get_close_matches(name, list(known), n=1)
    return f"{before}did you mean {close[0]!r}?{after}" if close else ""


def build(cls, *sources: dict):
    """Instantiate a config section from dicts in increasing precedence, keeping only its own keys; each
    value is checked against its field's type when the section is made (typed()).

    Values of None in a later source do not override (argparse leaves unset flags as None).
    """
    return cls(**explicit_values(cls, *sources))


def explicit_values(cls, *sources: dict) -> dict:
    """The fields of `cls` that a source actually sets (flags left unset are None), later sources first."""
    names = field_names(cls)
    out: dict[str, Any] = {}
    for src in sources:
        out.update({k: v for k, v in src.items() if k in names and v is not None})
    return out
