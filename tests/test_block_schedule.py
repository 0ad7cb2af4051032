"""The block schedule end to end, on the real local Ray: no URL row is written by two workers in the same
round (the servers' own record of every push says so), and, each row having one writer at a time, a run
is reproducible bit for bit, through checkpoints taken mid-round and a resume from one."""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import time

import numpy as np
import pytest

from doc2vec_dist import modeldir, settings
from doc2vec_dist.config import TEXT_SEGMENTS, TrainConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.run import PUSH_JOURNAL_ENV, STEP_PAUSE_ENV
from doc2vec_dist.settings import HANDOVER_ENV, STAGED_ENV
from doc2vec_dist.trainer import resumed_config, train

# One server: what these tests hold (blocks, rounds, handovers) is between the workers; the mid-round
# checkpoints' test keeps two (each server's part of a checkpoint taken mid-round)
TWO = {"dim": 16, "epochs": 2, "sample": 0, "num_ps": 1, "num_workers": 2, "cpus_per_worker": 1, "progress": False,
       "macro_batch": 8192}
LABEL = re.compile(r"epoch (\d+)(?: round (\d+))? .*worker (\d+)")


def pushes(journal: str) -> list[tuple[int, int, int, str, np.ndarray]]:
    """Every push the servers applied: (epoch, round, worker, table, global rows)."""
    found = []
    for name in os.listdir(journal):
        with open(os.path.join(journal, name)) as fh:
            for line in fh:
                entry = json.loads(line)
                epoch, round_, worker = LABEL.search(entry["label"]).groups()
                found.append((int(epoch), int(round_ or 0), int(worker), entry["table"], np.array(entry["rows"])))
    return found


def writers(journal: str, table: str) -> dict:
    """(epoch, round) -> worker -> the set of rows of `table` it pushed then."""
    by_round: dict = collections.defaultdict(lambda: collections.defaultdict(set))
    for epoch, round_, worker, name, rows in pushes(journal):
        if name == table:
            by_round[epoch, round_][worker].update(rows.tolist())
    return by_round


@pytest.mark.parametrize("segments", [1, 2])
def test_no_url_row_is_pushed_by_two_workers_in_the_same_round(ray_cluster, sample_corpus, tmp_path, monkeypatch,
                                                               segments):
    journal = tmp_path / "journal"
    monkeypatch.setenv(PUSH_JOURNAL_ENV, str(journal))
    # every round's block pushed home, so that the servers' journal holds what each round trained (handed
    # from worker to worker, the default, the blocks reach the servers at an epoch's end only; the same
    # model bit for bit: test_blocks_handed_from_worker_to_worker_train_what_the_servers_path_trains)
    monkeypatch.setenv(HANDOVER_ENV, "0")
    summary = train(sample_corpus[0], str(tmp_path / "blocks"), TrainConfig(**TWO, segments=segments))
    # where the workers' time went includes the rounds' barrier: the waits for the last worker of a round
    assert summary["worker_seconds"]["barrier"] >= 0 and summary["worker_seconds"]["compute"] > 0
    rounds = writers(str(journal), "words_out")
    per_epoch = 2 * segments  # two workers: a rotation of two rounds for each segment of their documents
    assert sorted(rounds) == [(e, r) for e in (0, 1) for r in range(per_epoch)]
    for (epoch, round_), by_worker in rounds.items():
        assert sorted(by_worker) == [0, 1], (epoch, round_)
        assert not by_worker[0] & by_worker[1], f"epoch {epoch} round {round_}: rows pushed by both workers"
    # every URL row is trained by both workers in each segment's rotation: the blocks do rotate
    rows = modeldir.ModelDir(str(tmp_path / "blocks")).spec("words_out")["rows"]
    for epoch in (0, 1):
        for worker in (0, 1):
            for first in range(0, per_epoch, 2):
                mine = rounds[epoch, first][worker] | rounds[epoch, first + 1][worker]
                assert len(mine) > 0.8 * rows, (epoch, worker, first)
    # a document's row has one writer for the whole run
    docs = collections.defaultdict(set)
    for _, _, worker, table, rows in pushes(str(journal)):
        if table == "docs":
            for r in rows.tolist():
                docs[r].add(worker)
    assert docs and all(len(w) == 1 for w in docs.values())


def test_the_shared_schedule_has_both_workers_push_the_same_rows_in_a_round(ray_cluster, sample_corpus, tmp_path,
                                                                           monkeypatch):
    """The check of test_no_url_row_is_pushed_by_two_workers_in_the_same_round can fail: the shared schedule
    has both workers push the hot rows in the same step. (Once: --segments does not apply to it.)"""
    journal = tmp_path / "journal"
    monkeypatch.setenv(PUSH_JOURNAL_ENV, str(journal))
    monkeypatch.setenv(HANDOVER_ENV, "0")
    train(sample_corpus[0], str(tmp_path / "shared"), TrainConfig(**TWO, schedule="shared"))
    shared = writers(str(journal), "words_out")
    assert any(by_worker[0] & by_worker[1] for by_worker in shared.values())


def test_on_a_text_corpus_the_workers_walk_it_in_16_segments_unless_told(ray_cluster, tmp_path, monkeypatch):
    """--segments' default on text (prepare --format text): 16, where Lee measured the block schedule to
    keep one worker's quality (with 1, 2 workers lost 0.018-0.020 Pearson); recorded in the checkpoint."""
    from doc2vec_dist.config import PrepareConfig
    from doc2vec_dist.prepare import prepare

    lines = [" ".join(f"w{(i * 7 + j) % 50}" for j in range(i % 11 + 5)) for i in range(640)]
    (tmp_path / "t.txt").write_text("\n".join(lines) + "\n")
    corpus = prepare([str(tmp_path / "t.txt")], str(tmp_path / "c"), PrepareConfig(format="text"), progress=False)
    journal = tmp_path / "journal"
    monkeypatch.setenv(PUSH_JOURNAL_ENV, str(journal))
    monkeypatch.setenv(HANDOVER_ENV, "0")  # every round's block pushed home, so the journal has every round
    for given, segments in ((None, TEXT_SEGMENTS), (1, 1)):
        model = str(tmp_path / f"m{given}")
        train(corpus.path, model, TrainConfig(**{**TWO, "epochs": 1, "segments": given}))
        walked_in(str(journal), model, segments)


def walked_in(journal: str, model: str, segments: int) -> None:
    """A 2-worker epoch's model and the servers' journal (then emptied) say the run walked it in `segments`
    segments: 2 rounds each, recorded in the manifest with the plan they take."""
    rounds = writers(journal, "words_out")
    assert sorted(rounds) == [(0, r) for r in range(2 * segments)], model
    _, manifest = modeldir.load_manifest(model)
    assert manifest["config"]["segments"] == segments
    assert manifest["plan"] == ("interleaved" if segments > 1 else "runs")
    shutil.rmtree(journal)


def test_on_browsing_logs_the_workers_walk_it_in_4_segments_where_its_rounds_hold_enough_tokens(
        ray_cluster, sample_corpus, tmp_path, monkeypatch):
    """--segments' default on other corpora (settings.default_segments): 4 where each worker's round still
    holds ROUND_TOKENS tokens (the corpus's tokens >= ROUND_TOKENS x workers² x 4), else 1; recorded in the
    checkpoint. The sample is far below the real threshold, so the threshold is lowered to it here."""
    tokens = Corpus(sample_corpus[0]).num_tokens
    journal = tmp_path / "journal"
    monkeypatch.setenv(PUSH_JOURNAL_ENV, str(journal))
    monkeypatch.setenv(HANDOVER_ENV, "0")  # every round's block pushed home, so the journal has every round
    for threshold, segments in ((tokens // 16, 4), (tokens // 16 + 1, 1)):
        monkeypatch.setattr(settings, "ROUND_TOKENS", threshold)
        model = str(tmp_path / f"m{threshold}")
        train(sample_corpus[0], model, TrainConfig(**{**TWO, "epochs": 1}))
        walked_in(str(journal), model, segments)


def tables_of(model: str) -> dict[str, np.ndarray]:
    found = modeldir.ModelDir(model)
    return {name: found.read_table(name) for name in ("docs", "words_out")}


@pytest.mark.parametrize("segments, device", [(1, False), (2, False), (1, True)],
                         ids=["1-segment", "2-segments", "device"])
def test_a_block_run_is_reproducible_through_mid_round_checkpoints_and_a_resume_from_one(ray_cluster, sample_corpus,
                                                                                        tmp_path, monkeypatch,
                                                                                        segments, device, caplog):
    """device: the GPU workers' path (the batched kernel, its block of URL rows on the device), the CPU
    as the device (trainer.STAGED_ENV). (With a 16-bit --dtype a checkpoint's push narrows the rows a
    worker holds in float32, its documents', so a paused run is not the straight one's bits.)"""
    corpus = sample_corpus[0]
    two = {**TWO, "segments": segments, "num_ps": 2}
    if device:
        monkeypatch.setenv(STAGED_ENV, "1")
        two.update(kernel="batched")
    with caplog.at_level("INFO", logger="doc2vec_dist.trainer"):
        straight = tables_of(train(corpus, str(tmp_path / "a"), TrainConfig(**two, checkpoint_every=0))["model"])
    assert ("examples drawn on its device" in caplog.text) == device
    # checkpoints every 50 ms pause the workers mid-round: their blocks go home and come back unchanged
    # (each macro-batch followed by a 40 ms sleep: a round outlasts the driver's 25 ms tick on any machine)
    paused_model = str(tmp_path / "b")
    with monkeypatch.context() as patch:
        patch.setenv(STEP_PAUSE_ENV, "0.04")
        train(corpus, paused_model, TrainConfig(**two, checkpoint_every=0.05, keep_checkpoints=1000))
    for name, matrix in tables_of(paused_model).items():
        np.testing.assert_array_equal(matrix, straight[name], err_msg=name)
    # a version taken mid-epoch (in a second round, where one fell there), resumed in a copy of the model,
    # ends where the straight run did
    mid = []
    for version in range(1, modeldir.latest_version(paused_model) + 1):
        with open(os.path.join(modeldir.version_dir(paused_model, version), "manifest.json")) as fh:
            positions = json.load(fh)["positions"]
        if positions:
            mid.append((positions[0].get("round", 0), version))
    assert mid, "no checkpoint fell inside an epoch"
    mid = [max(mid)[1]] if max(mid)[0] >= 1 else [mid[len(mid) // 2][1]]
    resumed = str(tmp_path / "c")
    shutil.copytree(paused_model, resumed)
    with open(os.path.join(resumed, "LATEST"), "w") as fh:
        fh.write(f"v{mid[0]}")
    for version in range(mid[0] + 1, modeldir.latest_version(paused_model) + 1):
        shutil.rmtree(modeldir.version_dir(resumed, version))
    if segments > 1:  # the rounds under way are numbered by the segments: a mid-epoch resume keeps them
        from doc2vec_dist.errors import UserError
        with pytest.raises(UserError, match=f"stopped mid-epoch with --segments {segments}; resume with "
                                            f"--segments {segments}"):
            train(corpus, resumed, resumed_config(resumed, {"segments": 1}))
        # a checkpoint of the plan before this version's (each worker one run of the corpus) is not followed
        manifest = os.path.join(modeldir.version_dir(resumed, mid[0]), "manifest.json")
        with open(manifest) as fh:
            saved = json.load(fh)
        assert saved["plan"] == "interleaved"
        with open(manifest, "w") as fh:
            json.dump({k: v for k, v in saved.items() if k not in ("plan", "settings")}, fh)  # as one written before either
        with pytest.raises(UserError, match="divided among the workers as runs .* divides it as interleaved"):
            train(corpus, resumed, resumed_config(resumed, {}))
        with open(manifest, "w") as fh:
            json.dump(saved, fh)
    train(corpus, resumed, resumed_config(resumed, {}))
    for name, matrix in tables_of(resumed).items():
        np.testing.assert_array_equal(matrix, straight[name], err_msg=name)


def test_two_device_workers_on_the_block_schedule_train_to_one_workers_quality(ray_cluster, sample_corpus, tmp_path,
                                                                                monkeypatch):
    """Issue 48, item 3: two workers on the GPU workers' path (the CPU as the device), each holding its block
    of the URL rows and its documents' rows on its device, train to one worker's recall@10 on the sample
    (seeds 1-3 at dim 32, 10 epochs: one worker 0.2299, 0.2292, 0.2285; two 0.2291, 0.2281, 0.2285)."""
    from doc2vec_dist.evaluate import heldout_metrics

    corpus, heldout = sample_corpus
    monkeypatch.setenv(STAGED_ENV, "1")
    recall = {}
    for workers in (1, 2):
        config = TrainConfig(dim=32, epochs=10, sample=0, num_ps=2, num_workers=workers, cpus_per_worker=1,
                             kernel="batched", progress=False)
        model = train(corpus, str(tmp_path / f"w{workers}"), config)["model"]
        recall[workers] = heldout_metrics(model, heldout)["model_recall@10"]
    assert abs(recall[2] - recall[1]) < 0.004, recall
    assert recall[1] > 1.3 * heldout_metrics(model, heldout)["popularity_recall@10"], recall


def test_modes_whose_windows_reach_across_blocks_are_warned_about_or_refused_with_their_measured_cost():
    from doc2vec_dist.errors import UserError
    from doc2vec_dist.settings import resolve

    # dbow_words shares the rows: it held quality on Lee but barely sped up, and says so
    assert not settings.blocks(TrainConfig(num_workers=2, dbow_words=True))
    with pytest.raises(UserError, match="--schedule blocks trains plain PV-DBOW"):
        TrainConfig(num_workers=2, schedule="blocks", dbow_words=True)

    class Corpus:
        num_tokens, vocab_size, meta = 10**8, 10**5, {}

    (shared,) = resolve(TrainConfig(num_workers=2, dbow_words=True), Corpus).warnings
    assert "--dbow-words share the URL rows" in shared and "0.4477" in shared
    # PV-DM lost most of its quality with two workers: refused, with the figures
    with pytest.raises(UserError, match=r"PV-DM with several workers lost most of its quality .*0\.272.*0\.077"):
        TrainConfig(num_workers=2, mode="dm")
    assert TrainConfig(num_workers=1, mode="dm").mode == "dm"


def test_the_scaling_job_measures_workers_and_threads_beside_gensim(ray_cluster, sample_corpus, tmp_path):
    import importlib.util
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    spec = importlib.util.spec_from_file_location("scaling_job", os.path.join(root, "benchmarks", "scaling.py"))
    job = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = job
    spec.loader.exec_module(job)
    out = tmp_path / "scaling.json"
    result = job.main(["--corpus", sample_corpus[0], "--workers", "1", "2", "--threads", "1", "2", "--epochs", "1",
                       "--dim", "16", "--no-warmup", "--workdir", str(tmp_path), "--json", str(out)])
    assert [r["workers"] for r in result["workers"]] == [1, 2]
    assert [r["segments"] for r in result["workers"]] == [1, 1]  # the sample's default: its rounds are short
    assert result["workers"][0]["efficiency"] == pytest.approx(1.0)
    for row in result["workers"]:  # the counters' bytes per token, and plan's prediction of them
        measured, planned = (sum(row[k].values()) for k in ("bytes_per_token", "planned_bytes_per_token"))
        assert planned == pytest.approx(measured, rel=0.1), row
    assert result["threads"][0]["ours"] is result["workers"][0]  # 1 thread: the one-worker run, not run twice
    assert all(r["gensim"]["tokens_per_second"] > 0 for r in result["threads"])
    assert json.loads(out.read_text())["threads"][1]["threads"] == 2


def test_a_block_run_without_resident_documents_trains_the_same_rows(ray_cluster, sample_corpus, tmp_path, monkeypatch,
                                                                     logged):
    """A run that fits the cluster only without its workers' resident documents runs without them (each
    batch pulls and pushes its documents' rows) and, each document still having one writer, trains the
    same model bit for bit; the batches' counters show the documents moving."""
    from doc2vec_dist import trainer

    corpus = sample_corpus[0]
    kept = train(corpus, str(tmp_path / "a"), TrainConfig(**TWO, checkpoint_every=0))
    # the cluster, as check_fit sees it, has room only for workers without their documents
    real = trainer._cluster_problems
    monkeypatch.setattr(trainer, "_cluster_problems",
                        lambda config, tables: ["too big"] if config.resident_docs else real(config, tables))
    dropped = train(corpus, str(tmp_path / "b"), TrainConfig(**TWO, checkpoint_every=0))
    assert "the workers do not keep their documents resident: with them the run needs" in logged.text
    assert kept["bytes_per_token"]["pulled"] == 0 < dropped["bytes_per_token"]["pulled"]
    for name, matrix in tables_of(kept["model"]).items():
        np.testing.assert_array_equal(tables_of(dropped["model"])[name], matrix, err_msg=name)


def test_blocks_handed_from_worker_to_worker_train_what_the_servers_path_trains(ray_cluster, sample_corpus, tmp_path,
                                                                               monkeypatch):
    """At a round's end each block goes straight to its next holder (client.ParameterClient.hand_over),
    not to the servers; a run trains the same model bit for bit as one whose blocks go home through the
    servers and are pulled again, and only an epoch's first round pulls URL rows, its last pushes them."""
    corpus = sample_corpus[0]
    two = {**TWO, "segments": 2}
    handed = train(corpus, str(tmp_path / "handed"), TrainConfig(**two, checkpoint_every=0))
    monkeypatch.setenv(HANDOVER_ENV, "0")
    home = train(corpus, str(tmp_path / "home"), TrainConfig(**two, checkpoint_every=0))
    for name, matrix in tables_of(home["model"]).items():
        np.testing.assert_array_equal(tables_of(handed["model"])[name], matrix, err_msg=name)
    assert home["bytes"]["handed"] == 0 < handed["bytes"]["handed"]
    # each handed byte is a pull saved: 3 of an epoch's 4 rounds, every block (2 workers x 2 segments)
    assert handed["bytes"]["resident_pulled"] + handed["bytes"]["handed"] == home["bytes"]["resident_pulled"]
    assert handed["bytes"]["resident_pushed"] + handed["bytes"]["handed"] == home["bytes"]["resident_pushed"]
    url_bytes = modeldir.ModelDir(handed["model"]).spec("words_out")["rows"] * 16 * 4
    assert handed["bytes"]["handed"] == 2 * 3 * url_bytes  # 2 epochs, 3 handovers of all the blocks each


def test_a_block_whose_holder_died_after_handing_it_over_is_taken_on_or_pulled(ray_cluster):
    """The worker that handed a block over died (its node, or a kill at a checkpoint) before the next
    holder took it on. The next holder goes on: from the rows handed over where they are still there,
    else from the servers' copy (take_over is False, the next sync pulls). No server write is sent at
    a round's end, so none is lost with it: taken on, the block is written at the next push, trained
    or not."""
    import ray

    from doc2vec_dist.client import ParameterClient

    @ray.remote(num_cpus=0)
    class Server:
        def rows(self):
            time.sleep(3)
            return np.full((3, 4), 2, np.float32)

    @ray.remote(num_cpus=0)
    class Holder:
        def hand(self, server):  # what a hand_over returns, owned here: its rows
            return [ray.put(np.ones((3, 4), np.float32)), server.rows.remote()]

    server = Server.remote()
    holder = Holder.remote()
    piece, lost_piece = ray.get(holder.hand.remote(server))
    ray.kill(holder)
    with pytest.raises(ray.exceptions.RayActorError):  # gone
        ray.get(holder.hand.remote(server), timeout=60)

    def client():
        c = ParameterClient([object()], {"words_out": 10}, workers=2, resident=3)
        c.hold(np.arange(3))
        return c

    written = []
    taker = client()
    assert taker.take_over({"rows": {"words_out": piece}}, lambda table, rows: written.append(rows))
    np.testing.assert_array_equal(written[0], np.ones((3, 4), np.float32))
    assert taker.held and taker.taken  # newer than the servers' copy: its next push writes it

    puller = client()
    assert not puller.take_over({"rows": {"words_out": lost_piece}},
                                lambda table, rows: written.append(rows))
    assert len(written) == 1 and not puller.held and not puller.taken  # the next sync pulls


def test_a_handed_block_reaches_the_servers_only_at_a_checkpoint_before_its_next_round_or_its_next_push(sample_corpus):
    """A round's end hands the block on without writing the servers' copy; a checkpoint taken before
    the next round (the worker idle: Worker.pause) writes the block it handed over, and nothing once
    its next round holds another; the next holder's first push writes the block it took over, though it
    trained nothing since (a pause before its first batch, an empty last round of an epoch)."""
    from doc2vec_dist.client import LocalServer, ParameterClient
    from doc2vec_dist.ps import ParameterServer, table_specs

    config = TrainConfig(**TWO)
    tables = table_specs(config, Corpus(sample_corpus[0]))
    servers = [LocalServer(ParameterServer(s, 2, tables, 1)) for s in range(2)]
    words = tables["words_out"]

    def client():
        return ParameterClient(servers, {name: spec.rows for name, spec in tables.items()}, workers=2, resident=0,
                               sole_writer=True, row_bytes=words.row_bytes, dtype=words.dtype, dim=words.dim)

    def client_rows(ids):
        c = client()
        c.hold(ids)
        return c.pull_resident()

    try:
        block, other = np.arange(0, 40, 2), np.arange(1, 40, 2)
        holder, rows = client(), {}
        holder.hold(block)
        before = holder.pull_resident()
        holder.held = True
        rows["words_out"] = before + 1.0
        handed = holder.hand_over(lambda table: rows[table], "epoch 0 round 0 end of worker 0")
        np.testing.assert_array_equal(client_rows(block), before)  # the round's end wrote nothing home
        assert holder.traffic["handed"] == before.nbytes and holder.traffic["resident_pushed"] == 0

        taker, got = client(), {}
        taker.hold(block)
        assert taker.take_over(handed, lambda table, r: got.update({table: r}))
        np.testing.assert_array_equal(got["words_out"], before + 1.0)

        holder.write_handed("checkpoint of worker 0")  # idle at a checkpoint: its handed block goes home
        np.testing.assert_array_equal(client_rows(block), before + 1.0)
        holder.hold(other)  # its next round: the block it handed is its next holder's now
        rows["words_out"] = np.zeros_like(before)
        holder.write_handed("checkpoint of worker 0")
        np.testing.assert_array_equal(client_rows(block), before + 1.0)

        got["words_out"] += 1.0  # what the next holder holds is newer than the servers' copy, trained or not
        taker.sync(lambda table: got[table], None, "epoch 0 round 1 end of worker 1", pull=False)
        np.testing.assert_array_equal(client_rows(block), before + 2.0)

        from doc2vec_dist.ps import NonFiniteUpdate  # a diverged block stops the run where it is handed on
        got["words_out"][3, 1] = np.nan
        taker.held = True
        with pytest.raises(NonFiniteUpdate, match="non-finite values in the push of epoch 0 round 1 end of worker 1 "
                                                  r"\(the block handed over\)"):
            taker.hand_over(lambda table: got[table], "epoch 0 round 1 end of worker 1")
    finally:
        for server in servers:
            server.close()
