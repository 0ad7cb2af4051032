"""Processes killed during training, on the real local Ray: Ray restarts the actor, the parameter
server reloads its rows from LATEST, the worker goes back to its checkpointed data position, and the
run completes. And (issue 28) what the driver does when a node dies or a worker stops answering."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import psutil
import pytest

from doc2vec_dist import modeldir
from doc2vec_dist.cli import main
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.evaluate import heldout_metrics
from doc2vec_dist.run import STEP_PAUSE_ENV, TrainingStopped
from doc2vec_dist.runlog import LOG_FILE
from doc2vec_dist.settings import STAGED_ENV
from doc2vec_dist.trainer import train

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def actor_processes(name: str) -> list[psutil.Process]:
    """Live processes of one actor class of this test session's own Ray (Ray titles them
    `ray::ClassName`): the local Ray the session started is this process's child, its actors its
    descendants. Other Rays on the machine (other sessions, other users) are never touched."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            cmdline = proc.cmdline()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if cmdline and cmdline[0].startswith(f"ray::{name}"):
            found.append(proc)
    return found


def kill_one_when_checkpointed(model: str, name: str, killed: list, min_epoch: int = 1) -> None:
    """Once the run has a checkpoint of at least `min_epoch` epochs, SIGKILL one `name` actor process."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if os.path.exists(os.path.join(model, "LATEST")):
            _, manifest = modeldir.load_manifest(model)
            if manifest["epoch"] >= min_epoch:
                procs = actor_processes(name)
                if procs:
                    killed.append((procs[0].pid, manifest["epoch"]))
                    os.kill(procs[0].pid, signal.SIGKILL)
                    return
        time.sleep(0.05)


def kill_each_when_checkpointed(model: str, names: tuple[str, ...], killed: list) -> None:
    """Kill one actor of each of `names` in turn (kill_one_when_checkpointed): the first once the run has
    a checkpoint of an epoch, each next once it has one of an epoch after the last kill (the run went on)."""
    for name in names:
        kill_one_when_checkpointed(model, name, killed, min_epoch=killed[-1][1] + 1 if killed else 1)


@pytest.mark.parametrize("victims, engine", [
    # a server, and later in the same run (same settings, one training for both) a worker
    (("ParameterServer", "Worker"), {}),
    # one worker holding the whole URL table, its examples drawn on its device (the token path): the GPU
    # workers' path, the CPU as the device (settings.STAGED_ENV), its documents' rows kept there across epochs
    # (issue 48), and lost with it since the last checkpoint
    (("Worker",), {"num_workers": 1, "cpus_per_worker": 2, "kernel": "batched", "staged": True}),
    # ... and PV-DM's words rows resident beside the URL table: a restarted worker pulls both again
    (("Worker",), {"num_workers": 1, "cpus_per_worker": 2, "kernel": "batched", "mode": "dm", "window": 3}),
], ids=["server-then-worker", "worker-tokens-on-device", "worker-dm-words-resident"])
def test_a_killed_actor_is_restarted_and_the_run_completes(ray_cluster, sample_corpus, tmp_path, monkeypatch, victims,
                                                           engine):
    corpus, heldout = sample_corpus
    if engine.pop("staged", False):
        monkeypatch.setenv(STAGED_ENV, "1")
    model = str(tmp_path / "model")
    killed: list = []
    killer = threading.Thread(target=kill_each_when_checkpointed, args=(model, victims, killed), daemon=True)
    killer.start()
    summary = train(corpus, model, TrainConfig(**{"dim": 32, "epochs": 12, "sample": 0, "num_ps": 2, "num_workers": 2,
                                                  "cpus_per_worker": 1, "checkpoint_every": 0.5, "progress": False,
                                                  **engine}))
    killer.join(timeout=5)
    assert len(killed) == len(victims), f"{victims[len(killed)]} was not killed: the run ended before a checkpoint"
    _, manifest = modeldir.load_manifest(model)
    assert manifest["epoch"] == 12
    if "ParameterServer" in victims:
        assert summary["server_restarts"] == 1
        # the restarted server reloaded its rows from a checkpoint; the other kept its own
        assert sum(v is not None for v in summary["servers_loaded_from"]) == 1
    assert summary["worker_restarts"] == victims.count("Worker")
    # nothing lost beyond the work since the last checkpoint: it still beats popularity clearly
    m = heldout_metrics(model, heldout)
    assert m["model_recall@10"] > 1.15 * m["popularity_recall@10"], m


DIES_AT_ITS_FIRST_PAUSE = """
import os, sys
from doc2vec_dist import run
from doc2vec_dist.cli import main

MARK = sys.argv.pop(1)

class DiesAtItsFirstPause(run.Worker):
    # a worker whose process dies as the checkpoint at its first epoch's end asks for its rows (once in
    # the run: its restart finds MARK)
    def pause(self):
        if not os.path.exists(MARK):
            open(MARK, "w").close()
            os._exit(1)
        return super().pause()

run.Worker = DiesAtItsFirstPause
sys.exit(main(sys.argv[1:]))
"""


def test_a_device_worker_that_dies_before_the_checkpoint_has_its_rows_trains_that_epoch_again(ray_cluster,
                                                                                              small_corpus, tmp_path,
                                                                                              monkeypatch):
    """Issue 48: one worker keeps its rows on its device across an epoch's end until the checkpoint there
    fetches them. Killed in between, it takes that epoch's updates with it; the driver has it train the
    epoch again from the last checkpoint (here the run's start), whose rows the servers still hold, so
    the run ends with the model of one that never failed, bit for bit, and says so."""
    from doc2vec_dist.settings import STAGED_ENV

    address = ray_cluster.get_runtime_context().gcs_address
    flags = ["--corpus", small_corpus, "--dim", "16", "--epochs", "2", "--sample", "0", "--num-ps", "2",
             "--num-workers", "1", "--cpus-per-worker", "1", "--kernel", "batched", "--macro-batch", "4096",
             "--address", address, "--no-progress"]
    models = {name: str(tmp_path / name) for name in ("straight", "died")}
    # the run that never fails in this process, on the session's Ray; the one whose worker dies in a process
    # of its own, where its Worker class is the one that dies
    monkeypatch.setenv(STAGED_ENV, "1")
    assert main(["train", "--out", models["straight"], *flags]) == 0
    done = subprocess.run([sys.executable, "-c", DIES_AT_ITS_FIRST_PAUSE, str(tmp_path / "mark"), "train", "--out",
                           models["died"], *flags], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.path.exists(tmp_path / "mark")
    assert "before the checkpoint at the end of epoch 1 had its rows; training that epoch again" in done.stderr
    with open(os.path.join(models["died"], "config.json")) as fh:
        assert json.load(fh)["summary"]["worker_restarts"] == 1
    for table in ("docs", "words_out"):
        np.testing.assert_array_equal(modeldir.ModelDir(models["died"]).read_table(table),
                                      modeldir.ModelDir(models["straight"]).read_table(table), err_msg=table)


DIES_IN_A_LATER_ROUND = """
import os, sys, time
from doc2vec_dist import run
from doc2vec_dist.cli import main

MARK = sys.argv.pop(1)

class DiesInALaterRound(run.Worker):
    # worker 1's process dies at its second macro-batch of round 1 of epoch 1 (once in the run: its
    # restart finds MARK), its block taken from worker 0 and partly trained; and only once worker 0 holds
    # the block worker 1 handed it for that round (MARK.taken): else, on a busy machine, worker 0 may ask
    # for it only after worker 1's process is gone, the other ending (peers.Outbox.hand's "gone")
    def _compute(self, batch, arrival, alphas):
        if (self.index, self.stats["epoch"], self._round) == (1, 1, 1) and not os.path.exists(MARK):
            self.computed = getattr(self, "computed", 0) + 1
            if self.computed == 2:
                deadline = time.monotonic() + 120
                while not os.path.exists(MARK + ".taken") and time.monotonic() < deadline:
                    time.sleep(0.01)
                open(MARK, "w").close()
                os._exit(1)
        return super()._compute(batch, arrival, alphas)

    def _hold(self, epoch, round_, handed=None):
        super()._hold(epoch, round_, handed)
        if (self.index, epoch, round_) == (0, 1, 1):
            open(MARK + ".taken", "w").close()

    def run_rounds(self, epoch, start=None, restarted=False):  # where the driver starts it, written down
        if self.index == 1:
            with open(MARK + ".calls", "a") as fh:
                fh.write(f"{epoch} {start.round if start else 0} {start.tokens if start else 0} {restarted}\\n")
        return super().run_rounds(epoch, start, restarted)

run.Worker = DiesInALaterRound
sys.exit(main(sys.argv[1:]))
"""


def test_a_worker_killed_mid_round_is_restarted_at_that_round_from_the_block_its_giver_kept(ray_cluster,
                                                                                          sample_corpus, tmp_path):
    """The rounds run without the driver (peers.py): worker 1 dies in the middle of round 1. The driver
    learns the round from its giver (worker 0), which keeps the block it handed for it; the restarted
    worker trains that round again from that block, worker 0 meanwhile waiting for worker 1's next one,
    and the run completes: no block lost, no row written by two workers in a round, and within a little
    of the recall the run that never failed reaches (worker 1's documents lose their updates since the
    epoch's start, which it trains again)."""
    from test_block_schedule import writers

    from doc2vec_dist.run import PUSH_JOURNAL_ENV

    corpus, heldout = sample_corpus
    model, journal = str(tmp_path / "model"), str(tmp_path / "journal")
    flags = ["--corpus", corpus, "--dim", "32", "--epochs", "6", "--sample", "0", "--num-ps", "1", "--num-workers",
             "2", "--force-workers", "--segments", "2", "--cpus-per-worker", "1", "--macro-batch", "4096",
             "--address", ray_cluster.get_runtime_context().gcs_address, "--no-progress"]
    done = subprocess.run([sys.executable, "-c", DIES_IN_A_LATER_ROUND, str(tmp_path / "mark"), "train", "--out",
                           model, *flags], cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, PUSH_JOURNAL_ENV: journal},
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert os.path.exists(tmp_path / "mark")
    calls = [line.split() for line in (tmp_path / "mark.calls").read_text().splitlines()]
    # epoch 1 twice: from its start, then, restarted, from round 1's start (what it trained before it, kept)
    assert [(c[0], c[1], c[3]) for c in calls] == [("0", "0", "False"), ("1", "0", "False"), ("1", "1", "True"),
                                                   ("2", "0", "False"), ("3", "0", "False"), ("4", "0", "False"),
                                                   ("5", "0", "False")], calls
    assert int(calls[2][2]) > 0
    assert "worker 1 failed" in done.stderr and "went with the process" not in done.stderr, done.stderr[-3000:]
    with open(os.path.join(model, "config.json")) as fh:
        assert json.load(fh)["summary"]["worker_restarts"] == 1
    with open(os.path.join(model, LOG_FILE)) as fh:
        restarts = [line for line in map(json.loads, fh) if line["event"] == "restart"]
    assert [(r["worker"], r["epoch"]) for r in restarts] == [(1, 1)]
    for (epoch, round_), by_worker in writers(journal, "words_out").items():
        assert not by_worker[0] & by_worker[1], f"epoch {epoch} round {round_}: rows pushed by both workers"
    _, manifest = modeldir.load_manifest(model)
    assert manifest["epoch"] == 6
    assert main(["train", "--out", str(tmp_path / "straight"), *flags]) == 0
    straight, m = heldout_metrics(str(tmp_path / "straight"), heldout), heldout_metrics(model, heldout)
    assert straight["model_recall@10"] > straight["popularity_recall@10"], straight
    assert m["model_recall@10"] > straight["model_recall@10"] - 0.01, (m, straight)


def _restart_worker_0_before(monkeypatch, method: str) -> list[int]:
    """Patch run.Run.<method> so that before its call for epoch 1, worker 0's process is killed and the one
    Ray restarts answers (another pid); returns the epochs it was killed before."""
    import ray

    from doc2vec_dist import run as run_module

    original, killed = getattr(run_module.Run, method), []

    def restarted_first(self, epoch, *args):
        if epoch == 1 and not killed:
            killed.append(epoch)
            before = ray.get(self.workers[0].progress.remote())["pid"]
            ray.kill(self.workers[0], no_restart=False)
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:  # until the restarted process answers
                with contextlib.suppress(ray.exceptions.RayActorError):
                    if ray.get(self.workers[0].progress.remote(), timeout=5)["pid"] != before:
                        break
                time.sleep(0.1)
        return original(self, epoch, *args)

    monkeypatch.setattr(run_module.Run, method, restarted_first)
    return killed


def test_a_device_worker_restarted_before_the_checkpoint_asks_for_its_rows_trains_that_epoch_again(
        ray_cluster, small_corpus, tmp_path, monkeypatch):
    """The window the test above leaves: the worker that keeps its rows on its device across an epoch's end
    dies after its epoch ended and Ray has restarted it before the checkpoint's pause reaches it. The pause
    then succeeds, answered by the new process, which holds nothing: the epoch's updates were lost with only
    a warning. Its answer names its process (Position.pid), so the driver sees the restart there and trains
    that epoch again from the last checkpoint, as where the pause failed: the model of a run that never failed,
    bit for bit."""
    config = TrainConfig(dim=16, epochs=2, sample=0, num_ps=2, num_workers=1, cpus_per_worker=1, kernel="batched",
                         macro_batch=4096, progress=False)
    monkeypatch.setenv(STAGED_ENV, "1")
    straight = train(small_corpus, str(tmp_path / "straight"), config)["model"]

    killed = _restart_worker_0_before(monkeypatch, "_checkpoint_between_epochs")  # after epoch 0, before the pause
    died = str(tmp_path / "died")
    summary = train(small_corpus, died, config)
    assert killed == [1]
    assert summary["worker_restarts"] == 1
    with open(os.path.join(died, LOG_FILE)) as fh:
        restarts = [line for line in map(json.loads, fh) if line.get("event") == "restart"]
    assert len(restarts) == 1 and "Ray restarted it" in restarts[0]["reason"], restarts
    for table in ("docs", "words_out"):
        np.testing.assert_array_equal(modeldir.ModelDir(died).read_table(table),
                                      modeldir.ModelDir(straight).read_table(table), err_msg=table)


def test_with_checkpoints_off_a_device_worker_restarted_between_epochs_loses_nothing(ray_cluster, small_corpus,
                                                                                       tmp_path, monkeypatch):
    """With --checkpoint-every 0 no pause comes between two epochs to find a restart out (the test above): the
    worker that keeps its rows across epochs writes them back at every epoch's end instead
    (RunSettings.writes_back_at_end_of), so a process Ray restarts between two epochs finds them on the
    servers. Killed after epoch 0, restarted before epoch 1 starts: one restart counted, and the model of a
    run that never failed, bit for bit."""
    config = TrainConfig(dim=16, epochs=2, sample=0, num_ps=1, num_workers=1, cpus_per_worker=1, kernel="batched",
                         macro_batch=4096, checkpoint_every=0, progress=False)
    monkeypatch.setenv(STAGED_ENV, "1")
    straight = train(small_corpus, str(tmp_path / "straight"), config)["model"]

    killed = _restart_worker_0_before(monkeypatch, "_run_epoch")  # epoch 0 ended (its rows written back)
    died = str(tmp_path / "died")
    summary = train(small_corpus, died, config)
    assert killed == [1]
    assert summary["worker_restarts"] == 1
    for table in ("docs", "words_out"):
        np.testing.assert_array_equal(modeldir.ModelDir(died).read_table(table),
                                      modeldir.ModelDir(straight).read_table(table), err_msg=table)


@pytest.mark.parametrize("wait", [0.0, 2.0], ids=["resumed-as-it-dies", "resumed-once-restarted"])
def test_a_worker_killed_between_the_checkpoint_and_its_resume_is_one_restart(ray_cluster, small_corpus, tmp_path,
                                                                                 monkeypatch, wait):
    """A worker that dies after the checkpoint at an epoch's end had its rows, before the driver resumes it,
    lost nothing, and is one restart: counted by the process it answers from (Run._note_pid), said once in the
    run log. Before, the count went by the calls that failed: one refused as the actor restarted counted the
    death again (on a machine with one busy core the run said 2 restarts for one:
    test_a_killed_actor_is_restarted_and_the_run_completes[worker-tokens-on-device]), and one restarted before
    the driver's next call was never counted (0). `wait`: seconds between the kill and the resume."""
    import ray

    from doc2vec_dist import run as run_module

    original, killed = run_module.Run._checkpoint, []

    def checkpoint_then_kill(self, epoch, positions, epoch_stats):
        original(self, epoch, positions, epoch_stats)
        if positions is None and epoch == 2 and not killed:  # the checkpoint between epochs 2 and 3
            killed.append(epoch)
            ray.kill(self.workers[0], no_restart=False)
            time.sleep(wait)

    monkeypatch.setattr(run_module.Run, "_checkpoint", checkpoint_then_kill)
    model = str(tmp_path / "model")
    summary = train(small_corpus, model, TrainConfig(dim=16, epochs=4, sample=0, num_ps=1, num_workers=1,
                                                     cpus_per_worker=1, checkpoint_every=60, progress=False))
    assert killed == [2]
    assert summary["worker_restarts"] == 1
    _, manifest = modeldir.load_manifest(model)
    assert manifest["epoch"] == 4
    with open(os.path.join(model, LOG_FILE)) as fh:
        restarts = [line for line in map(json.loads, fh) if line.get("event") == "restart"]
    assert len(restarts) == 1, restarts


# ---------------------------------------------------------------------------------------------------
# issue 28, item 2: a node Ray marks dead, and a worker that stops answering
# ---------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("case", ["no-room", "room", "can-grow"])
def test_actors_on_a_dead_node_that_do_not_come_back_stop_the_run_with_the_resume_line(
        ray_cluster, sample_corpus, tmp_path, monkeypatch, logged, case):
    """Ray's view of the nodes, as the driver asks for it, turned: once the first checkpoint is committed,
    the node every actor runs on is reported dead (as Ray reports a node whose heartbeats stopped). With no
    live node that could hold the actors on a cluster that cannot grow, the run stops at the next check;
    with room on another node, it waits RESTART_SECONDS for Ray to restart them there; where an autoscaler
    may add a node, --wait-for-resources. Each ends in one error line naming the node and what it ran, and
    the resume command; the checkpoint committed stays."""
    import ray

    from doc2vec_dist import trainer

    corpus, _ = sample_corpus
    model = str(tmp_path / "model")
    real_nodes = ray.nodes

    def nodes():
        found = real_nodes()
        if modeldir.latest_version(model) is None:
            return found
        dead = [{**n, "Alive": False, "DeathReasonMessage": "health check failed due to missing too many heartbeats"}
                for n in found]
        spare = [{**n, "NodeID": "f" * 56, "NodeManagerAddress": "10.0.0.9"} for n in found] if case == "room" else []
        return dead + spare

    monkeypatch.setattr(ray, "nodes", nodes)
    monkeypatch.setattr("doc2vec_dist.run.cluster_can_grow", lambda: case == "can-grow")
    monkeypatch.setattr(trainer, "cluster_can_grow", lambda: case == "can-grow")  # and where a run waits to start
    monkeypatch.setattr("doc2vec_dist.run.RESTART_SECONDS", 1.0)
    config = TrainConfig(dim=16, epochs=200, sample=0, num_ps=2, num_workers=1, cpus_per_worker=1, checkpoint_every=0.3,
                         progress=False, wait_for_resources=1.0)
    t0 = time.monotonic()
    with pytest.raises(TrainingStopped) as stopped:
        train(corpus, model, config)
    message = str(stopped.value)
    node = real_nodes()[0]
    assert message.startswith(f"node {node['NodeManagerAddress']} ({node['NodeID'][:8]}) is dead (Ray: health check "
                              "failed due to missing too many heartbeats): it ran worker 0"), message
    # every actor the node ran is named (it ran them all), not only the first found
    assert "it ran worker 0 and parameter servers 0, 1" in message, message
    if case == "no-room":
        assert message.endswith(", which cannot be restarted: 1 worker asks for 1 CPU, and no node is alive; the Ray "
                                "cluster cannot grow (it runs no autoscaler)"), message
    elif case == "room":
        assert message.endswith(", and Ray did not restart them within 1s"), message
        assert "it ran worker 0 and parameter servers 0, 1; Ray restarts them on a live node from the last checkpoint " \
               "(waiting up to 1s)" in logged.text
    else:
        assert message.endswith("still after 1s (--wait-for-resources)"), message
        assert "which cannot be restarted yet: " in logged.text and "waiting up to 1s (--wait-for-resources)" in logged.text
    version = modeldir.latest_version(model)
    assert f"training stopped: the model at {model} is kept up to checkpoint v{version}; resume with" in logged.text
    assert modeldir.ModelDir(model).read_table("docs").shape[1] == 16
    assert time.monotonic() - t0 < 60


FROZEN_AT_PAUSE = """
import os, signal, sys
from doc2vec_dist import run
from doc2vec_dist.cli import main

class FrozenAtPause(run.Worker):
    # a worker whose machine hangs while a checkpoint waits for it (its second pause, after a version is
    # committed): it answers nothing more
    pauses = 0

    def pause(self):
        self.pauses += 1
        if self.pauses == 2:
            os.kill(os.getpid(), signal.SIGSTOP)
        return super().pause()

run.Worker = FrozenAtPause
sys.exit(main(sys.argv[1:]))
"""


def test_ctrl_c_ends_a_run_waiting_on_a_worker_that_stopped_answering(sample_corpus, tmp_path, interrupt_when):
    """A worker frozen (SIGSTOP: a machine that hangs, a link that stalls) while the driver waits for it at a
    checkpoint: Ctrl-C ends the run within seconds, with the resume line. (It used to wait for the frozen
    worker to resume after the interrupt: a minute per worker.)"""
    corpus, _ = sample_corpus
    model = str(tmp_path / "model")
    proc = subprocess.Popen([sys.executable, "-c", FROZEN_AT_PAUSE, "train", "--corpus", corpus, "--out", model,
                             "--dim", "100", "--sample", "0", "--epochs", "500", "--num-ps", "2", "--num-workers", "1",
                             "--cpus-per-worker", "1", "--no-progress",
                             # mid-epoch checkpoints, where workers pause: each macro-batch 30 ms longer, so an
                             # epoch outlasts the driver's 0.02 s tick on any machine (at dim 16 and no pause an
                             # epoch took 0.03 s on a quiet machine: no pause came, the run ended, the test failed)
                             "--checkpoint-every", "0.02"],
                            stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": ROOT, STEP_PAUSE_ENV: "0.03"})
    frozen: list[psutil.Process] = []  # the driver's own Ray's worker, found among its descendants
    seen: list[float] = []  # when it was found frozen

    def frozen_a_while() -> bool:
        if not frozen:
            for child in psutil.Process(proc.pid).children(recursive=True):
                with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                    # a process starting or ending has no command line yet (or no more): [], not ours
                    title = child.cmdline()[:1]
                    if title and title[0].startswith("ray::") and child.status() == psutil.STATUS_STOPPED:
                        frozen.append(child)
                        seen.append(time.monotonic())
        return bool(seen) and time.monotonic() - seen[0] > 2  # the driver has waited on it a while

    try:
        err = interrupt_when(proc, frozen_a_while, within=180)
        ended_after = time.monotonic() - seen[0] - 2
    finally:
        for p in frozen:  # stopped, it would never exit on its own
            with contextlib.suppress(psutil.NoSuchProcess):
                p.kill()
    assert proc.returncode == 130, err
    # within seconds (about 2 quiet); the bug waited a minute for each frozen worker. 30 s tells the two
    # apart on a busy machine too
    assert ended_after < 30, (ended_after, err)
    version = modeldir.latest_version(model)
    assert f"interrupted: the model at {model} is kept up to checkpoint v{version}; resume with" in err
