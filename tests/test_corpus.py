"""Tests of corpus.py, readers.py, ids.py and prepare.py: prepare (every input format, vocabulary, ordering,
holdout, shards, errors) and reading a corpus (Corpus, iter_shard). Small real files in tmp_path; the whole
module runs in seconds."""

from __future__ import annotations

import gzip
import itertools
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.ipc
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import corpus as corpus_mod
from doc2vec_dist import read_formats, shard_pass
from doc2vec_dist.config import PrepareConfig
from doc2vec_dist.corpus import Corpus, CorpusError, iter_shard
from doc2vec_dist.errors import UserError
from doc2vec_dist.prepare import prepare

# (user, url, ts): users interleaved, a tie in time for user "u1" (ts 5 twice)
EVENTS = [
    ("u1", "a", 5), ("u2", "b", 1), ("u1", "b", 3), ("u3", "c", 9), ("u2", "a", 0),
    ("u1", "c", 5), ("u2", "a", 2), ("u1", "a", 1), ("u3", "a", 8), ("u4", "d", 4),
]


def _write_events(path, rows, cols=("user_id", "url", "ts")):
    """Write rows as Parquet, CSV or JSON lines according to the extension."""
    path = str(path)
    table = pa.table({c: [r[i] for r in rows] for i, c in enumerate(cols)})
    if path.endswith(".parquet"):
        pq.write_table(table, path)
    elif path.endswith(".csv"):
        with open(path, "w") as f:
            f.write(",".join(cols) + "\n")
            f.writelines(",".join("" if v is None else str(v) for v in r) + "\n" for r in rows)
    elif path.endswith(".jsonl"):
        with open(path, "w") as f:
            f.writelines(json.dumps(dict(zip(cols, r))) + "\n" for r in rows)
    else:
        raise ValueError(path)
    return path


def _documents(c: Corpus) -> dict[str, list[str]]:
    """key → training tokens (as strings) of every document, read back through iter_shard."""
    keys = c.docs()["key"].to_pylist()
    words = c.vocab()["token"].to_pylist()
    out = {}
    for path in c.shard_paths:
        for doc_ids, offsets, tokens in iter_shard(path):
            for i, d in enumerate(doc_ids):
                out[keys[d]] = [words[t] for t in tokens[offsets[i]:offsets[i + 1]]]
    return out


def _leftovers(directory) -> list[str]:
    return sorted(n for n in os.listdir(directory) if ".tmp-" in n or n.startswith("out") or ".old-" in n)


CALL = ("overwrite", "progress", "report")  # prepare's own keywords; the others are PrepareConfig's


def _prepare(inputs, out, **kw):
    kw.setdefault("progress", False)
    call = {k: kw.pop(k) for k in CALL if k in kw}
    return prepare([str(i) for i in inputs], str(out), PrepareConfig(**kw), **call)


# ------------------------------------------------------------------------------------------- events

def test_events_parquet_csv_jsonl_give_the_same_corpus(tmp_path):
    corpora = []
    for ext in ("parquet", "csv", "jsonl"):
        src = _write_events(tmp_path / f"events.{ext}", EVENTS)
        corpora.append(_prepare([src], tmp_path / f"out-{ext}"))
    first = corpora[0]
    assert (first.num_docs, first.num_tokens, first.vocab_size) == (4, 10, 4)
    # Input order (no time column): u1 saw a, b, c, a.
    assert _documents(first) == {"u1": ["a", "b", "c", "a"], "u2": ["b", "a", "a"],
                                 "u3": ["c", "a"], "u4": ["d"]}
    # Doc ids follow first appearance in the input.
    assert first.docs().to_pydict() == {"key": ["u1", "u2", "u3", "u4"], "id": [0, 1, 2, 3],
                                        "length": [4, 3, 2, 1]}
    for other in corpora[1:]:
        assert other.vocab().equals(first.vocab())
        assert other.docs().equals(first.docs())
        assert _documents(other) == _documents(first)
    meta = first.meta
    assert meta["format_version"] == 1 and meta["num_shards"] == 1
    assert meta["shards"] == [{"path": "shards/part-00000.arrow", "docs": 4, "tokens": 10}]
    assert first.shard_num_tokens() == [10]


def test_integer_keys_and_mixed_token_types_become_strings(tmp_path):
    pq.write_table(pa.table({"user_id": [7, 8, 7], "url": [1, 2, 1]}), tmp_path / "a.parquet")
    pq.write_table(pa.table({"user_id": ["7", "9"], "url": ["1", "x"]}), tmp_path / "b.parquet")
    c = _prepare([tmp_path / "a.parquet", tmp_path / "b.parquet"], tmp_path / "out")
    assert c.vocab()["token"].to_pylist() == ["1", "2", "x"]
    assert _documents(c) == {"7": ["1", "1", "1"], "8": ["2"], "9": ["x"]}
    assert c.docs().schema.field("key").type == pa.string()


def test_directory_and_glob_inputs(tmp_path):
    data = tmp_path / "data"
    (data / "day2").mkdir(parents=True)
    _write_events(data / "part-0.parquet", EVENTS[:4])
    _write_events(data / "day2" / "part-1.parquet", EVENTS[4:])
    (data / "_SUCCESS").write_text("")          # bookkeeping files are not inputs
    (data / "README.txt").write_text("not data")
    explicit = _prepare([data / "day2" / "part-1.parquet", data / "part-0.parquet"], tmp_path / "out-files")
    by_dir = _prepare([data], tmp_path / "out-dir")
    by_glob = _prepare([str(data / "**" / "*.parquet")], tmp_path / "out-glob")
    # A directory and a glob are read in sorted path order: day2/part-1 before part-0.
    assert _documents(by_dir) == _documents(explicit) == _documents(by_glob)
    assert by_dir.docs().equals(explicit.docs()) and by_glob.docs().equals(explicit.docs())
    assert by_dir.docs()["key"].to_pylist()[0] == "u2"  # first event of day2/part-1.parquet
    assert by_dir.meta["input_files"] == [str(data / "day2" / "part-1.parquet"), str(data / "part-0.parquet")]


def test_time_ordering_with_users_interleaved_across_two_files(tmp_path):
    a = _write_events(tmp_path / "a.parquet", EVENTS[:5])
    b = _write_events(tmp_path / "b.csv", EVENTS[5:])
    c = _prepare([a, b], tmp_path / "out", time_col="ts")
    # u1: a@5, b@3 (file a), c@5, a@1 (file b) → a@1, b@3, then the tie at 5 in input order: a, c.
    assert _documents(c) == {"u1": ["a", "b", "a", "c"], "u2": ["a", "b", "a"], "u3": ["a", "c"], "u4": ["d"]}
    assert c.meta["time_col"] == "ts"


def test_time_column_types_timestamps_and_iso_strings(tmp_path):
    ts = pa.array([3_000_000, 1_000_000, 2_000_000], pa.timestamp("us", tz="UTC"))
    pq.write_table(pa.table({"user_id": ["x"] * 3, "url": ["p", "q", "r"], "ts": ts}), tmp_path / "a.parquet")
    (tmp_path / "b.csv").write_text("user_id,url,ts\ny,p,2024-01-02T00:00:00\ny,q,2024-01-01T12:00:00\n"
                                    "y,r,2024-01-01T00:00:00.5\ny,s,\n")
    c = _prepare([tmp_path / "a.parquet", tmp_path / "b.csv"], tmp_path / "out", time_col="ts")
    # A missing time sorts last.
    assert _documents(c) == {"x": ["q", "r", "p"], "y": ["r", "q", "p", "s"]}


def test_bad_time_column_is_an_error_naming_file_and_column(tmp_path):
    (tmp_path / "e.csv").write_text("user_id,url,ts\nu,a,yesterday\n")
    with pytest.raises(CorpusError, match=r"e\.csv: column 'ts' is not a time.*'yesterday'"):
        _prepare([tmp_path / "e.csv"], tmp_path / "out", time_col="ts")
    assert _leftovers(tmp_path) == []


def test_min_count_max_vocab_and_id_order(tmp_path):
    rows = ([("u1", "z", 0)] * 3 + [("u1", "y", 0)] * 3 + [("u2", "x", 0)] * 5 + [("u2", "w", 0)] * 2
            + [("u3", "v", 0)] + [("u3", "rare", 0)] + [("u4", "rare2", 0)])
    src = _write_events(tmp_path / "e.parquet", rows)
    c = _prepare([src], tmp_path / "out", min_count=2)
    # Descending count; the tie between y and z (3 each) broken by the token.
    assert c.vocab().to_pydict() == {"token": ["x", "y", "z", "w"], "count": [5, 3, 3, 2], "id": [0, 1, 2, 3]}
    assert c.vocab().schema == corpus_mod.VOCAB_SCHEMA
    assert c.meta["skipped"]["tokens_below_min_count"] == 3
    # u3 and u4 have nothing left: not documents.
    assert c.meta["skipped"]["docs_without_tokens"] == 2
    assert c.docs()["key"].to_pylist() == ["u1", "u2"]
    assert c.counts().tolist() == [5, 3, 3, 2] and c.counts().dtype == np.int64

    c = _prepare([src], tmp_path / "out2", min_count=2, max_vocab=2)
    assert c.vocab()["token"].to_pylist() == ["x", "y"]
    assert c.meta["skipped"]["tokens_beyond_max_vocab"] == 5
    assert _documents(c) == {"u1": ["y"] * 3, "u2": ["x"] * 5}


def test_null_and_empty_tokens_are_skipped_and_counted(tmp_path):
    src = _write_events(tmp_path / "e.parquet", [("u1", "a", 0), ("u1", None, 0), ("u2", "", 0), ("u2", None, 0),
                                                ("u3", "a", 0)])
    c = _prepare([src], tmp_path / "out")
    assert c.meta["skipped"]["null_tokens"] == 2
    assert c.meta["skipped"]["empty_tokens"] == 1
    assert c.meta["skipped"]["docs_without_tokens"] == 1
    assert _documents(c) == {"u1": ["a"], "u3": ["a"]}


def test_compressed_csv_and_tsv(tmp_path):
    with gzip.open(tmp_path / "e.csv.gz", "wt") as f:
        f.write("user_id,url\nu1,a\nu2,b\n")
    (tmp_path / "e.tsv").write_text("user_id\turl\nu1\tc\n")
    c = _prepare([tmp_path / "e.csv.gz", tmp_path / "e.tsv"], tmp_path / "out")
    assert _documents(c) == {"u1": ["a", "c"], "u2": ["b"]}


# ------------------------------------------------------------------------------------- text, lists

def test_text_keys_are_line_numbers_across_inputs(tmp_path):
    (tmp_path / "a.txt").write_text("the cat sat\n\n  the   dog\tran \n")
    (tmp_path / "b.txt").write_text("cat\r\nno newline at end")
    c = _prepare([tmp_path / "a.txt", tmp_path / "b.txt"], tmp_path / "out", format="text")
    # Line 1 is empty: skipped, but it still counts as a line.
    assert _documents(c) == {"0": ["the", "cat", "sat"], "2": ["the", "dog", "ran"], "3": ["cat"],
                             "4": ["no", "newline", "at", "end"]}
    assert c.docs()["key"].to_pylist() == ["0", "2", "3", "4"]  # line order within the shard
    assert c.meta["skipped"]["docs_without_tokens"] == 1
    assert c.meta["skipped"]["empty_tokens"] == 0  # whitespace is not an empty token
    assert c.meta["input_rows"] == 5


def test_a_text_file_s_byte_order_mark_is_not_part_of_its_first_word(tmp_path):
    """Windows editors and Excel start UTF-8 text with U+FEFF: it was kept in the first word ('\\ufeffhello',
    a word of its own beside 'hello'); a mark elsewhere in the file is text and stays."""
    (tmp_path / "bom.txt").write_bytes(b"\xef\xbb\xbfhello world\r\nhello again\n")
    (tmp_path / "b.txt").write_bytes(b"hello\n")
    with gzip.open(tmp_path / "z.txt.gz", "wb") as f:
        f.write(b"\xef\xbb\xbfhello there\n")
    c = _prepare([tmp_path / "bom.txt", tmp_path / "b.txt", tmp_path / "z.txt.gz"], tmp_path / "out", format="text")
    assert _documents(c) == {"0": ["hello", "world"], "1": ["hello", "again"], "2": ["hello"], "3": ["hello", "there"]}
    assert "\ufeffhello" not in c.vocab()["token"].to_pylist()


def test_text_gzip_and_many_blocks(tmp_path, monkeypatch):
    monkeypatch.setattr(read_formats, "TEXT_BLOCK_BYTES", 7)  # lines straddle blocks
    lines = [f"w{i} w{i % 3} common" for i in range(50)]
    with gzip.open(tmp_path / "t.txt.gz", "wt") as f:
        f.write("\n".join(lines) + "\n")
    c = _prepare([tmp_path / "t.txt.gz"], tmp_path / "out", format="text")
    docs = _documents(c)
    assert len(docs) == 50 and docs["17"] == ["w17", "w2", "common"]
    assert c.docs()["key"].to_pylist() == [str(i) for i in range(50)]


def test_lists_format_parquet_and_jsonl(tmp_path):
    pq.write_table(pa.table({"doc": ["d1", "d2", "d3"], "tokens": [["a", "b", "a"], [], ["c", None]]}),
                   tmp_path / "l.parquet")
    with open(tmp_path / "l.jsonl", "w") as f:
        f.write(json.dumps({"doc": 4, "tokens": ["b", "c"], "other": 1}) + "\n")
        f.write(json.dumps({"doc": 5, "tokens": None, "other": "x"}) + "\n")
    c = _prepare([tmp_path / "l.parquet", tmp_path / "l.jsonl"], tmp_path / "out", format="lists",
                 doc_col="doc", token_col="tokens")
    assert _documents(c) == {"d1": ["a", "b", "a"], "d3": ["c"], "4": ["b", "c"]}
    assert c.meta["skipped"]["docs_without_tokens"] == 2
    assert c.meta["skipped"]["null_tokens"] == 1
    assert c.vocab()["token"].to_pylist() == ["a", "b", "c"]  # a:2, b:2, c:2 → by token


def test_lists_format_rejects_a_string_column(tmp_path):
    src = _write_events(tmp_path / "e.parquet", EVENTS)
    with pytest.raises(CorpusError, match=r"e\.parquet: column 'url' holds string, expected a list"):
        _prepare([src], tmp_path / "out", format="lists")


# ------------------------------------------------------------------------------------------ holdout

def _holdout_input(tmp_path):
    rows = []
    for u in range(60):
        n_distinct = 1 + u % 12
        for t in range(n_distinct):
            rows += [(f"u{u}", f"t{t}", 0)] * (1 + t % 3)
    return _write_events(tmp_path / "h.parquet", rows)


def test_holdout_hides_tokens_deterministically(tmp_path):
    src = _holdout_input(tmp_path)
    full = _documents(_prepare([src], tmp_path / "full"))
    c = _prepare([src], tmp_path / "out", holdout=0.3, holdout_out=tmp_path / "held.parquet", seed=7)
    held = pq.read_table(tmp_path / "held.parquet")
    assert held.schema == corpus_mod.HOLDOUT_SCHEMA
    hidden: dict[str, set] = {}
    for k, t in zip(held["key"].to_pylist(), held["token"].to_pylist()):
        assert t not in hidden.setdefault(k, set())  # one row per hidden distinct token
        hidden[k].add(t)
    train = _documents(c)
    for key, tokens in full.items():
        distinct = set(tokens)
        gone = hidden.get(key, set())
        expect = 0 if len(distinct) < 2 else min(max(1, int(np.floor(0.3 * len(distinct) + 0.5))), len(distinct) - 1)
        assert len(gone) == expect, key
        assert gone <= distinct
        assert set(train[key]) == distinct - gone            # every occurrence removed, nothing else
        assert train[key] == [t for t in tokens if t not in gone]  # order kept
        assert len(set(train[key])) >= 1
    assert c.meta["heldout_pairs"] == held.num_rows > 0
    # vocab counts are training counts
    words = c.vocab()["token"].to_pylist()
    all_train = [t for ts in train.values() for t in ts]
    assert c.counts().tolist() == [all_train.count(w) for w in words]
    assert c.num_tokens == len(all_train) == int(c.counts().sum())

    # Same seed → same split, whatever the number of shards; another seed → another split.
    _prepare([src], tmp_path / "again", holdout=0.3, holdout_out=tmp_path / "held2.parquet", seed=7, num_shards=3)
    assert pq.read_table(tmp_path / "held2.parquet").sort_by([("key", "ascending"), ("token", "ascending")]).equals(
        held.sort_by([("key", "ascending"), ("token", "ascending")]))
    _prepare([src], tmp_path / "other", holdout=0.3, holdout_out=tmp_path / "held3.parquet", seed=8)
    assert set(zip(*pq.read_table(tmp_path / "held3.parquet").to_pydict().values())) != set(
        zip(*held.to_pydict().values()))


def test_holdout_needs_an_output_file(tmp_path):
    src = _write_events(tmp_path / "e.parquet", EVENTS)
    with pytest.raises(CorpusError, match="holdout_out"):
        _prepare([src], tmp_path / "out", holdout=0.2)
    with pytest.raises(CorpusError, match=r"holdout must lie in \[0, 1\)"):
        _prepare([src], tmp_path / "out", holdout=1.0, holdout_out=tmp_path / "h.parquet")


# ------------------------------------------------------------------------------- shards, iter_shard

def test_iter_shard_round_trip_and_a_25000_token_document_comes_back_whole(tmp_path, monkeypatch):
    monkeypatch.setattr(corpus_mod, "BATCH_TOKENS", 1000)  # several record batches per shard
    rng = np.random.default_rng(0)
    rows, expected = [], {}
    for u in range(40):
        n = 25_000 if u == 13 else int(rng.integers(1, 300))
        toks = [f"w{x}" for x in rng.integers(0, 50, n)]
        expected[f"u{u}"] = toks
        rows += [(f"u{u}", t) for t in toks]
    pq.write_table(pa.table({"user_id": [r[0] for r in rows], "url": [r[1] for r in rows]}), tmp_path / "e.parquet")
    c = _prepare([tmp_path / "e.parquet"], tmp_path / "out")
    (shard,) = c.shard_paths
    with pa.memory_map(shard) as source:
        reader = pa.ipc.open_file(source)
        assert reader.schema == corpus_mod.SHARD_SCHEMA
        assert reader.num_record_batches > 5
    assert _documents(c) == expected

    words = c.vocab()["token"].to_pylist()
    keys = c.docs()["key"].to_pylist()
    for max_tokens in (500, 1000, 10**9):
        seen = []
        for doc_ids, offsets, tokens in iter_shard(shard, max_tokens=max_tokens):
            assert doc_ids.dtype == np.int64 and offsets.dtype == np.int64 and tokens.dtype == np.int32
            assert offsets[0] == 0 and offsets[-1] == len(tokens) and len(offsets) == len(doc_ids) + 1
            assert len(tokens) <= max_tokens or len(doc_ids) == 1  # only a lone long document exceeds it
            for i, d in enumerate(doc_ids):
                assert [words[t] for t in tokens[offsets[i]:offsets[i + 1]]] == expected[keys[d]]
            seen += doc_ids.tolist()
        assert seen == list(range(40))
    assert len(list(iter_shard(shard, max_tokens=10**9))) == 1  # small batches merge up to max_tokens
    long = [len(t) for ids, off, t in iter_shard(shard, max_tokens=500) if 13 in ids]
    assert long == [25_000]
    assert c.docs()["length"].to_pylist()[13] == 25_000


def test_iter_shard_is_zero_copy_within_a_batch(tmp_path):
    src = _write_events(tmp_path / "e.parquet", EVENTS)
    c = _prepare([src], tmp_path / "out")
    doc_ids, offsets, tokens = next(iter_shard(c.shard_paths[0]))
    assert not tokens.flags.owndata and not doc_ids.flags.owndata
    assert tokens.tolist() == [0, 1, 2, 0, 1, 0, 0, 2, 0, 3]  # a=0 (5×), b=1, c=2 (2× each, by token), d=3
    assert offsets.tolist() == [0, 4, 7, 9, 10] and doc_ids.tolist() == [0, 1, 2, 3]


def test_num_shards_spread_docs_each_in_exactly_one_shard(tmp_path):
    rows = [(f"user{i % 97}", f"url{(i * 7) % 31}") for i in range(2000)]
    pq.write_table(pa.table({"user_id": [r[0] for r in rows], "url": [r[1] for r in rows]}), tmp_path / "e.parquet")
    c = _prepare([tmp_path / "e.parquet"], tmp_path / "out", num_shards=4)
    assert c.meta["num_shards"] == 4 and len(c.shard_paths) == 4
    assert [os.path.basename(p) for p in c.shard_paths] == [f"part-0000{i}.arrow" for i in range(4)]
    per_shard = []
    for path in c.shard_paths:
        ids = np.concatenate([d for d, _, _ in iter_shard(path)] or [np.zeros(0, np.int64)])
        assert np.all(np.diff(ids) > 0)  # increasing within a shard
        per_shard.append(ids)
    assert sum(len(s) > 0 for s in per_shard) >= 3  # spread, not all in one
    everything = np.concatenate(per_shard)
    assert sorted(everything.tolist()) == list(range(97))  # each doc exactly once
    # Shards are numbered in order: shard b's ids all come before shard b+1's.
    nonempty = [s for s in per_shard if len(s)]
    assert all(a[-1] < b[0] for a, b in itertools.pairwise(nonempty))
    lengths = c.docs()["length"].to_numpy()
    assert c.shard_num_tokens() == [int(lengths[s].sum()) for s in per_shard]
    assert sum(c.shard_num_tokens()) == c.num_tokens == 2000
    # Same documents as a one-shard corpus.
    one = _prepare([tmp_path / "e.parquet"], tmp_path / "one")
    assert _documents(one) == _documents(c)


def test_small_memory_budget_gives_more_buckets_and_the_same_documents(tmp_path):
    src = _write_events(tmp_path / "e.parquet", EVENTS * 50)
    big = _prepare([src], tmp_path / "big")
    small = _prepare([src], tmp_path / "small", memory_budget_bytes=4096)
    assert big.meta["num_shards"] == 1 and small.meta["num_shards"] > 1
    assert _documents(big) == _documents(small)


# ----------------------------------------------------------------------------------------- errors

def test_missing_column_names_file_and_columns(tmp_path):
    pq.write_table(pa.table({"user_id": ["u"], "link": ["a"], "ts": [1]}), tmp_path / "x.parquet")
    with pytest.raises(CorpusError) as e:
        _prepare([tmp_path / "x.parquet"], tmp_path / "out")
    assert str(e.value) == f"{tmp_path / 'x.parquet'}: column 'url' not found (columns: user_id, link, ts)"
    (tmp_path / "x.csv").write_text("user_id,link\nu,a\n")
    with pytest.raises(CorpusError, match=r"x\.csv: column 'url' not found \(columns: user_id, link\)"):
        _prepare([tmp_path / "x.csv"], tmp_path / "out")
    (tmp_path / "x.jsonl").write_text('{"user_id": "u", "link": "a"}\n')
    with pytest.raises(CorpusError, match=r"x\.jsonl: column 'url' not found"):
        _prepare([tmp_path / "x.jsonl"], tmp_path / "out")
    assert isinstance(e.value, UserError)
    assert _leftovers(tmp_path) == []


def test_empty_inputs_are_errors_naming_the_path(tmp_path):
    with pytest.raises(CorpusError, match=r"nothing\.parquet: no such file"):
        _prepare([tmp_path / "nothing.parquet"], tmp_path / "out")
    with pytest.raises(CorpusError, match=r"\*\.parquet: the pattern matches no file"):
        _prepare([str(tmp_path / "*.parquet")], tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(CorpusError, match="empty: the directory holds no input files"):
        _prepare([tmp_path / "empty"], tmp_path / "out")
    (tmp_path / "header.csv").write_text("user_id,url\n")
    with pytest.raises(CorpusError, match=r"header\.csv: the inputs hold no rows"):
        _prepare([tmp_path / "header.csv"], tmp_path / "out")
    assert _leftovers(tmp_path) == []


def test_corrupt_parquet_among_good_files_leaves_nothing_behind(tmp_path):
    _write_events(tmp_path / "a.parquet", EVENTS)
    (tmp_path / "b.parquet").write_bytes(b"PAR1 this is not parquet at all")
    _write_events(tmp_path / "c.parquet", EVENTS)
    with pytest.raises(CorpusError, match=r"b\.parquet: cannot read: .*"):
        _prepare([tmp_path], tmp_path / "out", holdout=0.2, holdout_out=tmp_path / "held.parquet")
    assert _leftovers(tmp_path) == []
    assert not (tmp_path / "held.parquet").exists()
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet", "c.parquet"]


def test_failure_in_the_last_pass_leaves_nothing_behind(tmp_path, monkeypatch):
    src = _write_events(tmp_path / "e.parquet", EVENTS)

    def boom(*args, **kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(shard_pass, "write_shard", boom)
    with pytest.raises(RuntimeError, match="disk full"):
        _prepare([src], tmp_path / "out", num_shards=2)
    assert _leftovers(tmp_path) == []


def test_overwrite(tmp_path):
    a = _write_events(tmp_path / "a.parquet", EVENTS)
    b = _write_events(tmp_path / "b.parquet", [("z", "q", 0)])
    out = tmp_path / "out"
    _prepare([a], out)
    with pytest.raises(UserError, match=f"{out}: already holds a corpus; pass --overwrite to replace it"):
        _prepare([b], out)
    assert Corpus(str(out)).num_docs == 4  # untouched
    # A failing overwrite keeps the old corpus.
    with pytest.raises(CorpusError):
        _prepare([tmp_path / "missing.parquet"], out, overwrite=True)
    assert Corpus(str(out)).num_docs == 4
    c = _prepare([b], out, overwrite=True)
    assert (c.num_docs, c.vocab_size) == (1, 1) and _documents(c) == {"z": ["q"]}
    assert Corpus(str(out)).docs()["key"].to_pylist() == ["z"]
    assert sorted(os.listdir(tmp_path)) == ["a.parquet", "b.parquet", "out"]


def test_corpus_open_errors(tmp_path):
    with pytest.raises(CorpusError, match="not a corpus"):
        Corpus(str(tmp_path))
    (tmp_path / "corpus.json").write_text("{not json")
    with pytest.raises(CorpusError, match=r"corpus\.json: cannot read"):
        Corpus(str(tmp_path))
    src = _write_events(tmp_path / "e.parquet", EVENTS)
    c = _prepare([src], tmp_path / "out")
    os.remove(c.shard_paths[0])
    with pytest.raises(CorpusError, match="part-00000.arrow is missing"):
        Corpus(c.path)


def test_summary_is_logged(tmp_path, capsys, logged):
    caplog = logged
    src = _write_events(tmp_path / "e.parquet", EVENTS)
    prepare([src], str(tmp_path / "out"), progress=True)
    assert "4 docs, 10 tokens, vocabulary 4, 1 shard(s); skipped: nothing" in caplog.text
    caplog.clear()
    capsys.readouterr()  # the progress bars
    prepare([src], str(tmp_path / "quiet"), progress=False)
    assert caplog.text == "" and capsys.readouterr().err == ""


def test_corpus_files_are_arrow_ipc_files_with_the_contract_schemas(tmp_path):
    src = _write_events(tmp_path / "e.parquet", EVENTS)
    c = _prepare([src], tmp_path / "out")
    for name, schema in [("vocab.arrow", corpus_mod.VOCAB_SCHEMA), ("docs.arrow", corpus_mod.DOCS_SCHEMA)]:
        with pa.memory_map(os.path.join(c.path, name)) as source:
            assert pa.ipc.open_file(source).schema == schema
    with open(os.path.join(c.path, "corpus.json")) as f:
        meta = json.load(f)
    for key in ("format_version", "num_docs", "num_tokens", "vocab_size", "num_shards", "shards", "inputs",
                "format", "doc_col", "token_col", "time_col", "min_count", "max_vocab", "holdout", "seed",
                "skipped", "created"):
        assert key in meta
    assert meta["inputs"] == [src]


# ------------------------------------------------------------------------------------- bad input
# Each bad input is either one CorpusError line naming the file (and column, row) with nothing left
# behind, or a counted skip in corpus.json that prepare reports on stderr.

def _cli(capsys, *argv) -> tuple[int, str]:
    """Run the real console script in-process; its exit code and stderr."""
    from doc2vec_dist.cli import main

    code = main(["prepare", *map(str, argv), "--no-progress"])
    return code, capsys.readouterr().err


def _assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code == 2 and "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_null_and_empty_keys_are_skipped_counted_and_located(tmp_path, capsys):
    rows = [(f"u{i % 3}", f"p{i % 2}") for i in range(30)]
    rows[17] = (None, "a")
    _write_events(tmp_path / "a.csv", rows, cols=("user_id", "url"))
    # Row numbers count within the file across its batches (row groups of 4).
    pq.write_table(pa.table({"user_id": ["u0", "", "u1", "u1"] * 2 + ["u2", "u2", None],
                             "url": ["p0"] * 11}), tmp_path / "b.parquet", row_group_size=4)
    with open(tmp_path / "c.jsonl", "w") as f:  # a missing field is a null
        f.writelines(json.dumps(r) + "\n" for r in [{"user_id": "u9", "url": "p1"}, {"url": "p1"},
                                                    {"user_id": None, "url": "p0"}])
    code, err = _cli(capsys, tmp_path / "a.csv", tmp_path / "b.parquet", tmp_path / "c.jsonl",
                     "--out", tmp_path / "out")
    assert code == 0 and "Traceback" not in err
    c = Corpus(str(tmp_path / "out"))
    assert c.meta["skipped"]["null_keys"] == 4 and c.meta["skipped"]["empty_keys"] == 2
    assert c.meta["skipped_where"]["null_keys"] == [f"{tmp_path / 'a.csv'} row 17", f"{tmp_path / 'b.parquet'} row 10",
                                                   f"{tmp_path / 'c.jsonl'} row 1"]
    assert c.meta["skipped_where"]["empty_keys"] == [f"{tmp_path / 'b.parquet'} row 1", f"{tmp_path / 'b.parquet'} row 5"]
    assert sorted(c.docs()["key"].to_pylist()) == ["u0", "u1", "u2", "u9"]
    assert c.num_tokens == 29 + 8 + 1
    assert f"skipped 4 row(s) with a null 'user_id' (first: {tmp_path / 'a.csv'} row 17, " in err
    assert "skipped 2 row(s) with an empty 'user_id'" in err


def test_every_row_skipped_is_an_error_saying_why(tmp_path):
    pq.write_table(pa.table({"user_id": pa.array([None, None], pa.string()), "url": ["a", "b"]}),
                   tmp_path / "e.parquet")
    with pytest.raises(CorpusError, match=r"e\.parquet: nothing to prepare, every row was skipped \(null_keys 2\)"):
        _prepare([tmp_path / "e.parquet"], tmp_path / "out")
    assert _leftovers(tmp_path) == []


def test_integer_and_float_ids_are_cast_but_lists_and_structs_are_errors(tmp_path):
    # A null turns an int id column into floats (pandas): 7.0 must still be user "7".
    pq.write_table(pa.table({"user_id": [7, 8], "url": [101, 102]}), tmp_path / "ints.parquet")
    pq.write_table(pa.table({"user_id": [7.0, None], "url": [101.0, 103.0]}), tmp_path / "floats.parquet")
    c = _prepare([tmp_path / "ints.parquet", tmp_path / "floats.parquet"], tmp_path / "out")
    assert _documents(c) == {"7": ["101", "101"], "8": ["102"]}
    assert c.meta["skipped"]["null_keys"] == 1

    pq.write_table(pa.table({"user_id": [["u"]], "url": ["a"]}), tmp_path / "list.parquet")
    with pytest.raises(CorpusError, match=r"list\.parquet: column 'user_id' holds list<.*>, expected strings or "
                                          r"numbers \(a list of tokens per row is --format lists\)"):
        _prepare([tmp_path / "list.parquet"], tmp_path / "out2")
    pq.write_table(pa.table({"user_id": ["u"], "url": [{"host": "a"}]}), tmp_path / "struct.parquet")
    with pytest.raises(CorpusError, match=r"struct\.parquet: column 'url' holds struct<host: string>"):
        _prepare([tmp_path / "struct.parquet"], tmp_path / "out2")
    (tmp_path / "mixed.csv").write_text("user_id,url,ts\nu,a,1700000000\nu,b,2024-01-01T00:00:00\n")
    with pytest.raises(CorpusError, match=r"mixed\.csv: column 'ts' mixes numbers and ISO 8601 timestamps"):
        _prepare([tmp_path / "mixed.csv"], tmp_path / "out2", time_col="ts")
    (tmp_path / "bad.csv").write_text("user_id,url,ts\nu,a,1\nu,b,soon\n")
    with pytest.raises(CorpusError, match=r"bad\.csv: column 'ts' is not a time: cannot read 'soon' \(row 1\)"):
        _prepare([tmp_path / "bad.csv"], tmp_path / "out2", time_col="ts")
    assert _leftovers(tmp_path) == ["out"]


def test_json_column_changing_type_names_the_file_row(tmp_path, monkeypatch):
    # ids may change JSON type (next test); a time column may not
    monkeypatch.setattr(read_formats, "CSV_JSON_BLOCK_BYTES", 1000)  # the change lies in a later block
    rows = [{"user_id": "u", "url": "a", "ts": i} for i in range(200)] + [{"user_id": "u", "url": "a", "ts": "x"}]
    (tmp_path / "e.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with pytest.raises(CorpusError, match=r"e\.jsonl: cannot read: JSON parse error: Column\(/ts\) changed "
                                          r"from number to string in row 200 \(a column must hold one JSON type"):
        _prepare([tmp_path / "e.jsonl"], tmp_path / "out", time_col="ts")
    assert _leftovers(tmp_path) == []


def test_json_ids_that_are_strings_in_some_rows_and_numbers_in_others(tmp_path, monkeypatch):
    rows = [{"user_id": "u1", "url": "a"}, {"user_id": 100000, "url": "b"}, {"user_id": "100000", "url": 7},
            {"user_id": 7.0, "url": "a"}, {"user_id": 2.5, "url": True}, {"user_id": "u1", "url": 7.0}]
    (tmp_path / "mixed.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    c = _prepare([tmp_path / "mixed.jsonl"], tmp_path / "out")
    # as prepare makes strings of numeric Parquet/CSV ids: 100000 → "100000" (not "100000.0"), 7.0 → "7"
    assert _documents(c) == {"u1": ["a", "7"], "100000": ["b", "7"], "7": ["a"], "2.5": ["true"]}

    # the change in a later block, after Arrow has read 200 rows of numbers; a blank line is no row
    monkeypatch.setattr(read_formats, "CSV_JSON_BLOCK_BYTES", 1000)
    rows = [{"user_id": i, "url": "a", "ts": i} for i in range(200)] + [{"user_id": "x", "url": "b", "ts": 5},
                                                                         {"user_id": 2**70, "url": "c", "ts": 6}]
    (tmp_path / "later.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[:100]) + "\n"
                                          + "".join(json.dumps(r) + "\n" for r in rows[100:]))
    c = _prepare([tmp_path / "later.jsonl"], tmp_path / "out2", time_col="ts")
    docs = _documents(c)
    assert len(docs) == 202 and docs["0"] == ["a"] and docs["199"] == ["a"]
    assert docs["x"] == ["b"] and docs[str(2**70)] == ["c"]

    # --format lists: a token list may mix strings and numbers too
    (tmp_path / "l.jsonl").write_text('{"user_id": "d", "url": ["a", 1]}\n{"user_id": 5, "url": [2.0, "b"]}\n')
    assert _documents(_prepare([tmp_path / "l.jsonl"], tmp_path / "out3", format="lists")) == {
        "d": ["a", "1"], "5": ["2", "b"]}

    # what was an error stays one: a list where an id belongs, a missing column, a malformed row
    (tmp_path / "k.jsonl").write_text('{"user_id": "a", "url": "x"}\n{"user_id": 1, "url": "x"}\n'
                                      '{"user_id": ["b"], "url": "y"}\n')
    with pytest.raises(CorpusError, match=r"k\.jsonl: column 'user_id' row 2 holds a JSON array, expected strings or "
                                          r"numbers \(a list of tokens per row is --format lists\)"):
        _prepare([tmp_path / "k.jsonl"], tmp_path / "out4")
    (tmp_path / "m.jsonl").write_text('{"user_id": "a", "link": "x"}\n{"user_id": 1, "link": "x"}\n')
    with pytest.raises(CorpusError, match=r"m\.jsonl: column 'url' not found \(columns: user_id, link\)"):
        _prepare([tmp_path / "m.jsonl"], tmp_path / "out4")
    (tmp_path / "b.jsonl").write_text('{"user_id": "a", "url": "x"}\n{"user_id": 1, "url": "x"}\n{"user_id": 2,\n')
    with pytest.raises(CorpusError, match=r"b\.jsonl: cannot read: JSON parse error in row 2: .*one object per line"):
        _prepare([tmp_path / "b.jsonl"], tmp_path / "out4")
    assert not os.path.exists(tmp_path / "out4")


def test_empty_files_among_good_ones_are_counted_skips(tmp_path, logged):
    good = _write_events(tmp_path / "good.parquet", EVENTS)
    (tmp_path / "zero.parquet").write_bytes(b"")
    pq.write_table(pa.table({"user_id": pa.array([], pa.string()), "url": pa.array([], pa.string())}),
                   tmp_path / "norows.parquet")
    (tmp_path / "zero.csv").write_bytes(b"")
    (tmp_path / "header.csv").write_text("user_id,url\n")
    (tmp_path / "blank.jsonl").write_text("\n\n")
    with gzip.open(tmp_path / "empty.csv.gz", "wb"):
        pass
    inputs = [good, *(tmp_path / n for n in ("zero.parquet", "norows.parquet", "zero.csv", "header.csv",
                                             "blank.jsonl", "empty.csv.gz"))]
    c = prepare([str(i) for i in inputs], str(tmp_path / "out"), progress=False, report=True)
    assert c.meta["skipped"]["empty_files"] == 6
    assert c.meta["skipped_where"]["empty_files"] == [str(tmp_path / "zero.parquet"), str(tmp_path / "norows.parquet"),
                                                     str(tmp_path / "zero.csv")]
    assert _documents(c) == _documents(_prepare([good], tmp_path / "alone"))
    assert f"skipped 6 empty input file(s) (first: {tmp_path / 'zero.parquet'}, " in logged.text

    (tmp_path / "empty.txt").write_text("")
    with pytest.raises(CorpusError, match=r"zero\.parquet, .*zero\.csv and 1 more: the inputs hold no rows "
                                          r"\(every file is empty\)"):
        _prepare([tmp_path / n for n in ("zero.parquet", "norows.parquet", "zero.csv", "header.csv")],
                 tmp_path / "out2")
    with pytest.raises(CorpusError, match=r"empty\.txt: the inputs hold no rows"):
        _prepare([tmp_path / "empty.txt"], tmp_path / "out2", format="text")
    assert _leftovers(tmp_path) == ["out"]


def test_invalid_utf8_text_lines_are_skipped_and_keep_their_numbers(tmp_path, monkeypatch, logged):
    monkeypatch.setattr(read_formats, "TEXT_BLOCK_BYTES", 16)  # line numbers must hold across blocks
    lines = [b"good one", b"bad \xff line", b"caf\xc3\xa9 ok", b"\xc3 truncated", b"last good"]
    (tmp_path / "a.txt").write_bytes(b"\n".join(lines) + b"\n")
    (tmp_path / "b.txt").write_bytes(b"\xfe\xfe\nmore text\n")
    c = prepare([str(tmp_path / "a.txt"), str(tmp_path / "b.txt")], str(tmp_path / "out"), PrepareConfig(format="text"), progress=False, report=True)
    # Bad lines 1, 3 (a.txt) and 5 (b.txt line 0) are gone; later lines keep their numbers as keys.
    assert _documents(c) == {"0": ["good", "one"], "2": ["café", "ok"], "4": ["last", "good"], "6": ["more", "text"]}
    assert c.meta["skipped"]["invalid_utf8_lines"] == 3
    assert c.meta["skipped"]["docs_without_tokens"] == 0  # not counted twice
    assert c.meta["skipped_where"]["invalid_utf8_lines"] == [f"{tmp_path / 'a.txt'} line 1", f"{tmp_path / 'a.txt'} line 3",
                                                            f"{tmp_path / 'b.txt'} line 0"]
    assert c.meta["input_rows"] == 7
    err = logged.text
    assert f"skipped 3 line(s) that are not valid UTF-8 (their keys are not reused) (first: {tmp_path / 'a.txt'} line 1" in err


def test_invalid_utf8_in_structured_files_is_an_error_naming_file_column_and_row(tmp_path, capsys):
    (tmp_path / "e.csv").write_bytes(b"user_id,url,note\nu1,a,\xff fine: not our column\nu1,b,x\nu\xe9,c,x\n")
    code, err = _cli(capsys, tmp_path / "e.csv", "--out", tmp_path / "out")
    _assert_one_line_error(code, err, f"{tmp_path / 'e.csv'}: column 'user_id' row 2 is not valid UTF-8")
    (tmp_path / "e.jsonl").write_bytes(b'{"user_id": "u", "url": "a"}\n{"user_id": "u", "url": "b\xff"}\n')
    with pytest.raises(CorpusError, match=r"e\.jsonl: column 'url' row 1 is not valid UTF-8"):
        _prepare([tmp_path / "e.jsonl"], tmp_path / "out")
    pq.write_table(pa.table({"user_id": pa.array([b"u", b"v\xff"], pa.binary()), "url": ["a", "b"]}),
                   tmp_path / "e.parquet")
    with pytest.raises(CorpusError, match=r"e\.parquet: column 'user_id' row 1 is not valid UTF-8"):
        _prepare([tmp_path / "e.parquet"], tmp_path / "out")
    (tmp_path / "l.jsonl").write_bytes(b'{"d": "x", "t": ["a"]}\n{"d": "y", "t": ["b", "\xff"]}\n')
    with pytest.raises(CorpusError, match=r"l\.jsonl: column 't' row 1 is not valid UTF-8"):
        _prepare([tmp_path / "l.jsonl"], tmp_path / "out", format="lists", doc_col="d", token_col="t")
    assert _leftovers(tmp_path) == []


def test_malformed_csv_row_is_an_error_with_a_hint(tmp_path):
    (tmp_path / "e.csv").write_text("user_id,url\nu,http://a/x\nu,http://b/?q=1,2\n")
    with pytest.raises(CorpusError, match=r"e\.csv: cannot read: CSV parse error: Expected 2 columns, got 3: .*"
                                          r"\(a field that holds the delimiter must be quoted\)$"):
        _prepare([tmp_path / "e.csv"], tmp_path / "out")


def test_duplicate_events_are_dropped_only_with_a_time_column(tmp_path, logged):
    rows = [("u1", "a", 1), ("u1", "b", 1), ("u1", "a", 1), ("u1", "a", 2), ("u2", "a", 1), ("u1", "a", None),
            (None, "a", 0), ("u1", "a", None)]
    a = _write_events(tmp_path / "a.parquet", rows)
    b = _write_events(tmp_path / "b.csv", [("u1", "b", 1), ("u2", "a", 1), ("u3", "c", 5)])  # repeats across files
    c = prepare([a, b], str(tmp_path / "out"), PrepareConfig(time_col="ts"), progress=False, report=True)
    assert c.meta["skipped"]["duplicate_events"] == 3 and c.meta["skipped"]["null_keys"] == 1
    # u1: a@1, b@1 (a@1 again and b@1 from b.csv dropped), a@2, then the two timeless a's (never duplicates).
    assert _documents(c) == {"u1": ["a", "b", "a", "a", "a"], "u2": ["a"], "u3": ["c"]}
    assert c.counts().tolist() == [5, 1, 1]  # training counts, after the drop
    assert "skipped 3 duplicate event(s): the same 'user_id', 'url' and 'ts' as an earlier one" in logged.text
    # Without a time column a repeated (user, URL) is another visit: kept.
    c = _prepare([a, b], tmp_path / "no-time")
    assert c.meta["skipped"]["duplicate_events"] == 0 and c.num_tokens == 10


def test_single_event_users_are_kept_counted_and_keep_their_event_with_holdout(tmp_path, capsys):
    rows = [("solo1", "a", 0), ("solo2", "b", 0), ("same", "a", 0), ("same", "a", 1)]
    rows += [("many", t, i) for i, t in enumerate("abcdef")]
    src = _write_events(tmp_path / "e.parquet", rows)
    code, err = _cli(capsys, src, "--out", tmp_path / "out", "--holdout", "0.5", "--holdout-out", tmp_path / "h.parquet")
    assert code == 0
    c = Corpus(str(tmp_path / "out"))
    assert c.meta["docs_with_one_token"] == 2
    assert c.meta["docs_without_heldout"] == 3  # solo1, solo2 and "same" (one distinct URL)
    docs = _documents(c)
    assert docs["solo1"] == ["a"] and docs["solo2"] == ["b"] and docs["same"] == ["a", "a"]
    held = pq.read_table(tmp_path / "h.parquet")
    assert set(held["key"].to_pylist()) == {"many"} and held.num_rows == 3
    assert "kept 2 document(s) with a single event: they train like any other" in err
    assert "held out nothing of 3 document(s) with one distinct token" in err


def test_a_user_with_a_million_events_is_used_whole(tmp_path):
    n = 1_000_000
    urls = np.arange(n) * 7919 % 5000  # every URL id 0..4999, in a scrambled order
    table = pa.table({"user_id": pa.array(["big"] * n + ["small"] * 3),
                      "url": pa.array(np.concatenate([urls, [1, 2, 3]])).cast(pa.string())})
    pq.write_table(table, tmp_path / "e.parquet")
    c = _prepare([tmp_path / "e.parquet"], tmp_path / "out")
    assert c.docs().to_pydict() == {"key": ["big", "small"], "id": [0, 1], "length": [n, 3]}
    assert c.num_tokens == n + 3
    # A reader asking for 1,000 tokens at a time still gets the long document whole, then the next.
    (doc_ids, offsets, tokens), rest = list(iter_shard(c.shard_paths[0], max_tokens=1000))
    assert doc_ids.tolist() == [0] and offsets.tolist() == [0, n] and rest[0].tolist() == [1]
    words = np.array(c.vocab()["token"].to_pylist()).astype(np.int64)
    assert np.array_equal(words[tokens[:n]], urls)  # all of them, in input order


def test_corrupt_and_truncated_parquet_through_the_cli(tmp_path, capsys):
    _write_events(tmp_path / "good.parquet", EVENTS)
    whole = (tmp_path / "good.parquet").read_bytes()
    out, held = tmp_path / "new" / "deeper" / "corpus", tmp_path / "h.parquet"
    for name, content in [("garbage.parquet", os.urandom(300)), ("truncated.parquet", whole[: len(whole) // 2])]:
        (tmp_path / name).write_bytes(content)
        code, err = _cli(capsys, tmp_path / "good.parquet", tmp_path / name, "--out", out,
                         "--holdout", "0.2", "--holdout-out", held)
        _assert_one_line_error(code, err, f"{tmp_path / name}: cannot read: ")
        # Nothing written, not even the directories made for the output.
        assert sorted(os.listdir(tmp_path)) == sorted(["good.parquet", name]), os.listdir(tmp_path)
        os.remove(tmp_path / name)


@pytest.mark.parametrize("case", ["missing column", "mistyped column", "no rows", "unknown file"])
def test_cli_prints_one_line_naming_the_file(tmp_path, capsys, case):
    path = tmp_path / "e.parquet"
    if case == "missing column":
        pq.write_table(pa.table({"uid": ["u"], "url": ["a"]}), path)
        needles = [f"{path}: column 'user_id' not found (columns: uid, url)"]
    elif case == "mistyped column":
        pq.write_table(pa.table({"user_id": ["u"], "url": [[1, 2]]}), path)
        needles = [f"{path}: column 'url' holds list<"]
    elif case == "no rows":
        path = tmp_path / "e.csv"
        path.write_text("user_id,url\n")
        needles = [f"{path}: the inputs hold no rows (every file is empty)"]
    else:
        path = tmp_path / "e.xlsx"
        path.write_text("x")
        needles = [f"{path}: unknown file type"]
    code, err = _cli(capsys, path, "--out", tmp_path / "out")
    _assert_one_line_error(code, err, *needles)
    assert sorted(os.listdir(tmp_path)) == [path.name]


def test_an_output_that_cannot_be_written_is_a_one_line_error(tmp_path):
    src = _write_events(tmp_path / "e.parquet", EVENTS)
    (tmp_path / "afile").write_text("")
    with pytest.raises(CorpusError, match=r"afile/corpus: cannot write the corpus: "):
        _prepare([src], tmp_path / "afile" / "corpus")
    assert sorted(os.listdir(tmp_path)) == ["afile", "e.parquet"]


# ----------------------------------------------------- CSV delimiters, whitespace (issue 26, item 12)

def test_a_semicolon_separated_csv_reads_with_delimiter(tmp_path, capsys):
    rows = "".join(f"{u};{v};{t}\n" for u, v, t in EVENTS)
    (tmp_path / "semi.csv").write_text("user_id;url;ts\n" + rows)
    (tmp_path / "tabs.csv").write_text("user_id\turl\tts\n" + rows.replace(";", "\t"))
    expected = _documents(_prepare([_write_events(tmp_path / "e.parquet", EVENTS)], tmp_path / "ref", time_col="ts"))
    code, err = _cli(capsys, tmp_path / "semi.csv", "--out", tmp_path / "out", "--time-col", "ts", "--delimiter", ";")
    assert code == 0, err
    assert _documents(Corpus(str(tmp_path / "out"))) == expected
    code, err = _cli(capsys, tmp_path / "tabs.csv", "--out", tmp_path / "out2", "--delimiter", "\\t")
    assert code == 0 and Corpus(str(tmp_path / "out2")).meta["delimiter"] == "\t", err
    # without it: the one-column header is named, and the option that reads it
    code, err = _cli(capsys, tmp_path / "semi.csv", "--out", tmp_path / "out3")
    _assert_one_line_error(code, err, f"{tmp_path}/semi.csv: column 'user_id' not found (columns: user_id;url;ts) "
                                      "(a header of one column: are the fields separated by ';'? give --delimiter ';')")
    code, err = _cli(capsys, tmp_path / "semi.csv", "--out", tmp_path / "out3", "--delimiter", ";;")
    _assert_one_line_error(code, err, "--delimiter must be one character other than a quote or a newline")
    assert not (tmp_path / "out3").exists()


def test_keys_and_tokens_with_edge_whitespace_are_stripped_counted_and_reported(tmp_path, logged):
    """' u1' and 'u1 ' are user u1, 'https://a.com/ ' is https://a.com/: stripped in every format, counted
    in corpus.json and reported; a key or token of whitespace alone is then empty, and skipped as such."""
    (tmp_path / "e.csv").write_text("user_id,url\nu1,https://a.com/\n u1,https://a.com/ \nu1 ,\thttps://b.com/\n"
                                    "u2,https://a.com/\n   ,https://c.com/\n")
    pq.write_table(pa.table({"user_id": ["u2\u00a0"], "url": [" https://b.com/"]}), tmp_path / "e.parquet")
    (tmp_path / "e.jsonl").write_text('{"user_id": " u3", "url": "https://a.com/"}\n')
    c = prepare([str(tmp_path / f) for f in ("e.csv", "e.parquet", "e.jsonl")], str(tmp_path / "out"),
                progress=False, report=True)
    assert _documents(c) == {"u1": ["https://a.com/", "https://a.com/", "https://b.com/"],
                             "u2": ["https://a.com/", "https://b.com/"], "u3": ["https://a.com/"]}
    assert c.meta["stripped_whitespace"] == {"user_id": 5, "url": 3}
    assert c.meta["stripped_where"]["url"] == [f"{tmp_path}/e.csv row 1", f"{tmp_path}/e.csv row 2",
                                               f"{tmp_path}/e.parquet row 0"]
    assert c.meta["skipped"]["empty_keys"] == 1  # "   "
    assert (f"stripped leading or trailing whitespace from 3 'url' value(s), so that they match the same values "
            f"without it (first: {tmp_path}/e.csv row 1") in logged.text

    pq.write_table(pa.table({"user_id": ["d"], "url": [["a ", " a", "b"]]}), tmp_path / "l.parquet")
    c = prepare([str(tmp_path / "l.parquet")], str(tmp_path / "lists"), PrepareConfig(format="lists"), progress=False)
    assert _documents(c) == {"d": ["a", "a", "b"]} and c.meta["stripped_whitespace"] == {"url": 2}
    assert c.meta["stripped_where"] == {"url": [f"{tmp_path}/l.parquet"]}


def test_numpy_of_gives_what_to_numpy_gives_read_only_and_zero_copy():
    from doc2vec_dist.corpus import numpy_of

    for values in (pa.array(np.arange(10, dtype=np.int64)).slice(3, 5), pa.array(np.arange(6, dtype=np.int32)),
                   pa.array(np.linspace(0, 1, 7, dtype=np.float16)), pa.array(np.ones(4, np.uint16)).slice(1),
                   pa.chunked_array([pa.array(np.arange(5, dtype=np.float32))])):
        out = numpy_of(values)
        expected = values.to_numpy()
        assert out.dtype == expected.dtype and not out.flags.writeable
        np.testing.assert_array_equal(out, expected)
    view = pa.array(np.arange(8, dtype=np.int64))
    assert np.shares_memory(numpy_of(view), np.frombuffer(view.buffers()[1], np.int64))  # no copy
    # what a view cannot be: nulls, several chunks, strings, as to_numpy makes them
    np.testing.assert_array_equal(numpy_of(pa.array([1.0, None, 3.0])), [1.0, np.nan, 3.0])
    np.testing.assert_array_equal(numpy_of(pa.chunked_array([[1, 2], [3]])), [1, 2, 3])
    assert list(numpy_of(pa.array(["a", "b"]))) == ["a", "b"]


def test_arrow_of_gives_what_pa_array_gives_over_the_same_memory():
    from doc2vec_dist.corpus import arrow_of, numpy_of

    for values in (np.arange(10, dtype=np.int64), np.arange(6, dtype=np.int32)[::2], np.linspace(0, 1, 7, dtype=np.float16),
                   np.ones(4, np.uint16), np.arange(5, dtype=np.float32), np.empty(0, np.float64)):
        out = arrow_of(values)
        expected = pa.array(values)
        assert out.type == expected.type and out.equals(expected) and out.null_count == 0
        np.testing.assert_array_equal(numpy_of(out), values)
    contiguous = np.arange(8, dtype=np.int64)
    assert np.shares_memory(numpy_of(arrow_of(contiguous)), contiguous)  # no copy
    # another byte order is read as its numbers (pa.array refuses it), not as this machine's bytes
    swapped = np.arange(3, dtype=np.dtype(np.int64).newbyteorder("S"))
    assert arrow_of(swapped).to_pylist() == [0, 1, 2] and arrow_of(swapped).type == pa.int64()
    for wrong in (np.zeros((2, 3), np.float32), np.array([True, False]), np.array(["a"])):
        with pytest.raises(ValueError, match="arrow_of takes a 1-D array of numbers"):
            arrow_of(wrong)


def test_a_worker_s_and_a_server_s_reading_imports_no_pandas(sample_corpus, trained_model):
    """What a worker and a server read as they start (the vocabulary's counts, the shards, a checkpoint's
    rows): pyarrow's to_numpy imported pandas for it, 0.2-0.5 s of every actor's start."""
    import subprocess
    import sys

    code = f"""
import sys
from doc2vec_dist import modeldir
from doc2vec_dist.corpus import Corpus, iter_shard
c = Corpus({sample_corpus[0]!r})
tokens = sum(len(t) for path in c.shard_paths for _, _, t in iter_shard(path))
assert tokens == c.num_tokens and len(c.counts()) == c.vocab_size
rows, state = modeldir.read_shard({trained_model!r}, "words_out", 0, 2)
assert len(rows) > 0
print("pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.strip() == "False", done.stdout + done.stderr


def test_a_server_s_checkpoint_writing_imports_no_pandas(tmp_path):
    """pa.array on a numpy array imports pandas the first time in a process (0.2-0.3 s of CPU), and every
    server wrote its checkpoint's columns with it: a 16-bit table with its Adagrad state, written and read
    back, in a fresh process."""
    import subprocess
    import sys

    model = str(tmp_path / "model")
    code = f"""
import sys
import numpy as np
import pyarrow as pa
from doc2vec_dist import checkpoint, modeldir, precision
from doc2vec_dist.corpus import numpy_of
ids = np.arange(1, 40, 3)
matrix = np.random.default_rng(0).standard_normal((len(ids), 8)).astype(np.float32)
state = np.abs(matrix[:, :1])
bits = precision.narrow(matrix, "bfloat16")
entry = checkpoint.write_slice({model!r}, 1, "docs", 1, 3, ids, bits, state, dtype="bfloat16")
with pa.memory_map(modeldir.version_dir({model!r}, 1) + "/" + entry["path"]) as source:
    table = pa.ipc.open_file(source).read_all()
same = (np.array_equal(numpy_of(table["id"]), ids) and np.array_equal(numpy_of(table["adagrad"]), state[:, 0])
        and np.array_equal(numpy_of(table["vector"].combine_chunks().flatten()).reshape(-1, 8), bits))
print(entry["rows"], same, "pandas" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0 and done.stdout.split() == ["13", "True", "False"], done.stdout + done.stderr


# ------------------------------------------------------------------ event times, untimed events, files
# passed over, heavy documents, --max-tokens-per-doc (issue 47)

def test_a_corpus_prepared_with_a_time_column_keeps_each_tokens_time(tmp_path):
    """A shard keeps `times` beside `tokens` (what a refresh needs to tell an event sent again from a new
    one); training reads doc_id and tokens alone, by position, and gets the same documents; without a
    time column there are no times."""
    rows = EVENTS + [("u5", "a", None)]
    src = _write_events(tmp_path / "e.parquet", rows)
    c = _prepare([src], tmp_path / "out", time_col="ts")
    (shard,) = c.shard_paths
    assert pa.ipc.open_file(shard).schema == corpus_mod.TIMED_SHARD_SCHEMA
    keys, words = c.docs()["key"].to_pylist(), c.vocab()["token"].to_pylist()
    found = {keys[d]: list(zip([words[t] for t in tokens[a:b]], times[a:b].tolist()))
             for ids, offsets, tokens, times in corpus_mod.shard_batches(shard)
             for d, a, b in zip(ids, offsets, offsets[1:])}
    expected: dict[str, list] = {}
    for user, url, ts in sorted(rows, key=lambda r: (np.inf if r[2] is None else r[2])):  # stable: ties in input order
        expected.setdefault(user, []).append((url, float("nan") if ts is None else float(ts)))
    assert {k: [(u, None if np.isnan(t) else t) for u, t in v] for k, v in found.items()} == \
        {k: [(u, None if np.isnan(t) else t) for u, t in v] for k, v in expected.items()}
    assert _documents(c) == {k: [u for u, _ in v] for k, v in expected.items()}
    assert pa.ipc.open_file(_prepare([src], tmp_path / "no-time").shard_paths[0]).schema == corpus_mod.SHARD_SCHEMA


def test_events_without_a_time_are_kept_counted_and_said(tmp_path, logged):
    """A null time was taken without a word: such events are counted (corpus.json, the first rows named)
    and a line says what became of them: kept after their user's timed events, or outside a window."""
    rows = [("u1", "a", 3), ("u1", "b", None), ("u1", "c", 1), ("u2", "a", None), (None, "z", None), ("u2", "b", 2)]
    src = _write_events(tmp_path / "e.csv", rows)
    c = _prepare([src], tmp_path / "out", time_col="ts", report=True)
    assert c.meta["events_without_time"] == 2  # the row without a user is skipped, not counted here
    assert c.meta["events_without_time_where"] == [f"{src} row 1", f"{src} row 3"]
    assert _documents(c) == {"u1": ["c", "a", "b"], "u2": ["b", "a"]}
    assert any(r.levelname == "WARNING" and r.getMessage() == (
        f"2 event(s) with a null 'ts' (first: {src} row 1, {src} row 3): kept, after their user's timed events (in "
        "input order); never a duplicate of another event, nor matched to one a base has") for r in logged.records)
    assert _prepare([src], tmp_path / "none").meta["events_without_time"] is None  # no time column, nothing to say


def test_files_in_an_input_folder_that_are_not_data_are_counted_and_named(tmp_path, logged):
    """A README.txt or a .DS_Store in an input folder was passed over without a word: such files are
    counted and named; what the tools that write data sets leave (_SUCCESS, _metadata, .crc checksums,
    _temporary/) stays quiet."""
    folder = tmp_path / "events"
    (folder / "_temporary").mkdir(parents=True)
    (folder / ".hidden").mkdir()
    _write_events(folder / "part-0.csv", EVENTS)
    for name in ("README.txt", ".DS_Store", "_SUCCESS", "_metadata", ".part-0.csv.crc", "_temporary/part-9.csv",
                 ".hidden/part-1.csv"):
        (folder / name).write_text("not data\n")
    c = _prepare([folder], tmp_path / "out", report=True)
    assert c.meta["skipped"]["unread_files"] == 3
    assert c.meta["skipped_where"]["unread_files"] == [str(folder / ".DS_Store"), str(folder / ".hidden") + os.sep,
                                                       str(folder / "README.txt")]
    assert (f"skipped 3 file(s) in the input folders that are not data (hidden, or not .parquet, .csv, .jsonl …) "
            f"(first: {folder / '.DS_Store'}, {folder / '.hidden'}{os.sep}, {folder / 'README.txt'})") in logged.text
    assert _documents(c) == _documents(_prepare([folder / "part-0.csv"], tmp_path / "alone"))
    quiet = tmp_path / "quiet"
    quiet.mkdir()
    _write_events(quiet / "part-0.csv", EVENTS)
    for name in ("_SUCCESS", "_metadata", ".part-0.csv.crc"):
        (quiet / name).write_text("")
    assert _prepare([quiet], tmp_path / "out2").meta["skipped"]["unread_files"] == 0


def test_a_document_holding_a_large_share_of_the_tokens_is_named(tmp_path, logged):
    """A user with 17% of all tokens (a bot) went unremarked: a document above HEAVY_SHARE of the tokens,
    in a corpus of HEAVY_MIN_DOCS documents or more, is named with its share, a line of its own."""
    from doc2vec_dist.prepare_report import HEAVY_MIN_DOCS

    rows = [(f"u{i}", f"url{(i * 7 + j) % 50}") for i in range(HEAVY_MIN_DOCS) for j in range(3)]
    rows += [("bot", f"url{j % 50}") for j in range(700)]
    src = _write_events(tmp_path / "e.parquet", rows, cols=("user_id", "url"))
    c = _prepare([src], tmp_path / "out", report=True)
    share = 700 / (3 * HEAVY_MIN_DOCS + 700)
    assert c.meta["heavy_docs"] == [{"key": "bot", "tokens": 700, "share": round(share, 4)}]
    assert any(r.levelname == "WARNING" and r.getMessage().startswith(
        f"document 'bot' ('user_id') holds {share:.1%} of all tokens (700 of {3 * HEAVY_MIN_DOCS + 700:,}), over 5%")
        for r in logged.records)
    small = _write_events(tmp_path / "small.parquet", rows[:300] + rows[-700:], cols=("user_id", "url"))
    assert _prepare([small], tmp_path / "small").meta["heavy_docs"] == []  # 100 documents: shares say little


def test_keys_and_urls_one_in_unicode_nfc_but_written_apart_are_said(tmp_path, logged):
    """'Jos\\xe9' and 'Jose\\u0301' (one name in NFC and NFD: two exporters, two platforms) became two users
    without a word. They are kept apart, as written (an id is the user's to define), and counted, the first pair
    named as ascii() shows them; an ASCII key that a wide one becomes in NFC ('K' and the Kelvin sign) counts."""
    nfc, nfd = "Jos\u00e9", "Jose\u0301"
    rows = [(nfc, "http://a.example/caf\u00e9"), (nfd, "http://a.example/cafe\u0301"), (nfc, "http://b.example/x"),
            ("K", "http://b.example/x"), ("\u212a", "http://c.example/y"), ("ann", "http://c.example/y")]
    src = _write_events(tmp_path / "e.parquet", rows, cols=("user_id", "url"))
    c = _prepare([src], tmp_path / "out", report=True)
    assert c.num_docs == 5  # kept apart
    docs = c.meta["unicode_twins"]["docs"]
    assert (docs["count"], docs["forms"]) == (4, 2) and sorted(docs["first"]) in (
        sorted([ascii(nfc), ascii(nfd)]), sorted([ascii("K"), ascii("\u212a")]))
    urls = c.meta["unicode_twins"]["tokens"]
    assert (urls["count"], urls["forms"], sorted(urls["first"])) == (
        2, 1, sorted([ascii("http://a.example/caf\u00e9"), ascii("http://a.example/cafe\u0301")]))
    said = [r.getMessage() for r in logged.records if r.levelname == "WARNING"]
    assert any(m.startswith("4 'user_id' key(s) equal to another in Unicode's NFC form but written apart (first: ")
               and m.endswith("2 such form(s)): kept apart, as written, as different users; write each in one form "
                              "if they are one") for m in said), said
    assert any(m.startswith("2 'url' value(s) equal to another") and "as different URLs" in m for m in said), said
    plain = _write_events(tmp_path / "plain.parquet", rows[2:4] + rows[5:], cols=("user_id", "url"))
    assert _prepare([plain], tmp_path / "plain").meta["unicode_twins"] == {}


@pytest.mark.parametrize("time_col", ["ts", None])
def test_max_tokens_per_doc_keeps_each_documents_latest_events(tmp_path, logged, time_col):
    """--max-tokens-per-doc N (opt-in): a document keeps its most recent N events by time, else its last N
    in input order; the documents cut and the events dropped are counted and said."""
    rows = [("bot", f"url{j}", 100 - j) for j in range(10)] + [("u1", "a", 5), ("u1", "b", 1), ("u2", "c", 0)]
    src = _write_events(tmp_path / "e.parquet", rows)
    c = _prepare([src], tmp_path / "out", time_col=time_col, max_tokens_per_doc=3, report=True)
    docs = _documents(c)
    # by time the bot's latest events are url2, url1, url0 (times 98, 99, 100), in time order; else its last rows
    assert docs["bot"] == (["url2", "url1", "url0"] if time_col else ["url7", "url8", "url9"])
    assert docs["u1"] == (["b", "a"] if time_col else ["a", "b"]) and docs["u2"] == ["c"]
    assert c.meta["skipped"]["tokens_beyond_max_per_doc"] == 7 and c.meta["docs_capped"] == 1
    assert c.num_tokens == 6 and c.docs()["length"].to_pylist()[0] == 3 and c.counts().sum() == 6
    token = "event"
    assert (f"skipped 7 {token}(s) beyond max_tokens_per_doc=3: the earliest of 1 document(s) longer than that "
            "(first: bot)") in logged.text
    # the 7 URLs cut stay in the vocabulary with no event: said (their rows are never trained)
    assert c.meta["words_without_events"] == 7 == int((c.counts() == 0).sum()) and c.vocab_size == 13
    assert ("kept 7 of the 13 'url' values in the vocabulary with no event left to train on (all held out, or cut by "
            "--max-tokens-per-doc)") in logged.text
    with pytest.raises(CorpusError, match="--max-tokens-per-doc must be >= 1, not 0"):
        _prepare([src], tmp_path / "zero", max_tokens_per_doc=0)


def test_max_tokens_per_doc_keeps_timed_events_before_untimed_ones(tmp_path):
    """An event without a time goes after its user's timed ones, and the cap kept the last N: every untimed
    event beat the most recent timed one (a user's review: 3 kept of 5 timed and 2 undated were the newest
    timed event and both undated ones). Untimed events now fill only the places the timed ones leave."""
    t0 = 1_700_000_000
    rows = ([("mix", f"t{j}", t0 + j) for j in range(5)] + [("mix", "x0", None), ("mix", "x1", None)]
            + [("few", "f0", t0), ("few", "y0", None), ("few", "y1", None), ("few", "y2", None)]
            + [("none", f"z{j}", None) for j in range(4)] + [("short", "s0", None), ("short", "s1", t0)])
    c = _prepare([_write_events(tmp_path / "e.parquet", rows)], tmp_path / "out", time_col="ts", max_tokens_per_doc=3)
    docs = _documents(c)
    assert docs["mix"] == ["t2", "t3", "t4"]  # its 3 most recent timed events; before: t4, x0, x1
    assert docs["few"] == ["f0", "y1", "y2"]  # its one timed event, then the last untimed ones read
    assert docs["none"] == ["z1", "z2", "z3"]  # none timed: the last 3 read, as without --time-col
    assert docs["short"] == ["s1", "s0"]  # under the cap: all of it
    assert c.meta["skipped"]["tokens_beyond_max_per_doc"] == 4 + 1 + 1 and c.meta["docs_capped"] == 3


def test_max_tokens_per_doc_in_a_refresh_caps_the_joined_documents(tmp_path):
    """In a refresh the cap applies to the document a user's new events join: its latest events stay,
    whichever day they came from; both ways of joining alike."""
    t0 = 1_700_000_000
    old = _write_events(tmp_path / "old.parquet", [("bot", f"o{j}", t0 + j) for j in range(5)] + [("u1", "a", t0 + 1)])
    new = _write_events(tmp_path / "new.parquet", [("bot", "n0", t0 + 10), ("bot", "o2", t0 + 2), ("u2", "b", t0 + 11)])
    base = _prepare([old], tmp_path / "base", time_col="ts", num_shards=2)
    for name, shards in (("joined", None), ("re-bucketed", 3)):
        c = _prepare([new], tmp_path / name, time_col="ts", base=base.path, num_shards=shards, max_tokens_per_doc=4)
        assert _documents(c) == {"bot": ["o2", "o3", "o4", "n0"], "u1": ["a"], "u2": ["b"]}, name
        assert c.meta["skipped"]["tokens_beyond_max_per_doc"] == 2 and c.meta["docs_capped"] == 1
        assert c.meta["skipped"]["events_in_base"] == 1  # bot's o2 at t0 + 2: the base has it
        assert dict(zip(c.docs()["key"].to_pylist(), c.docs()["length"].to_pylist())) == {"bot": 4, "u1": 1, "u2": 1}
