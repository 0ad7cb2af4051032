"""Bad input, as a table: what a user may give us, and what they get.

Each row is one input through the real console script (`doc2vec_dist.cli.main`, or a fresh process
where the outcome depends on no Ray running yet), or through a job's main (a row that starts with
jobs/NAME.py), and one outcome:

  error    exit 2 and exactly one line, `error: ` followed by the words given, naming the file,
           column, row or flag; no traceback; the output path named by the row does not exist
           (nothing half-written) or, for a file or folder of the user's, is byte for byte as it was
  skipped  exit 0; the corpus counts the skipped rows under the reason given (corpus.json "skipped")
  works    exit 0: an input shape that was once refused and is now read (the row says why); the path
           named by the row, if any, is byte for byte as it was
  says     exit 0, and a line of the output (stdout or stderr) starts with the words given: a warning
           or a note the command once left unsaid

README.md ("what prepare refuses") points here. `{t}` in a row is the test's temporary directory,
`{model}` a copy of the trained sample model, `{corpus}` the prepared sample corpus, `{heldout}` its
held-out pairs, `{url}` the sample's most visited URL.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import subprocess
import sys
import uuid
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import pipeline
from doc2vec_dist.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SAMPLE_EVENTS = os.path.join(ROOT, "data", "sample", "events")


@dataclass
class Case:
    name: str
    argv: str                      # the command line, {t} {model} {corpus} filled in
    outcome: str                   # "error", "skipped", "works" or "says"
    expect: str = ""               # error: the first words after "error: "; skipped: the reason counted; says: a line's start
    files: dict = field(default_factory=dict)  # name → bytes (or a callable of the tmp dir) made first
    untouched: str | None = None   # a path that must not exist, or stay as it was, after an error
    fresh_process: bool = False    # run `python -m doc2vec_dist` in a new process (no Ray started in it)
    bare_python: bool = False      # run argv (a job script) with this Python less its site-packages (-S)


def _truncated_parquet(t: str) -> bytes:
    source = os.path.join(SAMPLE_EVENTS, min(os.listdir(SAMPLE_EVENTS)))
    with open(source, "rb") as fh:
        return fh.read()[:300]


def _users_parquet(t: str) -> bytes:
    path = os.path.join(t, "_made.parquet")
    pq.write_table(pa.table({"note": ["not ours"]}), path)
    with open(path, "rb") as fh:
        data = fh.read()
    os.remove(path)
    return data


def _generate_output(t: str) -> None:
    assert main(["generate", "--users", "60", "--urls", "40", "--out", os.path.join(t, "gen"), "--no-progress"]) == 0


def _sample_urls() -> list[str]:
    """The sample's URLs, most visited first."""
    urls = pq.read_table(SAMPLE_EVENTS, columns=["url"]).column("url")
    counts = pc.value_counts(urls).to_pylist()
    return [c["values"] for c in sorted(counts, key=lambda c: (-c["counts"], c["values"]))]


SAMPLE_URL = _sample_urls()[0]


def _new_page(url: str, name: str = "a-page-first-seen-today") -> str:
    """A page of the sample URL's site that the sample never visited."""
    scheme, rest = url.split("://", 1)
    return f"{scheme}://{rest.partition('/')[0]}/{name}"


NEW_PAGE = _new_page(SAMPLE_URL)
NEW_PAGES = [_new_page(u, "first-seen-today") for u in _sample_urls()[:3]]


def _written_otherwise(url: str) -> str:
    """A sample URL as another log writes the same page: its scheme and host upper-cased, a slash after it."""
    scheme, rest = url.split("://", 1)
    host, _, path = rest.partition("/")
    return f"{scheme.upper()}://{host.upper()}/{path}" + ("/" if path else "")


def _model_of(t: str) -> str:
    return os.path.join(os.path.dirname(t), "model")  # where test_bad_input copies the trained model


def _other_model_index(t: str) -> None:
    """{t}/other: the sample trained again (a copy of {model} given an id of its own), and its index {t}/other.index."""
    other = shutil.copytree(_model_of(t), os.path.join(t, "other"))
    with open(os.path.join(other, "LATEST")) as fh:
        manifest_path = os.path.join(other, "checkpoints", fh.read().strip(), "manifest.json")
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    manifest["model_id"] = uuid.uuid4().hex
    with open(manifest_path, "w") as fh:
        json.dump(manifest, fh)
    assert main(["index", "--model", other, "--out", os.path.join(t, "other.index"), "--no-progress"]) == 0


def _older_index(t: str) -> None:
    """{t}/users.index: an index of {model} built from its v9 (the model's latest is v10)."""
    index = os.path.join(t, "users.index")
    assert main(["index", "--model", _model_of(t), "--out", index, "--no-progress"]) == 0
    with open(os.path.join(index, "params.json")) as fh:
        params = json.load(fh)
    params["provenance"]["version"] = 9
    with open(os.path.join(index, "params.json"), "w") as fh:
        json.dump(params, fh)


def _inferred(t: str) -> None:
    """{t}/inferred.parquet: the vector `infer` gives user `newcomer`, who visited five of the sample's URLs, and
    the null vector it writes for `stranger`, whose one URL the model never saw."""
    events = os.path.join(t, "_new.csv")
    with open(events, "w") as fh:
        fh.write("user_id,url\n" + "".join(f"newcomer,{url}\n" for url in _sample_urls()[10:15])
                 + "stranger,https://never.example/\n")
    assert main(["infer", "--model", _model_of(t), events, "--out", os.path.join(t, "inferred.parquet"),
                 "--no-progress"]) == 0
    os.remove(events)


OTHER_SITE_CSV = b"user_id,url\n" + b"".join(b"v%d,https://elsewhere.example/%d\n" % (i % 30, i % 70)
                                              for i in range(400))


def _foreign_forget_list(t: str) -> None:
    """{model}/forget.arrow: a forget list made for another model (copied there by hand)."""
    from doc2vec_dist.forgotten import FILE, ForgetList

    ForgetList(model_ids=[uuid.uuid4().hex]).write(os.path.join(_model_of(t), FILE))


def _parquet_bytes(columns: dict):
    """A file maker (Case.files): Parquet of these columns, as bytes."""
    def make(t: str) -> bytes:
        sink = pa.BufferOutputStream()
        pq.write_table(pa.table(columns), sink)
        return sink.getvalue().to_pybytes()
    return make


SOME_USERS = ["u54e266157a4c", "u0a1b", "u0c2d", "u0e3f"]


def _bot_csv(t: str) -> bytes:
    """1,000 users of 3 visits each, and a bot with 600 (17% of every visit)."""
    rows = [f"u{i},https://s.example/{(i * 7 + j) % 50}" for i in range(1000) for j in range(3)]
    rows += [f"bot,https://s.example/{j % 50}" for j in range(600)]
    return ("user_id,url\n" + "\n".join(rows) + "\n").encode()


def _sample_events(t: str) -> bytes:
    """The sample's events, which the sample corpus {corpus} holds (but its held-out pairs)."""
    with open(os.path.join(SAMPLE_EVENTS, min(os.listdir(SAMPLE_EVENTS))), "rb") as fh:
        return fh.read()


def _sample_events_csv(t: str) -> bytes:
    """A few of the sample's users' events, without their times (a refresh input with no time column)."""
    events = pq.read_table(os.path.join(SAMPLE_EVENTS, min(os.listdir(SAMPLE_EVENTS))), columns=["user_id", "url"])
    return b"user_id,url\n" + b"".join(f"{u},{w}\n".encode() for u, w in zip(
        events.column("user_id").to_pylist()[:50], events.column("url").to_pylist()[:50]))


def _new_users_events(t: str) -> bytes:
    """The sample's events twice over as new users' (none of them in {corpus}): with the sample again beside
    them, under half of all the inputs' events are the base's, so only the sample's file is mostly old."""
    sample = pq.read_table(SAMPLE_EVENTS)
    users = pc.binary_join_element_wise("new-", sample["user_id"], "")
    table = pa.concat_tables([sample.set_column(0, "user_id", pc.binary_join_element_wise(users, suffix, ""))
                              for suffix in ("-a", "-b")])
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    return sink.getvalue().to_pybytes()


GOOD_CSV = b"user_id,url\nu1,a\nu1,b\nu2,a\nu2,c\n"
GOOD_TIMED_CSV = b"user_id,url,ts\nu1,a,1793491200\nu1,b,1793491300\nu2,a,1793491200\nu2,c,1793491400\n"
CASES = [
    # --- prepare: input it cannot trust (the README's "what prepare refuses") --------------------------
    Case("missing path", "prepare {t}/nope.parquet --out {t}/c", "error", "{t}/nope.parquet: no such file or directory",
         untouched="{t}/c"),
    Case("wrong column", "prepare {t}/e.csv --out {t}/c", "error",
         "{t}/e.csv: column 'user_id' not found (columns: uid, url)", {"e.csv": b"uid,url\nu1,a\n"}, "{t}/c"),
    Case("corrupt Parquet", "prepare {t}/e.parquet --out {t}/c", "error", "{t}/e.parquet: cannot read: Parquet magic",
         {"e.parquet": b"garbage, not parquet\n"}, "{t}/c"),
    Case("truncated Parquet", "prepare {t}/e.parquet --out {t}/c", "error", "{t}/e.parquet: cannot read: ",
         {"e.parquet": _truncated_parquet}, "{t}/c"),
    Case("empty file only", "prepare {t}/e.csv --out {t}/c", "error", "{t}/e.csv: the inputs hold no rows",
         {"e.csv": b""}, "{t}/c"),
    Case("header-only file only", "prepare {t}/e.csv --out {t}/c", "error", "{t}/e.csv: the inputs hold no rows",
         {"e.csv": b"user_id,url\n"}, "{t}/c"),
    Case("empty file among good ones", "prepare {t}/good.csv {t}/e.csv --out {t}/c", "skipped", "empty_files",
         {"good.csv": GOOD_CSV, "e.csv": b""}),
    Case("invalid UTF-8 in a used column", "prepare {t}/e.csv --out {t}/c", "error",
         "{t}/e.csv: column 'user_id' row 0 is not valid UTF-8", {"e.csv": b"user_id,url\n\xff\xfe,a\n"}, "{t}/c"),
    Case("null user ids", "prepare {t}/e.csv --out {t}/c", "skipped", "null_keys",
         {"e.csv": GOOD_CSV + b",a\n"}),
    Case("holdout >= 1", "prepare {t}/good.csv --out {t}/c --holdout 1 --holdout-out {t}/h.parquet", "error",
         "holdout must lie in [0, 1), not 1.0", {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("min-count 0", "prepare {t}/good.csv --out {t}/c --min-count 0", "error", "min_count must be >= 1, not 0",
         {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("a training flag given to prepare", "prepare {t}/good.csv --out {t}/c --dim 50", "error",
         "--dim is a training option", {"good.csv": GOOD_CSV}, "{t}/c"),
    # item 7: the directory `generate` wrote
    Case("prepare the directory generate wrote", "prepare {t}/gen --out {t}/c", "works",
         files={"gen": _generate_output}),
    # item 8: ids that are strings in some JSON rows and numbers in others
    Case("JSON ids of mixed type", "prepare {t}/e.jsonl --out {t}/c", "works",
         files={"e.jsonl": b'{"user_id": "a1", "url": "x"}\n{"user_id": 100000, "url": 7}\n'}),
    # --- issue 26, item 1: time units; item 3: a base that fits no input; item 12: delimiter, whitespace --
    # epoch milliseconds over 4 hours: a 2-day window keeps them all (it kept the last 172.8 s)
    Case("epoch milliseconds with --window-days", "prepare {t}/e.csv.gz --out {t}/c --time-col ts --window-days 2",
         "works", files={"e.csv.gz": gzip.compress(b"user_id,url,ts\nu1,a,1793491200000\nu1,b,1793498400000\n"
                                                   b"u2,a,1793505600000\n")}),
    Case("ISO times and epoch milliseconds in two files", "prepare {t}/a.csv {t}/b.csv --out {t}/c --time-col ts",
         "works", files={"a.csv": b"user_id,url,ts\nu1,a,2026-10-31T00:00:00Z\n",
                         "b.csv": b"user_id,url,ts\nu1,b,1793491100000\n"}),
    Case("a file in two time units", "prepare {t}/e.csv --out {t}/c --time-col ts", "error",
         "{t}/e.csv: column 'ts' row 2 holds 1793491300, epoch seconds by its size, but the file's times are epoch "
         "milliseconds by their size", {"e.csv": b"user_id,url,ts\nu1,a,1793491200000\nu1,b,1793491250000\n"
                                                 b"u2,a,1793491300\n"}, "{t}/c"),
    Case("sequence numbers with --window-days", "prepare {t}/e.csv --out {t}/c --time-col ts --window-days 2", "error",
         "{t}/e.csv: column 'ts' row 0 holds 1: these numbers are no epoch time",
         {"e.csv": b"user_id,url,ts\nu1,a,1\nu1,b,2\n"}, "{t}/c"),
    Case("sequence numbers beside epoch times", "prepare {t}/a.csv {t}/b.csv --out {t}/c --time-col ts", "error",
         "{t}/b.csv: column 'ts' read as epoch milliseconds (detected), but {t}/a.csv's as numbers that only order",
         {"a.csv": b"user_id,url,ts\nu1,a,1\n", "b.csv": b"user_id,url,ts\nu1,b,1793491100000\n"}, "{t}/c"),
    Case("--time-unit that the numbers do not fit", "prepare {t}/e.csv --out {t}/c --time-col ts --time-unit s",
         "error", "{t}/e.csv: column 'ts' row 0 holds 1793491200000, which in epoch seconds (--time-unit s) lies after "
         "the year 5000; its size says epoch milliseconds (--time-unit ms)",
         {"e.csv": b"user_id,url,ts\nu1,a,1793491200000\n"}, "{t}/c"),
    Case("--time-unit without --time-col", "prepare {t}/good.csv --out {t}/c --time-unit ms", "error",
         "--time-unit needs a time column (--time-col)", {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("--base (a corpus) that knows no user of the inputs", "prepare {t}/good.csv --out {t}/c --base {corpus} "
         "--time-col ts", "error", "{corpus}: --base shares no user with the inputs: 0 of the 2 users in the inputs",
         {"good.csv": GOOD_TIMED_CSV}, "{t}/c"),
    Case("--base (a model) that knows no user of the inputs", "prepare {t}/good.csv --out {t}/c --base {model} "
         "--time-col ts", "error", "{model}: --base shares no user with the inputs: 0 of the 2 users in the inputs",
         {"good.csv": GOOD_TIMED_CSV}, "{t}/c"),
    Case("--base that keeps event times, without --time-col (events sent again were joined twice, exit 0)",
         "prepare {t}/good.csv --out {t}/c --base {corpus}", "error", "{corpus}: keeps its events' times (column "
         "'ts'), and {t}/good.csv has that column, but this refresh has no --time-col: an event sent again would be "
         "joined a second time and a late one put last, and the new corpus would keep no times; give --time-col ts",
         {"good.csv": GOOD_TIMED_CSV}, "{t}/c"),
    Case("--base that keeps event times, with inputs that have none", "prepare {t}/e.csv --out {t}/c --base {corpus}",
         "says", "warning: {corpus}: keeps its events' times (column 'ts'), and {t}/e.csv has none: events sent again "
         "cannot be told from new ones", {"e.csv": _sample_events_csv}),
    Case("semicolon-separated CSV with --delimiter", "prepare {t}/e.csv --out {t}/c --delimiter ;", "works",
         files={"e.csv": GOOD_CSV.replace(b",", b";")}),
    Case("semicolon-separated CSV without --delimiter", "prepare {t}/e.csv --out {t}/c", "error",
         "{t}/e.csv: column 'user_id' not found (columns: user_id;url) (a header of one column: are the fields "
         "separated by ';'? give --delimiter ';')", {"e.csv": GOOD_CSV.replace(b",", b";")}, "{t}/c"),
    Case("--delimiter of two characters", "prepare {t}/good.csv --out {t}/c --delimiter ;;", "error",
         "--delimiter must be one character", {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("user ids and URLs with edge spaces (stripped, counted)", "prepare {t}/e.csv --out {t}/c", "works",
         files={"e.csv": b"user_id,url\nu1 ,a\n u1, a\nu2,a \n"}),
    # --- where outputs go (item 1) ----------------------------------------------------------------------
    Case("prepare into a folder of the user's", "prepare {t}/good.csv --out {t}/mine --overwrite", "error",
         "{t}/mine: exists and is not a corpus made by doc2vec-dist (it holds keep.txt)",
         {"good.csv": GOOD_CSV, "mine/keep.txt": b"mine"}, "{t}/mine"),
    Case("prepare into a model", "prepare {t}/good.csv --out {model} --overwrite", "error",
         "{model}: holds a model (made by doc2vec-dist train or baseline), not a corpus", {"good.csv": GOOD_CSV},
         "{model}"),
    Case("prepare over a corpus without --overwrite", "prepare {t}/good.csv --out {corpus}", "error",
         "{corpus}: already holds a corpus; pass --overwrite to replace it", {"good.csv": GOOD_CSV}, "{corpus}"),
    Case("train into a folder of the user's", "train --corpus {corpus} --out {t}/mine --overwrite", "error",
         "{t}/mine: exists and is not a model made by doc2vec-dist (it holds notes.txt)",
         {"mine/notes.txt": b"mine"}, "{t}/mine"),
    Case("train into a non-empty folder, no --overwrite", "train --corpus {corpus} --out {t}/mine", "error",
         "{t}/mine: exists and is not a model made by doc2vec-dist (it holds notes.txt)",
         {"mine/notes.txt": b"mine"}, "{t}/mine"),
    Case("train over a model without --overwrite", "train --corpus {corpus} --out {model}", "error",
         "{model}: already holds a model; pass --overwrite to replace it", untouched="{model}"),
    # issue 47, item 1: jobs/train.py --input writes beside --out, and reuses no corpus prepared otherwise
    Case("jobs/train.py --input without --out", "jobs/train.py --input {t}/e.parquet", "error",
         "--input needs --out MODEL_DIR", {"e.parquet": _users_parquet}),
    Case("jobs/train.py on a corpus prepared from other inputs", "jobs/train.py --input {t}/e.parquet --corpus {corpus} "
         "--out {t}/m --overwrite", "error", "{corpus}: prepared from other inputs ({sample_events}), not {t}/e.parquet",
         {"e.parquet": _users_parquet}, "{corpus}"),
    Case("export over a Parquet file of the user's", "export --model {model} --out {t}/mynotes.parquet", "error",
         "{t}/mynotes.parquet: exists and is not a file doc2vec-dist wrote",
         {"mynotes.parquet": _users_parquet}, "{t}/mynotes.parquet"),
    Case("export word2vec over a text file of the user's", "export --model {model} --format word2vec --out {t}/n.txt",
         "error", "{t}/n.txt: exists and is not a file doc2vec-dist wrote", {"n.txt": b"my notes\n"}, "{t}/n.txt"),
    Case("export word2vec over another tool's word2vec file (its 'rows dim' header was taken for ours)",
         "export --model {model} --format word2vec --out {t}/pretrained.vec", "error",
         "{t}/pretrained.vec: exists and is not a file doc2vec-dist wrote", {"pretrained.vec": b"2 3\na 1 2 3\nb 4 5 6\n"},
         "{t}/pretrained.vec"),
    Case("index into a folder of the user's", "index --model {model} --out {t}/mine", "error",
         "{t}/mine: exists and is not a faiss index made by doc2vec-dist (it holds keep.txt)",
         {"mine/keep.txt": b"mine"}, "{t}/mine"),
    Case("neighbors --out over a file of the user's", "neighbors --model {model} --key u54e266157a4c --out {t}/n.parquet",
         "error", "{t}/n.parquet: exists and is not a file doc2vec-dist wrote", {"n.parquet": _users_parquet},
         "{t}/n.parquet"),
    # --- training flags and configs ---------------------------------------------------------------------
    Case("dim 0", "train --corpus {corpus} --out {t}/m --dim 0", "error", "bad training config: dim must be > 0",
         untouched="{t}/m"),
    Case("epochs 0", "train --corpus {corpus} --out {t}/m --epochs 0", "error",
         "bad training config: epochs must be > 0", untouched="{t}/m"),
    Case("negative < 0", "train --corpus {corpus} --out {t}/m --negative -1", "error",
         "bad training config: negative must be > 0", untouched="{t}/m"),
    Case("dim and vector-size disagree", "train --corpus {corpus} --out {t}/m --dim 60 --vector-size 50", "error",
         "--dim and --vector-size (gensim's name) are one setting", untouched="{t}/m"),
    Case("min-count given to train", "train --corpus {corpus} --out {t}/m --min-count 2", "error",
         "--min-count is a prepare option (the vocabulary is fixed when the corpus is made)", untouched="{t}/m"),
    Case("an engine flag given to baseline", "baseline --corpus {corpus} --out {t}/m --num-ps 2", "error",
         "--num-ps is a doc2vec-dist engine option; gensim's baseline does not use it", untouched="{t}/m"),
    Case("config YAML with an unknown key", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: unknown config key(s): epochz (did you mean 'epochs'?)", {"c.yaml": b"epochz: 3\n"}, "{t}/m"),
    Case("config YAML with a wrong type", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: bad value for dim: 'abc' (a whole number expected)", {"c.yaml": b"dim: abc\n"}, "{t}/m"),
    Case("corpus that is not one", "train --corpus {t} --out {t}/m", "error",
         "{t}: not a corpus (no corpus.json; make one with `prepare`)", untouched="{t}/m"),
    Case("resume where nothing was trained", "train --corpus {corpus} --out {t}/e --resume", "error",
         "{t}/e: not a trained model (no LATEST file)", {"e/.keep": b""}),
    # --- resources, refused before Ray starts (item 5): a fresh process, as a user runs it ---------------
    Case("more servers than the machine holds", "train --corpus {corpus} --out {t}/m --num-ps 50", "error",
         "50 parameter servers x 0.50 GiB", untouched="{t}/m", fresh_process=True),
    Case("more workers than CPUs", "train --corpus {corpus} --out {t}/m --num-workers 100", "error",
         "100 workers need 200 CPU but the Ray cluster has", untouched="{t}/m", fresh_process=True),
    # --- issue 26, items 7, 8, 9, 10 and 13 ------------------------------------------------------------
    # item 7: gensim's habits, as flags and as YAML keys
    Case("min_count in a train YAML", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: min_count is a prepare option (the vocabulary is fixed when the corpus is made); run "
         "doc2vec-dist prepare INPUT... --out CORPUS --min-count 50", {"c.yaml": b"min_count: 50\n"}, "{t}/m"),
    Case("gensim's dm in a train YAML", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: dm is gensim's name; doc2vec-dist uses mode: dm (or mode: dbow)", {"c.yaml": b"dm: 1\n"},
         "{t}/m"),
    Case("--dbow_words 1", "train --corpus {corpus} --out {t}/m --dbow_words 1", "error",
         "--dbow_words: flags are spelled with dashes here, and --dbow-words is a switch that takes no value: write "
         "--dbow-words to turn it on", untouched="{t}/m"),
    Case("gensim's --sg on train", "train --corpus {corpus} --out {t}/m --sg 1", "error",
         "--sg is gensim's name; doc2vec-dist train uses --mode dbow", untouched="{t}/m"),
    # item 13: a value of the wrong type, in YAML and on the command line
    Case("dim: 100.7 in YAML", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: bad value for dim: 100.7 (a whole number expected)", {"c.yaml": b"dim: 100.7\n"}, "{t}/m"),
    Case("dim: true in YAML", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: bad value for dim: True (a whole number expected)", {"c.yaml": b"dim: true\n"}, "{t}/m"),
    Case("overwrite: ture in YAML", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: bad value for overwrite: 'ture' (true or false expected)", {"c.yaml": b"overwrite: ture\n"},
         "{t}/m"),
    Case("--overwrite given a value", "train --corpus {corpus} --out {model} --overwrite ture", "error",
         "--overwrite is a switch and takes no value (given 'ture')", untouched="{model}"),
    # item 8: a flag that contradicts the --init-from model's shape (the sample model has dim 32)
    Case("--init-from with another --dim", "train --corpus {corpus} --out {t}/m --init-from {model} --dim 50", "error",
         "--dim 50 contradicts the --init-from model {model}, trained with dim 32", untouched="{model}"),
    # item 9: a worker no node of the session's 2-CPU Ray (no autoscaler) can hold
    Case("a worker larger than any node", "train --corpus {corpus} --out {t}/m --cpus-per-worker 3", "error",
         "a worker asks for 3 CPU, and no node has that much: ", untouched="{t}/m"),
    # item 10: a job run by a Python without the project's packages (a head started outside the venv)
    Case("a job run by a Python without the packages", "jobs/train.py --corpus {corpus} --out {t}/m", "error",
         "this Python (", untouched="{t}/m", bare_python=True),
    # --- damaged models ---------------------------------------------------------------------------------
    Case("a part file truncated (export)", "export --model {model} --out {t}/u.parquet", "error",
         "{model}/checkpoints/v10/docs/part-00000-of-00002.arrow: 1000 bytes, the manifest says",
         {"@truncate": "docs"}, "{t}/u.parquet"),
    Case("a part file truncated (neighbors)", "neighbors --model {model} --key u54e266157a4c", "error",
         "{model}/checkpoints/v10/docs/part-00000-of-00002.arrow: 1000 bytes, the manifest says",
         {"@truncate": "docs"}),
    Case("a corpus shard truncated (train)", "train --corpus {corpus} --out {t}/m", "error",
         "training stopped: {corpus}/shards/part-00000.arrow: cannot read shard", {"@shard": 1},
         "{t}/m"),
    Case("a corpus shard truncated (baseline)", "baseline --corpus {corpus} --out {t}/m", "error",
         "{corpus}/shards/part-00000.arrow: cannot read shard", {"@shard": 1}, "{t}/m"),
    # issue 47, item 8: resume verifies its version first; a damaged LATEST falls back to the newest intact one
    Case("resume with a part of the latest checkpoint missing", "train --corpus {corpus} --out {model} --resume",
         "says", "warning: {model}: checkpoint v10 is damaged (docs/part-00001-of-00002.arrow: part file missing); "
         "resuming from v9, the newest intact version", {"@delete": "docs"}),
    Case("--resume-from a damaged version", "train --corpus {corpus} --out {model} --resume-from v10", "error",
         "{model}: checkpoint v10 is damaged (docs/part-00001-of-00002.arrow: part file missing); resume from v9, the "
         "newest intact version, with --resume-from v9", {"@delete": "docs"}, "{model}"),
    Case("--resume-from a version the model does not keep", "train --corpus {corpus} --out {model} --resume-from v3",
         "error", "{model}: --resume-from v3: no such checkpoint (it keeps v9, v10)", untouched="{model}"),
    Case("--resume-from that is no version", "train --corpus {corpus} --out {model} --resume-from latest", "error",
         "bad training config: resume_from must be a checkpoint version like v9, not 'latest'", untouched="{model}"),
    # issue 47, item 6: one writer per model directory
    Case("train --overwrite into a model another run writes", "train --corpus {corpus} --out {model} --overwrite",
         "error", "{model} is being written by another run (host ", {"@locked": ""}, "{model}"),
    Case("baseline --overwrite into a model another run writes", "baseline --corpus {corpus} --out {model} --overwrite",
         "error", "{model} is being written by another run (host ", {"@locked": ""}, "{model}"),
    Case("resume a model whose last run was killed (its lock left behind)", "train --corpus {corpus} --out {model} "
         "--resume --epochs 11", "says", "warning: {model}: taking over the lock of a run that is gone (host ",
         {"@killed-writer": ""}),
    Case("LATEST naming a missing version", "export --model {model} --out {t}/u.parquet", "error",
         "{model}/checkpoints/v99/manifest.json: missing; v99 is not a committed checkpoint",
         {"@latest": "v99"}, "{t}/u.parquet"),
    # --- issue 26, items 2, 3 (infer) and 12 (evaluate's sample, npy files, --vectors, a URL as a user) ---
    Case("neighbors with an index of another model", "neighbors --model {model} --index {t}/other.index --key "
         "u54e266157a4c", "error", "{t}/other.index was made from the model at {t}/other (id ",
         {"other": _other_model_index}),
    Case("index --update of another model's index", "index --update {t}/other.index --model {model} --out "
         "{t}/other.index", "error", "{t}/other.index was made from the model at {t}/other (id ",
         {"other": _other_model_index}, "{t}/other.index"),
    Case("neighbors with an index older than the model", "neighbors --model {model} --index {t}/users.index --key "
         "u54e266157a4c", "says", "warning: {t}/users.index was made from the model at {model} (id ",
         {"users.index": _older_index}),
    Case("infer with events of another site", "infer --model {model} {t}/e.csv --out {t}/u.parquet", "error",
         "{t}/e.csv: none of the 400 events has a URL the model knows", {"e.csv": OTHER_SITE_CSV}, "{t}/u.parquet"),
    Case("infer with events that barely fit", "infer --model {model} {t}/e.csv --out {t}/u.parquet", "says",
         "warning: only 4.8% of the events (20 of 420) have a URL the model knows",
         {"e.csv": OTHER_SITE_CSV + b"".join(b"v1,%s\n" % u.encode() for u in _sample_urls()[:20])}),
    Case("evaluate samples the users", "evaluate --model {model} --heldout {heldout} --max-users 100", "says",
         "sampled 100 of the "),
    Case("export npy to a path ending in .npy", "export --model {model} --format npy --out {t}/users.npy", "says",
         "exported 5,000 rows of docs to {t}/users.npy (keys in {t}/users.keys.parquet)"),
    Case("export parquet to a path ending in .npy", "export --model {model} --out {t}/users.npy", "error",
         "{t}/users.npy: ends in .npy, but --format is parquet; give --format npy", untouched="{t}/users.npy"),
    Case("neighbors of a user that infer wrote", "neighbors --model {model} --vectors {t}/inferred.parquet --key "
         "newcomer", "says", "newcomer\t", {"inferred.parquet": _inferred}),
    Case("neighbors --vectors with a key not in the file", "neighbors --model {model} --vectors {t}/inferred.parquet "
         "--key nobody", "error", "unknown {t}/inferred.parquet key 'nobody'", {"inferred.parquet": _inferred}),
    # --- a user's review, round four: rows that were read as something else, with exit 0 ------------------------
    Case("evaluate --labels with a key given twice (it voted twice)", "evaluate --model {model} --labels {t}/l.parquet",
         "error", "{t}/l.parquet: key 'u0a1b' (column 'key') is in rows 1 and 4; 1 key(s) are given more than once",
         {"l.parquet": _parquet_bytes({"key": SOME_USERS + ["u0a1b"], "label": ["a", "b", "a", "b", "a"]})}),
    Case("evaluate --labels with a null label", "evaluate --model {model} --labels {t}/l.parquet", "error",
         "{t}/l.parquet: row 2 has no 'label' (1 row(s) are null there)",
         {"l.parquet": _parquet_bytes({"key": SOME_USERS, "label": ["a", "b", None, "b"]})}),
    Case("evaluate --pairs with a null score (it printed pearson nan)", "evaluate --model {model} --pairs "
         "{t}/p.parquet", "error", "{t}/p.parquet: row 1 has no 'score' (1 row(s) are null there)",
         {"p.parquet": _parquet_bytes({"key1": SOME_USERS[:3], "key2": SOME_USERS[1:], "score": [0.5, None, 0.1]})}),
    Case("evaluate --pairs with a NaN score", "evaluate --model {model} --pairs {t}/p.parquet", "error",
         "{t}/p.parquet: row 2 has score nan (1 row(s) are not finite numbers)",
         {"p.parquet": _parquet_bytes({"key1": SOME_USERS[:3], "key2": SOME_USERS[1:], "score": [0.5, 0.2, float("nan")]})}),
    Case("evaluate --pairs with a pair twice, the other way round", "evaluate --model {model} --pairs {t}/p.parquet",
         "error", "{t}/p.parquet: pair 'u0a1b / u54e266157a4c' (key1 / key2, either way round) is in rows 0 and 3",
         {"p.parquet": _parquet_bytes({"key1": SOME_USERS[:3] + ["u0a1b"], "key2": SOME_USERS[1:] + ["u54e266157a4c"],
                                       "score": [0.5, 0.2, 0.1, 0.4]})}),
    Case("evaluate --pairs with a null key (it was the user 'None')", "evaluate --model {model} --pairs {t}/p.parquet",
         "error", "{t}/p.parquet: row 0 has no 'key1' (1 row(s) are null there)",
         {"p.parquet": _parquet_bytes({"key1": pa.array([None, "u0a1b"], pa.string()), "key2": SOME_USERS[2:],
                                       "score": [0.5, 0.2]})}),
    # flags of another evaluation were ignored, exit 0 (a review of evaluate's modes)
    Case("evaluate --heldout with --pairs (the pairs were never scored)", "evaluate --model {model} --heldout "
         "{t}/h.parquet --pairs {t}/p.parquet", "error", "give one of --heldout FILE, --pairs FILE or --labels FILE, "
         "not --heldout and --pairs"),
    Case("evaluate --pairs with --k (recall@k's, not a correlation's)", "evaluate --model {model} --pairs "
         "{t}/p.parquet --k 3", "error", "--k is for --heldout and --labels, not --pairs: leave it out"),
    Case("evaluate --pairs with --label-col", "evaluate --model {model} --pairs {t}/p.parquet --label-col x",
         "error", "--label-col is for --labels, not --pairs: leave it out"),
    Case("evaluate --labels --test-fraction 0 (it ran at 0.2)", "evaluate --model {model} --labels {t}/l.parquet "
         "--test-fraction 0", "error", "--test-fraction must lie between 0 and 1, not 0"),
    Case("neighbors --keys-file with a null key (it was the user 'None')", "neighbors --model {model} --keys-file "
         "{t}/k.parquet", "error", "{t}/k.parquet: row 1 has no 'key' (1 row(s) are null there)",
         {"k.parquet": _parquet_bytes({"key": pa.array(["u54e266157a4c", None], pa.string())})}),
    Case("an infinite time (it was stored, and --window-days said no event has a time)", "prepare {t}/e.csv --out "
         "{t}/c --time-col ts", "error", "{t}/e.csv: column 'ts' row 1 holds inf, which is no time",
         {"e.csv": b"user_id,url,ts\nu1,a,1793491200\nu1,b,inf\nu2,a,-inf\n"}, "{t}/c"),
    Case("a NaN user id in a float column (it was the user 'nan')", "prepare {t}/e.parquet --out {t}/c", "skipped",
         "null_keys", {"e.parquet": _parquet_bytes({"user_id": [1.0, float("nan"), 3.0], "url": ["a", "b", "a"]})}),
    Case("an infinite user id in a float column", "prepare {t}/e.parquet --out {t}/c", "error",
         "{t}/e.parquet: column 'user_id' row 2 holds inf, which is no id",
         {"e.parquet": _parquet_bytes({"user_id": [1.0, 2.0, float("inf")], "url": ["a", "b", "a"]})}, "{t}/c"),
    Case("neighbors of a URL without --table words_out", "neighbors --model {model} --key {url}", "error",
         "unknown docs key '{url}': it is a URL of the model's vocabulary, not a user; add --table words_out"),
    # --- issue 26, items 4, 5 and 14: read-only and full disks, temporary names ----------------------------
    # {t}/ro: an empty read-only tmpfs ("@ro"), or one holding a copy of the model ("@ro-model"); {t}/full: a
    # tmpfs filled up by a file of the user's ("@full"), beside a copy of the model ("@full-model")
    Case("prepare into a read-only mount", "prepare {t}/good.csv --out {t}/ro/c", "error",
         "cannot write to {t}/ro/c: read-only file system", {"good.csv": GOOD_CSV, "@ro": ""}, "{t}/ro/c"),
    Case("train into a read-only mount", "train --corpus {corpus} --out {t}/ro/m", "error",
         "cannot write to {t}/ro/m: read-only file system", {"@ro": ""}, "{t}/ro/m", fresh_process=True),
    Case("resume a model on a read-only mount", "train --corpus {corpus} --out {t}/ro/model --resume --epochs 11",
         "error", "cannot write to {t}/ro/model: read-only file system", {"@ro-model": ""}, "{t}/ro/model"),
    Case("baseline into a read-only mount", "baseline --corpus {corpus} --out {t}/ro/m", "error",
         "cannot write to {t}/ro/m: read-only file system", {"@ro": ""}, "{t}/ro/m"),
    Case("export into a read-only mount", "export --model {model} --out {t}/ro/u.parquet", "error",
         "cannot write to {t}/ro/u.parquet: read-only file system", {"@ro": ""}, "{t}/ro/u.parquet"),
    Case("index into a read-only mount", "index --model {model} --out {t}/ro/i", "error",
         "cannot write to {t}/ro/i: read-only file system", {"@ro": ""}, "{t}/ro/i"),
    Case("infer into a read-only mount", "infer --model {model} {t}/good.csv --out {t}/ro/v.parquet", "error",
         "cannot write to {t}/ro/v.parquet: read-only file system", {"good.csv": GOOD_CSV, "@ro": ""},
         "{t}/ro/v.parquet"),
    Case("generate into a read-only mount", "generate --users 10 --urls 10 --out {t}/ro/g", "error",
         "cannot write to {t}/ro/g: read-only file system", {"@ro": ""}, "{t}/ro/g"),
    Case("neighbors --out into a read-only mount", "neighbors --model {model} --key u54e266157a4c --out {t}/ro/n.parquet",
         "error", "cannot write to {t}/ro/n.parquet: read-only file system", {"@ro": ""}, "{t}/ro/n.parquet"),
    Case("plan --json into a read-only mount", "plan --corpus {corpus} --no-calibrate --json {t}/ro/p.json", "error",
         "cannot write to {t}/ro/p.json: read-only file system", {"@ro": ""}, "{t}/ro/p.json"),
    Case("tune into a read-only mount", "tune --corpus {corpus} --heldout {heldout} --out {t}/ro/s", "error",
         "cannot write to {t}/ro/s: read-only file system", {"@ro": ""}, "{t}/ro/s"),
    Case("evaluate a model on a read-only mount (its figures are printed first)",
         "evaluate --model {t}/ro/model --heldout {heldout}", "error",
         "cannot write to {t}/ro/model/eval-heldout.json: read-only file system; the figures above are not saved",
         {"@ro-model": ""}, "{t}/ro/model"),
    Case("train onto a full disk", "train --corpus {corpus} --out {t}/full/m", "error",
         "{t}/full/m: 0.0 MiB free on its disk, and the first checkpoint needs about 4.3 MiB", {"@full": ""},
         "{t}/full/m"),
    Case("resume on a full disk", "train --corpus {corpus} --out {t}/full/model --resume --epochs 11", "error",
         "{t}/full/model: 0.0 MiB free on its disk, and the next checkpoint needs about 1.3 MiB; the model stays at "
         "checkpoint v10", {"@full-model": ""}, "{t}/full/model"),
    Case("prepare beside a temporary name another machine's process holds", "prepare {t}/good.csv --out {t}/c",
         "works", files={"good.csv": GOOD_CSV, f"c.tmp-{os.getpid()}/theirs.arrow": b"being written elsewhere"},
         untouched=f"{{t}}/c.tmp-{os.getpid()}"),
    # --- issue 26, item 11: tune --searcher optuna draws every setting, so a grid has no meaning there ----
    Case("tune --searcher optuna with a grid", "tune --corpus {corpus} --heldout {heldout} --out {t}/s --space "
         "{t}/g.yaml --searcher optuna", "error", "{t}/g.yaml: alpha: grid is not searched by --searcher optuna",
         {"g.yaml": b"alpha: {grid: [0.01, 0.05]}\nepochs: 2\n"}, "{t}/s"),
    Case("tune --space with an unknown setting", "tune --corpus {corpus} --heldout {heldout} --out {t}/s --space "
         "{t}/g.yaml", "error", "{t}/g.yaml: 'epochz' is not a training setting (TrainConfig field); did you mean "
         "'epochs'?", {"g.yaml": b"epochz: {choice: [1, 2]}\n"}, "{t}/s"),
    # --- issue 30: prepare --parallel, and its inputs on object storage ----------------------------------
    Case("prepare --parallel below 0", "prepare {t}/good.csv --out {t}/c --parallel -1", "error",
         "--parallel must be >= 0 (0: a task per CPU of the Ray cluster), not -1", {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("prepare from a storage scheme pyarrow has no filesystem for", "prepare nosuch://bucket/events --out {t}/c",
         "error", "nosuch://bucket/events: cannot open this storage location", untouched="{t}/c"),
    # --- issue 30, Ray Data: --engine data --------------------------------------------------------------
    Case("prepare --engine data in one process", "prepare {t}/good.csv --out {t}/c --engine data", "error",
         "--engine data runs pass 2 on Ray: give --parallel N (N > 1, or 0: a task per CPU)",
         {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("prepare --engine spark", "prepare {t}/good.csv --out {t}/c --engine spark --parallel 2", "error",
         "bad value for --engine: 'spark' (choose from tasks, data)", {"good.csv": GOOD_CSV}, "{t}/c"),
    # --- issue 29, item 1: --dtype and --rounding (16-bit tables) --------------------------------------
    Case("--dtype float64", "train --corpus {corpus} --out {t}/m --dtype float64", "error",
         "bad value for --dtype: 'float64' (choose from float32, bfloat16, float16)", untouched="{t}/m"),
    Case("dtype: half in a train YAML", "train --corpus {corpus} --out {t}/m --config {t}/c.yaml", "error",
         "{t}/c.yaml: bad value for dtype: 'half' (choose from float32, bfloat16, float16)",
         {"c.yaml": b"dtype: half\n"}, "{t}/m"),
    Case("--rounding up", "train --corpus {corpus} --out {t}/m --dtype bfloat16 --rounding up", "error",
         "bad value for --rounding: 'up' (choose from stochastic, nearest)", untouched="{t}/m"),
    # --- issue 27: --segments ------------------------------------------------------------------------------
    Case("--segments 0", "train --corpus {corpus} --out {t}/m --num-workers 2 --segments 0", "error",
         "bad training config: segments must be > 0", untouched="{t}/m"),
    # --- issue 47: k, and users infer cannot place ---------------------------------------------------------
    Case("neighbors --k -3", "neighbors --model {model} --key u54e266157a4c --k -3", "error",
         "bad value for --k: '-3' (a whole number >= 1)"),
    Case("neighbors --k 0", "neighbors --model {model} --key u54e266157a4c --k 0", "error",
         "bad value for --k: '0' (a whole number >= 1)"),
    Case("neighbors --k 2.5", "neighbors --model {model} --key u54e266157a4c --k 2.5", "error",
         "bad value for --k: '2.5' (a whole number >= 1)"),
    Case("evaluate --k 0", "evaluate --model {model} --heldout {heldout} --k 0", "error",
         "bad value for --k: '0' (a whole number >= 1)", untouched="{model}"),
    Case("index --recall-queries 0", "index --model {model} --out {t}/i --recall-queries 0", "error",
         "bad value for --recall-queries: '0' (a whole number >= 1)", untouched="{t}/i"),
    Case("infer names the users it cannot place", "infer --model {model} {t}/e.csv --out {t}/u.parquet", "says",
         "warning: 2 users have no URL the model knows (v1, v2): their rows in {t}/u.parquet have a null vector",
         {"e.csv": b"user_id,url\nv1,https://never.example/1\n" + b"".join(b"u1,%s\n" % u.encode()
                                                                             for u in _sample_urls()[:20])
          + b"v2,https://never.example/2\n"}),
    Case("neighbors --vectors of a user infer could not place", "neighbors --model {model} --vectors "
         "{t}/inferred.parquet --key newcomer --key stranger", "says", "warning: {t}/inferred.parquet: 1 key asked has "
         "a null vector (a user infer could not place), left out of the answer: stranger",
         {"inferred.parquet": _inferred}),
    Case("index --vectors with a user infer could not place", "index --vectors {t}/inferred.parquet --out {t}/i",
         "says", "warning: {t}/inferred.parquet: 1 row with a null or all-zero vector (users infer could not place, rows never trained) left out of "
         "the index: stranger", {"inferred.parquet": _inferred}),
    # --- issue 47, item 5: URLs are normalised, by the rule the corpus or model recorded ---------------------
    Case("infer with the model's URLs written otherwise (case, a slash)", "infer --model {model} {t}/e.csv --out "
         "{t}/u.parquet", "says", "inferred 1 user vectors",
         {"e.csv": b"user_id,url\n" + b"".join(b"newcomer,%s\n" % _written_otherwise(u).encode()
                                               for u in _sample_urls()[10:15])}),
    Case("neighbors of a URL written otherwise", "neighbors --model {model} --table words_out --key "
         + _written_otherwise(SAMPLE_URL) + "#top", "says", "{url}\t"),
    # --- issue 51, part 3: vectors for URLs the model never saw ----------------------------------------------
    Case("neighbors --url of a page the model never saw", "neighbors --model {model} --url " + NEW_PAGE, "says",
         NEW_PAGE + "\t"),
    Case("neighbors --url of a site the model never saw", "neighbors --model {model} --url https://never.example/a",
         "error", "1 URL with no vector: the model knows neither it nor its host or domain (a site it never saw): "
         "https://never.example/a"),
    Case("neighbors --url and --key", "neighbors --model {model} --url {url} --key u54e266157a4c", "error",
         "give --url or --key, not both"),
    Case("neighbors --url --table docs", "neighbors --model {model} --url {url} --table docs", "error",
         "--url asks for a URL's neighbours: give --table words_out (or words), or leave --table out"),
    Case("neighbors --key of a URL the model never saw", "neighbors --model {model} --table words_out --key " + NEW_PAGE,
         "error", f"unknown words_out key '{NEW_PAGE}': the model never saw this URL; --url composes a vector for it "
         "from its path, host or domain"),
    Case("export --urls of the users' table", "export --model {model} --urls {t}/u.txt --out {t}/o.parquet", "error",
         "--urls: vectors of URLs come from a URL table: give --table words_out (or words)", {"u.txt": b"x\n"},
         "{t}/o.parquet"),
    Case("export --urls --format npy", "export --model {model} --table words_out --urls {t}/u.txt --format npy --out "
         "{t}/o", "error", "--urls writes Parquet (key, vector, source, part): leave --format out",
         {"u.txt": b"x\n"}, "{t}/o"),
    Case("export --urls of a Parquet without a url column", "export --model {model} --table words_out --urls "
         "{t}/u.parquet --out {t}/o.parquet", "error", "{t}/u.parquet: no 'url' or 'key' column (it has: note)",
         {"u.parquet": _users_parquet}, "{t}/o.parquet"),
    Case("export --urls of an empty list", "export --model {model} --table words_out --urls {t}/u.txt --out "
         "{t}/o.parquet", "error", "{t}/u.txt: no URLs in it; give one URL a line, or a Parquet or CSV file with a "
         "url column", {"u.txt": b"\n  \n"}, "{t}/o.parquet"),
    Case("infer with only pages the model never saw, of its sites", "infer --model {model} {t}/e.csv --out "
         "{t}/u.parquet", "says", "composed vectors for 3 URLs the model never saw (3 events) from their",
         {"e.csv": b"user_id,url\n" + b"".join(b"newcomer,%s\n" % u.encode() for u in NEW_PAGES)}),
    Case("infer --no-compose with only pages the model never saw", "infer --model {model} {t}/e.csv --out "
         "{t}/u.parquet --no-compose", "error", "{t}/e.csv: none of the 3 events has a URL the model knows",
         {"e.csv": b"user_id,url\n" + b"".join(b"newcomer,%s\n" % u.encode() for u in NEW_PAGES)}, "{t}/u.parquet"),
    # --- a review of infer: the flags its own messages name, and what it took without a word ----------------------
    Case("infer of a semicolon CSV with millisecond times (its error said: give --delimiter ';')", "infer --model "
         "{model} {t}/e.csv --out {t}/u.parquet --delimiter ; --time-col ts --time-unit ms", "says",
         "inferred 2 user vectors", {"e.csv": b"user_id;url;ts\n" + b"".join(
             b"%s;%s;%d\n" % (u, SAMPLE_URL.encode(), 1793491200000 + i) for i, u in enumerate([b"v1", b"v2"] * 2))}),
    Case("infer --tmp-dir that does not exist (a traceback)", "infer --model {model} {t}/good.csv --out {t}/u.parquet "
         "--tmp-dir {t}/nowhere", "error", "--tmp-dir {t}/nowhere: no such directory", {"good.csv": GOOD_CSV},
         "{t}/u.parquet"),
    Case("infer --alpha inf (every user got a null vector, exit 0)", "infer --model {model} {t}/good.csv --out "
         "{t}/u.parquet --alpha inf", "error", "alpha must be a finite number, not inf", {"good.csv": GOOD_CSV},
         "{t}/u.parquet"),
    Case("infer with an event given twice under --time-col (dropped without a count)", "infer --model {model} "
         "{t}/e.csv --out {t}/u.parquet --time-col ts", "says", "skipped while reading: duplicate_events 1",
         {"e.csv": b"user_id,url,ts\n" + b"".join(b"v1,%s,1793491200\n" % u.encode() for u in [SAMPLE_URL] * 2)}),
    Case("prepare --base with another URL rule than the base's", "prepare {t}/good.csv --base {corpus} --no-normalize "
         "--time-col ts --out {t}/c", "error", "--no-normalize: the base {corpus} was prepared with URLs normalised: "
         "scheme and host", {"good.csv": GOOD_TIMED_CSV}, "{t}/c"),
    Case("prepare --format text --drop-query", "prepare {t}/d.txt --format text --drop-query --out {t}/c", "error",
         "--drop-query applies to the URLs of --format events and lists; text tokens are taken as written",
         {"d.txt": b"a b\n"}, "{t}/c"),
    # --- issue 47: what prepare took without a word ----------------------------------------------------------
    Case("a folder of events with a README.txt and a .DS_Store", "prepare {t}/events --out {t}/c", "skipped",
         "unread_files", {"events/part-0.csv": GOOD_CSV, "events/README.txt": b"notes\n", "events/.DS_Store": b"\0",
                          "events/_SUCCESS": b""}),
    Case("events with a null time", "prepare {t}/e.csv --out {t}/c --time-col ts", "says",
         "1 event(s) with a null 'ts' (first: {t}/e.csv row 1): kept",
         {"e.csv": b"user_id,url,ts\nu1,a,1793491200\nu1,b,\nu2,a,1793491300\n"}),
    Case("a user with 17% of all visits (a bot)", "prepare {t}/e.csv --out {t}/c", "says",
         "document 'bot' ('user_id') holds 16.7% of all tokens", {"e.csv": _bot_csv}),
    Case("--max-tokens-per-doc", "prepare {t}/e.csv --out {t}/c --max-tokens-per-doc 1", "skipped",
         "tokens_beyond_max_per_doc", {"e.csv": GOOD_CSV}),
    Case("--max-tokens-per-doc 0", "prepare {t}/good.csv --out {t}/c --max-tokens-per-doc 0", "error",
         "--max-tokens-per-doc must be >= 1, not 0", {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("all the events again with --base (a cumulative export)", "prepare {t}/e.parquet --out {t}/c --base {corpus} "
         "--time-col ts", "says", "{t}/e.parquet looks like a cumulative export: ", {"e.parquet": _sample_events}),
    Case("--base prepared with --holdout (its held-out events, sent again, came back as new without a word)",
         "prepare {t}/e.parquet --out {t}/c --base {corpus} --time-col ts", "says", "warning: {corpus}: prepared with --holdout "
         "0.2, so the events it held out are not in it: sent again, they join the documents as new events",
         {"e.parquet": _sample_events}),
    Case("a cumulative export given with a larger day of new events", "prepare {t}/e.parquet {t}/new.parquet --out "
         "{t}/c --base {corpus} --time-col ts", "says", "{t}/e.parquet looks like a cumulative export: ",
         {"e.parquet": _sample_events, "new.parquet": _new_users_events}),
    # --- issue 47: plan for a cluster larger than this machine -------------------------------------------------
    Case("plan calibrating more workers than this machine holds", "plan --corpus {corpus} --num-workers 100", "error",
         "plan's calibration run cannot start here: 100 workers need 200 CPU but this machine has",
         fresh_process=True),
    Case("plan --calibrate-workers above --num-workers", "plan --corpus {corpus} --calibrate-workers 3", "error",
         "--calibrate-workers 3: give 1 to --num-workers (1)"),
    Case("plan --network-gbps 0", "plan --corpus {corpus} --no-calibrate --network-gbps 0", "error",
         "--network-gbps must be > 0 (given 0)"),
    # --- issue 52: the report page, the training log, the projector export ---------------------------------------
    Case("report over a page of the user's", "report --model {model} --out {t}/notes.html", "error",
         "{t}/notes.html: exists and is not a file doc2vec-dist wrote", {"notes.html": b"<!doctype html><p>mine</p>"},
         "{t}/notes.html"),
    Case("report of a folder that is no model", "report --model {t} --out {t}/r.html", "error",
         "{t}: not a trained model (no LATEST file)", untouched="{t}/r.html"),
    Case("report with held-out pairs that are not there", "report --model {model} --heldout {t}/nope.parquet "
         "--out {t}/r.html", "error", "{t}/nope.parquet: cannot read held-out pairs", untouched="{t}/r.html"),
    Case("train --resume of a model another run writes (its training log too)", "train --corpus {corpus} --out {model} "
         "--resume --epochs 11", "error", "{model} is being written by another run (host ", {"@locked": ""},
         "{model}/training.jsonl"),
    Case("export --sample of a format that exports every row", "export --model {model} --sample 5 --out {t}/u.parquet",
         "error", "--sample 5: only --format projector exports a sample", untouched="{t}/u.parquet"),
    Case("export --format projector into a folder of the user's", "export --model {model} --format projector "
         "--out {t}/mine", "error", "{t}/mine: exists and is not a projector export made by doc2vec-dist (it holds "
         "keep.txt)", {"mine/keep.txt": b"mine"}, "{t}/mine"),
    Case("export --format projector --dtype float16 (it wrote float32 without a word)", "export --model {model} "
         "--format projector --dtype float16 --out {t}/p", "error", "--dtype float16: --format projector writes its "
         "vectors as text (tensors.tsv), at float32; drop --dtype", untouched="{t}/p"),
    Case("export --seed without --sample (the seed was ignored without a word)", "export --model {model} --format "
         "projector --seed 3 --out {t}/p", "error", "--seed 3: it draws the users of --sample; without --sample every "
         "row is exported; drop --seed", untouched="{t}/p"),
    Case("export --seed of a URL table's sample (its most visited URLs, no draw)", "export --model {model} --format "
         "projector --table words_out --sample 5 --seed 3 --out {t}/p", "error", "--seed 3: it draws the users of "
         "--sample; a URL table's sample is its most visited URLs, drawn by no seed; drop --seed", untouched="{t}/p"),
    Case("export --format projector --sample 0", "export --model {model} --format projector --sample 0 --out {t}/p",
         "error", "bad value for --sample: '0' (a whole number >= 1)", untouched="{t}/p"),
    # --- issue 48: --device-memory -------------------------------------------------------------------------
    Case("--device-memory 0", "train --corpus {corpus} --out {t}/m --device-memory 0", "error",
         "bad training config: device_memory must be > 0", untouched="{t}/m"),
    # --- issue 48: plan's GPU workers ------------------------------------------------------------------------
    Case("plan --pcie-gb-per-second 0", "plan --corpus {corpus} --no-calibrate --gpus-per-worker 1 "
         "--pcie-gb-per-second 0", "error", "--pcie-gb-per-second must be > 0 (given 0)"),
    Case("plan --device-tokens-per-second -1", "plan --corpus {corpus} --no-calibrate --gpus-per-worker 1 "
         "--device-tokens-per-second -1", "error", "--device-tokens-per-second must be > 0 (given -1)"),
    Case("plan --hbm-gb-per-second 0", "plan --corpus {corpus} --no-calibrate --gpus-per-worker 1 "
         "--hbm-gb-per-second 0", "error", "--hbm-gb-per-second must be > 0 (given 0)"),
    Case("plan --device-tokens-per-second for CPU workers", "plan --corpus {corpus} --no-calibrate "
         "--device-tokens-per-second 2e7", "error",
         "--device-tokens-per-second is a GPU worker's device: plan GPU workers (--gpus-per-worker 1"),
    Case("plan --gpu-model unknown", "plan --corpus {corpus} --no-calibrate --gpus-per-worker 1 --gpu-model B200",
         "error", "--gpu-model B200 is not a device plan knows: one of H200, H100, A100"),
    # --- issue 51: forget, and --expire-days ----------------------------------------------------------------
    Case("forget a key the model never had", "forget --model {model} --key u54e266157a4c --key nobody-here", "says",
         "1 key(s) are not in the model (--key nobody-here): never there, perhaps"),
    Case("forget keys none of which the model has", "forget --model {model} --keys {t}/k.txt", "says",
         "warning: none of the 2 key(s) is in {model}: is it the model of these users",
         {"k.txt": b"stranger-1\nstranger-2\n"}),
    Case("forget with an empty keys file", "forget --model {model} --keys {t}/k.txt", "error",
         "{t}/k.txt: holds no keys; give one key per line", {"k.txt": b"\n \n"}, "{model}"),
    Case("forget with a forget list of another model", "forget --model {model} --key u54e266157a4c", "error",
         "{model}/forget.arrow: a forget list of another model (made for model id ",
         {"forget.arrow": _foreign_forget_list}),
    Case("forget --index of another model", "forget --model {model} --key u54e266157a4c --index {t}/other.index",
         "error", "the index {t}/other.index was made from the model at {t}/other (id ",
         {"other.index": _other_model_index}, "{model}"),
    Case("forget --retrain-epochs without --corpus", "forget --model {model} --key u54e266157a4c --retrain-epochs 1",
         "error", "--retrain-epochs trains on the model's corpus without the users: give it with --corpus",
         untouched="{model}"),
    Case("forget --retrain-epochs 0", "forget --model {model} --key u54e266157a4c --corpus {corpus} --retrain-epochs 0",
         "error", "--retrain-epochs must be ≥ 1, not 0", untouched="{model}"),
    Case("forget --retrain-out onto a model", "forget --model {model} --key u54e266157a4c --corpus {corpus} "
         "--retrain-epochs 1 --retrain-out {model}", "error", "{model}: --retrain-out is the model itself",
         untouched="{model}"),
    Case("prepare --expire-days 0", "prepare {t}/good.csv --base {corpus} --time-col ts --expire-days 0 --out {t}/c",
         "error", "--expire-days must be > 0, not 0", {"good.csv": GOOD_CSV}, "{t}/c"),
    Case("prepare --expire-days without --base", "prepare {t}/good.csv --time-col ts --expire-days 7 --out {t}/c",
         "error", "--expire-days applies to a refresh (--base) with event times (--time-col)", {"good.csv": GOOD_CSV},
         "{t}/c"),
    # --- issue 48: --kernel fused (triton_kernel.py) ------------------------------------------------------------
    Case("--kernel fused for PV-DM", "train --corpus {corpus} --out {t}/m --kernel fused --mode dm", "error",
         "bad training config: --kernel fused does not train --mode dm (several input rows an example): use "
         "--kernel batched", untouched="{t}/m"),
    Case("--kernel fused where triton is not installed", "train --corpus {corpus} --out {t}/m --kernel fused",
         "error", "bad training config: --kernel fused needs triton, which is not installed here: pip install triton",
         {"@no-triton": b""}, untouched="{t}/m"),
]


def _mount(t: str, model: str, files: dict, tmpfs) -> None:
    """The tmpfs mounts a row asks for (see the block of issue 26 in CASES)."""
    def copy_model(path: str) -> None:
        shutil.copytree(model, os.path.join(path, "model"))

    if "@ro" in files:
        tmpfs.mount(os.path.join("w", "ro"), "1m", read_only=True)
    if "@ro-model" in files:
        tmpfs.mount(os.path.join("w", "ro"), "20m", read_only=True, fill=copy_model)
    if "@full" in files:
        tmpfs.mount(os.path.join("w", "full"), "1m", fill=tmpfs.fill_up)
    if "@full-model" in files:
        tmpfs.mount(os.path.join("w", "full"), "20m", fill=lambda path: (copy_model(path), tmpfs.fill_up(path)))


def _damage(model: str, files: dict) -> None:
    if "@truncate" in files:
        with open(os.path.join(model, "LATEST")) as fh:
            version = fh.read().strip()
        part = os.path.join(model, "checkpoints", version, files["@truncate"], "part-00000-of-00002.arrow")
        os.truncate(part, 1000)
    if "@latest" in files:
        with open(os.path.join(model, "LATEST"), "w") as fh:
            fh.write(files["@latest"] + "\n")
    if "@delete" in files:
        os.remove(os.path.join(model, "checkpoints", "v10", files["@delete"], "part-00001-of-00002.arrow"))
    if "@killed-writer" in files:  # a run that took the model's lock and was killed holding it
        held = "from doc2vec_dist import checkpoint; import os, sys\nwith checkpoint.writing(sys.argv[1]): os.kill(os.getpid(), 9)"
        assert subprocess.run([sys.executable, "-c", held, model], cwd=ROOT, check=False).returncode == -9


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_input(case: Case, tmp_path, trained_model, sample_corpus, capsys, snapshot, tmpfs, request, monkeypatch):
    t = str(tmp_path / "w")
    os.makedirs(t)
    model = shutil.copytree(trained_model, str(tmp_path / "model"))
    with open(os.path.join(model, "LATEST")) as fh:
        assert fh.read().strip() == "v10"  # the damage rows name this version
    corpus = shutil.copytree(sample_corpus[0], str(tmp_path / "corpus"))
    fill = {"t": t, "model": model, "corpus": corpus, "heldout": sample_corpus[1], "url": SAMPLE_URL,
            "sample_events": SAMPLE_EVENTS}
    for name, content in case.files.items():
        if name.startswith("@"):
            continue
        if callable(content):
            content = content(t)
            if content is None:
                continue
        path = os.path.join(t, name)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as fh:
            fh.write(content)
    _damage(model, case.files)
    _mount(t, model, case.files, tmpfs)
    if "@no-triton" in case.files:  # what `import triton` finds where it is not installed
        monkeypatch.setitem(sys.modules, "triton", None)
    if "@shard" in case.files:
        os.truncate(os.path.join(corpus, "shards", "part-00000.arrow"), 100)
    if "@locked" in case.files:  # another run writes the model: this process holds its lock meanwhile
        from doc2vec_dist import checkpoint

        locked = checkpoint.Writer.take(model)
        request.addfinalizer(locked.release)
    untouched = case.untouched.format(**fill) if case.untouched else None
    before = snapshot(untouched) if untouched else None
    argv = [a.format(**fill) for a in case.argv.split()] + ["--no-progress"] * (case.argv.split()[0] in (
        "prepare", "train", "baseline", "export", "index", "generate", "infer", "jobs/train.py"))

    if case.fresh_process:
        done = subprocess.run([sys.executable, "-m", "doc2vec_dist", *argv], capture_output=True, text=True,
                              cwd=ROOT, timeout=120, check=False)
        code, out, err = done.returncode, done.stdout, done.stderr
    elif case.bare_python:
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        done = subprocess.run([sys.executable, "-S", *argv], capture_output=True, text=True, cwd=ROOT, env=env,
                              timeout=60, check=False)
        code, out, err = done.returncode, done.stdout, done.stderr
    elif argv[0].startswith("jobs/"):
        capsys.readouterr()
        job = os.path.splitext(os.path.basename(argv[0]))[0]  # what jobs/NAME.py runs, in this process
        code = {"train": pipeline.train_job, "refresh": pipeline.refresh_job}[job](argv[1:])
        out, err = capsys.readouterr()
    else:
        capsys.readouterr()  # what making the files printed
        code = main(argv)
        out, err = capsys.readouterr()

    assert "Traceback" not in err, err
    if case.outcome == "error":
        errors = [line for line in err.splitlines() if line.startswith("error: ")]
        assert code == 2 and len(errors) == 1, err
        assert errors[0].startswith("error: " + case.expect.format(**fill)), errors[0]
        if untouched:
            assert snapshot(untouched) == before, f"{untouched} changed"
    elif case.outcome == "says":
        assert code == 0, err
        said = case.expect.format(**fill)
        assert any(line.startswith(said) for line in (out + err).splitlines()), out + err
    else:
        assert code == 0, err
        if untouched:
            assert snapshot(untouched) == before, f"{untouched} changed"
        with open(os.path.join(t, "c", "corpus.json")) as fh:
            meta = json.load(fh)
        if case.outcome == "skipped":
            assert meta["skipped"][case.expect] > 0
        else:
            assert meta["num_docs"] > 0 and not any(meta["skipped"].values()), meta["skipped"]
