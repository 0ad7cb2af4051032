"""doc2vec-dist tune: a real search on Ray Tune over the bundled sample, on the session's local Ray."""

import json
import os

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import made_once

from doc2vec_dist.cli import main
from doc2vec_dist.config import TrainConfig
from doc2vec_dist.corpus import Corpus, iter_shard
from doc2vec_dist.errors import UserError
from doc2vec_dist.search_cost import (
    ADAGRAD_COST,
    TRIAL_OVERHEAD_SECONDS,
    asha_epochs,
    rung_epochs,
    trial_cost,
    trial_epoch_cost,
    trials_for_budget,
)
from doc2vec_dist.search_space import DEFAULT_SPACE, seed_points, tune_space
from doc2vec_dist.tune import search, split_validation

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# a deliberately bad learning rate beside a good one, and a setting that cannot train
SPACE = {"alpha": {"grid": [0.0002, 0.05]}, "negative": {"grid": [5, -1]}, "epochs": 8, "dim": 16}
# the searched fixture's base settings: besides the space's (epochs, dim), some only the base sets (window: unused
# by PV-DBOW without dbow_words, so the search finds what it found without it)
BASE = {"sample": 0, "num_ps": 1, "cpus_per_worker": 1, "dim": 16, "epochs": 4, "window": 3}


@pytest.fixture(scope="module")
def searched(ray_cluster, sample_corpus, tmp_path_factory):
    def make(root) -> tuple[str, dict]:  # (once a run: the test processes share it)
        out = str(root / "search")
        return out, search(sample_corpus[0], out, heldout=sample_corpus[1], budget=1, space=SPACE,
                           base=TrainConfig(**BASE), calibrate_seconds=2)

    return made_once(tmp_path_factory, "tune", make)


def _trials(out: str) -> list[dict]:
    import csv

    with open(os.path.join(out, "trials.csv")) as fh:
        return list(csv.DictReader(fh))


def test_a_tiny_search_finds_the_good_learning_rate(searched):
    out, result = searched
    rows = _trials(out)
    # the base settings (alpha 0.025, negative 5) first, then the grid's four
    assert len(rows) == 5 and result["trials"] == 5
    assert [(r["alpha"], r["negative"]) for r in rows if r["source"] == "base"] == [("0.025", "5")]
    # plan's estimate, made before the search started, of the search itself: its parts add up
    # (test_the_estimate_s_parts_add_up_and_count_evaluation_and_ray_tunes_overhead); how near it comes to the
    # search's own time depends on how busy the machine is at each moment, which benchmarks/quality.py --tune
    # reports (search seconds, estimated), not a test
    estimate = result["estimate"]
    assert result["estimated_seconds"] > estimate["search_seconds"] > 0 and estimate["measure_seconds"] > 0
    trained = {float(r["alpha"]): float(r["recall@10"]) for r in rows if r["state"] != "failed" and r["source"] != "base"}
    assert set(trained) == {0.0002, 0.05}
    assert trained[0.05] > trained[0.0002] + 0.03, trained  # far above: the bad rate barely moves the vectors
    with open(os.path.join(out, "best.yaml")) as fh:
        best = yaml.safe_load(fh)
    # the searched settings and the base's own beside them (test_best_yaml_is_the_configuration_the_comparison_trained)
    assert best == {"alpha": 0.05, "negative": 5, "epochs": 8, "dim": 16, "sample": 0, "num_ps": 1, "cpus_per_worker": 1,
                    "window": 3}
    with open(os.path.join(out, "best.yaml")) as fh:
        assert "on the validation split" in fh.readline()  # --heldout: never the user's own file
    assert float(rows[0]["recall@10"]) == max(trained.values())  # the table is sorted by the metric
    assert os.path.getsize(os.path.join(out, "settings.png")) > 1000
    assert not os.path.exists(os.path.join(out, "trials"))  # the trials' models are removed once measured


def test_the_best_is_compared_with_the_defaults_and_gensim_on_the_users_file(searched, sample_corpus):
    """Each trained on the whole corpus and measured on the held-out file the search never used."""
    from doc2vec_dist.evaluate import heldout_metrics

    out, result = searched
    compare = result["compare"]
    assert set(compare) == {"tuned", "defaults", "gensim"}
    assert compare["tuned"]["epochs"] == 8 == compare["gensim"]["epochs"] and compare["defaults"]["epochs"] == 4
    assert not result["base_is_best"] and result["base"]["alpha"] == 0.025
    again = heldout_metrics(os.path.join(out, "compare", "tuned"), sample_corpus[1])["model_recall@10"]
    assert compare["tuned"]["metric"] == pytest.approx(again)
    popular = heldout_metrics(os.path.join(out, "compare", "gensim"), sample_corpus[1])["popularity_recall@10"]
    assert min(c["metric"] for c in compare.values()) > popular  # all three trained: above popularity
    with open(os.path.join(out, "tune.json")) as fh:
        assert json.load(fh)["compare"] == compare


def test_a_failing_trial_does_not_stop_the_search(searched):
    out, result = searched
    failed = [r for r in _trials(out) if r["state"] == "failed"]
    assert len(failed) == 2 == result["failed"]
    assert all(r["negative"] == "-1" and "negative must be > 0" in r["error"] for r in failed)


def test_the_written_yaml_trains(searched, sample_corpus, tmp_path):
    out, _ = searched
    model = str(tmp_path / "model")
    assert main(["train", "--corpus", sample_corpus[0], "--out", model, "--config", os.path.join(out, "best.yaml"),
                 "--epochs", "1", "--no-progress"]) == 0
    from doc2vec_dist.modeldir import ModelDir

    config = ModelDir(model).config()
    assert config.alpha == 0.05 and ModelDir(model).spec("docs")["dim"] == 16
    assert (config.sample, config.num_ps, config.window) == (0, 1, 3)  # the base settings the search trained with


def test_best_yaml_is_the_configuration_the_comparison_trained(searched):
    """best.yaml held only the searched keys, while the trials and the comparison's tuned model trained the
    base settings (tune's flags and --config) with them: `train --config best.yaml` trained another model.
    It holds both now, and its header says which are which."""
    import dataclasses

    from doc2vec_dist.config import build, load_yaml
    from doc2vec_dist.modeldir import ModelDir

    out, _ = searched
    path = os.path.join(out, "best.yaml")
    loaded = load_yaml(path)  # as train --config reads it: every key a setting it takes
    assert {k: loaded[k] for k in ("sample", "num_ps", "cpus_per_worker", "window")} == {
        "sample": 0, "num_ps": 1, "cpus_per_worker": 1, "window": 3}
    with open(path) as fh:
        header = fh.readlines()[1]
    assert header == ("# the configuration measured, for train --config: searched alpha, dim, epochs, negative; as tune "
                      "was given them (its flags and --config): cpus_per_worker, num_ps, sample, window\n")
    tuned = dataclasses.asdict(ModelDir(os.path.join(out, "compare", "tuned")).config())
    written = dataclasses.asdict(build(TrainConfig, loaded))
    # every setting alike but what the trainer resolved for the run (segments) and the progress bars
    assert {k for k in tuned if tuned[k] != written[k]} <= {"segments", "progress"}, (tuned, written)


def test_best_yaml_holds_the_base_settings_beside_the_searched_ones(tmp_path):
    """The recorder's best.yaml (what `tune` writes as the search goes): the searched settings of the best
    trial, every base setting that is not the default (--dim 16 --mode dm --window 3 --num-ps 1), not where
    the search ran (--address); loaded, the configuration the trials and the comparison trained."""
    import dataclasses
    from types import SimpleNamespace

    from doc2vec_dist.config import build, load_yaml
    from doc2vec_dist.search_report import _Recorder

    base = dataclasses.asdict(TrainConfig(dim=16, epochs=2, mode="dm", window=3, num_ps=1, address="ray://head:10001"))
    recorder = _Recorder(str(tmp_path), ["alpha", "epochs"], base, "recall@10", "validation", 1, False)
    trial = SimpleNamespace(trial_id="a", config={"alpha": 0.03, "epochs": 4}, error_file=None)
    recorder.seen(trial, {"metric": 0.25, "epoch": 4, "tokens_per_second": 1.0, "seconds": 1.0})
    recorder.ended(trial, "finished")
    path = tmp_path / "best.yaml"
    assert yaml.safe_load(path.read_text()) == {"alpha": 0.03, "epochs": 4, "dim": 16, "mode": "dm", "window": 3,
                                                "num_ps": 1}
    assert path.read_text().splitlines()[1] == ("# the configuration measured, for train --config: searched alpha, "
                                                "epochs; as tune was given them (its flags and --config): dim, mode, "
                                                "num_ps, window")
    from doc2vec_dist.search_report import measured_config  # what the comparison trains (tune.compare_on_test)

    assert build(TrainConfig, load_yaml(str(path)), {"progress": False}) == dataclasses.replace(
        measured_config(base, trial.config), address=None)
    # several workers: the trials trained as many as asked, which train does only with force_workers
    recorder = _Recorder(str(tmp_path), ["alpha"], dataclasses.asdict(TrainConfig(num_workers=2)), "recall@10",
                         "validation", 1, False)
    trial = SimpleNamespace(trial_id="b", config={"alpha": 0.03}, error_file=None)
    recorder.seen(trial, {"metric": 0.25, "epoch": 10, "tokens_per_second": 1.0, "seconds": 1.0})
    recorder.ended(trial, "finished")
    assert yaml.safe_load(path.read_text()) == {"alpha": 0.03, "num_workers": 2, "force_workers": True}
    assert path.read_text().splitlines()[1].endswith("; force_workers: the trials trained --num-workers as given")


@pytest.mark.parametrize("given, starts, ends", [
    (["--heldout", "HELDOUT", "--test-fraction", "0.9"], "--test-fraction is the share of a --labels or --pairs file",
     "leave --test-fraction out"),
    (["--heldout", "HELDOUT", "--resume"], "--resume: tune trains each trial and the comparison afresh",
     "leave --resume out (a model goes on with train --resume)"),
    (["--heldout", "HELDOUT", "--resume-from", "v2"], "--resume-from: tune trains each trial",
     "leave --resume-from out (a model goes on with train --resume)"),
    (["--heldout", "HELDOUT", "--config", "RESUME_YAML"], "RESUME_YAML: resume / resume_from: tune trains each trial",
     "leave them out of the base settings"),
    (["--labels", "HELDOUT", "--test-fraction", "0"], "--test-fraction must lie between 0 and 1, not 0", ""),
    # it was answered as prepare's flag ("run doc2vec-dist prepare ... --overwrite"), which it is not here
    (["--heldout", "HELDOUT", "--overwrite"], "--overwrite: tune replaces an earlier search of its own at --out",
     "leave --overwrite out"),
])
def test_tune_refuses_flags_it_would_ignore_in_one_line(given, starts, ends, sample_corpus, tmp_path, capsys):
    """--test-fraction with --heldout was ignored (it splits a --labels or --pairs file), and --resume was taken,
    then failed every trial with Ray's traceback: each is one line now, before anything starts. (--budget 0:
    should the refusal go, the command stops at the budget rather than run a search.)"""
    out, config = tmp_path / "search", tmp_path / "resume.yaml"
    config.write_text("resume: true\n")
    names = {"HELDOUT": sample_corpus[1], "RESUME_YAML": str(config)}
    argv = ["tune", "--corpus", sample_corpus[0], "--out", str(out), "--budget", "0",
            *[names.get(a, a) for a in given]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: " + starts.replace("RESUME_YAML", str(config))), err
    assert err[0].endswith(ends), err
    assert not out.exists()


def test_the_validation_split_hides_what_prepare_holdout_hides(sample_corpus, tmp_path):
    """A share of each user's distinct URLs, every event of them; the rest stays, in order."""
    corpus = Corpus(sample_corpus[0])
    val, pairs = split_validation(corpus, str(tmp_path / "v"), fraction=0.2, seed=3)
    before = {int(d): t[a:b] for ids, off, t in _shards(corpus) for d, a, b in zip(ids, off, off[1:])}
    after = {int(d): t[a:b] for ids, off, t in _shards(val) for d, a, b in zip(ids, off, off[1:])}
    hidden = pq.read_table(pairs)
    doc = pc.index_in(hidden.column("key"), value_set=corpus.docs().column("key")).to_numpy()
    word = pc.index_in(hidden.column("token"), value_set=corpus.vocab().column("token")).to_numpy()
    assert val.num_tokens + sum(int(np.isin(before[d], [w]).sum()) for d, w in zip(doc, word)) == corpus.num_tokens
    by_doc: dict[int, set] = {}
    for d, w in zip(doc, word):
        by_doc.setdefault(int(d), set()).add(int(w))
    for d, tokens in before.items():
        gone = by_doc.get(d, set())
        distinct = len(set(tokens.tolist()))
        assert len(gone) == (0 if distinct < 2 else min(max(1, int(0.2 * distinct + 0.5)), distinct - 1))
        np.testing.assert_array_equal(after[d], tokens[~np.isin(tokens, list(gone))])
    np.testing.assert_array_equal(val.counts(), np.bincount(np.concatenate(list(after.values())),
                                                            minlength=corpus.vocab_size))


def _shards(corpus):
    for path in corpus.shard_paths:
        yield from iter_shard(path)


def test_a_relative_init_from_is_found_from_every_trial(ray_cluster, sample_corpus, trained_model, tmp_path,
                                                        monkeypatch):
    """tune --init-from RELATIVE failed every trial ("not a trained model (no LATEST file)"): each trial runs in
    a directory of Ray Tune's, where the path named nothing. It is taken from where tune was asked."""
    monkeypatch.chdir(os.path.dirname(trained_model))
    out = str(tmp_path / "search")
    search(sample_corpus[0], out, heldout=sample_corpus[1], budget=0.5, space={"alpha": {"grid": [0.025]}},
           base=TrainConfig(init_from=os.path.basename(trained_model), dim=32, epochs=1, sample=0, num_ps=1,
                            cpus_per_worker=1), compare=False, calibrate_seconds=0, progress=False)
    rows = _trials(out)
    assert rows and all(r["state"] != "error" for r in rows), rows


def test_trials_for_budget_follows_ashas_rungs():
    # every trial runs a third of the schedule (4 of 10 epochs), a third of them the remaining 6
    assert trials_for_budget(8, 10) == int(8 * 10 / (4 + 6 / 3)) == 13
    # with grace 1: rungs 1, 3, 9, then 10: 1 epoch each, a third 2 more, a ninth 6 more, a 27th 1 more
    assert trials_for_budget(8, 10, grace=1) == int(8 * 10 / (1 + 2 / 3 + 6 / 9 + 1 / 27)) == 33
    assert trials_for_budget(1, 1) == 1


def test_trials_are_measured_at_ashas_milestones():
    """A trial is measured (a checkpoint and an evaluation) only where ASHA compares it: Ray Tune's own
    bracket has exactly these milestones."""
    from ray.tune.schedulers.async_hyperband import _Bracket

    from doc2vec_dist.search_cost import REDUCTION, grace_epochs

    for max_epochs in (1, 4, 6, 8, 10, 20, 27, 40, 80):
        bracket = _Bracket(grace_epochs(max_epochs), max_epochs, REDUCTION, 0)
        assert rung_epochs(max_epochs) == sorted(int(m) for m, _ in bracket._rungs), max_epochs
    assert rung_epochs(20) == [7] and rung_epochs(6) == [2, 6]


def test_a_labels_search_never_measures_on_the_test_share(ray_cluster, sample_corpus, tmp_path):
    """--labels: trials are scored among the keys outside evaluate's test share; the comparison on the
    test share, exactly what evaluate --labels prints for those models."""
    from doc2vec_dist.evaluate import labels_metrics

    truth = os.path.join(ROOT, "data", "sample", "truth", "users.parquet")
    out = str(tmp_path / "search")
    result = search(sample_corpus[0], out, labels=truth, key_col="user_id", label_col="community", budget=1,
                    space={"alpha": {"grid": [0.0002, 0.05]}, "epochs": 3, "dim": 16}, calibrate_seconds=0,
                    base=TrainConfig(sample=0, num_ps=1, cpus_per_worker=1, dim=16, epochs=3), progress=False)
    assert "keys outside its test share (0.2)" in result["measured_on"]
    assert "keys in its test share (0.2)" in result["compared_on"]
    rows = {float(r["alpha"]): float(r["knn_accuracy@10"]) for r in _trials(out)}
    assert rows[0.05] > rows[0.0002]
    tuned = os.path.join(out, "compare", "tuned")
    test = labels_metrics(tuned, truth, key_col="user_id", label_col="community")
    assert result["compare"]["tuned"]["metric"] == test["knn_accuracy@10"]
    validation = labels_metrics(tuned, truth, key_col="user_id", label_col="community", part="validation")
    assert validation["validation_users"] + test["test_users"] == 5000 - test["skipped_keys"]


def test_a_bad_search_space_is_refused_by_name():
    with pytest.raises(UserError, match="'widnow' is not a training setting"):
        tune_space({"widnow": {"choice": [5, 10]}})
    with pytest.raises(UserError, match="alpha: uniform needs \\[low, high\\]"):
        tune_space({"alpha": {"uniform": [0.1]}})
    with pytest.raises(UserError, match="depends on 'optimizer', which the space does not set"):
        tune_space({"alpha": {"by": "optimizer", "sgd": {"uniform": [0.01, 0.05]}}})


def test_tune_without_a_metric_is_refused_in_one_line_and_writes_nothing(sample_corpus, tmp_path, capsys):
    out = tmp_path / "search"
    assert main(["tune", "--corpus", sample_corpus[0], "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: tune needs one of --heldout, --labels or --pairs to measure trials on"]
    assert not out.exists()


def test_the_tune_job_takes_the_commands_flags():
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, os.path.join(root, "jobs", "tune.py"), "--help"], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 0 and "--budget" in done.stdout and "--heldout" in done.stdout


def test_ctrl_c_keeps_the_trials_so_far_and_the_best_settings(ray_cluster, sample_corpus, tmp_path, interrupt_when):
    """A search told to stop (SIGINT, as Ctrl-C sends) ends the command there, with the table of the
    trials so far and the best settings so far, and trains nothing more. (A process of its own, for the
    signal; on the session's Ray, as on a cluster, not a Ray of its own.)"""
    import subprocess
    import sys

    space, out = tmp_path / "space.yaml", tmp_path / "search"
    space.write_text(yaml.safe_dump({"alpha": {"choice": [0.0002, 0.05]}, "epochs": 6, "dim": 16}))
    cmd = [sys.executable, "-m", "doc2vec_dist", "tune", "--corpus", sample_corpus[0], "--heldout", sample_corpus[1],
           "--out", str(out), "--space", str(space), "--budget", "100", "--sample", "0", "--num-ps", "1",
           "--cpus-per-worker", "1", "--calibrate-seconds", "0",
           "--address", ray_cluster.get_runtime_context().gcs_address]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    def one_finished() -> bool:
        table = out / "trials.csv"
        return table.exists() and "finished" in table.read_text(errors="replace")

    err = interrupt_when(proc, one_finished, within=240)
    assert proc.returncode == 130, err[-2000:]
    assert "trial(s) unfinished: the trials so far are in" in err
    rows = _trials(str(out))
    assert any(r["state"] == "finished" for r in rows) and len(rows) < 50
    assert yaml.safe_load((out / "best.yaml").read_text())["epochs"] == 6
    assert not (out / "tune.json").exists() and not (out / "compare").exists()


def test_the_estimate_s_parts_add_up_and_count_evaluation_and_ray_tunes_overhead(searched):
    """The estimate said 2.5 min of a 5.9 min search: its parts are shown, add up to it, and include
    every evaluation a trial makes, Ray Tune's own time per trial, and the comparison."""
    _, result = searched
    estimate = result["estimate"]
    parts = estimate["parts"]
    assert set(parts) == {"startup", "overhead", "training", "measuring", "comparing"}
    assert sum(parts.values()) == pytest.approx(estimate["seconds"])
    assert estimate["search_seconds"] == pytest.approx(estimate["seconds"] - parts["comparing"])
    at_once = round(estimate["trials"] * TRIAL_OVERHEAD_SECONDS / parts["overhead"])
    assert at_once >= 1 and estimate["trials"] == result["trials"] == 5
    # every evaluation: ASHA's rung (epoch 3 of 8) for each trial, the last epoch for the third that goes on
    assert estimate["measurements"] == pytest.approx(5 + 5 / 3)
    # each measurement reads a committed checkpoint of the trial: its write is counted with it
    each = estimate["measure_seconds"] + estimate["checkpoint_seconds"]
    assert parts["measuring"] == pytest.approx(estimate["measurements"] * each / at_once, rel=0.5)
    assert parts["comparing"] > 2 * estimate["test_measure_seconds"] > 0


def test_a_trial_s_cost_follows_what_the_space_draws(sample_corpus):
    """The calibration trains the base settings; a space drawing negative 20 or Adagrad costs more."""
    counts = Corpus(sample_corpus[0]).counts()
    base = TrainConfig(negative=5, dim=100, sample=0)
    assert trial_cost({"negative": {"choice": [20]}}, base, counts) == pytest.approx(21 / 6)
    assert trial_cost({"negative": {"choice": [5, 20]}}, base, counts) == pytest.approx((1 + 21 / 6) / 2, rel=0.1)
    assert trial_cost({"optimizer": {"choice": ["adagrad"]}, "dim": 50}, base, counts) == pytest.approx(ADAGRAD_COST / 2)
    assert trial_cost({"sample": {"choice": [1e-4]}}, base, counts) < 1  # subsampling drops frequent URLs
    assert trial_cost(DEFAULT_SPACE, TrainConfig(), counts) > 1.5  # the default space: about 2.5x the defaults


def test_the_training_estimate_counts_each_trial_s_own_epochs(sample_corpus):
    """The skewed set's search (epochs drawn from 5, 10, 20, 40) trained for 257 s where the estimate,
    which gave every trial the longest schedule, said 746 s: a trial that asks for fewer epochs than
    ASHA's first rung ends there, and one at the longest trains the budget's share."""
    assert asha_epochs(5, 40) == 5 and asha_epochs(14, 40) == 14  # below the first rung (14): its own
    assert asha_epochs(40, 40) == pytest.approx(14 + 26 / 3)  # a third of the trials go on to 40
    assert trials_for_budget(8, 40) * asha_epochs(40, 40) == pytest.approx(8 * 40, rel=0.05)
    counts = Corpus(sample_corpus[0]).counts()
    base = TrainConfig(epochs=40, negative=5, dim=100, sample=0)
    epochs, cost = trial_epoch_cost({"epochs": {"choice": [5, 10, 20, 40]}}, base, counts, 40)
    assert epochs == pytest.approx((5 + 10 + 16 + asha_epochs(40, 40)) / 4, rel=0.1) and cost == pytest.approx(1)
    epochs, cost = trial_epoch_cost({"epochs": 40, "negative": {"choice": [5, 20]}}, base, counts, 40)
    assert epochs == pytest.approx(asha_epochs(40, 40)) and cost == pytest.approx((1 + 21 / 6) / 2, rel=0.1)


def test_each_optimizer_is_tried_at_a_known_learning_rate_before_any_draw():
    """The base settings first, then every optimizer of the space at START_ALPHA, the rest as in the
    base; both searchers hand these out before drawing."""
    from doc2vec_dist.tune import _searcher

    space = {**DEFAULT_SPACE, "epochs": {"choice": [5, 10, 20]}}
    points = seed_points(space, TrainConfig())
    assert [(p["optimizer"], p["alpha"]) for p in points] == [("sgd", 0.025), ("adagrad", 0.05)]
    assert all(p["epochs"] == 10 and p["negative"] == 5 and p["dim"] == 100 for p in points)
    mine = seed_points(space, TrainConfig(alpha=0.01, dim=16))  # the user's own base stays first
    assert [(p["optimizer"], p["alpha"]) for p in mine] == [("sgd", 0.01), ("sgd", 0.025), ("adagrad", 0.05)]
    assert all(p["dim"] == 16 for p in mine)
    for name in ("random", "optuna"):
        searcher = _searcher(name, space, mine, seed=0)
        first = [searcher.suggest(f"t{i}") for i in range(5)]
        for got, want in zip(first, mine):
            assert {k: got[k] for k in want} == want, name
        for drawn in first[3:]:  # then draws, within each optimizer's own alpha range
            low, high = {"sgd": (0.01, 0.05), "adagrad": (0.02, 0.2)}[drawn["optimizer"]]
            assert low <= drawn["alpha"] <= high and drawn["dim"] in (64, 100, 128, 16), (name, drawn)


def test_best_so_far_never_goes_down(tmp_path):
    """The progress line's "best so far" and best.yaml: the best of the trials that have ended, so a
    running trial whose figure falls after its rung (0.2366, then 0.2303) never lowers it."""
    from types import SimpleNamespace

    from doc2vec_dist.search_report import _Recorder

    recorder = _Recorder(str(tmp_path), ["alpha", "epochs"], {"epochs": 20}, "recall@10", "validation", 3, False)
    a = SimpleNamespace(trial_id="a", config={"alpha": 0.05, "epochs": 20}, error_file=None)
    b = SimpleNamespace(trial_id="b", config={"alpha": 0.01, "epochs": 20}, error_file=None)
    shown = []

    def step(event, *args):
        event(*args)
        best = recorder.best()
        shown.append(None if best is None else best["recall@10"])

    step(recorder.seen, a, {"metric": 0.2366, "epoch": 7, "tokens_per_second": 1.0, "seconds": 1.0})
    step(recorder.seen, b, {"metric": 0.2200, "epoch": 7, "tokens_per_second": 1.0, "seconds": 1.0})
    step(recorder.ended, b, "finished")  # stopped by ASHA at its rung
    step(recorder.seen, a, {"metric": 0.2303, "epoch": 20, "tokens_per_second": 1.0, "seconds": 2.0})
    step(recorder.ended, a, "finished")
    assert shown == [None, None, 0.22, 0.22, 0.2303]
    assert [r["state"] for r in recorder.table()] == ["finished", "stopped early"]
    assert yaml.safe_load((tmp_path / "best.yaml").read_text()) == {"alpha": 0.05, "epochs": 20}


def test_when_nothing_beats_the_base_the_command_says_so_and_best_yaml_is_the_base(ray_cluster, sample_corpus,
                                                                                   tmp_path):
    """Through the command line, as a user runs it: the base (--alpha 0.05) is a trial though the space
    draws only rates too small to train; nothing beats it, one line says so, best.yaml is the base.
    The trials ASHA stops leave no Ray SIGTERM traceback on the console. (A process of its own, for its
    console; on the session's Ray, as on a cluster, not a Ray of its own.)"""
    import subprocess
    import sys

    space, out = tmp_path / "space.yaml", tmp_path / "search"
    space.write_text(yaml.safe_dump({"alpha": {"choice": [0.0002, 0.0005]}, "epochs": 4, "dim": 16}))
    done = subprocess.run([sys.executable, "-m", "doc2vec_dist", "tune", "--corpus", sample_corpus[0], "--heldout",
                           sample_corpus[1], "--out", str(out), "--space", str(space), "--budget", "2", "--alpha", "0.05",
                           "--sample", "0", "--num-ps", "1", "--cpus-per-worker", "1", "--calibrate-seconds", "0",
                           "--no-compare", "--address", ray_cluster.get_runtime_context().gcs_address],
                          capture_output=True, text=True, cwd=ROOT, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    said = [line for line in done.stdout.splitlines() if line.startswith("nothing beat the base settings")]
    assert len(said) == 1 and said[0].endswith("best.yaml is the base"), done.stdout
    rows = _trials(str(out))
    assert len(rows) == 3 and rows[0]["source"] == "base" and rows[0]["alpha"] == "0.05"
    assert any(r["state"] == "stopped early" for r in rows)
    best = (out / "best.yaml").read_text()
    assert best.startswith("# doc2vec-dist tune: nothing beat the base settings")
    # the base as given on the command line, all of it (not --address: where it ran), for train --config
    assert yaml.safe_load(best) == {"alpha": 0.05, "epochs": 4, "dim": 16, "sample": 0, "num_ps": 1,
                                    "cpus_per_worker": 1}
    assert "Exception ignored" not in done.stderr and "SystemExit" not in done.stderr, done.stderr[-3000:]


def test_ray_s_sigterm_in_a_finalizer_leaves_no_traceback_in_our_actors(ray_cluster):
    """Ray's SIGTERM handler raises SystemExit; landing in a finalizer (ActorHandle.__del__, as when ASHA
    stops a trial and Ray removes its workers), Python prints "Exception ignored in … SystemExit: 1",
    which Ray forwards to the console. A server actor prints nothing for it, and still every other
    error a finalizer meets."""
    import ray

    from doc2vec_dist.ps import ParameterServer

    server = ray.remote(num_cpus=0)(ParameterServer).remote(0, 1, {}, 0)

    def finalizer_meets(_, what: str) -> str:
        import io
        import os
        import signal
        import sys
        import time

        class Dying:
            def __del__(self):
                if what == "sigterm":
                    os.kill(os.getpid(), signal.SIGTERM)
                    time.sleep(2)  # Ray's handler runs here, inside the finalizer
                else:
                    raise ValueError("a finalizer's own error")

        before, sys.stderr = sys.stderr, io.StringIO()
        try:
            Dying()
            return sys.stderr.getvalue()
        finally:
            sys.stderr = before

    try:
        assert ray.get(server.__ray_call__.remote(finalizer_meets, "sigterm")) == ""
        other = ray.get(server.__ray_call__.remote(finalizer_meets, "error"))
        assert "Exception ignored in" in other and "ValueError: a finalizer's own error" in other
    finally:
        ray.kill(server)


def test_the_validation_split_of_some_users_leaves_the_others_whole(sample_corpus, tmp_path):
    """tune hides URLs of the users it measures (TRIAL_USERS) only: with ~5 URLs a user, hiding one
    of every user took a fifth of every trial's training away."""
    corpus = Corpus(sample_corpus[0])
    everyone = Corpus(split_validation(corpus, str(tmp_path / "all"), seed=3)[0].path)
    val, pairs = split_validation(corpus, str(tmp_path / "some"), seed=3, users=500)
    hidden = pq.read_table(pairs)
    keys = set(hidden.column("key").to_pylist())
    assert len(keys) == 500
    before = {int(d): t[a:b] for ids, off, t in _shards(corpus) for d, a, b in zip(ids, off, off[1:])}
    after = {int(d): t[a:b] for ids, off, t in _shards(val) for d, a, b in zip(ids, off, off[1:])}
    names = corpus.docs().column("key").to_pylist()
    changed = {names[d] for d in before if len(after[d]) != len(before[d])}
    assert changed == keys  # the 500 lost what the file holds; every other user is whole
    assert corpus.num_tokens - val.num_tokens < (corpus.num_tokens - everyone.num_tokens) / 5


def test_a_search_with_optuna_runs(ray_cluster, sample_corpus, tmp_path):
    """--searcher optuna: the base and each optimizer at its known rate first, then Optuna's draws."""
    space = {"optimizer": {"choice": ["sgd", "adagrad"]},
             "alpha": {"by": "optimizer", "sgd": {"loguniform": [0.01, 0.05]}, "adagrad": {"loguniform": [0.02, 0.2]}},
             "epochs": 2, "dim": 16}
    out = str(tmp_path / "search")
    result = search(sample_corpus[0], out, heldout=sample_corpus[1], budget=3, space=space, searcher="optuna",
                    base=TrainConfig(sample=0, num_ps=1, cpus_per_worker=1, dim=16, epochs=2), compare=False,
                    calibrate_seconds=0, progress=False)
    rows = _trials(out)
    assert result["searcher"] == "optuna" and len(rows) == result["trials"] == 4
    assert sorted(r["source"] for r in rows) == ["base", "optuna", "optuna", "start"]
    assert {(r["optimizer"], r["alpha"]) for r in rows if r["source"] != "optuna"} == {("sgd", "0.025"),
                                                                                       ("adagrad", "0.05")}
    assert all(r["state"] != "failed" and r["dim"] == "16" for r in rows)


def test_optuna_refuses_a_grid_in_one_line(sample_corpus, tmp_path):
    with pytest.raises(UserError, match="space.yaml: alpha: grid is not searched by --searcher optuna"):
        search(sample_corpus[0], str(tmp_path / "s"), heldout=sample_corpus[1], space={"alpha": {"grid": [0.01, 0.05]}},
               searcher="optuna", space_name="space.yaml")
    assert not (tmp_path / "s").exists()
