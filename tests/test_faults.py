"""Processes killed during training, on the real local Ray: Ray restarts the actor, the parameter
server reloads its rows from LATEST, the worker goes back to its checkpointed data position, and the
run completes."""

from __future__ import annotations

import os
import signal
import threading
import time

import psutil
import pytest

from doc2vec_dist import checkpoint
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.evaluate import heldout_metrics
from doc2vec_dist.trainer import train


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
            _, manifest = checkpoint.load_manifest(model)
            if manifest["epoch"] >= min_epoch:
                procs = actor_processes(name)
                if procs:
                    killed.append((procs[0].pid, manifest["epoch"]))
                    os.kill(procs[0].pid, signal.SIGKILL)
                    return
        time.sleep(0.05)


@pytest.mark.parametrize("victim, engine", [
    ("ParameterServer", {}),
    ("Worker", {}),
    # one worker holding the whole URL table, its examples drawn on its device (the token path)
    ("Worker", {"num_workers": 1, "cpus_per_worker": 2, "kernel": "batched"}),
    # ... and PV-DM's words rows resident beside the URL table: a restarted worker pulls both again
    ("Worker", {"num_workers": 1, "cpus_per_worker": 2, "kernel": "batched", "mode": "dm", "window": 3}),
], ids=["server", "worker", "worker-tokens-on-device", "worker-dm-words-resident"])
def test_a_killed_actor_is_restarted_and_the_run_completes(ray_cluster, sample_corpus, tmp_path, victim, engine):
    corpus, heldout = sample_corpus
    model = str(tmp_path / "model")
    killed: list = []
    killer = threading.Thread(target=kill_one_when_checkpointed, args=(model, victim, killed), daemon=True)
    killer.start()
    summary = train(corpus, model, TrainConfig(**{"dim": 32, "epochs": 12, "sample": 0, "num_ps": 2, "num_workers": 2,
                                                  "cpus_per_worker": 1, "checkpoint_every": 0.5, "progress": False,
                                                  **engine}))
    killer.join(timeout=5)
    assert killed, f"no {victim} was killed: the run ended before a checkpoint"
    _, manifest = checkpoint.load_manifest(model)
    assert manifest["epoch"] == 12
    if victim == "ParameterServer":
        assert summary["server_restarts"] == 1
        # the restarted server reloaded its rows from a checkpoint; the other kept its own
        assert sum(v is not None for v in summary["servers_loaded_from"]) == 1
    else:
        assert summary["worker_restarts"] == 1
    # nothing lost beyond the work since the last checkpoint: it still beats popularity clearly
    m = heldout_metrics(model, heldout)
    assert m["model_recall@10"] > 1.15 * m["popularity_recall@10"], m
