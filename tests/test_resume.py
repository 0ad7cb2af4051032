"""Checkpoints mid-epoch, `--resume` (same or different number of servers), and a diverging run that
leaves its last good checkpoint intact: on the real local Ray, with real drivers killed."""

from __future__ import annotations

import dataclasses
import json
import os
import re
import signal
import subprocess
import sys
import time
import types

import numpy as np
import pytest

from doc2vec_dist import checkpoint, modeldir, trainer
from doc2vec_dist.cli import main
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.errors import UserError
from doc2vec_dist.evaluate import heldout_metrics
from doc2vec_dist.run import STEP_PAUSE_ENV, TrainingStopped
from doc2vec_dist.trainer import resumed_config, train
from doc2vec_dist.units import Unit, read_chunks

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# the trained_model fixture's settings (tests/conftest.py): a resumed run must end as good as it
SAMPLE = {"dim": 32, "epochs": 10, "sample": 0, "num_ps": 2, "num_workers": 2, "cpus_per_worker": 1,
          "progress": False}


def manifest_of(model: str, version: int) -> dict:
    with open(os.path.join(modeldir.version_dir(model, version), "manifest.json")) as fh:
        return json.load(fh)


def latest(model: str) -> int:
    with open(os.path.join(model, "LATEST")) as fh:
        return int(fh.read().strip()[1:])


def test_worker_data_positions_cover_the_rest_of_its_units_exactly(sample_corpus):
    corpus = Corpus(sample_corpus[0])
    path = corpus.shard_paths[0]
    docs = corpus.meta["shards"][0]["docs"]
    units = [Unit(path, 0, docs // 2, 0), Unit(path, docs // 2, docs, 0)]
    macro_batch = 5000  # tokens a chunk holds at most
    every = [(start, ids) for start, (ids, _, _) in read_chunks(units, macro_batch)]
    seen = np.concatenate([ids for _, ids in every])
    assert len(every) > 4 and len(np.unique(seen)) == docs == len(seen)
    # restart from the position of the 4th chunk: exactly the documents from it onwards
    (unit, row), _ = every[3]
    rest = np.concatenate([ids for _, (ids, _, _) in read_chunks(units, macro_batch, unit, row)])
    np.testing.assert_array_equal(rest, seen[sum(len(ids) for _, ids in every[:3]):])
    assert list(read_chunks(units, macro_batch, len(units), None)) == []  # a finished worker reads nothing


def test_checkpoints_are_taken_mid_epoch_with_each_workers_position(ray_cluster, sample_corpus, tmp_path,
                                                                    monkeypatch):
    model = str(tmp_path / "model")
    monkeypatch.setenv(STEP_PAUSE_ENV, "0.03")  # each macro-batch 30 ms longer: an epoch outlasts the tick anywhere
    summary = train(sample_corpus[0], model, TrainConfig(**{**SAMPLE, "epochs": 3}, checkpoint_every=0.02,
                                                         keep_checkpoints=1000))
    versions = range(1, latest(model) + 1)
    manifests = [manifest_of(model, v) for v in versions]
    mid = [m for m in manifests if m["positions"] is not None]
    assert mid, "no mid-epoch checkpoint in a run with checkpoint_every 0.02 s"
    for m in mid:
        assert len(m["positions"]) == 2
        assert all(p["epoch"] == m["epoch"] and p["tokens"] >= 0 for p in m["positions"])
        assert 0.025 >= m["lr"] >= 0.0001
    # and one at each epoch end, positions None, epoch counting up to the last
    ends = [m["epoch"] for m in manifests if m["positions"] is None]
    assert ends == [1, 2, 3]
    assert summary["checkpoint_seconds"] > 0


def test_a_checkpoint_names_the_workers_that_have_not_paused_after_a_while(ray_cluster, logged, monkeypatch):
    """A run that seems stuck at a checkpoint says, once, which workers have not paused and their processes
    (as the hang fixed at stop 63 would have), and goes on waiting: the driver's wait, on real Ray calls."""
    from doc2vec_dist import run

    monkeypatch.setattr(run, "PAUSE_WARN_SECONDS", 0.5)

    @ray_cluster.remote(num_cpus=0)
    def pause():
        time.sleep(2.0)
        return "paused"

    refs = [ray_cluster.put("paused"), pause.remote()]  # worker 0 answered at once; worker 1 after 2 s
    driver = types.SimpleNamespace(tick=0.1, _watch=lambda: None, worker_pids={0: 1111, 1: 2222})
    run.Run._settle(driver, refs, pausing=True)
    assert ray_cluster.get(refs) == ["paused", "paused"]
    said = [r.getMessage() for r in logged.records if "to pause" in r.getMessage()]
    assert len(said) == 1 and "for worker 1 (pid 2222) to pause" in said[0] and "worker 0" not in said[0], said
    logged.clear()
    run.Run._settle(driver, [ray_cluster.put("paused"), pause.remote()])  # other calls: no such line
    assert not [r for r in logged.records if "to pause" in r.getMessage()]


def test_a_killed_driver_resumes_and_ends_as_good_as_an_uninterrupted_run(ray_cluster, sample_corpus, tmp_path,
                                                                          trained_model):
    corpus, heldout = sample_corpus
    model = str(tmp_path / "model")
    address = ray_cluster.get_runtime_context().gcs_address
    flags = ["--dim", "32", "--epochs", "10", "--sample", "0", "--num-ps", "2", "--num-workers", "2", "--force-workers",
             "--cpus-per-worker", "1", "--address", address, "--no-progress"]
    cmd = [sys.executable, "-m", "doc2vec_dist", "train", "--corpus", corpus, "--out", model]
    driver = subprocess.Popen(cmd + flags + ["--checkpoint-every", "0.5"], cwd=ROOT)
    try:
        deadline = time.monotonic() + 120
        while not (os.path.exists(os.path.join(model, "LATEST")) and manifest_of(model, latest(model))["epoch"] >= 2):
            assert driver.poll() is None, "the run ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.1)
        driver.send_signal(signal.SIGKILL)
    finally:
        driver.wait()
    killed_at = manifest_of(model, latest(model))
    assert killed_at["epoch"] < 10
    # resume names only what may change; the rest comes from the checkpoint (in this process, on the
    # session's Ray: only the killed driver needed a process of its own)
    assert main(cmd[3:] + ["--resume", "--no-progress"]) == 0
    with open(os.path.join(model, "config.json")) as fh:
        summary = json.load(fh)["summary"]
    assert summary["resumed_from_epoch"] == killed_at["epoch"]
    assert manifest_of(model, latest(model))["epoch"] == 10
    resumed, straight = heldout_metrics(model, heldout), heldout_metrics(trained_model, heldout)
    # within noise of the uninterrupted run (two uninterrupted seeds differ by ~0.005 here)
    assert abs(resumed["model_recall@10"] - straight["model_recall@10"]) < 0.02, (resumed, straight)
    assert resumed["model_recall@10"] > 1.15 * resumed["popularity_recall@10"]


@pytest.mark.parametrize("engine", [
    {},
    {"num_workers": 1, "cpus_per_worker": 2, "kernel": "batched"},
    # PV-DM on the token path: the words rows resident in the worker too, and written back
    {"num_workers": 1, "cpus_per_worker": 2, "kernel": "batched", "mode": "dm", "window": 3},
], ids=["two-workers", "tokens-on-device", "dm-words-resident"])
def test_resume_with_another_number_of_servers_reshards_rows_exactly(ray_cluster, small_corpus, tmp_path, engine):
    model = str(tmp_path / "model")
    train(small_corpus, model, TrainConfig(**{**SAMPLE, "epochs": 2, **engine}, optimizer="adagrad", alpha=0.05))
    tables = ("docs", "words_out") + (("words",) if engine.get("mode") == "dm" else ())
    before = {t: modeldir.ModelDir(model).read_table(t) for t in tables}
    model_id = modeldir.ModelDir(model).manifest["model_id"]
    # nothing left to train: the rows go through 3 servers' load and save unchanged
    summary = train(small_corpus, model, resumed_config(model, {"num_ps": 3}))
    assert summary["tokens"] == 0
    _, manifest = modeldir.load_manifest(model)
    assert manifest["num_ps"] == 3 and len(manifest["tables"]["docs"]["parts"]) == 3
    assert manifest["model_id"] == model_id  # a resumed run is the same model (issue 26, item 2)
    for table, matrix in before.items():
        np.testing.assert_array_equal(modeldir.ModelDir(model).read_table(table), matrix)
    # and training goes on from there with 3 servers (one more epoch)
    summary = train(small_corpus, model, resumed_config(model, {"num_ps": 3, "epochs": 3}))
    assert summary["tokens"] == Corpus(small_corpus).num_tokens and summary["resumed_from_epoch"] == 2
    for table in tables:  # every table trained on, the resident ones included
        assert not np.array_equal(modeldir.ModelDir(model).read_table(table), before[table]), table


def test_one_device_worker_keeps_its_rows_across_epochs_and_every_checkpoint_holds_them(ray_cluster, small_corpus,
                                                                                       tmp_path, monkeypatch):
    """Issue 48: one worker on the GPU workers' path (the CPU as the device) keeps its documents' and URL
    rows on its device across epochs, and every checkpoint holds their current values: those taken
    mid-epoch (a pause writes them back) and the one at each epoch's end (the driver pauses the worker
    for it). A run through checkpoints trains the straight run's bits, and runs resumed from a mid-epoch
    checkpoint, or from an epoch's end, end where the straight run did."""
    import shutil

    from doc2vec_dist.settings import STAGED_ENV

    def tables(model: str) -> dict:
        found = modeldir.ModelDir(model)
        return {name: found.read_table(name) for name in ("docs", "words_out")}

    monkeypatch.setenv(STAGED_ENV, "1")
    one = {"dim": 16, "epochs": 2, "sample": 0, "num_ps": 2, "num_workers": 1, "cpus_per_worker": 1,
           "kernel": "batched", "macro_batch": 4096, "progress": False}
    straight = tables(train(small_corpus, str(tmp_path / "a"), TrainConfig(**one, checkpoint_every=0))["model"])
    paused = str(tmp_path / "b")
    with monkeypatch.context() as patch:  # a batch outlasts the driver's tick on any machine: checkpoints mid-epoch
        patch.setenv(STEP_PAUSE_ENV, "0.04")
        train(small_corpus, paused, TrainConfig(**one, checkpoint_every=0.05, keep_checkpoints=1000))
    for name, matrix in tables(paused).items():
        np.testing.assert_array_equal(matrix, straight[name], err_msg=name)
    manifests = {v: manifest_of(paused, v) for v in range(1, latest(paused) + 1)}
    mid = [v for v, m in manifests.items() if m["positions"] and m["epoch"] >= 1]
    end = [v for v, m in manifests.items() if m["positions"] is None and m["epoch"] == 1]
    assert mid and end, "no checkpoint mid-epoch after the first epoch's end"
    for version in (mid[len(mid) // 2], end[0]):
        resumed = str(tmp_path / f"v{version}")
        shutil.copytree(paused, resumed)
        with open(os.path.join(resumed, "LATEST"), "w") as fh:
            fh.write(f"v{version}")
        for later in range(version + 1, latest(paused) + 1):
            shutil.rmtree(modeldir.version_dir(resumed, later))
        summary = train(small_corpus, resumed, resumed_config(resumed, {}))
        for name, matrix in tables(resumed).items():
            np.testing.assert_array_equal(matrix, straight[name], err_msg=f"resumed from v{version}: {name}")
        # its figures count what it trained, not what its checkpoint had (they counted the epoch whole)
        done = sum(p["tokens"] for p in manifests[version]["positions"] or [])
        assert summary["tokens"] == Corpus(small_corpus).num_tokens * (2 - manifests[version]["epoch"]) - done


def test_a_resume_says_what_it_changed_and_the_learning_rate_it_goes_on_at(small_corpus):
    # resumed with fewer --epochs, a run stopped at epoch 11 of 40 goes on at the end of its decay, and only
    # "resumed from v12 (epoch 11, T tokens)" was said
    from doc2vec_dist.lr import rate_at

    corpus, base = Corpus(small_corpus), TrainConfig()
    n = corpus.num_tokens
    stopped = rate_at(base.alpha, base.min_alpha, 11 * n, 40 * n)
    saved = {**dataclasses.asdict(base), "epochs": 40}
    resume = trainer.Resume(epoch=11, version=12, tokens=11 * n, saved=saved, saved_lr=stopped)
    assert resume.line(dataclasses.replace(base, epochs=40), corpus) == f"resumed from v12 (epoch 11, {11 * n:,} tokens)"
    now = rate_at(base.alpha, base.min_alpha, 11 * n, 12 * n)
    assert resume.line(dataclasses.replace(base, epochs=12, dtype="float16"), corpus) == (
        f"resumed from v12 (epoch 11, {11 * n:,} tokens); changed since: epochs 40 -> 12, dtype float32 -> float16; "
        f"learning rate {now:.6g} (it stopped at {stopped:.6g})")


def test_resume_refuses_a_change_to_the_model_and_names_it(ray_cluster, trained_model):
    with pytest.raises(UserError, match="cannot resume with dim=64.*dim=32"):
        resumed_config(trained_model, {"dim": 64})
    assert resumed_config(trained_model, {"alpha": 0.01, "num_ps": 5}).dim == 32


def test_resume_on_another_corpus_of_the_same_counts_is_refused_naming_a_row(ray_cluster, tmp_path, snapshot):
    # the same events read in another order: the same counts, other row ids (a resume there trained each
    # user's row on another user's events, under the first user's key, and exited 0)
    import pyarrow.parquet as pq
    from conftest import SAMPLE_EVENTS

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    events = pq.read_table(SAMPLE_EVENTS).slice(0, 3000)
    pq.write_table(events, tmp_path / "a.parquet")
    pq.write_table(events.take(np.random.default_rng(7).permutation(len(events))), tmp_path / "b.parquet")
    a, b = (prepare([str(tmp_path / f"{n}.parquet")], str(tmp_path / f"corpus-{n}"), PrepareConfig(time_col="ts"),
                    progress=False) for n in "ab")
    assert (a.num_docs, a.num_tokens, a.vocab_size) == (b.num_docs, b.num_tokens, b.vocab_size)
    assert not a.docs().column("key").equals(b.docs().column("key"))
    model = str(tmp_path / "model")
    train(a.path, model, TrainConfig(**{**SAMPLE, "epochs": 1, "num_ps": 1, "num_workers": 1}))
    before = snapshot(model)
    with pytest.raises(UserError, match=rf"{model}: the checkpoint was trained on other users than {b.path} holds "
                                        r"\(row \d+: '.+' in the model, '.+' in the corpus\); resume on the corpus"):
        train(b.path, model, resumed_config(model, {"epochs": 2}))
    assert snapshot(model) == before
    train(a.path, model, resumed_config(model, {"epochs": 2}))  # its own corpus goes on
    assert latest(model) > 1


def test_a_corpus_replaced_while_a_run_reads_it_stops_the_run_and_keeps_nothing_of_the_other(
        ray_cluster, tmp_path, monkeypatch):
    """`prepare --overwrite` into the corpus a running train read: the workers read the other corpus's shards
    from the next epoch on, under the first one's keys (6 of 8 epochs on another corpus: recall 0.136 against
    0.206, exit 0). The run stops in one line at its next checkpoint and no version of it holds the other's."""
    import threading

    import pyarrow.parquet as pq
    from conftest import SAMPLE_EVENTS

    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    events = pq.read_table(SAMPLE_EVENTS)
    pq.write_table(events.slice(0, 3000), tmp_path / "a.parquet")
    pq.write_table(events.slice(3000, 3000), tmp_path / "b.parquet")
    corpus, model = str(tmp_path / "corpus"), str(tmp_path / "model")
    prepare([str(tmp_path / "a.parquet")], corpus, PrepareConfig(time_col="ts"), progress=False)
    monkeypatch.setenv(STEP_PAUSE_ENV, "0.2")  # epochs long enough to replace the corpus during one

    def replace() -> None:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(model, "LATEST")) and time.monotonic() < deadline:
            time.sleep(0.05)
        prepare([str(tmp_path / "b.parquet")], corpus, PrepareConfig(time_col="ts"), progress=False, overwrite=True)
        replaced.append(latest(model))

    replaced: list[int] = []
    swap = threading.Thread(target=replace)
    swap.start()
    try:
        with pytest.raises(TrainingStopped, match=rf"^{re.escape(corpus)}: the corpus this run was reading \(prepared "
                                                  r"\S+\) was replaced by another \(prepared \S+\) while this run "
                                                  "trained: what it trained since its last checkpoint may have read the "
                                                  "other, and is not kept$"):
            train(corpus, model, TrainConfig(dim=8, epochs=200, sample=0, num_ps=1, num_workers=1, progress=False,
                                             checkpoint_every=0.3, macro_batch=4096))
    finally:
        swap.join()
    # no version after the swap but one whose check had passed before it
    assert latest(model) <= replaced[0] + 1


def test_a_non_finite_push_stops_the_run_and_keeps_the_last_good_checkpoint(ray_cluster, sample_corpus, tmp_path):
    model = str(tmp_path / "model")
    train(sample_corpus[0], model, TrainConfig(**{**SAMPLE, "epochs": 1}))
    good = latest(model)
    docs = modeldir.ModelDir(model).read_table("docs")
    # go on with a learning rate that overflows float32 within a step or two (halfway down from 1e30 to
    # 1e29: 5.5e29 at the start of the second epoch, a little less at the step that overflows)
    # (two workers on the block schedule keep their documents' rows until a checkpoint: the loss of the batch
    # that diverged stops it, named after its step, issue 48)
    with pytest.raises(TrainingStopped, match=r"non-finite loss in epoch 1 .*step \d+ .*alpha 5\.\d*e\+29"):
        train(sample_corpus[0], model, resumed_config(model, {"epochs": 2, "alpha": 1e30, "min_alpha": 1e29}))
    assert latest(model) == good
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), docs)  # checksums verified too
    # and the run goes on from there with a sane learning rate
    summary = train(sample_corpus[0], model, resumed_config(model, {"epochs": 2}))
    assert summary["resumed_from_epoch"] == 1 and np.isfinite(modeldir.ModelDir(model).read_table("docs")).all()


def test_ctrl_c_says_how_to_resume_and_the_resumed_run_says_where_from(ray_cluster, sample_corpus, tmp_path,
                                                                      interrupt_when, capsys):
    corpus = sample_corpus[0]
    model = str(tmp_path / "model")
    address = ray_cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "doc2vec_dist", "train", "--corpus", corpus, "--out", model]
    # 200 epochs: long enough that the interrupt always lands mid-run (20 took ~1 s after the first
    # checkpoint, and on a loaded machine the run once ended before the signal arrived); a run that
    # ignored Ctrl-C would outlast communicate()'s timeout and fail
    driver = subprocess.Popen(cmd + ["--dim", "8", "--epochs", "200", "--sample", "0", "--checkpoint-every", "0.3",
                                     "--address", address, "--no-progress"],
                              cwd=ROOT, stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    err = interrupt_when(driver, lambda: os.path.exists(os.path.join(model, "LATEST")))
    assert driver.returncode == 130, err
    kept = latest(model)
    assert (f"interrupted: the model at {model} is kept up to checkpoint v" in err
            and f"resume with `doc2vec-dist train --corpus {corpus} --out {model} --resume`" in err), err
    assert kept >= 1 and "Traceback" not in err
    at = manifest_of(model, kept)
    tokens = at["epoch"] * Corpus(corpus).num_tokens + sum(p["tokens"] for p in at["positions"] or [])
    # the resumed run in this process, on the session's Ray (only the interrupted one needed its own)
    capsys.readouterr()
    code = main(cmd[3:] + ["--resume", "--epochs", str(at["epoch"] + 1), "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert f"resumed from v{kept} (epoch {at['epoch']}, {tokens:,} tokens)" in err
    assert f"model: {model} (checkpoint v" in out


def test_a_worker_position_is_written_to_the_manifest_and_read_back_as_it_was():
    from doc2vec_dist.units import Position

    saved = {"epoch": 2, "unit": 1, "row": 350, "step": 7, "tokens": 41_000, "pairs": 203_112, "loss": 1234.5}
    position = Position.from_json(saved)
    assert position == Position(2, 1, 350, 7, tokens=41_000, pairs=203_112, loss=1234.5)
    assert json.dumps(position.to_json(), sort_keys=True) == json.dumps(saved, sort_keys=True)
    assert Position(3).to_json() == {"epoch": 3, "unit": 0, "row": None, "step": 0, "tokens": 0, "pairs": 0,
                                     "loss": 0.0}  # an epoch's start
    # the process that answered a pause (Run sees a restart by it) is neither saved nor part of the position
    answered = dataclasses.replace(position, pid=4242)
    assert answered == position and answered.to_json() == position.to_json()


# ---------------------------------------------------------------------------------------------------
# issue 26, item 5: a full disk
# ---------------------------------------------------------------------------------------------------

def _train_argv(corpus: str, model: str, *extra: str) -> list[str]:
    return ["train", "--corpus", corpus, "--out", model, "--dim", "32", "--sample", "0", "--num-ps", "2",
            "--num-workers", "2", "--force-workers", "--cpus-per-worker", "1", "--no-progress", *extra]


def _one_error(capsys) -> tuple[str, str]:
    """The error line of a command that failed, and all it wrote on stderr: no traceback, no colour codes."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in err and "\x1b[" not in err, err
    return errors[0], err


def test_a_full_disk_stops_with_one_line_keeps_the_last_checkpoint_and_resumes_once_there_is_room(
        ray_cluster, sample_corpus, tmpfs, capsys):
    corpus = sample_corpus[0]
    disk = tmpfs.mount("disk", "2800k")  # the key tables and one checkpoint (about 1.8 MB), not a second
    model = os.path.join(disk, "model")
    assert main(_train_argv(corpus, model, "--epochs", "2")) == 2
    error, err = _one_error(capsys)
    assert "warning: " + model + ": 2.7 MiB free on its disk, and this run may need about 3.0 MiB" in err
    assert re.fullmatch(rf"error: {model}: no space left on device for checkpoint v2: it needs about 1\.3 MiB, "
                        rf"and \d\.\d MiB is free beside the 1 kept \(--keep-checkpoints 2\)", error), error
    assert f"training stopped: the model at {model} is kept up to checkpoint v1; resume with" in err
    assert os.listdir(os.path.join(model, "checkpoints")) == ["v1"]  # the partial v2 is gone
    assert latest(model) == 1 and modeldir.ModelDir(model).read_table("docs").shape == (5000, 32)

    # resuming on the same full disk is refused before anything starts
    assert main(_train_argv(corpus, model, "--resume")) == 2
    error, _ = _one_error(capsys)
    assert re.fullmatch(rf"error: {model}: \d\.\d MiB free on its disk, and the next checkpoint needs about 1\.3 MiB; "
                        "the model stays at checkpoint v1: free some space, then resume", error), error
    tmpfs.remount(disk, "size=8m")  # room again: it goes on from v1
    assert main(_train_argv(corpus, model, "--resume")) == 0
    assert latest(model) == 2 and sorted(os.listdir(os.path.join(model, "checkpoints"))) == ["v1", "v2"]


@pytest.mark.parametrize("size, fails", [
    ("256k", "cannot write to {model}/"),
    ("1m", "{model}: no space left on device for checkpoint v1: it needs about"),
])
def test_a_fresh_run_that_fills_the_disk_before_its_first_checkpoint_leaves_nothing(
        ray_cluster, sample_corpus, tmpfs, capsys, monkeypatch, size, fails):
    # the disk fills up after the check of its free space (another program's files, say); 256k: not even the
    # key tables fit, 1m: they do, the first checkpoint does not
    monkeypatch.setattr(trainer, "check_room", lambda *args: None)
    disk = tmpfs.mount("disk", size)
    model = os.path.join(disk, "new", "model")
    assert main(_train_argv(sample_corpus[0], model, "--epochs", "1")) == 2
    error, err = _one_error(capsys)
    assert error.startswith("error: " + fails.format(model=model)), error
    assert os.listdir(disk) == [], err  # the model and the folder made for it


def test_the_room_a_model_replaced_with_overwrite_frees_counts_as_free(trained_model, sample_corpus, tmpfs):
    import shutil

    from doc2vec_dist.ps import table_specs

    disk = tmpfs.mount("disk", "6m", fill=lambda path: (shutil.copytree(trained_model, os.path.join(path, "model")),
                                                       tmpfs.fill_up(path)))
    model, corpus = os.path.join(disk, "model"), Corpus(sample_corpus[0])
    config = TrainConfig(**SAMPLE)
    tables = table_specs(config, corpus)
    trainer.check_room(model, config, corpus, tables, trainer.Resume(), replaces=True)  # its old checkpoints go
    another = os.path.join(disk, "another")
    with pytest.raises(UserError, match=f"^{another}: 0.0 MiB free on its disk, and the first checkpoint needs about "):
        trainer.check_room(another, config, corpus, tables, trainer.Resume(), replaces=False)


# --- issue 29: a run's --dtype may change on resume, and a model of one dtype starts a run of another ---------

@pytest.mark.parametrize("first, then", [("float32", "bfloat16"), ("bfloat16", "float32"), ("float16", "bfloat16")])
def test_resume_across_dtypes_narrows_or_widens_the_rows_and_keeps_the_accumulator(ray_cluster, small_corpus,
                                                                                    tmp_path, first, then):
    import pyarrow as pa

    from doc2vec_dist import precision
    from doc2vec_dist.ps import ParameterServer, table_specs
    from doc2vec_dist.warmstart import WarmStart

    model = str(tmp_path / "model")
    # one worker: the dtypes are the servers' (several workers' resumes: test_resume_with_another_number_of_servers_…)
    train(small_corpus, model, TrainConfig(**{**SAMPLE, "epochs": 1, "num_workers": 1}, optimizer="adagrad", alpha=0.05,
                                           dtype=first))
    found = modeldir.ModelDir(model)
    assert {t["dtype"] for t in found.manifest["tables"].values()} == {first}
    before = {t: found.read_table(t) for t in ("docs", "words_out")}  # every reader widens to float32
    state = modeldir.read_shard(model, "docs", 0, 1)[1]
    # --init-from: a server of the other dtype starts from the model's rows, narrowed to nearest or widened
    config = TrainConfig(**{**SAMPLE, "num_workers": 1}, optimizer="adagrad", dtype=then)
    tables = table_specs(config, Corpus(small_corpus))
    warm = ParameterServer(0, 1, tables, 1, warm=WarmStart(model, found.version, {"docs": len(before["docs"])}))
    np.testing.assert_array_equal(precision.widen(warm.tables["docs"][:, :32], then),
                                  precision.widen(precision.narrow(before["docs"], then), then))
    np.testing.assert_array_equal(precision.state_view(warm.tables["docs"], then, 32), state)

    # nothing left to train: the rows go through the other dtype's servers (and 3 of them) and back to disk
    summary = train(small_corpus, model, resumed_config(model, {"dtype": then, "num_ps": 3}))
    assert summary["tokens"] == 0
    found = modeldir.ModelDir(model)
    assert {t["dtype"] for t in found.manifest["tables"].values()} == {then}
    for table, matrix in before.items():
        np.testing.assert_array_equal(found.read_table(table), precision.widen(precision.narrow(matrix, then), then))
    np.testing.assert_array_equal(modeldir.read_shard(model, "docs", 0, 1)[1], state)  # float32, to the bit
    part = found.spec("docs")["parts"][0]["path"]
    with pa.memory_map(os.path.join(modeldir.version_dir(model, found.version), part)) as source:
        schema = pa.ipc.open_file(source).schema
    assert schema.field("vector").type.value_type == modeldir.PART_VALUE_TYPES[then]
    assert modeldir.part_dtype(schema) == then and schema.field("adagrad").type == pa.float32()
    # and training goes on in the new dtype
    summary = train(small_corpus, model, resumed_config(model, {"epochs": 2}))
    assert summary["tokens"] == Corpus(small_corpus).num_tokens
    assert modeldir.ModelDir(model).manifest["config"]["dtype"] == then


# --- issue 47, item 6: one writer per model directory ---------------------------------------------------------

def test_two_runs_into_one_out_the_second_is_refused_in_one_line_naming_the_first(ray_cluster, small_corpus, tmp_path,
                                                                                capsys, interrupt_when):
    import socket

    model = str(tmp_path / "model")
    address = ray_cluster.get_runtime_context().gcs_address
    cmd = [sys.executable, "-m", "doc2vec_dist", "train", "--corpus", small_corpus, "--out", model]
    flags = ["--dim", "8", "--sample", "0", "--address", address, "--no-progress"]
    # long enough that it is still training when the second comes, whatever the machine's speed
    first = subprocess.Popen(cmd + flags + ["--epochs", "500", "--checkpoint-every", "0.3"], cwd=ROOT,
                             stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(model, "LATEST")):  # under way, with a checkpoint to lose
            assert first.poll() is None, first.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        before = latest(model)
        capsys.readouterr()
        code = main(["train", "--corpus", small_corpus, "--out", model, "--overwrite", "--epochs", "1", *flags])
        error, _ = _one_error(capsys)
        assert code == 2
        shown = " ".join(["doc2vec-dist", *cmd[3:], *flags, "--epochs", "500", "--checkpoint-every", "0.3"])
        assert re.fullmatch(rf"error: {re.escape(model)} is being written by another run \(host "
                            rf"{re.escape(socket.gethostname())}, pid {first.pid}, started \S+, `{re.escape(shown)}`\); "
                            r"wait for it to end, or give another --out", error), error
        assert latest(model) >= before and first.poll() is None  # the first goes on, its checkpoints intact
    finally:
        err = interrupt_when(first, lambda: True)
    assert first.returncode == 130 and f"interrupted: the model at {model} is kept up to checkpoint v" in err, err
    assert not os.path.exists(os.path.join(model, checkpoint.WRITER_FILE))  # released on Ctrl-C
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs").shape, (1500, 8))


# --- issue 47, item 8: a damaged latest checkpoint -------------------------------------------------------------

def _damaged_copy(trained_model: str, tmp_path) -> tuple[str, str]:
    """A copy of the sample model (v9 and v10) whose v10 lost a part file: (model, the part's name)."""
    import shutil

    model = shutil.copytree(trained_model, str(tmp_path / "model"))
    assert latest(model) == 10 and sorted(os.listdir(os.path.join(model, "checkpoints"))) == ["v10", "v9"]
    part = "docs/part-00001-of-00002.arrow"
    os.remove(os.path.join(modeldir.version_dir(model, 10), part))
    return model, part


def test_resume_from_a_damaged_latest_falls_back_to_the_newest_intact_version_in_one_line(
        ray_cluster, trained_model, sample_corpus, tmp_path, capsys):
    model, part = _damaged_copy(trained_model, tmp_path)
    code = main(["train", "--corpus", sample_corpus[0], "--out", model, "--resume", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert [line for line in err.splitlines() if "v10" in line] == [
        f"warning: {model}: checkpoint v10 is damaged ({part}: part file missing); resuming from v9, the newest intact version"]
    assert f"resumed from v9 (epoch {manifest_of(model, 9)['epoch']}, " in err
    with open(os.path.join(model, "config.json")) as fh:
        summary = json.load(fh)["summary"]
    assert summary["servers_loaded_from"] == [9, 9] and summary["resumed_from_epoch"] == 9
    # the run's version is v11; of the older ones the damaged v10 went first, the intact v9 is kept
    assert latest(model) == 11 and sorted(os.listdir(os.path.join(model, "checkpoints"))) == ["v11", "v9"]
    assert manifest_of(model, 11)["epoch"] == 10


def test_resume_from_names_a_version_explicitly(ray_cluster, trained_model, sample_corpus, tmp_path, capsys):
    import shutil

    model = shutil.copytree(trained_model, str(tmp_path / "model"))
    epoch = manifest_of(model, 9)["epoch"]
    code = main(["train", "--corpus", sample_corpus[0], "--out", model, "--resume-from", "v9", "--no-progress"])
    err = capsys.readouterr().err
    assert code == 0 and "Traceback" not in err, err
    assert f"resumed from v9 (epoch {epoch}, " in err
    with open(os.path.join(model, "config.json")) as fh:
        saved = json.load(fh)
    assert saved["summary"]["servers_loaded_from"] == [9, 9] and latest(model) == 11
    assert resumed_config(model, {}).resume_from is None  # a later --resume goes on from LATEST
    # a version the model does not keep is refused, naming those it keeps
    code = main(["train", "--corpus", sample_corpus[0], "--out", model, "--resume-from", "v3", "--no-progress"])
    error, _ = _one_error(capsys)
    assert code == 2 and error == f"error: {model}: --resume-from v3: no such checkpoint (it keeps v10, v11)"


def test_a_server_restarted_before_the_runs_first_checkpoint_loads_the_version_resumed_from(trained_model,
                                                                                          sample_corpus, tmp_path):
    from doc2vec_dist.ps import ParameterServer, table_specs

    model, part = _damaged_copy(trained_model, tmp_path)
    tables = table_specs(resumed_config(model, {}), Corpus(sample_corpus[0]))
    # (9, 10): resumed from v9 while LATEST named v10, as Ray re-runs a server's __init__ after a crash
    server = ParameterServer(0, 1, tables, 1, model, restore=(9, 10))
    assert server.restored_version == 9
    np.testing.assert_array_equal(server.tables["docs"][:, :32], modeldir.ModelDir(model, version=9).read_table("docs"))
    # once LATEST has moved past the version it named then (the run committed), LATEST is what a restart loads
    with pytest.raises(UserError, match=f"v10/{part}: part file missing"):
        ParameterServer(0, 1, tables, 1, model, restore=(9, 8))
