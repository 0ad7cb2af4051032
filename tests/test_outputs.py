"""Every command replaces only an output of its own kind, recognised by its marker (doc2vec_dist/outputs.py).

Each case is a folder or file a user could point --out at by mistake; the command must refuse it with
one line naming what it found, and leave every byte of it as it was.
"""

from __future__ import annotations

import os
import types

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import checkpoint, modeldir, outputs, storage
from doc2vec_dist.cli import main
from doc2vec_dist.errors import UserError


def _user_folder(tmp_path, name="mine", file="keep.txt"):
    folder = tmp_path / name
    folder.mkdir()
    (folder / file).write_text("the user's own notes\n")
    return folder


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert err and err[-1].startswith("error: "), err
    return err[-1]


# -- judge_dir: the rule itself ----------------------------------------------------------------------

@pytest.mark.parametrize("names, marker, overwrite, expected", [
    ([], None, False, False),                                            # empty: write into it
    (["corpus.json", "vocab.arrow", "docs.arrow", "shards"], None, True, True),  # a corpus from before markers
    ([outputs.MARKER, "corpus.json", "shards"], "corpus", True, True),
    ([outputs.MARKER, "part-00000.parquet"], "export", None, True),     # export replaces its own, no flag
    (["part-00000.parquet", "part-00001.parquet"], None, None, True),    # an export from before markers
])
def test_judge_dir_accepts_empty_and_own(names, marker, overwrite, expected):
    kind = "corpus" if "corpus.json" in names or marker == "corpus" or not names else "export"
    assert outputs.judge_dir("D", kind, names, marker, overwrite) is expected


def test_a_settings_search_is_recognised_by_its_marker():
    assert outputs.judge_dir("D", "tune", [outputs.MARKER, "validation", "trials.csv"], "tune", None) is True


@pytest.mark.parametrize("kind, names, marker, overwrite, first_words", [
    ("corpus", ["keep.txt"], None, True, "D: exists and is not a corpus made by doc2vec-dist (it holds keep.txt)"),
    ("model", ["notes.txt"], None, True, "D: exists and is not a model made by doc2vec-dist (it holds notes.txt)"),
    ("model", [outputs.MARKER, "corpus.json"], "corpus", True, ("D: holds a corpus (made by doc2vec-dist prepare), "
                                                                "not a model")),
    ("model", [outputs.MARKER, "LATEST", "notes.txt"], "model", True, "D: holds a model, and also notes.txt, which"),
    ("model", [outputs.MARKER, "LATEST", "checkpoints"], "model", False, "D: already holds a model; pass --overwrite"),
    ("export", ["part-00000.parquet", "keep.txt"], None, None, "D: exists and is not an export made by"),
    ("index", [outputs.MARKER, "index.faiss"], "export", None, ("D: holds an export (made by doc2vec-dist export), "
                                                                "not a faiss index")),
    # a folder of the user's whose entries happen to have a search's names is not taken for a search
    ("tune", ["validation", "compare"], None, None, "D: exists and is not a settings search made by"),
])
def test_judge_dir_refuses_everything_else_naming_it(kind, names, marker, overwrite, first_words):
    with pytest.raises(UserError) as info:
        outputs.judge_dir("D", kind, names, marker, overwrite)
    assert str(info.value).startswith(first_words), str(info.value)
    assert "\n" not in str(info.value)


def test_file_kind_reads_the_markers(tmp_path):
    ours = tmp_path / "ours.parquet"
    pq.write_table(pa.table({"key": ["a"]}, metadata=outputs.parquet_metadata("vectors")), ours)
    theirs = tmp_path / "theirs.parquet"
    pq.write_table(pa.table({"key": ["a"], "vector": [[1.0]]}), theirs)
    text = tmp_path / "notes.txt"
    text.write_text("12 monkeys\n")
    w2v = tmp_path / "vectors.txt"
    w2v.write_text("2 3\na 1 2 3\nb 4 5 6\n")
    plan = tmp_path / "plan.json"
    plan.write_text('{"doc2vec_dist": "plan", "x": 1}')
    # a 'rows dim' header is every word2vec text file's (gensim's, fastText's): ours only beside its marker
    pretrained = tmp_path / "pretrained.vec"
    pretrained.write_text("2 3\na 1 2 3\nb 4 5 6\n")
    (tmp_path / ("vectors.txt" + outputs.MARKER)).write_text('{"doc2vec_dist": "word2vec-marker"}')
    assert [outputs.file_kind(str(p)) for p in (ours, theirs, text, w2v, plan, pretrained)] == [
        "vectors", None, None, "word2vec", "plan", None]
    outputs.check_file(str(ours), "vectors")
    with pytest.raises(UserError, match="theirs.parquet: exists and is not a file doc2vec-dist wrote"):
        outputs.check_file(str(theirs), "vectors")
    with pytest.raises(UserError, match="is a word2vec text file"):
        outputs.check_file(str(w2v), "vectors")
    with pytest.raises(UserError, match="pretrained.vec: exists and is not a file doc2vec-dist wrote"):
        outputs.check_file(str(pretrained), "word2vec")


# -- through the real commands -----------------------------------------------------------------------

def test_prepare_overwrite_refuses_a_folder_of_the_users(tmp_path, capsys, sample_corpus, snapshot):
    folder = _user_folder(tmp_path)
    before = snapshot(folder)
    events = os.path.join(os.path.dirname(sample_corpus[0]), "..")  # any input: refused before it is read
    assert main(["prepare", events, "--out", str(folder), "--overwrite", "--no-progress"]) == 2
    assert _error(capsys).startswith(f"error: {folder}: exists and is not a corpus made by doc2vec-dist "
                                     "(it holds keep.txt)")
    assert snapshot(folder) == before


def test_prepare_overwrite_replaces_its_own_corpus_only(tmp_path, capsys):
    events = tmp_path / "events.csv"
    events.write_text("user_id,url\nu1,a\nu1,b\nu2,a\n")
    out = tmp_path / "corpus"
    assert main(["prepare", str(events), "--out", str(out), "--no-progress"]) == 0
    assert outputs.read_marker_kind((out / outputs.MARKER).read_bytes()) == "corpus"
    assert main(["prepare", str(events), "--out", str(out), "--no-progress"]) == 2
    assert _error(capsys) == f"error: {out}: already holds a corpus; pass --overwrite to replace it, or choose " \
                             "another --out"
    (out / "keep.txt").write_text("mine")  # something of the user's inside our corpus: never deleted
    assert main(["prepare", str(events), "--out", str(out), "--overwrite", "--no-progress"]) == 2
    assert "also keep.txt, which doc2vec-dist did not write" in _error(capsys)
    os.remove(out / "keep.txt")
    assert main(["prepare", str(events), "--out", str(out), "--overwrite", "--no-progress"]) == 0
    empty = tmp_path / "empty"
    empty.mkdir()  # an empty folder is fine
    assert main(["prepare", str(events), "--out", str(empty), "--no-progress"]) == 0
    assert (empty / "corpus.json").exists()


def test_prepare_refuses_a_heldout_file_it_did_not_write(tmp_path, capsys):
    events = tmp_path / "events.csv"
    events.write_text("user_id,url\nu1,a\nu1,b\nu2,a\nu2,c\n")
    mine = tmp_path / "heldout.parquet"
    pq.write_table(pa.table({"x": [1]}), mine)
    before = mine.read_bytes()
    assert main(["prepare", str(events), "--out", str(tmp_path / "c"), "--holdout", "0.5", "--holdout-out",
                 str(mine), "--overwrite", "--no-progress"]) == 2
    assert _error(capsys).startswith(f"error: {mine}: exists and is not a file doc2vec-dist wrote")
    assert mine.read_bytes() == before and not (tmp_path / "c").exists()


def test_train_refuses_a_folder_of_the_users_before_starting_ray(tmp_path, capsys, sample_corpus, snapshot):
    import ray

    for flags in ([], ["--overwrite"]):
        folder = _user_folder(tmp_path, f"m{len(flags)}", "notes.txt")
        before = snapshot(folder)
        started = ray.is_initialized()
        assert main(["train", "--corpus", sample_corpus[0], "--out", str(folder), "--no-progress", *flags]) == 2
        assert _error(capsys).startswith(f"error: {folder}: exists and is not a model made by doc2vec-dist "
                                         "(it holds notes.txt)")
        assert snapshot(folder) == before
        assert ray.is_initialized() == started  # refused before Ray


def test_baseline_refuses_a_folder_of_the_users(tmp_path, capsys, sample_corpus, snapshot):
    folder = _user_folder(tmp_path, "g", "notes.txt")
    before = snapshot(folder)
    assert main(["baseline", "--corpus", sample_corpus[0], "--out", str(folder), "--overwrite", "--no-progress"]) == 2
    assert "is not a model made by doc2vec-dist" in _error(capsys)
    assert snapshot(folder) == before


def test_export_and_index_replace_only_their_own(trained_model, tmp_path, capsys):
    notes = tmp_path / "mynotes.parquet"
    pq.write_table(pa.table({"note": ["do not lose me"]}), notes)
    text = tmp_path / "notes.txt"
    text.write_text("my notes\n")
    before = notes.read_bytes()
    assert main(["export", "--model", trained_model, "--out", str(notes), "--no-progress"]) == 2
    assert _error(capsys).startswith(f"error: {notes}: exists and is not a file doc2vec-dist wrote")
    assert notes.read_bytes() == before
    assert main(["export", "--model", trained_model, "--out", str(text), "--format", "word2vec", "--no-progress"]) == 2
    assert text.read_text() == "my notes\n"
    # its own outputs are replaced, files and directories alike
    for out, fmt in ((tmp_path / "users.parquet", "parquet"), (tmp_path / "users", "parquet"),
                     (tmp_path / "users.txt", "word2vec"), (tmp_path / "npy", "npy")):
        for _ in range(2):
            assert main(["export", "--model", trained_model, "--out", str(out), "--format", fmt, "--no-progress"]) == 0
    assert outputs.file_kind(str(tmp_path / "users.parquet")) == "vectors"
    assert outputs.read_marker_kind((tmp_path / "npy" / outputs.MARKER).read_bytes()) == "export"
    folder = _user_folder(tmp_path, "idx")
    assert main(["index", "--model", trained_model, "--out", str(folder), "--no-progress"]) == 2
    assert "is not a faiss index made by doc2vec-dist (it holds keep.txt)" in _error(capsys)
    assert main(["index", "--model", trained_model, "--out", str(tmp_path / "npy"), "--no-progress"]) == 2
    assert "holds an export (made by doc2vec-dist export), not a faiss index" in _error(capsys)


def test_infer_replaces_only_a_vectors_file(trained_model, tmp_path, capsys, sample_corpus):
    events = tmp_path / "new.csv"
    events.write_text("user_id,url\nnew1," + _some_url(trained_model) + "\n")
    theirs = tmp_path / "users.parquet"
    pq.write_table(pa.table({"key": ["x"], "vector": [[0.0]]}), theirs)
    before = theirs.read_bytes()
    assert main(["infer", "--model", trained_model, str(events), "--out", str(theirs), "--no-progress"]) == 2
    assert _error(capsys).startswith(f"error: {theirs}: exists and is not a file doc2vec-dist wrote")
    assert theirs.read_bytes() == before
    ours = tmp_path / "ours.parquet"
    for _ in range(2):
        assert main(["infer", "--model", trained_model, str(events), "--out", str(ours), "--no-progress"]) == 0
    assert pq.read_table(ours).column("key").to_pylist() == ["new1"]


def _some_url(model: str) -> str:
    from doc2vec_dist.modeldir import ModelDir

    return ModelDir(model).keys("words_out")[0].as_py()


def test_plan_json_replaces_only_a_plan(tmp_path):
    from doc2vec_dist.plan import save_json

    path = str(tmp_path / "plan.json")
    save_json(path, {"a": 1})
    save_json(path, {"a": 2})
    assert outputs.file_kind(path) == "plan"
    mine = tmp_path / "settings.json"
    mine.write_text('{"mine": true}')
    with pytest.raises(UserError, match="settings.json: exists and is not a file doc2vec-dist wrote"):
        save_json(str(mine), {"a": 1})
    assert mine.read_text() == '{"mine": true}'


def test_start_model_dir_replaces_a_model_but_keeps_what_is_not_its_own(tmp_path, sample_corpus):
    out = str(tmp_path / "model")
    made = checkpoint.start_model_dir(out, sample_corpus[0], overwrite=False)
    assert made == [out]
    os.makedirs(os.path.join(out, "exports"))  # jobs/train.py's default exports folder
    (tmp_path / "model" / "exports" / "job.json").write_text("{}")
    os.makedirs(os.path.join(out, "checkpoints", "v1"))
    storage.Store.of(out).write_json("LATEST", "v1")  # a committed model, as far as the check goes
    with pytest.raises(UserError, match="already holds a model; pass --overwrite"):
        checkpoint.start_model_dir(out, sample_corpus[0], overwrite=False)
    assert checkpoint.start_model_dir(out, sample_corpus[0], overwrite=True) == []
    assert sorted(os.listdir(out)) == sorted([outputs.MARKER, "docs.arrow", "vocab.arrow", "exports"])
    assert os.path.exists(os.path.join(out, "exports", "job.json"))


def test_discard_unfinished_removes_a_fresh_model_and_keeps_a_committed_one(tmp_path, sample_corpus):
    parent = tmp_path / "new" / "deeper"
    out = str(parent / "model")
    made = checkpoint.start_model_dir(out, sample_corpus[0], overwrite=False)
    assert made == [str(tmp_path / "new"), str(parent), out]
    assert checkpoint.discard_unfinished(out, made)
    assert not (tmp_path / "new").exists()  # and the folders it made for it
    # into an existing empty folder: the folder stays, empty again
    empty = tmp_path / "empty"
    empty.mkdir()
    made = checkpoint.start_model_dir(str(empty), sample_corpus[0], overwrite=False)
    assert made == [] and checkpoint.discard_unfinished(str(empty), made)
    assert empty.exists() and os.listdir(empty) == []
    # a model with a committed checkpoint is whole and resumable: it stays
    out = str(tmp_path / "kept")
    made = checkpoint.start_model_dir(out, sample_corpus[0], overwrite=False)
    version = checkpoint.next_version(out)
    part = checkpoint.write_slice(out, version, "docs", 0, 1, np.arange(2, dtype=np.int64),
                                  np.zeros((2, 4), np.float32))
    checkpoint.commit(out, version, {"docs": [part]}, {"docs": 4}, {"epoch": 1}, keep=2)
    assert not checkpoint.discard_unfinished(out, made)
    assert modeldir.latest_version(out) == version


# -- issue 26, item 14: temporary names no other process holds ------------------------------------------

def _theirs(path) -> bytes:
    """A file at `path` as another process would have it: one with our process id, on another machine."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as fh:
        fh.write(b"another process's output, being written")
    return b"another process's output, being written"


def test_a_temporary_name_with_this_process_id_that_another_process_holds_is_left_alone(tmp_path, snapshot):
    pid = os.getpid()
    # a file output (outputs.replacing), a directory output, a whole local write, generate's staging folder
    theirs = {f"users.parquet.tmp-{pid}": None, f"corpus.tmp-{pid}": "part.arrow", f"notes.json.tmp-{pid}": None,
              f"gen.partial-{pid}": "events.parquet"}
    for name, inside in theirs.items():
        _theirs(str(tmp_path / name / inside) if inside else str(tmp_path / name))
    before = {name: snapshot(str(tmp_path / name)) for name in theirs}

    table = pa.table({"key": ["a"], "vector": pa.FixedSizeListArray.from_arrays(pa.array([0.5, 0.5], pa.float32()), 2)})
    outputs.write_parquet_file(table, str(tmp_path / "users.parquet"), "vectors")
    with outputs.replacing(str(tmp_path / "corpus"), "corpus") as staged:
        (tmp_path / staged.path / "corpus.json").write_text("{}")
    storage.write_local(str(tmp_path / "notes.json"), "{}")
    from doc2vec_dist.synthetic import generate

    generate(str(tmp_path / "gen"), 20, 10, progress=False)

    assert {name: snapshot(str(tmp_path / name)) for name in theirs} == before
    assert pq.read_table(tmp_path / "users.parquet").num_rows == 1
    assert (tmp_path / "corpus" / "corpus.json").exists() and (tmp_path / "notes.json").read_text() == "{}"
    assert (tmp_path / "gen" / "generate.json").exists()
    # and nothing of ours is left beside them
    assert sorted(os.listdir(tmp_path)) == sorted([*theirs, "users.parquet", "corpus", "notes.json", "gen"])


def test_a_staged_output_is_a_new_name_of_this_process_with_the_usual_permissions(tmp_path):
    out = str(tmp_path / "users.parquet")
    first, second = outputs.temp_path(out), outputs.temp_path(out)
    assert first != second and all(os.path.basename(p).startswith(f"users.parquet.tmp-{os.getpid()}-")
                                   for p in (first, second))
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(first).st_mode & 0o777 == 0o666 & ~umask  # as open() would make it
    folder = outputs.temp_path(str(tmp_path / "corpus"), directory=True)
    assert os.stat(folder).st_mode & 0o777 == 0o777 & ~umask


class _OsOf(types.SimpleNamespace):
    """`os` as outputs.py sees it, with the calls given replaced: the test's process (its Ray threads) keeps
    the real one."""

    def __getattr__(self, name):
        return getattr(os, name)


@pytest.mark.parametrize("directory", [False, True])
def test_a_ctrl_c_as_a_staged_name_is_made_leaves_nothing(tmp_path, monkeypatch, directory):
    """A Ctrl-C is raised as the call that made the entry returns, before the caller has its name (a full
    run's `prepare` left its writability probe, `.doc2vec-dist-probe.tmp-…`, so). Here the interrupt comes
    right after the real call: the file or folder is made, then the KeyboardInterrupt. Nothing is left,
    and a name some other process holds is not touched."""
    theirs = tmp_path / "out.tmp-1-theirs"
    theirs.write_text("someone else's")
    made = os.mkdir if directory else os.open

    def then_interrupted(*args, **kwargs):
        made(*args, **kwargs)  # (the descriptor leaks: the process is being interrupted)
        raise KeyboardInterrupt

    monkeypatch.setattr(outputs, "os", _OsOf(**{"mkdir" if directory else "open": then_interrupted}))
    with pytest.raises(KeyboardInterrupt):
        outputs.temp_path(str(tmp_path / "out"), directory=directory)
    if not directory:
        with pytest.raises(KeyboardInterrupt):
            outputs.check_writable(str(tmp_path / "model"))  # the probe, a file
    monkeypatch.undo()
    assert os.listdir(tmp_path) == ["out.tmp-1-theirs"] and theirs.read_text() == "someone else's"


def test_a_ctrl_c_while_an_outputs_folders_are_made_leaves_none_of_them(tmp_path, monkeypatch):
    made = os.makedirs
    calls = []

    def second_interrupted(path, *args, **kwargs):
        made(path, *args, **kwargs)
        calls.append(path)
        if len(calls) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(outputs, "os", _OsOf(makedirs=second_interrupted))
    with pytest.raises(KeyboardInterrupt), outputs.replacing(str(tmp_path / "a" / "b" / "c" / "users.parquet"), "vectors"):
        pass
    monkeypatch.undo()
    assert len(calls) == 2 and os.listdir(tmp_path) == []


def test_a_failed_output_removes_the_folders_made_for_it(tmp_path):
    out = str(tmp_path / "new" / "deeper" / "users.parquet")
    with pytest.raises(RuntimeError), outputs.replacing(out, "vectors"):
        raise RuntimeError("the body failed")
    assert os.listdir(tmp_path) == []


# -- issue 26, item 4: a place one cannot write to is named before any work ------------------------------

def test_check_writable_probes_where_the_first_new_entry_goes(tmpfs):
    def prepared(path):
        os.mkdir(os.path.join(path, "scratch"))

    ro = tmpfs.mount("ro", "1m", read_only=True, fill=prepared)
    writable = tmpfs.mount(os.path.join("ro", "scratch"), "1m")  # a writable disk inside a read-only one
    outputs.check_writable(os.path.join(writable, "new", "model"))  # made inside it
    outputs.check_writable(writable, inside=True)  # written into (train, tune, a scratch directory)
    with pytest.raises(UserError, match=f"^cannot write to {writable}: read-only file system$"):
        outputs.check_writable(writable)  # replaced by a rename in its read-only parent
    with pytest.raises(UserError, match=f"^cannot write to {ro}/a/b/users.parquet: read-only file system$"):
        outputs.check_writable(os.path.join(ro, "a", "b", "users.parquet"))
    assert os.listdir(writable) == []  # the probes leave nothing
    outputs.check_writable("s3://bucket/model")  # an object store is not probed (no request is made)


def test_evaluate_prints_its_figures_before_saying_it_cannot_save_them(trained_model, sample_corpus, tmpfs,
                                                                        capsys):
    import shutil

    ro = tmpfs.mount("ro", "20m", read_only=True, fill=lambda path: shutil.copytree(trained_model,
                                                                                  os.path.join(path, "model")))
    model = os.path.join(ro, "model")
    assert main(["evaluate", "--model", model, "--heldout", sample_corpus[1]]) == 2
    out, err = capsys.readouterr()
    figures = dict(line.split() for line in out.splitlines())
    assert 0 < float(figures["model_recall@10"]) <= 1, out
    assert err.strip().splitlines()[-1] == (f"error: cannot write to {model}/eval-heldout.json: read-only file "
                                            "system; the figures above are not saved")
