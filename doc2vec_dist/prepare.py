"""prepare: raw events in, a corpus directory out (the format is corpus.py's).

Changes when the way a corpus is made changes: the order of the passes, the checks before and between
them, the vocabulary, the held-out split, the files of a refresh. Running each pass and merging its results
is prepare_merge.py's, the lines of the report prepare_report.py's. `prepare` turns browsing events (or
token lists, or plain text; readers.py) into the corpus that training reads. It never holds the events in
memory, only the vocabulary (one row per distinct token):

    pass 1  read every block of the inputs, count tokens and rows, check columns → vocabulary, ids by
            frequency
    pass 2  read every block again, map tokens to ids, spill each event into bucket hash(key) % B
    pass 3  per bucket: group the events into documents, hold out, number them, write shard b

B is chosen so that one bucket fits in `memory_budget_bytes`. Everything is written under a temporary
sibling of the output directory and renamed into place at the very end, so an error or an interrupt
never leaves a half-written corpus behind.

Each pass is a function of one block of the inputs (readers.plan_blocks: a file, or a run of a big
Parquet file's row groups) or of one bucket, with the settings (passes.py, shard_pass.py); prepare_merge.py runs
them and merges what they return, in input order. With parallel 1 they run one after another in this
process; with parallel N as Ray tasks, N at a time, on a local Ray or a cluster (runners.RayTasks); with
0 a task per CPU, but in this process where the input is too small for tasks to pay (processes_that_pay).
The corpus is the same either way: the blocks depend on the inputs alone, and every result is
merged in the order of its block or bucket. Through Ray every node must see the output's directory
(the spills and shards are written there) and the inputs.

Within a shard, documents keep the order in which they first appear in the input, so a small text
corpus (one shard) has doc id == line number unless lines were skipped.

Bad input. Each kind either stops `prepare` with a one-line CorpusError naming the file (and the column
and row where known), leaving nothing at the output, or is skipped, counted in corpus.json's "skipped"
(where the first few were in "skipped_where") and reported one line per reason (logged as warnings
of the "doc2vec_dist.prepare" logger). Rows and lines in messages are counted from 0 within their
file (a CSV header is not a row), as text keys are. Of several bad blocks, the first in input order
is the one named, however many processes read them.

    errors   no input file; a missing column (the message lists the columns the file has); a key or
             token column holding lists or structs; a time column that is not a time; a file that is
             not what its name says (a corrupt or truncated Parquet among good ones, malformed JSON
             or CSV rows); invalid UTF-8 in a column of a CSV, JSON or Parquet file (a whole file in
             another encoding is the usual cause, and training on whatever part decodes would be
             wrong silently); all inputs empty, or nothing left once the skips below are made.
    skips    files in an input folder that are not data ("unread_files": a README.txt, a .DS_Store,
             a hidden folder; read_files.bookkeeping's _SUCCESS, _metadata, .crc pass quietly);
             an empty file among non-empty ones; rows whose key is null or empty ("null_keys",
             "empty_keys"); null or empty tokens; text lines that are not valid UTF-8 (the line
             keeps its number, so later keys do not shift); duplicate events, i.e. the same
             (key, token, time) more than once when time_col is given ("duplicate_events": without
             a time column a repeated (user, URL) is a repeated visit, which is signal, and is kept;
             rows without a time are never duplicates); with a base, events it has ("events_in_base":
             the same key, token and time); tokens below min_count or beyond max_vocab; a document's
             earliest events beyond max_tokens_per_doc ("tokens_beyond_max_per_doc", opt-in);
             documents left with no token.
    kept     integer, float and boolean keys and tokens become strings ("7" from 7 and from 7.0, so
             ids written as numbers by one exporter and as strings by another still meet, as do
             JSON lines whose ids are strings in some rows and numbers in others); documents
             with a single token train like any other and are counted in "docs_with_one_token";
             with holdout, a document with fewer than 2 distinct tokens keeps them all for training
             ("docs_without_heldout"). Long documents are kept whole unless max_tokens_per_doc says
             otherwise: a user with millions of events is one document (gensim would cut it at 10,000
             tokens); one above HEAVY_SHARE of all tokens is named ("heavy_docs"), a line each.
             Keys (and tokens) that are one string in Unicode's NFC form but written apart are kept
             apart, as written, counted ("unicode_twins") and said.
             Events with a null time are kept, after their user's timed events, counted
             ("events_without_time") and said.

Vocabulary counts for min_count and max_vocab are taken before duplicates are removed (pass 1 sees
events, not users); the counts in vocab.arrow are those of the training tokens.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import re
import shutil
import uuid
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa

from . import compact, forgotten, outputs, passes, prepare_base, runners, storage
from .config import PrepareConfig
from .corpus import (
    FORMAT_VERSION,
    VOCAB_SCHEMA,
    Corpus,
    CorpusError,
    one_line,
)
from .passes import Settings
from .prepare_base import Base, open_base, stored_time_range
from .prepare_merge import (
    DAY_SECONDS,
    _choose_buckets,
    _data_engine,
    _latest_time,
    _line_bases,
    _Pass1,
    _pass1,
    _pass2,
    _Pass3,
    _pass3,
    _Progress,
    _ray_memory,
    _runner,
    _Window,
    _write_heldout,
    processes_that_pay,
    task_memory_line,
)
from .prepare_report import _heavy_docs, attention_lines, refresh_report, skip_report, unicode_twins
from .read_files import FORMATS, Options, csv_delimiter, expand_inputs, input_bytes
from .read_formats import column_names
from .read_times import ORDER, TIME_UNITS
from .readers import Block, plan_blocks
from .shard_pass import EMPTY_KEYS_FILE, EMPTY_KEYS_SCHEMA, empty_part
from .urls import RAW, UrlRule, recorded, report_line

log = logging.getLogger(__name__)


# ---------------------------------------------------------------------------------------------------
# prepare
# ---------------------------------------------------------------------------------------------------

def _check(c: PrepareConfig, out: str) -> Base | None:
    """The settings checked against each other, and the base opened: before anything is read."""
    if c.format not in FORMATS:
        raise CorpusError(f"format '{c.format}' is not one of {', '.join(FORMATS)}")
    if c.time_col and c.format != "events":
        raise CorpusError(f"time_col '{c.time_col}' applies to --format events only, not {c.format}")
    if c.min_count < 1:
        raise CorpusError(f"min_count must be >= 1, not {c.min_count}")
    if c.max_vocab is not None and c.max_vocab < 1:
        raise CorpusError(f"max_vocab must be >= 1, not {c.max_vocab}")
    if c.num_shards is not None and c.num_shards < 1:
        raise CorpusError(f"num_shards must be >= 1, not {c.num_shards}")
    if c.max_tokens_per_doc is not None and c.max_tokens_per_doc < 1:
        raise CorpusError(f"--max-tokens-per-doc must be >= 1, not {c.max_tokens_per_doc}")
    if c.memory_budget_bytes < 1:
        raise CorpusError(f"memory_budget_bytes must be >= 1, not {c.memory_budget_bytes}")
    if c.parallel is not None and c.parallel < 0:
        raise CorpusError(f"--parallel must be >= 0 (0: a task per CPU of the Ray cluster), not {c.parallel}")
    if c.engine == "data" and c.parallel in (None, 1):
        raise CorpusError("--engine data runs pass 2 on Ray: give --parallel N (N > 1, or 0: a task per CPU)")
    if not 0 <= c.holdout < 1:
        raise CorpusError(f"holdout must lie in [0, 1), not {c.holdout}")
    if c.holdout > 0 and not c.holdout_out:
        raise CorpusError("holdout > 0 needs holdout_out, the Parquet file for the hidden tokens")
    if c.holdout == 0 and c.holdout_out:
        raise CorpusError(f"{c.holdout_out}: holdout_out is given but holdout is 0")
    if c.expire_days is not None and not c.expire_days > 0:
        raise CorpusError(f"--expire-days must be > 0, not {c.expire_days:g}")
    if c.expire_days is not None and (c.base is None or not c.time_col):
        raise CorpusError("--expire-days applies to a refresh (--base) with event times (--time-col): it drops the "
                          "base's users with no event in the last N days")
    if c.expire_days is not None and c.window_days is not None and c.expire_days > c.window_days:
        raise CorpusError(f"--expire-days {c.expire_days:g} is longer than --window-days {c.window_days:g}: a window's "
                          "documents hold its last days only, so a user last seen before it cannot be told from one "
                          "long gone; give --expire-days at most the window")
    if c.window_days is not None and not (c.window_days > 0 and c.time_col):
        raise CorpusError("--window-days needs a time column (--time-col) and a number of days > 0"
                          if not c.time_col else f"--window-days must be > 0, not {c.window_days}")
    if c.time_unit is not None and (c.time_unit not in TIME_UNITS or not c.time_col):
        raise CorpusError(f"--time-unit must be one of {', '.join(TIME_UNITS)}, not {c.time_unit!r}"
                          if c.time_unit not in TIME_UNITS else "--time-unit needs a time column (--time-col)")
    if c.base is None:
        return None
    if c.format == "text":
        raise CorpusError("--base with --format text: a text document's key is its line number, so new lines "
                          "cannot join the documents of earlier ones; use --format lists or events")
    if c.holdout > 0:
        raise CorpusError("--base with --holdout: the base's users were trained on everything they had; hold "
                          "events out of the inputs before preparing the base instead")
    if os.path.abspath(os.fspath(c.base)).rstrip(os.sep) == out:
        raise CorpusError(f"{out}: --out is the --base; a refresh writes a new corpus and never changes its base")
    found = open_base(c.base, join=c.window_days is None)
    if c.expire_days is not None and c.window_days is None and not found.times_kept:
        raise CorpusError(f"{found.path}: keeps no event times (prepared before corpora kept them, or without "
                          "--time-col), so --expire-days cannot tell when its users were last seen; prepare the base "
                          "anew with --time-col")
    base_range, base_unit, read_as = stored_time_range(found.meta)
    if c.time_col and base_unit == ORDER:
        raise CorpusError(f"{found.path}: its times {base_range} are numbers that only order events, no "
                          "epoch time, so new events cannot be told from those it has: prepare the base again "
                          "with --time-unit, or refresh without --time-col")
    if read_as and c.time_col:
        log.info(f"{found.path}: its corpus.json predates time units; its time range read as {read_as}")
    return found


def _base_checked(c: PrepareConfig, base: Base, first: str, delimiter: str | None) -> None:
    """What a refresh is told of its base once every setting is checked. A base prepared with --holdout: its
    held-out events, sent again, come back as new (a warning). A refresh without --time-col of a base that
    keeps its events' times (not numbers that only order them): refused where the inputs have the base's
    time column (the flag forgotten: an event sent again would be joined a second time, a late one put last,
    and the new corpus would keep no times); where they have none, a warning says what the refresh cannot
    do. The first input file's columns stand for all of them."""
    column = base.meta.get("time_col")
    untimed = not c.time_col and c.format == "events" and column and stored_time_range(base.meta)[1] != ORDER \
        and base.times_kept
    if untimed and column in column_names(first, delimiter):
        raise CorpusError(f"{base.path}: keeps its events' times (column '{column}'), and {first} has that column, "
                          "but this refresh has no --time-col: an event sent again would be joined a second time "
                          f"and a late one put last, and the new corpus would keep no times; give --time-col {column}")
    if untimed:
        log.warning(f"warning: {base.path}: keeps its events' times (column '{column}'), and {first} has none: events "
                    "sent again cannot be told from new ones (each is joined again), and the new corpus keeps no times")
    if base.meta.get("holdout"):
        log.warning(f"warning: {base.path}: prepared with --holdout {base.meta['holdout']:g}, so the events it held "
                    "out are not in it: sent again, they join the documents as new events, and that held-out file no "
                    "longer measures a model of this corpus (evaluate leaves such pairs out and counts them)")


def _url_rule(c: PrepareConfig, base: Base | None) -> UrlRule:
    """The rule by which the token column's URLs are normalised (urls.py): the settings' (on unless
    --no-normalize), never for text; with a base, the base's rule, recorded in its vocab.arrow (none
    recorded: as written), so that today's events name a page as the base does; a flag that asks for
    another rule is refused in one line naming both."""
    given = {"--no-normalize": c.no_normalize, "--drop-query": c.drop_query, "--merge-www": c.merge_www,
             f"--drop-params {c.drop_params!r}": c.drop_params is not None}
    if c.format == "text":
        asked = next((flag for flag, on in given.items() if on and flag != "--no-normalize"), None)
        if asked:
            raise CorpusError(f"{asked} applies to the URLs of --format events and lists; text tokens are taken as "
                              "written")
        return RAW
    rule = UrlRule.of_settings(c.no_normalize, c.drop_query, c.drop_params, c.merge_www)
    if base is None:
        return rule
    theirs = recorded(os.path.join(base.path, "vocab.arrow"))
    differs = {"--no-normalize": theirs.normalize, "--drop-query": not theirs.drop_query,
               "--merge-www": not theirs.merge_www}
    for flag, on in given.items():
        if on and differs.get(flag, rule.drop_params != theirs.drop_params or not theirs.normalize):
            raise CorpusError(f"{flag}: the base {base.path} was prepared with {theirs.describe()}, and a refresh "
                              "reads its events by the base's URL rule so that a page stays the word it was; leave "
                              "the flag out, or prepare a new corpus without --base")
    return theirs


def _write_empty_keys(s: Settings, buckets: int, path: str) -> None:
    """The buckets' keys of documents left with no token (shard_pass.empty_part), as one Arrow file."""
    with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, EMPTY_KEYS_SCHEMA) as writer:
        for b in range(buckets):
            part = empty_part(s, b)
            if os.path.exists(part):
                writer.write_table(pa.ipc.open_file(pa.memory_map(part)).read_all(), max_chunksize=1 << 20)


def prepare(inputs: list[str], out: str, config: PrepareConfig | None = None, *, overwrite: bool = False,
            progress: bool = True, report: bool | None = None, empty_keys: bool = False) -> Corpus:
    """Build a corpus directory at `out` from the inputs (see the module docstring) as `config` says,
    and open it.

    With holdout=F > 0, each document with at least 2 distinct tokens has max(1, round(F × distinct))
    of them (never all: at least one stays) removed from its training tokens and written as
    (key, token) rows to the Parquet file `holdout_out`; a document with one distinct token keeps it.
    Raises CorpusError (naming the file, column or row) on bad input, and on an output that cannot be
    written; on any error nothing is left at `out` or `holdout_out`, nor directories made for them.
    empty_keys: the keys of the documents left with no token (each event's URL null, empty or out of the
    vocabulary; counted as "docs_without_tokens") are kept in the corpus's EMPTY_KEYS_FILE, for infer,
    which gives each of them a row without a vector; not with a base.
    What was skipped, and why, is in corpus.json ("skipped", "skipped_where"); with `report` (by
    default: with `progress`) a summary and one line per reason are logged (`skip_report`; the
    dropped as warnings, the rest as information, on the "doc2vec_dist.prepare" logger).

    base (a corpus, or a model whose corpus is still there) is a daily refresh: every user and URL of
    the base keeps its id, new ones come after (URLs by their frequency among the new); a user's new
    events join the document it had, after its earlier tokens (in time order, late ones among them,
    with a time column), and every earlier document stays (its user kept, with no new event). An
    input event the base has (the same user, URL and time: a corpus prepared with a time column keeps
    its tokens' times) is dropped and counted, so a cumulative export is harmless; every other is
    new, whatever its time. With window_days (and time_col) a document is instead the
    events of the last N days before the latest one; a known user with none keeps its id and an empty
    row. Counts, and so subsampling and negatives, are the new corpus's. changed.arrow lists the new
    users and those with new events (train --first-epoch changed). corpus.json's "refresh" counts
    what is new, what grew and what no longer appears, and ("files") the events of each input file the
    base had, so that the report names a cumulative export among files of new events. A base that knows none of the inputs' users is
    an error (it is not an earlier corpus of these events), one that knows fewer than
    LOW_OVERLAP of them a warning.

    Times (readers.py) become epoch seconds, UTC, as they are read; numeric ones are in time_unit
    (s, ms, us, ns) or, by default, in the unit their size says, file by file. corpus.json's
    "time_range" and "window_start" are in the unit "time_unit" names: "s" (epoch seconds), or
    "order" when the times were numbers that only order events (refused with window_days or base);
    "time_read" says how each file's times were read. delimiter: of CSV/TSV fields (default ',' for
    .csv, a tab for .tsv).

    parallel: 1 (or None) runs the passes in this process; N > 1 as Ray tasks, N at a time, on the Ray
    this process is connected to, else the cluster at `address` (or RAY_ADDRESS), else a local Ray of N
    CPUs started here; 0 as many at a time as the cluster has CPUs, or in this process where the input is
    too small for tasks to pay (processes_that_pay). The corpus is the same.
    """
    c = dataclasses.replace(config) if config is not None else PrepareConfig()
    delimiter = csv_delimiter(c.delimiter)
    out = os.path.abspath(os.fspath(out)).rstrip(os.sep)
    found_base = _check(c, out)
    rule = _url_rule(c, found_base)
    outputs.check_dir(out, "corpus", overwrite)  # only a corpus of ours is replaced, and only when asked
    if c.holdout_out:
        outputs.check_file(os.path.abspath(c.holdout_out), "heldout", overwrite)
    for path in (out, c.holdout_out):  # a read-only or forbidden place is named before any reading
        outputs.check_writable(path)
    unread: list[str] = []
    files = expand_inputs(inputs, c.format, unread)
    if found_base is not None and files:
        _base_checked(c, found_base, files[0], delimiter)
    opt = Options(c.format, c.doc_col, c.token_col, c.time_col if c.format == "events" else None, c.time_unit,
                  delimiter, "--window-days" if c.window_days is not None else "--base" if c.base is not None else None,
                  rule if rule.normalize else None)
    blocks = plan_blocks(files, opt)
    c.parallel, line = processes_that_pay(c.parallel, input_bytes(files))
    if line:
        log.info(line)
    hold_final = os.path.abspath(c.holdout_out) if c.holdout_out else None
    made: list[str] = []  # directories we create for the outputs, removed again on failure
    try:
        made += outputs.make_dirs(os.path.dirname(out))
        if hold_final:
            made += outputs.make_dirs(os.path.dirname(hold_final))
        # Both outputs appear whole or not at all, and replace only what was checked at the start (a
        # corpus or held-out file of ours, or nothing): the corpus is committed first, then the file.
        with (outputs.replacing(hold_final, "heldout", overwrite) if hold_final
              else contextlib.nullcontext()) as held, outputs.replacing(out, "corpus", overwrite) as staged, \
                _runner(c) as runner:
            meta, p3 = _passes(c, inputs, files, blocks, opt, staged.path, held.path if held else None, hold_final,
                               found_base, runner, progress, unread, empty_keys)
    except BaseException as e:
        outputs.remove_dirs(made)
        if isinstance(e, OSError):  # reading errors are CorpusErrors already: this is the output
            raise CorpusError(f"{out}: cannot write the corpus: {one_line(e)}") from e
        raise

    if report is None:
        report = progress
    if report:
        lines = skip_report(meta)
        log.info(f"prepared {out}: {p3.num_docs:,} docs, {p3.num_tokens:,} tokens, vocabulary "
                 f"{meta['vocab_size']:,}, {meta['num_shards']} shard(s)"
                 + ("" if any(line.startswith("skipped") for line in lines) else "; skipped: nothing")
                 + (f"; held out {p3.heldout:,} (key, token) pairs to {hold_final}" if hold_final else ""))
        for line in lines:  # what was dropped or changed is a warning; what was kept, information
            (log.warning if line.startswith(("skipped", "stripped")) else log.info)(line)
        if c.format != "text":
            found = meta["distinct_tokens"]
            log.info(report_line(found["read"], found["normalised"], found["http_urls"], rule))
        for line in attention_lines(meta):
            log.warning(line)
        if meta.get("refresh"):
            for level, line in refresh_report(meta):
                log.log(level, line)
    return Corpus(out)


def _passes(c: PrepareConfig, inputs, files: list[str], blocks: list[Block], opt, tmp: str, hold_tmp: str | None,
            hold_final: str | None, found_base: Base | None, runner, progress: bool,
            unread: list[str] = (), empty_keys: bool = False) -> tuple[dict, _Pass3]:
    """The passes, into the staging directory `tmp` (and the held-out file's `hold_tmp`): corpus.json's
    contents, and pass 3's totals. unread: what the input folders hold that is not read (counted)."""
    if not runner.in_process:
        log.info(f"prepare: {len(blocks):,} block(s) of input, {runner.tasks} Ray task(s) at a time")
    known = [b.rows for b in blocks]
    bar = _Progress(progress, 3 + (c.window_days is not None), sum(known) if None not in known else None)
    try:
        s = Settings(opt, tmp, holdout=c.holdout, seed=c.seed, base=found_base.path if found_base else None,
                     empty_keys=empty_keys and found_base is None)
        os.makedirs(s.spill_dir)
        os.makedirs(s.parts_dir)
        listed = _base_forget_list(found_base)
        if len(listed):  # the base's forgotten users: their events are left out of every pass, counted
            listed.write(os.path.join(s.parts_dir, forgotten.FILE))
            listed.write(os.path.join(tmp, forgotten.FILE))  # and the new corpus keeps the list
            s = dataclasses.replace(s, forget=os.path.join(s.parts_dir, forgotten.FILE))
        s = dataclasses.replace(s, run=uuid.uuid4().hex)
        with open(os.path.join(tmp, passes.RUN_NAME), "w") as fh:  # for the tasks to find (Settings.check_seen)
            fh.write(s.run)
        runner = runner.stopping_with(s.stop_path())  # Ray tasks still running when the run stops end at once
        if c.format == "text":
            blocks = _line_bases(blocks, runner)
        window = None
        if c.window_days is not None:
            bar.start("latest time")
            latest, blocks = _latest_time(blocks, files, s, runner, bar)
            window = _Window(c.window_days, latest - c.window_days * DAY_SECONDS, latest)
            s = dataclasses.replace(s, window_start=window.cutoff)
        join = window is None
        bar.start("count")
        p1, blocks = _pass1(blocks, files, s, c.min_count, c.max_vocab, runner, bar,
                            found_base.vocab_tokens if found_base else None)
        data = _data_engine(c, files, opt, runner)
        bar.know_rows(p1.rows)
        # a join keeps the base's shards by key hash, adding each user's new events to its own shard
        by_shard = (found_base is not None and join and c.num_shards is None
                    and found_base.corpus.meta.get("shards_by") == "key_hash")
        buckets = found_base.corpus.num_shards if by_shard else c.num_shards or _choose_buckets(
            p1, c.time_col is not None, c.memory_budget_bytes, found_base.token_count(join) if found_base else 0)
        s = dataclasses.replace(s, buckets=buckets, join=join, by_shard=by_shard,
                                base_rows=found_base is not None and not by_shard,
                                max_tokens_per_doc=c.max_tokens_per_doc)
        vocab_tokens = p1.vocab["token"].combine_chunks()
        with pa.OSFile(s.vocab_path(), "wb") as sink, pa.ipc.new_file(sink, pa.schema([("token", pa.string())])) as w:
            w.write_table(pa.table({"token": vocab_tokens}), max_chunksize=1 << 20)
        memory = _ray_memory(runner, passes.task_bytes(c.memory_budget_bytes, len(vocab_tokens)))
        # what the tasks ask of the nodes, said once the bar has closed (a line under a live bar breaks it)
        memory_line = task_memory_line(memory, runner.tasks, runners.largest_node_memory()) if memory else None
        parts = blocks + (found_base.parts(join) if s.base_rows else [])
        bar.start("partition")
        spills = _pass2(parts, s, runner, bar, memory, [f for f in files if f in p1.read_rows] if data else None,
                        p1.units)
        bar.start("shards")
        p3 = _pass3(spills, s, len(vocab_tokens), runner, bar, memory, p1.rows, found_base if found_base else None,
                    len(blocks))
        if hold_tmp:
            _write_heldout(s, hold_tmp)
        if s.empty_keys:
            _write_empty_keys(s, buckets, os.path.join(tmp, EMPTY_KEYS_FILE))
        shutil.rmtree(s.spill_dir)
        shutil.rmtree(s.parts_dir)
        os.remove(os.path.join(tmp, passes.RUN_NAME))
        seconds = bar.timings()
    finally:
        bar.close()
    if memory_line:
        log.info(memory_line)
    if p3.refresh is not None:
        _check_overlap(found_base, p3.refresh, p1, c.doc_col, window is not None)

    rule = s.opt.urls or RAW
    schema = VOCAB_SCHEMA.with_metadata(rule.schema_metadata())  # the URL rule travels with the vocabulary
    vocab = pa.table({"token": vocab_tokens, "count": pa.array(p3.counts), "id": p1.vocab["id"]}, schema=schema)
    with pa.OSFile(os.path.join(tmp, "vocab.arrow"), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(vocab, max_chunksize=1 << 20)
    dropped = _drop_rows(c, tmp, found_base, listed, p3, window)
    p1.skips.add("duplicate_events", p3.duplicate_events)
    p1.skips.add("events_in_base", p3.in_base)
    p1.skips.add("tokens_beyond_max_per_doc", p3.capped.tokens)
    p1.skips.where.update({"tokens_beyond_max_per_doc": p3.capped.keys} if p3.capped.keys else {})
    p1.skips.add("docs_without_tokens", p3.docs_without_tokens)
    if unread:  # files in the input folders that are not data (read_files.expand_inputs), bookkeeping apart
        p1.skips.add("unread_files", len(unread))
        p1.skips.where["unread_files"] = unread[:p1.skips.EXAMPLES]
    meta = {
        "format_version": FORMAT_VERSION,
        "num_docs": p3.num_docs, "num_tokens": p3.num_tokens,
        "vocab_size": dropped["vocab_size"] if dropped else len(vocab_tokens),
        "num_shards": buckets, "shards": p3.shards,
        "inputs": [os.fspath(i) for i in ([inputs] if isinstance(inputs, str) else inputs)],
        "input_files": [storage.location(f) for f in files], "input_rows": p1.rows,
        "format": c.format, "doc_col": c.doc_col, "token_col": c.token_col, "time_col": opt.time_col,
        "min_count": c.min_count, "max_vocab": c.max_vocab, "holdout": c.holdout,
        "url_rule": rule.to_json(),  # how the token column's URLs were normalised (urls.py)
        "distinct_tokens": {"read": p1.read_words, "normalised": p1.input_words, "http_urls": p1.http_words},
        "holdout_out": hold_final, "heldout_pairs": p3.heldout, "seed": c.seed,
        "skipped": p1.skips.counts, "skipped_where": p1.skips.where,
        "docs_with_one_token": p3.docs_with_one_token,
        # (held out, or cut by the cap: in the vocabulary, their rows never trained)
        "words_without_events": int(np.count_nonzero(np.asarray(p3.counts) == 0)),
        "events_without_time": p1.notes.untimed if opt.time_col else None,
        "events_without_time_where": p1.notes.untimed_where,
        "max_tokens_per_doc": c.max_tokens_per_doc, "docs_capped": p3.capped.docs,
        "heavy_docs": _heavy_docs(tmp, p3.num_tokens), "unicode_twins": unicode_twins(tmp),
        "docs_without_heldout": p3.docs_without_heldout if c.holdout > 0 else None,
        "time_range": _union(p3.time_range, found_base.time_range if found_base and join else None),
        "time_unit": (ORDER if ORDER in p1.notes.time_units else "s") if opt.time_col else None,
        "time_read": p1.notes.time_read, "delimiter": opt.delimiter,
        # --time-unit as asked (None: each file's by its numbers), and whether any time was read from numbers
        "time_unit_asked": opt.time_unit,
        "time_numbers": any(u is not None for u in p1.notes.time_units) if opt.time_col else None,
        "stripped_whitespace": p1.notes.stripped, "stripped_where": p1.notes.stripped_where,
        "window_days": c.window_days, "shards_by": "key_hash",  # shard b holds the keys hashing to b
        "window_start": window.cutoff if window else None,
        "parallel": runner.tasks, "seconds": seconds,
        # what ran pass 2: this process, Ray tasks, or Ray Data (--engine data)
        "engine": "data" if data else "process" if runner.in_process else "tasks",
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    if p3.refresh is not None:
        meta["refresh"] = {**p3.refresh, "mode": "join" if join else "window", "input_events": p1.events,
                           "files": _files_in_base(files, blocks, p1.block_events, p3.in_base_blocks,
                                                   p3.early_blocks),
                           "forgotten_input_users": p1.forgotten_users,
                           "forgotten_input_events": p1.skips.counts["events_of_forgotten_users"],
                           **({k: v for k, v in dropped.items() if k != "vocab_size"} if dropped else {})}
        if c.expire_days is not None:
            meta["expire_days"] = c.expire_days
    with open(os.path.join(tmp, "corpus.json"), "w") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta, p3


def _base_forget_list(base: Base | None) -> forgotten.ForgetList:
    """The users the base was told to forget (forgotten.py): a corpus's list, or a model's together with its
    corpus's; a model's own list is checked to be that model's."""
    if base is None:
        return forgotten.ForgetList()
    if base.kind == "corpus":
        return forgotten.of_corpus(base.path)
    from .modeldir import ModelDir

    listed = forgotten.of_model(base.path, ModelDir(base.path).manifest)
    return listed.merge(forgotten.of_corpus(base.corpus.path)) if base.corpus is not None else listed


def _drop_rows(c: PrepareConfig, tmp: str, base: Base | None, listed: forgotten.ForgetList, p3: _Pass3,
               window: _Window | None) -> dict | None:
    """The rows a refresh drops from the corpus staged at `tmp` (compact.py), counted for corpus.json's refresh:
    the base's users on its forget list; with --expire-days, the users with no event in the last N days
    before the latest event of the inputs and base (a user whose tokens carry no time cannot be judged and
    stays, counted), and then the URLs no user that stays visits. None when nothing is dropped. Updates
    p3's counts and shards; dropped.arrow names the base's rows that went, for the warm start."""
    if base is None:
        return None
    docs = prepare_base.read_mapped(os.path.join(tmp, "docs.arrow"))
    forgotten_ids = np.flatnonzero(listed.matches(docs.column("key").slice(0, base.num_docs))) if len(listed) \
        else np.zeros(0, np.int64)
    expired = np.zeros(0, np.int64)
    found: dict = {}
    if c.expire_days is not None:
        shards = sorted(os.path.join(tmp, sh["path"]) for sh in p3.shards)
        latest = compact.latest_times(shards, p3.num_docs)
        newest = max([t for t in (p3.time_range[1] if p3.time_range else None, base.latest_time) if t is not None],
                     default=None)
        if newest is None:
            raise CorpusError(f"{base.path}: no event of the inputs or base has a time; --expire-days needs them")
        cutoff = newest - c.expire_days * DAY_SECONDS
        untimed = np.isnan(latest)
        expired = np.flatnonzero(~untimed & (latest < cutoff))  # -inf: a user with no event left at all
        found.update(expire_cutoff=cutoff, expire_latest=newest, users_kept_without_time=int(untimed.sum()))
    drop_docs = np.union1d(forgotten_ids, expired).astype(np.int64)
    if not len(drop_docs):
        return {**found, "expired_users": 0, "expired_urls": 0, "forgotten_base_users": 0} if found else None
    drop_words = None
    if c.expire_days is not None:  # URLs that only the users leaving visit: their count drops to 0
        left, leaving = p3.counts.copy(), np.zeros(p3.num_docs, bool)
        leaving[drop_docs] = True
        shards = [os.path.join(tmp, sh["path"]) for sh in p3.shards]
        for doc_ids, offsets, tokens, _ in (b for path in shards for b in passes.shard_batches(path)):
            np.subtract.at(left, tokens[np.repeat(leaving[doc_ids], np.diff(offsets))], 1)
        drop_words = np.flatnonzero(left == 0)
    counts = compact.compact_corpus(tmp, tmp, drop_docs, drop_words)
    compact.write_dropped(tmp, {"docs": drop_docs[drop_docs < base.num_docs],
                                "words": (drop_words[drop_words < base.vocab_size] if drop_words is not None
                                          else np.zeros(0, np.int64))})
    p3.num_docs, p3.num_tokens, p3.shards = counts["num_docs"], counts["num_tokens"], counts["shards"]
    return {**found, "expired_users": len(np.setdiff1d(expired, forgotten_ids)),
            "expired_base_users": int(np.count_nonzero(np.setdiff1d(expired, forgotten_ids) < base.num_docs)),
            "expired_urls": len(drop_words) if drop_words is not None else 0,
            "forgotten_base_users": len(forgotten_ids), "vocab_size": counts["vocab_size"]}


LOW_OVERLAP = 0.10


def _check_overlap(base: Base, refresh: dict, p1: _Pass1, doc_col: str, window: bool) -> None:
    """A base that knows none of the inputs' users is refused; one that knows few is a warning.

    In a daily refresh most of a day's users came before (a site's returning users), and new users
    are a minority; a base that knows under LOW_OVERLAP of them is more likely another site's or
    another id scheme's (hashed against raw ids, another doc_col) than the one these events follow.
    """
    users, known = refresh["input_users"], refresh["known_input_users"]
    inputs = "the inputs' window" if window else "the inputs"
    counts = (f"{known:,} of the {users:,} users in {inputs} and {p1.known_words:,} of their {p1.input_words:,} "
              f"URLs are known to it ({base.num_docs:,} users, {base.vocab_size:,} URLs)")
    if users and not known:
        raise CorpusError(f"{base.path}: --base shares no user with {inputs}: {counts}; is it an earlier corpus or "
                          f"model of these events (the same '{doc_col}')?")
    if users and known < LOW_OVERLAP * users:
        log.warning(f"{base.path}: --base knows only {known / users:.1%} of the users in {inputs}: {counts}; is "
                    "it an earlier corpus or model of these events?")


def _files_in_base(files: list[str], blocks: list[Block], events: np.ndarray, in_base: np.ndarray,
                   early: np.ndarray) -> list[dict]:
    """corpus.json's refresh.files: each input file with an event the base had, or one at or before its
    latest time (not_after_base: late data, or with a base without times perhaps the base's own), with
    its events (pass 1's) and those counts, in input order: the counts of its blocks summed."""
    position = {f: i for i, f in enumerate(files)}
    of_file = np.array([position[b.path] for b in blocks], np.int64)
    per_file = []
    for counts in (events, in_base, early):
        summed = np.zeros(len(files), np.int64)
        np.add.at(summed, of_file, counts)
        per_file.append(summed)
    return [{"file": storage.location(files[i]), "events": int(per_file[0][i]), "in_base": int(per_file[1][i]),
             "not_after_base": int(per_file[2][i])} for i in np.flatnonzero(per_file[1] + per_file[2])]


def time_unit_asked(meta: dict) -> tuple[str | None, bool]:
    """The --time-unit a corpus was prepared with (None: each file's by its numbers) and whether any of its times
    was read from numbers (where none was, the unit asked changed nothing). A corpus.json from before these two
    fields says both only in its "time_read" wording."""
    if "time_unit_asked" in meta:
        return meta["time_unit_asked"], bool(meta.get("time_numbers"))
    read = " ".join(meta.get("time_read") or {})
    unit = re.search(r"--time-unit (\w+)", read)
    return unit and unit[1], "epoch" in read or "numbers" in read


def _union(a: list | None, b: list | None) -> list | None:
    """The time range covering both (either may be None)."""
    if a is None or b is None:
        return a or b
    return [min(a[0], b[0]), max(a[1], b[1])]


