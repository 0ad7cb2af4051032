"""The worker's staged (device) path, run on CPU.

On a GPU the worker assembles each macro-batch's rows in pinned host matrices, copies them to the
device, trains there (the resident --cache-rows rows never leave it) and copies back what it pushes.
CI has no GPU, so these tests run that same bookkeeping with the device being the CPU, and check that
it trains exactly what the in-place path trains: same pulls, same pushes, same tables, bit for bit.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from doc2vec_dist import client, precision
from doc2vec_dist import settings as run_settings
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.ps import ParameterServer, table_specs
from doc2vec_dist.settings import resolve
from doc2vec_dist.units import Position, plan_units
from doc2vec_dist.worker import Worker

NUM_PS = 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def start_worker(ray, corpus_path: str, config: TrainConfig, local: bool = False,
                 **server_options) -> tuple[list, dict, Worker]:
    """Real servers and worker 0 of config.num_workers, in this process: (servers, rows, worker). The
    servers are actors, or with `local` ParameterServer objects in this process (client.LocalServer, one
    call at a time each, as an actor of max_concurrency 1: what a test of the worker's own paths needs,
    without two actor processes started for each run)."""
    corpus = Corpus(corpus_path)
    tables = table_specs(config, corpus)
    if local:
        servers = local_servers(tables, config.seed)
    else:
        server_cls = ray.remote(ParameterServer)
        servers = [server_cls.options(**server_options).remote(s, NUM_PS, tables, config.seed) for s in range(NUM_PS)]
    rows = {name: spec.rows for name, spec in tables.items()}
    worker = Worker(0, plan_units(corpus, config.num_workers)[0], corpus.path, resolve(config, corpus), servers, tables)
    return servers, rows, worker


def local_servers(tables: dict, seed: int) -> list:
    """NUM_PS ParameterServer objects in this process, called as their actors are (client.LocalServer)."""
    return [client.LocalServer(ParameterServer(s, NUM_PS, tables, seed)) for s in range(NUM_PS)]


def stop_servers(ray, servers: list) -> None:
    for s in servers:
        s.close() if isinstance(s, client.LocalServer) else ray.kill(s)


def served(ray, servers: list, name: str, n: int, dtype: str = "float32", dim: int = 0) -> np.ndarray:
    """Rows 0..n-1 of table `name` as the servers hold them (row r on server r % NUM_PS), widened to
    float32 from a 16-bit `dtype` whose vectors have `dim` values."""
    slices = client.get([s.pull.remote({name: np.arange(len(range(i, n, NUM_PS)))}) for i, s in enumerate(servers)])
    slices = [precision.widen_rows(part, dtype, dim) for part in slices]
    full = np.empty((n, slices[0].shape[1]), dtype=np.float32)
    for i, part in enumerate(slices):
        full[i::NUM_PS] = part
    return full


def train_one_worker(ray, corpus_path: str, config: TrainConfig, staged: bool,
                     pause_at: int | None = None) -> tuple[dict, dict]:
    """Two epochs of one in-process worker against real servers in this process (one call at a time
    each, so the run is deterministic; test_a_worker_killed_after_a_checkpoint_… runs its other run against
    actors and compares the rows bit for bit); returns every table's rows and the worker's counters.
    pause_at: a checkpoint's pause is asked for as the worker prepares its pause_at-th batch (so it pauses
    at the next batch boundary, the same one in every run), and resumed once the worker has paused."""
    servers, rows, worker = start_worker(ray, corpus_path, config, local=True)
    worker.staged = staged
    paused = []
    if pause_at is not None:
        prepare, prepared = worker._prepare, []

        def resume_when_paused():
            with worker._cv:
                while worker._paused_at is None:
                    worker._cv.wait()
                paused.append(worker._paused_at)
            worker.resume()

        def prepare_and_ask(*args):
            prepared.append(1)
            if len(prepared) == pause_at:
                worker._pause_requested = True
                threading.Thread(target=resume_when_paused, daemon=True).start()
            return prepare(*args)

        worker._prepare = prepare_and_ask
    stats = []
    for epoch in range(config.epochs):
        # on the block schedule, worker 0 goes through every round as if the others' shares were empty
        start = Position(epoch)
        for r in range(config.num_workers if run_settings.blocks(config) else 1):
            s = worker.run_epoch(epoch, start)
            start = Position(epoch, round=r + 1, tokens=s["tokens"], pairs=s["pairs"], loss=s["loss"])
        stats.append(s)
    out = {name: served(ray, servers, name, n, config.dtype, config.dim) for name, n in rows.items()}
    stop_servers(ray, servers)
    return out, {"host": {k: len(v) for k, v in worker._host.items()}, "stats": stats, "paused": paused,
                 "outputs": str(worker._outputs.dtype), "partitions": len(worker.partitions),
                 "said": worker.lines_to_say()}


@pytest.mark.parametrize("settings", [
    {"mode": "dbow"},  # every words_out row resident: the token path, examples drawn on the device
    {"mode": "dbow", "cache_rows": 300, "shared_negatives": 16},
    {"mode": "dbow", "cache_rows": 0, "optimizer": "adagrad", "alpha": 0.1},
    {"mode": "dm", "window": 3},  # the token path too: words resident beside words_out
    {"mode": "dbow", "dbow_words": True, "window": 3, "cache_rows": 300},  # host examples, some rows resident
    {"mode": "dbow", "dbow_words": True, "window": 3},  # the token path, skip-gram windows drawn on the device
    # the block schedule: worker 0 of 2, its block on the device, swapped each round; its documents resident too
    {"mode": "dbow", "num_workers": 2},
    # issue 29: 16-bit tables, narrowed stochastically by the servers (deltas, the float32 accumulator beside
    # them), the same draws in both paths (off the token path: there the device keeps its rows in 16 bits,
    # test_a_staged_worker_keeps_its_url_rows_in_the_tables_16_bits_and_trains_as_the_host_does)
    {"mode": "dbow", "cache_rows": 300, "optimizer": "adagrad", "alpha": 0.1, "dtype": "float16"},
], ids=["dbow-tokens-on-device", "dbow-resident-shared", "dbow-adagrad", "dm-tokens-on-device", "dbow-words-host",
        "dbow-words-tokens-on-device", "dbow-blocks", "float16-adagrad-resident-shared"])
def test_the_staged_path_trains_exactly_what_the_in_place_path_trains(ray_cluster, small_corpus, settings):
    # the staged path is the batched kernel's (GPU workers'); the exact kernel trains the host matrices
    config = TrainConfig(dim=16, epochs=2, sample=0, num_ps=NUM_PS, macro_batch=8192, kernel="batched",
                         progress=False, **{"num_workers": 1, **settings})
    in_place, info_a = train_one_worker(ray_cluster, small_corpus, config, staged=False)
    staged, info_b = train_one_worker(ray_cluster, small_corpus, config, staged=True)
    # staged: two slots of host matrices, one batch's arriving while the other's trains; in place: nothing staged
    assert info_b["host"].keys() == {"inputs0", "outputs0", "inputs1", "outputs1"} and not info_a["host"]
    if "cache_rows" not in settings:  # the token path: every URL row resident on the device, none in host memory
        assert info_b["host"]["outputs0"] == info_b["host"]["outputs1"] == 0
    if settings.get("num_workers") == 2:  # ... and on the block schedule its documents too
        assert info_b["host"]["inputs0"] == info_b["host"]["inputs1"] == 0
    for name, table in in_place.items():
        assert np.isfinite(table).all()
        np.testing.assert_array_equal(staged[name], table, err_msg=name)
    assert [s["tokens"] for s in info_b["stats"]] == [s["tokens"] for s in info_a["stats"]]
    assert [s["loss"] for s in info_b["stats"]] == [s["loss"] for s in info_a["stats"]]
    # and it trained: words_out starts at zero, and every resident row's updates reached the servers
    assert np.abs(in_place["words_out"][:max(settings.get("cache_rows", 0), 1)]).sum(1).min() > 0
    assert info_a["stats"][-1]["pairs"] > 0


@pytest.mark.parametrize("settings", [
    {"dtype": "bfloat16"},
    {"dtype": "float16", "optimizer": "adagrad", "alpha": 0.1},
    {"dtype": "bfloat16", "num_workers": 2},  # the block schedule: worker 0's block swapped each round
], ids=["bfloat16", "float16-adagrad", "bfloat16-blocks"])
def test_a_staged_worker_keeps_its_url_rows_in_the_tables_16_bits_and_trains_as_the_host_does(ray_cluster,
                                                                                             small_corpus, settings):
    """On the token path a device worker keeps every URL row it holds in the tables' 16-bit dtype (half
    the device memory), narrowing each micro-batch's update stochastically: not the host path's bits,
    but its training, and the same bits run after run."""
    config = TrainConfig(mode="dbow", dim=16, epochs=2, sample=0, num_ps=NUM_PS, macro_batch=8192, kernel="batched",
                         device_rows="dtype", progress=False, **{"num_workers": 1, **settings})
    in_place, info_a = train_one_worker(ray_cluster, small_corpus, config, staged=False)
    staged, info_b = train_one_worker(ray_cluster, small_corpus, config, staged=True)
    assert info_a["outputs"] == "torch.float32" and info_b["outputs"] == f"torch.{settings['dtype']}"
    assert info_b["host"]["outputs0"] == info_b["host"]["outputs1"] == 0  # the URL rows never in host memory
    loss_a, loss_b = (info["stats"][-1]["loss"] / info["stats"][-1]["pairs"] for info in (info_a, info_b))
    assert abs(loss_b - loss_a) < 0.005 * loss_a, (loss_a, loss_b)  # within 0.003% measured
    assert [s["tokens"] for s in info_b["stats"]] == [s["tokens"] for s in info_a["stats"]]
    for name, table in in_place.items():
        assert np.isfinite(staged[name]).all()
        dim = config.dim
        # the same training, rounded differently: every row's vector close to the host path's
        cosine = (staged[name][:, :dim] * table[:, :dim]).sum(1) / (
            np.linalg.norm(staged[name][:, :dim], axis=1) * np.linalg.norm(table[:, :dim], axis=1) + 1e-12)
        trained = np.linalg.norm(table[:, :dim], axis=1) > 0
        assert np.median(cosine[trained]) > 0.99, (name, np.median(cosine[trained]))  # 0.9999-1.0 measured
    again, _ = train_one_worker(ray_cluster, small_corpus, config, staged=True)
    for name, table in staged.items():
        np.testing.assert_array_equal(again[name], table, err_msg=name)


@pytest.mark.parametrize("settings", [
    {"mode": "dbow", "cache_rows": 300},  # host examples, users' and URLs' rows pulled
    {"mode": "dbow", "macro_batch": 8192},  # the token path
], ids=["host-examples", "tokens-on-device"])
def test_a_checkpoint_pause_between_staged_batches_trains_what_the_in_place_path_trains(ray_cluster, small_corpus,
                                                                                        settings):
    """The staged worker's next batch is already arriving (pulled, assembled, copied to its device
    slot) when a checkpoint pauses it: after the pause it is pulled and staged again, as the in-place
    worker pulls it again, so both train the same thing bit for bit."""
    config = TrainConfig(dim=16, epochs=2, sample=0, num_ps=NUM_PS, num_workers=1, kernel="batched", progress=False,
                         **{"macro_batch": 4096, **settings})
    in_place, info_a = train_one_worker(ray_cluster, small_corpus, config, staged=False, pause_at=3)
    staged, info_b = train_one_worker(ray_cluster, small_corpus, config, staged=True, pause_at=3)
    assert info_a["paused"] and info_a["paused"] == info_b["paused"] and info_a["paused"][0].step >= 1
    for name, table in in_place.items():
        np.testing.assert_array_equal(staged[name], table, err_msg=name)
    assert [s["loss"] for s in info_b["stats"]] == [s["loss"] for s in info_a["stats"]]


# --- issue 48: a worker's documents resident across epochs, or swapped by partition -----------------------------

def test_a_device_worker_keeps_its_documents_across_epochs_and_moves_nothing_to_the_servers_between(ray_cluster,
                                                                                                   small_corpus):
    """One worker on the device path (the CPU as the device) pulls its documents' rows and its URL rows
    once, then trains epoch after epoch with no call to a server: no bytes a token. A checkpoint's pause
    writes every row it holds back over the servers', as they are on its device."""
    config = TrainConfig(dim=16, epochs=4, sample=0, num_ps=NUM_PS, num_workers=1, macro_batch=4096, kernel="batched",
                         progress=False)
    servers, rows, worker = start_worker(ray_cluster, small_corpus, config)
    worker.staged = True
    stats = [worker.run_epoch(epoch) for epoch in range(3)]  # not the run's last: nothing written back yet
    width = 16 * 4
    assert stats[0]["bytes"] == {"pulled": 0, "pushed": 0, "resident_pulled": (rows["docs"] + rows["words_out"]) * width,
                                 "resident_pushed": 0, "handed": 0}
    for later in stats[1:]:
        assert set(later["bytes"].values()) == {0}, later["bytes"]
    assert len(worker.partitions) == 1 and len(worker._host["inputs0"]) == len(worker._host["inputs1"]) == 0
    worker.pause()  # what a checkpoint does, between epochs
    worker.resume()
    assert worker.progress()["bytes"]["resident_pushed"] == (rows["docs"] + rows["words_out"]) * width
    ids = worker.client.docs.ids
    np.testing.assert_array_equal(served(ray_cluster, servers, "docs", rows["docs"])[ids],
                                  worker._read_resident("docs")[worker.client.docs.rows_of(ids)])
    np.testing.assert_array_equal(served(ray_cluster, servers, "words_out", rows["words_out"]),
                                  worker._read_resident("words_out"))
    for s in servers:
        ray_cluster.kill(s)


@pytest.mark.parametrize("kernel, staged", [("batched", True), ("exact", False)], ids=["device", "cpu-exact"])
def test_documents_resident_or_swapped_by_partition_train_what_documents_pulled_per_batch_train(ray_cluster,
                                                                                               small_corpus,
                                                                                               kernel, staged):
    """A worker's documents resident for the run, or cut into partitions under a memory cap (--device-memory)
    and swapped as its walk passes from one to the next, train the same model bit for bit as documents
    pulled and pushed with each macro-batch (the path before issue 48), through a checkpoint's pause:
    each document's row has one writer, and no macro-batch changes."""
    # (one thread: the exact kernel's threads share the rows Hogwild-style, which no two runs do alike)
    config = TrainConfig(dim=16, epochs=2, sample=0, num_ps=NUM_PS, num_workers=1, macro_batch=4096, kernel=kernel,
                         cpus_per_worker=1, progress=False)
    streamed, info = train_one_worker(ray_cluster, small_corpus, dataclasses.replace(config, resident_docs=False),
                                      staged=staged, pause_at=3)
    assert info["partitions"] == 0 and info["stats"][-1]["bytes"]["pulled"] > 0
    cap = 300 * 16 * 4 / 2**30  # GiB: 300 documents' rows, of the corpus's 1,500
    for settings in ({}, {"device_memory": cap}):
        held, info = train_one_worker(ray_cluster, small_corpus, dataclasses.replace(config, **settings),
                                      staged=staged, pause_at=3)
        assert info["partitions"] == 1 if not settings else info["partitions"] >= 3, info["partitions"]
        # said through the driver (an actor's log line reached no terminal nor Ray's log files)
        assert info["said"] == ([] if not settings else [
            (f"worker 0: its 1,500 documents' rows do not fit its --device-memory: held in {info['partitions']} "
            "partitions, one at a time")])
        resident = info["stats"][-1]["bytes"]["resident_pulled"]
        assert resident == (info["partitions"] > 1) * 1500 * 16 * 4  # each partition pulled once an epoch, once held
        assert info["stats"][-1]["bytes"]["pulled"] == info["stats"][-1]["bytes"]["pushed"] == 0
        for name, table in streamed.items():
            np.testing.assert_array_equal(held[name], table, err_msg=f"{settings}: {name}")


def test_where_a_workers_documents_live_kept_across_epochs_swapped_by_partition_or_streamed(monkeypatch):
    """settings.document_partitions: a CPU worker keeps its share within 2 GiB, else streams it as before; a
    GPU worker keeps it where its share of its device's free memory holds it beside its URL rows
    (Worker._device_room), else in partitions; --device-memory caps either; off the token path, streamed."""
    from types import SimpleNamespace

    import torch

    from doc2vec_dist.config import TableSpec
    from doc2vec_dist.settings import RESIDENT_AUTO_BYTES

    row = 100 * 4
    fits = RESIDENT_AUTO_BYTES // row
    assert run_settings.document_partitions(TrainConfig(dim=100), fits, 1000) == 1
    assert run_settings.document_partitions(TrainConfig(dim=100), fits + 1, 1000) == 0
    assert run_settings.document_partitions(TrainConfig(dim=100, device_memory=0.5), fits + 1, 1000) == 5  # 2 GiB and a row
    assert run_settings.document_partitions(TrainConfig(dim=100, num_workers=2, schedule="shared"), 1000, 1000) == 0
    assert run_settings.document_partitions(TrainConfig(dim=100, gpus_per_worker=1), 10 * fits, 1000) == 1  # the driver: unknown
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (8 << 30, 16 << 30))
    two = TrainConfig(dim=100, num_workers=2, gpus_per_worker=0.5)
    room = Worker._device_room(SimpleNamespace(device="cuda", config=two, width=100),
                               TableSpec("words_out", 1_000_000, 100))
    assert room == int((8 << 30) * 0.75 * 0.5) - 500_000 * row  # half the device, less its block of URL rows
    assert run_settings.document_partitions(two, 20_000_000, 1_000_000, free_bytes=room) == 2  # 10M users' rows, 4 GB each


def test_a_worker_killed_after_a_checkpoint_loses_only_what_it_trained_since_and_its_restart_trains_the_same_rows(
        ray_cluster, small_corpus):
    """A device worker killed mid-epoch loses its updates since the last checkpoint (its documents' rows
    lived on its device, not yet written back) and nothing else: restarted from the checkpoint's position,
    as the trainer restarts it, it finds the servers holding exactly the checkpoint's rows, and trains
    what a run that never stopped trains, bit for bit. (Before, the documents' pushes it made after the
    checkpoint were in the servers, and the restart trained that stretch a second time over them.)"""
    from doc2vec_dist.units import Compute

    config = TrainConfig(dim=16, epochs=2, sample=0, num_ps=NUM_PS, num_workers=1, macro_batch=4096, kernel="batched",
                         progress=False)
    straight, _ = train_one_worker(ray_cluster, small_corpus, config, staged=True, pause_at=3)

    servers, rows, worker = start_worker(ray_cluster, small_corpus, config, max_concurrency=1)
    worker.staged = True
    prepare, prepared, computed, paused = worker._prepare, [], [], []

    def resume_when_paused():
        with worker._cv:
            while worker._paused_at is None:
                worker._cv.wait()
            paused.append(worker._paused_at)
        worker.resume()

    def prepare_and_ask(*args):  # the checkpoint's pause, asked for where train_one_worker asks for it
        prepared.append(1)
        if len(prepared) == 3:
            worker._pause_requested = True
            threading.Thread(target=resume_when_paused, daemon=True).start()
        return prepare(*args)

    def dies_at_the_sixth(*args, **kwargs):  # three batches after the checkpoint: the process dies
        computed.append(1)
        if len(computed) == 6:
            raise RuntimeError("killed")
        return Compute.default().batched(*args, **kwargs)

    worker._prepare = prepare_and_ask
    worker.compute = dataclasses.replace(worker.compute, batched=dies_at_the_sixth)
    with pytest.raises(RuntimeError, match="killed"):
        worker.run_epoch(0)
    (at,) = paused
    assert at.step < 5 and len(computed) == 6  # killed batches after it
    corpus = Corpus(small_corpus)
    restarted = Worker(0, plan_units(corpus, 1)[0], corpus.path, dataclasses.replace(resolve(config, corpus), staged=True),
                       servers, table_specs(config, corpus))
    restarted.run_epoch(0, at)
    restarted.run_epoch(1)
    for name, n in rows.items():
        np.testing.assert_array_equal(served(ray_cluster, servers, name, n), straight[name], err_msg=name)
    for s in servers:
        ray_cluster.kill(s)


def test_overlap_weights_count_rare_rows_whole_and_hot_rows_once_among_workers():
    from doc2vec_dist.client import overlap_weights

    w = overlap_weights(np.array([0, 1, 3, 1000]), 4)
    assert w[0] == 1.0 and abs(w[-1] - 0.25) < 1e-6
    assert (np.diff(w) < 0).all()  # the more a row is used, the more workers likely pushed it too
    assert (overlap_weights(np.array([0, 5, 1000]), 1) == 1.0).all()


def test_resident_rows_pushed_by_several_workers_are_weighted_by_their_uses(ray_cluster, sample_corpus):
    """Each of W workers trains its own copy of the resident rows from the same pull; summed whole,
    their deltas overshot (4 workers: recall@10 0.101 against 0.166 weighted, README)."""
    config = TrainConfig(dim=8, epochs=1, sample=0, num_ps=NUM_PS, num_workers=3, cache_rows=4, progress=False)
    servers, _, worker = start_worker(ray_cluster, sample_corpus[0], config)
    worker._sync("test", push=False)  # pull the 4 resident rows (zeros: words_out starts at zero)
    np.testing.assert_array_equal(worker.client.base, 0)
    worker._outputs[:4] = 1.0  # what training moved them by
    worker.client.uses[:] = [0, 1, 2, 10_000]
    worker._sync("test", pull=False)
    assert not worker.client.uses.any()  # counted afresh from the next pull
    pushed = served(ray_cluster, servers, "words_out", 4)
    overlap = 1.0 / (1.0 + 2 * (1.0 - np.exp(-np.array([0.0, 1.0, 2.0, 10_000.0]))))
    expected = np.minimum(1.0, 2 * overlap)  # at most two workers' worth: 1, 0.88, 0.73, 0.67
    np.testing.assert_allclose(pushed, np.repeat(expected[:, None], 8, axis=1), rtol=1e-6)
    for server in servers:
        ray_cluster.kill(server)


@pytest.mark.parametrize("kernel, words", [("exact", False), ("batched", False), ("batched", True)],
                         ids=["exact", "batched", "batched-dbow-words"])
def test_the_token_path_pulls_the_url_rows_once_and_writes_them_over_the_servers(ray_cluster, sample_corpus, kernel,
                                                                                 words):
    """One worker holding every URL row is their only writer: it pulls them once, and each push writes
    them over the servers' instead of adding a delta. With dbow_words the words rows are resident too,
    at the head of `inputs`; its documents' rows after them, pulled once too (issue 48)."""
    config = TrainConfig(dim=16, epochs=3, sample=0, num_ps=NUM_PS, num_workers=1, kernel=kernel, dbow_words=words,
                         window=3, progress=False)
    servers, rows, worker = start_worker(ray_cluster, sample_corpus[0], config)
    assert worker.token_path and worker.cached == rows["words_out"]
    assert worker.words_head == (rows["words"] if words else 0)
    start = served(ray_cluster, servers, "words", rows["words"]) if words else None
    pulls = []
    pull = worker.client.pull_resident
    worker.client.pull_resident = lambda table="words_out", out=None: pulls.append(table) or pull(table, out=out)
    for epoch in range(config.epochs):
        worker.run_epoch(epoch)
    assert pulls == (["words_out", "words"] if words else ["words_out"]) + ["docs"]
    held = {"words_out": np.asarray(worker._outputs[:worker.cached])}  # numpy, or torch (batched)
    if words:
        held["words"] = np.asarray(worker._inputs[:worker.words_head])
        assert (np.abs(held["words"] - start).sum(1) > 0).mean() > 0.9  # trained (a word alone in its documents is not)
    for name, rows_held in held.items():  # written over, not summed
        np.testing.assert_array_equal(served(ray_cluster, servers, name, len(rows_held)), rows_held, err_msg=name)
    assert (np.abs(held["words_out"]).sum(1) > 0).mean() > 0.9  # and trained (words_out starts at zero)
    ids = worker.client.docs.ids  # its documents: every one, kept grouped by server, written back at the run's end
    assert len(ids) == rows["docs"]
    np.testing.assert_array_equal(served(ray_cluster, servers, "docs", rows["docs"])[ids],
                                  worker._read_resident("docs")[worker.client.docs.rows_of(ids)])
    for s in servers:
        ray_cluster.kill(s)


def test_a_worker_trains_against_servers_in_its_own_process_without_ray(sample_corpus):
    """benchmarks/feed_rate.py --no-ray (a GPU machine without Ray): the real worker against ParameterServer
    objects in its process, run where any import of Ray fails; the token paths and the host's examples."""
    probe = textwrap.dedent(f"""
        import sys, json
        sys.modules["ray"] = None  # any import of Ray fails
        import numpy as np
        from doc2vec_dist.client import LocalServer
        from doc2vec_dist.config import TrainConfig
        from doc2vec_dist.corpus import Corpus
        from doc2vec_dist.ps import ParameterServer, table_specs
        from doc2vec_dist.settings import resolve
        from doc2vec_dist.units import Position, plan_units
        from doc2vec_dist.worker import Worker
        corpus = Corpus({sample_corpus[0]!r})
        out = {{}}
        for name, engine in {{"exact": {{}}, "batched": {{"kernel": "batched"}}, "host": {{"cache_rows": 0}}}}.items():
            config = TrainConfig(dim=16, epochs=3, sample=0, num_ps=2, num_workers=1, progress=False, **engine)
            tables = table_specs(config, corpus)
            servers = [LocalServer(ParameterServer(s, 2, tables, 1)) for s in range(2)]
            start = servers[0].server.tables["docs"].copy()
            worker = Worker(0, plan_units(corpus, 1)[0], corpus.path, resolve(config, corpus), servers, tables)
            stats = [worker.run_epoch(e) for e in range(config.epochs)]
            moved = float(np.abs(servers[0].server.tables["docs"] - start).mean())
            for s in servers:
                s.close()
            out[name] = {{"token_path": worker.token_path, "tokens": [s["tokens"] for s in stats],
                         "loss": [s["loss"] / s["pairs"] for s in stats], "moved": moved}}
        print(json.dumps(out))
    """)
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    runs = json.loads(done.stdout.strip().splitlines()[-1])
    assert [runs[k]["token_path"] for k in ("exact", "batched", "host")] == [True, True, False]
    total = Corpus(sample_corpus[0]).num_tokens
    for name, run in runs.items():
        assert run["tokens"] == [total] * 3, name
        assert run["loss"][2] < run["loss"][1] < 0.98 * run["loss"][0], (name, run["loss"])
        assert run["moved"] > 1e-3, name  # the servers hold what the worker trained


def test_a_cpu_worker_on_the_exact_kernel_trains_without_importing_torch(small_corpus):
    """torch's import is most of a CPU worker's start (1-1.7 s here, in every actor of every run): the
    exact kernel's worker trains numpy matrices and never imports it; the batched kernel's does."""
    script = textwrap.dedent(f"""
        import sys
        from doc2vec_dist import client
        from doc2vec_dist.config import TrainConfig
        from doc2vec_dist.corpus import Corpus
        from doc2vec_dist.ps import ParameterServer, table_specs
        from doc2vec_dist.settings import resolve
        from doc2vec_dist.units import plan_units
        from doc2vec_dist.worker import Worker

        for kernel in ("exact", "batched"):
            config = TrainConfig(dim=8, epochs=1, sample=0, num_ps=2, kernel=kernel, progress=False)
            corpus = Corpus({small_corpus!r})
            tables = table_specs(config, corpus)
            servers = [client.LocalServer(ParameterServer(s, 2, tables, 1)) for s in range(2)]
            worker = Worker(0, plan_units(corpus, 1)[0], corpus.path, resolve(config, corpus), servers, tables)
            stats = worker.run_epoch(0)
            for server in servers:
                server.close()
            print(kernel, stats["tokens"] == corpus.num_tokens, "torch" in sys.modules, str(worker.device))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.splitlines() == ["exact True False cpu", "batched True True cpu"], done.stdout


def test_a_worker_idle_between_rounds_puts_the_documents_it_trained_into_a_checkpoint(small_corpus):
    """On the block schedule a worker's resident documents go home after the epoch's last round; a
    checkpoint taken while it waits between two rounds (its round done, the other worker's not) must
    still hold what its round trained, or a run resumed from it trains other vectors (the test of
    tests/test_block_schedule.py that resumes mid-epoch failed this way under load)."""

    config = TrainConfig(dim=8, epochs=1, sample=0, num_ps=NUM_PS, num_workers=2, cpus_per_worker=1,
                         macro_batch=8192, progress=False)
    corpus = Corpus(small_corpus)
    tables = table_specs(config, corpus)
    servers = local_servers(tables, config.seed)
    try:
        worker = Worker(0, plan_units(corpus, 2)[0], corpus.path, resolve(config, corpus), servers, tables)
        assert run_settings.blocks(config) and worker.rounds == 2 and worker.docs_head > 0

        def on_servers(ids):  # row r lives on server r % NUM_PS, at r // NUM_PS
            rows = np.empty((len(ids), worker.width), np.float32)
            for s, server in enumerate(servers):
                mine = ids % NUM_PS == s
                rows[mine] = client.get(server.pull.remote({"docs": ids[mine] // NUM_PS}))
            return rows

        worker.run_epoch(0, Position(0))  # round 0 of 2: the worker now waits for the other's round
        ids = worker.client.docs.ids
        trained = worker._read_resident("docs")[worker.client.docs.rows_of(ids)]  # kept grouped by server
        assert not np.array_equal(on_servers(ids), trained)  # still only in the worker
        position = worker.pause()
        np.testing.assert_array_equal(on_servers(ids), trained)  # in the servers, for the checkpoint
        assert (position.epoch, position.round, position.unit) == (0, 0, len(worker.units))
        worker.resume()
    finally:
        for server in servers:
            server.close()


def _rows_on_servers(servers, table: str, ids: np.ndarray, width: int, config: TrainConfig) -> np.ndarray:
    """Rows `ids` of a table as the servers hold them, widened (row r lives on server r % NUM_PS, at r // NUM_PS)."""

    rows = np.empty((len(ids), width), np.float32)
    for s, server in enumerate(servers):
        mine = ids % NUM_PS == s
        rows[mine] = precision.widen_rows(client.get(server.pull.remote({table: ids[mine] // NUM_PS})),
                                          config.dtype, config.dim)
    return rows


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_resident_rows_pulled_in_place_train_what_rows_copied_in_train(small_corpus, dtype):
    """A CPU worker pulls its resident rows (its block, its documents) straight into its matrices; a
    CUDA worker gets them as an array to copy to its device (`_resident_array` None). Both ways, two
    rounds of the block schedule end in the same rows on the servers, bit for bit."""

    config = TrainConfig(dim=8, epochs=2, sample=0, num_ps=NUM_PS, num_workers=2, cpus_per_worker=1,
                         dtype=dtype, progress=False)
    corpus = Corpus(small_corpus)
    tables = table_specs(config, corpus)
    finals = []
    for copied in (False, True):
        servers = local_servers(tables, config.seed)
        try:
            worker = Worker(0, plan_units(corpus, 2)[0], corpus.path, resolve(config, corpus), servers, tables)
            assert worker.docs_head > 0 and worker.rounds == 2
            docs = worker.client.docs  # kept grouped by server
            on_servers = _rows_on_servers(servers, "docs", docs.ids, worker.width, config)
            into = np.zeros_like(on_servers)
            np.testing.assert_array_equal(worker.client.pull_resident("docs", out=into)[docs.rows_of(docs.ids)],
                                          on_servers)
            np.testing.assert_array_equal(into[docs.rows_of(docs.ids)], on_servers)
            if copied:
                worker._resident_array = lambda table: None
            for epoch in range(config.epochs):
                for r in range(worker.rounds):
                    worker.run_epoch(epoch, Position(epoch, round=r))
            block = worker.client.urls  # the block it held last, kept in id order
            np.testing.assert_array_equal(worker.client.pull_resident("words_out"),
                                          _rows_on_servers(servers, "words_out", block.ids, worker.width, config))
            finals.append({name: [s.server.tables[name].copy() for s in servers] for name in ("docs", "words_out")})
        finally:
            for server in servers:
                server.close()
    for name in ("docs", "words_out"):
        for a, b in zip(finals[0][name], finals[1][name]):
            np.testing.assert_array_equal(a, b)


def test_every_change_a_block_worker_makes_to_the_url_rows_reaches_the_servers_once(small_corpus):
    """Two block-schedule workers in this process, driven round by round as the trainer drives them (each
    block handed to its next holder, home at an epoch's end): the servers' words_out at the end is the
    sum of every change their kernels made, none lost, none twice, and each kernel starts from the rows
    of the block it holds as they truly are (all the changes made to them before)."""
    from doc2vec_dist.cpu_kernel import train_tokens
    from doc2vec_dist.schedule import Blocks
    from doc2vec_dist.units import Compute

    epochs, workers = 3, 2
    config = TrainConfig(dim=8, epochs=epochs, num_ps=NUM_PS, num_workers=workers, cpus_per_worker=1, macro_batch=2048,
                         segments=2, progress=False)
    corpus = Corpus(small_corpus)
    tables = table_specs(config, corpus)
    servers = local_servers(tables, config.seed)
    rows = tables["words_out"].rows
    made = np.zeros((rows, config.dim))  # every change the kernels made, summed in float64
    worst = [0.0]

    def counted(worker):
        def tokens(inputs, outputs, *args, **kwargs):
            ids = worker.held.ids  # the held block's rows, in its order
            worst[0] = max(worst[0], float(np.abs(outputs[:len(ids)] - made[ids]).max()))
            before = outputs.copy()
            done = train_tokens(inputs, outputs, *args, **kwargs)
            made[ids] += (outputs - before).astype(np.float64)[:len(ids)]
            return done
        return tokens

    try:
        plan = plan_units(corpus, workers)
        pool = []
        for i in range(workers):
            worker = Worker(i, plan[i], corpus.path, resolve(config, corpus), servers, tables)
            worker.compute = dataclasses.replace(Compute.default(), tokens=counted(worker))
            pool.append(worker)
        for epoch in range(epochs):  # as trainer._run_epoch drives them
            starts, handed = [Position(epoch)] * workers, [None] * workers
            for r in range(run_settings.rounds(config)):
                last = [w.run_epoch(epoch, starts[i], handed[i]) for i, w in enumerate(pool)]
                by_block = {h["block"]: h for h in (s.pop("handover") for s in last) if h is not None}
                handed = [by_block.get(Blocks.held(i, r + 1, workers)) for i in range(workers)]
                starts = [Position(epoch, round=r + 1, tokens=s["tokens"], pairs=s["pairs"], loss=s["loss"])
                          for s in last]
        assert np.abs(made).max() > 0.1
        assert worst[0] < 1e-5  # each round started from its block's rows as they were
        ends = _rows_on_servers(servers, "words_out", np.arange(rows), config.dim, config)
        np.testing.assert_allclose(ends, made, rtol=0, atol=1e-5)
    finally:
        for server in servers:
            server.close()


def test_a_checkpoint_that_asks_again_before_the_paused_worker_wakes_is_answered(small_corpus):
    """Checkpoints every few ms (--checkpoint-every): the driver resumes the workers and, for the next
    checkpoint, asks them to pause again. When the second request lands before a paused worker's thread
    has woken from the first, that thread must pause again at once and say where. It slept on instead,
    and the second checkpoint's pause waited forever (a hung run, seen once in a full test run of
    test_resume's mid-epoch checkpoints). Here the two land under the worker's lock, in that order."""
    config = TrainConfig(dim=16, epochs=1, sample=0, num_ps=NUM_PS, num_workers=1, macro_batch=512, progress=False)
    servers, _, worker = start_worker(None, small_corpus, config, local=True)
    try:
        worker.pause()  # idle: the request stays set, so the epoch pauses before its first batch
        trained = []
        epoch = threading.Thread(target=lambda: trained.append(worker.run_epoch(0)), daemon=True)
        epoch.start()
        with worker._cv:
            assert worker._cv.wait_for(lambda: worker._paused_at is not None, timeout=60), "the first pause"
            first = worker._paused_at
            worker.resume()  # the first checkpoint's end ...
            worker._pause_requested = True  # ... and the next one's request (pause()'s first step), before it wakes
        answers = []
        second = threading.Thread(target=lambda: answers.append(worker.pause()), daemon=True)
        second.start()
        second.join(timeout=30)
        stuck = second.is_alive()
        worker.resume()  # (lets a stuck worker go)
        epoch.join(timeout=60)
        assert not stuck, "the second checkpoint's pause got no answer"
        assert answers[0].unit == first.unit and answers[0].row == first.row and answers[0].step == first.step
        assert trained and trained[0]["tokens"] > 0
    finally:
        stop_servers(None, servers)
