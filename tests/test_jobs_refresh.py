"""jobs/refresh.py, the daily step as one job, on the bundled sample split in time (as tests/test_refresh.py
splits it): day 1 is everything before the last 5 days, day 2 the next 3 days, day 3 the last 2. The
job runs in this process, on the session's Ray."""

from __future__ import annotations

import glob
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
import pytest
import yaml
from conftest import assert_same_corpus

from doc2vec_dist import outputs, pipeline
from doc2vec_dist.config import PrepareConfig
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.errors import UserError
from doc2vec_dist.modeldir import ModelDir
from doc2vec_dist.prepare import prepare

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DAY = 86_400


@pytest.fixture(scope="module")
def days(ray_cluster, tmp_path_factory):
    """The sample's events in three files (day1, day2, day3 by time), and day 1's corpus, model (dim 8,
    2 servers) and IVF-PQ index, as a first run of the job's schedule would leave them."""
    from doc2vec_dist.config import PrepareConfig, TrainConfig
    from doc2vec_dist.index import build_index
    from doc2vec_dist.prepare import prepare
    from doc2vec_dist.trainer import train

    root = tmp_path_factory.mktemp("days")
    events = pa.concat_tables(pq.read_table(f) for f in sorted(glob.glob(os.path.join(ROOT, "data", "sample",
                                                                                        "events", "*.parquet"))))
    seconds = pc.cast(events["ts"], pa.int64()).to_numpy() / 1000
    last = seconds.max()
    found = {}
    for name, keep in (("events1", seconds < last - 5 * DAY), ("events2", (seconds >= last - 5 * DAY)
                                                                & (seconds < last - 2 * DAY)),
                       ("events3", seconds >= last - 2 * DAY)):
        found[name] = str(root / f"{name}.parquet")
        pq.write_table(events.filter(pa.array(keep)), found[name])
    day1 = root / "day1"
    corpus = prepare([found["events1"]], str(day1 / "corpus"), PrepareConfig(time_col="ts"), progress=False).path
    found["model"] = str(day1 / "model")
    train(corpus, found["model"], TrainConfig(dim=8, epochs=1, sample=0, num_ps=2, cpus_per_worker=1, progress=False))
    found["index"] = str(day1 / "index")
    build_index(found["index"], kind="ivfpq", model=found["model"], table="docs", progress=False)
    return found


def _keys(model: str, table: str = "docs") -> list[str]:
    return ModelDir(model).keys(table).to_pylist()


def test_a_refresh_writes_corpus_model_exports_index_and_its_report(days, tmp_path, capsys, monkeypatch):
    """No --index: a new index. Settings come from the base model (dim 8, 2 servers: no flag says so),
    the event columns from its corpus (time_col ts), epochs 1; known users and URLs keep their ids.
    (The input size from which the job's task per CPU pays, issue 50, is lowered so that the tasks run.)"""
    monkeypatch.setattr("doc2vec_dist.prepare_merge.PARALLEL_MIN_INPUT_BYTES", 0)
    day = tmp_path / "day2"
    assert pipeline.refresh_job(["--events", days["events2"], "--base-model", days["model"], "--out", str(day),
                                     "--no-progress", "--recall-queries", "200"]) == 0
    out = capsys.readouterr().out
    assert sorted(os.listdir(day)) == sorted([outputs.MARKER, "corpus", "model", "exports", "index", "refresh.json",
                                              "report.html"])
    corpus = Corpus(str(day / "corpus"))
    assert corpus.meta["time_col"] == "ts" and corpus.meta["refresh"]["base"] == days["model"]
    new_keys, old_keys = _keys(str(day / "model")), _keys(days["model"])
    assert new_keys[:len(old_keys)] == old_keys and len(new_keys) > len(old_keys)
    old_urls = _keys(days["model"], "words_out")
    assert _keys(str(day / "model"), "words_out")[:len(old_urls)] == old_urls

    config = ModelDir(str(day / "model")).config()
    assert (config.dim, config.num_ps, config.epochs, config.init_from) == (8, 2, 1, days["model"])
    report = json.loads((day / "refresh.json").read_text())
    refresh = report["prepare"]["refresh"]
    assert refresh == corpus.meta["refresh"] and refresh["new_docs"] == len(new_keys) - len(old_keys) > 0
    assert refresh["grown_docs"] > 0
    assert report["train"]["drift"]["docs"]["rows"] == len(old_keys)
    assert ds.dataset(str(day / "exports" / "users")).count_rows() == corpus.num_docs
    assert ds.dataset(str(day / "exports" / "urls")).count_rows() == corpus.vocab_size
    users = pq.read_table(glob.glob(str(day / "exports" / "users" / "*.parquet"))[0])
    assert users.schema.field("vector").type.list_size == 8
    index = report["index"]
    assert index["kind"] == "flat" and index["rows"] == corpus.num_docs and "update" not in index
    assert set(report["stages"]) == {"prepare", "train", "export", "index", "report"}
    assert f"users: {len(old_keys):,} known, {refresh['new_docs']:,} new, {refresh['grown_docs']:,} grown" in out
    assert "drift    users cosine(old, new) median" in out and "index    flat: " in out
    assert "times    prepare" in out
    # the page: its last line names it; the drift of the known users drawn, and the counts of new and grown ones
    assert out.strip().splitlines()[-1] == f"report: {day / 'report.html'}"
    page = (day / "report.html").read_text()
    assert '<section id="refresh">' in page and '<figure id="fig-drift">' in page
    figures = json.loads(page.split('<script type="application/json" id="figures">')[1].split("</script>")[0])
    assert figures["refresh"]["new_docs"] == refresh["new_docs"] and figures["refresh"]["grown_docs"] == refresh["grown_docs"]
    assert figures["drift"]["docs"]["median"] == pytest.approx(report["train"]["drift"]["docs"]["median"], abs=1e-6)
    # on the session's Ray, prepare ran as Ray tasks and made the single process's refresh (issue 30, item 5)
    assert corpus.meta["parallel"] == 2
    settings = {k: corpus.meta[k] for k in ("format", "doc_col", "token_col", "time_col", "min_count", "max_vocab",
                                            "seed", "window_days")}
    single = prepare([days["events2"]], str(tmp_path / "single"), PrepareConfig(**settings, base=days["model"]),
                     progress=False)
    assert_same_corpus(single.path, corpus.path)


def test_yesterdays_model_and_index_are_todays_base_day_after_day(days, tmp_path, snapshot, capsys):
    """The schedule: day 2 refreshes day 1's model (every user, --first-epoch all) and updates its IVF-PQ
    index; day 3 does the same from day 2's, its first epoch on the changed users only (the default). Each index update adds the new users and
    keeps its kind; flags and the YAML override the base model's settings; yesterday's outputs are only
    read. Day 2 also changes the tables' type (float32 to bfloat16: issue 29), which day 3 keeps."""
    day1 = snapshot(os.path.dirname(days["model"]))
    config = tmp_path / "refresh.yaml"
    config.write_text(yaml.safe_dump({"epochs": 3, "alpha": 0.02}))
    day2, day3 = tmp_path / "day2", tmp_path / "day3"
    assert pipeline.refresh_job(["--events", days["events2"], "--base-model", days["model"], "--index", days["index"],
                     "--out", str(day2), "--config", str(config), "--alpha", "0.01", "--first-epoch", "all",
                     "--dtype", "bfloat16", "--no-progress"]) == 0
    day2_files = snapshot(str(day2))
    assert pipeline.refresh_job(["--events", days["events3"], "--base-model", str(day2 / "model"), "--index", str(day2 / "index"),
                     "--out", str(day3), "--no-progress"]) == 0  # a refresh's first epoch: the changed users
    out = capsys.readouterr().out
    assert snapshot(os.path.dirname(days["model"])) == day1 and snapshot(str(day2)) == day2_files

    config2 = ModelDir(str(day2 / "model")).config()
    assert (config2.epochs, config2.alpha, config2.dim) == (3, 0.01, 8)  # YAML, then the flag, over the base's
    config3 = ModelDir(str(day3 / "model")).config()
    assert (config3.epochs, config3.alpha, config3.init_from, config3.first_epoch) == (1, 0.01, str(day2 / "model"),
                                                                                     "changed")
    assert (ModelDir(days["model"]).config().dtype, config2.dtype, config3.dtype) == ("float32", "bfloat16", "bfloat16")
    for day in (day2, day3):  # 16-bit rows in the checkpoint, widened to float32 by every reader
        assert ModelDir(str(day / "model")).spec("docs")["dtype"] == "bfloat16"
        docs = ModelDir(str(day / "model")).read_table("docs")
        assert docs.dtype == np.float32 and np.isfinite(docs).all() and np.abs(docs).max() > 0
    keys1, keys2, keys3 = _keys(days["model"]), _keys(str(day2 / "model")), _keys(str(day3 / "model"))
    assert keys3[:len(keys2)] == keys2 and keys2[:len(keys1)] == keys1 and len(keys3) > len(keys2) > len(keys1)
    for day, before, after, old_index in ((day2, keys1, keys2, days["index"]), (day3, keys2, keys3, str(day2 / "index"))):
        report = json.loads((day / "refresh.json").read_text())
        index, grown = report["index"], report["prepare"]["refresh"]["grown_docs"]
        assert index["kind"] == "ivfpq" and index["update"]["from"] == old_index
        assert index["update"]["added"] == len(after) - len(before) and index["update"]["removed"] == 0
        assert index["rows"] == len(after)
        served = pq.read_table(day / "index" / "keys.parquet").column("key")
        assert set(served.drop_null().to_pylist()) == set(after)
        if day == day2:  # every user trained: the index replaces more rows than the users who grew
            assert index["update"]["replaced"] > grown
        else:  # only the changed users moved: the others' rows are left as they were
            assert 0 < index["update"]["replaced"] <= grown
            assert index["update"]["unchanged"] >= len(before) - grown
    assert out.count("updated from") == 2 and "1 epoch(s) (the first on the changed users only)" in out


@pytest.mark.parametrize("case", ["user's file", "earlier refresh", "a model", "bad yaml", "not a model",
                                  "another dim", "another mode", "resume nothing", "resume a finished refresh"])
def test_refusals_are_one_line_and_touch_nothing(days, tmp_path, snapshot, capsys, case):
    day = tmp_path / "day"
    args = ["--events", days["events2"], "--base-model", days["model"], "--out", str(day), "--no-progress"]
    if case == "user's file":
        day.mkdir()
        (day / "notes.txt").write_text("mine")
        message = "exists and is not a daily refresh made by doc2vec-dist (it holds notes.txt)"
    elif case == "earlier refresh":
        (day / "corpus").mkdir(parents=True)
        outputs.write_marker(str(day), "refresh")
        message = "holds an earlier refresh (made by jobs/refresh.py); a refresh writes only into a new or empty"
    elif case == "a model":
        day = tmp_path / "model-copy"
        shutil.copytree(days["model"], day)
        args[args.index("--out") + 1] = str(day)
        message = "holds a model (made by doc2vec-dist train or baseline), not a daily refresh"
    elif case == "bad yaml":
        config = tmp_path / "c.yaml"
        config.write_text(yaml.safe_dump({"corpus": "/x", "holdout": 0.2, "dim": 8}))
        args += ["--config", str(config)]
        message = "corpus, holdout: not a setting of a refresh"
    elif case == "another dim":  # issue 26, item 8: the base model's shape is the refresh's
        args += ["--dim", "4"]
        message = f"--dim 4 contradicts the --base-model model {days['model']}, trained with dim 8: a run from an "
    elif case == "another mode":
        config = tmp_path / "c.yaml"
        config.write_text("mode: dm\n")
        args += ["--config", str(config)]
        message = f"{config}: mode: dm contradicts the --base-model model {days['model']}, trained with mode dbow"
    elif case == "resume nothing":
        args += ["--resume"]
        message = f"{day}: holds no refresh to resume; run the refresh without --resume"
    elif case == "resume a finished refresh":  # only a stop in training is resumed
        shutil.copytree(days["model"], day / "model")
        (day / "index").mkdir()
        outputs.write_marker(str(day), "refresh")
        args += ["--resume"]
        message = f"{day}: the refresh got past training (index there), so there is no training to resume"
    else:
        args[args.index("--base-model") + 1] = str(tmp_path)
        message = str(tmp_path)
    model_before, day_before = snapshot(days["model"]), snapshot(str(day))
    assert pipeline.refresh_job(args) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("error: ") and message in err, err
    assert snapshot(str(day)) == day_before and snapshot(days["model"]) == model_before


def test_inside_a_submitted_job_relative_paths_need_a_root(days, tmp_path, monkeypatch):
    """Under `ray job submit --working-dir` the working dir is a temporary copy: a relative --out is refused;
    with --root, --out and the earlier day's relative paths are taken from it, and the events from the upload."""
    monkeypatch.setenv("RAY_JOB_CONFIG_JSON_ENV_VAR", json.dumps({"runtime_env": {"working_dir": "gcs://_ray_pkg_x.zip"}}))
    with pytest.raises(UserError, match="'out' is the relative path day2, which inside `ray job submit"):
        pipeline.parse_refresh(["--events", "today.parquet", "--base-model", days["model"], "--out", "day2"])
    root = os.path.dirname(os.path.dirname(days["model"]))
    found, prep, cfg = pipeline.parse_refresh(["--events", "today.parquet", "--base-model", "day1/model", "--index", "day1/index",
                                  "--out", "day2", "--root", root])
    assert (found.out, found.base_model, found.index) == (os.path.join(root, "day2"), days["model"], days["index"])
    assert found.events == ["today.parquet"] and prep.time_col == "ts" and cfg.init_from == days["model"]


def test_a_refresh_stopped_in_training_resumes_with_its_own_command_and_finishes(days, tmp_path, monkeypatch,
                                                                                  snapshot, capsys):
    """Issue 47, item 11: a refresh whose nodes died after a checkpoint said `doc2vec-dist train … --resume`,
    which leaves its export and index undone, and the refresh itself refused to run into that DAY_DIR again.
    It names `jobs/refresh.py … --resume`, which trains the model on from its checkpoint, then exports and
    indexes, without preparing again. A --resume with other events or prepare flags than the corpus there was
    made of took them without a word and recorded the events given in refresh.json: it is refused in one line
    naming what differs, and refresh.json records the corpus's own inputs (here spelt otherwise on resuming)."""
    import shlex

    from test_jobs import job_resume_args, nodes_die_after_the_first_checkpoint

    from doc2vec_dist import modeldir

    day = tmp_path / "day2"
    model = str(day / "model")
    bring_back = nodes_die_after_the_first_checkpoint(monkeypatch, model)
    argv = ["--events", days["events2"], "--base-model", days["model"], "--out", str(day), "--epochs", "30",
            "--checkpoint-every", "0.05", "--no-progress"]
    assert pipeline.refresh_job(argv) == 2
    err = capsys.readouterr().err
    version, args = job_resume_args(err, model, "refresh.py")
    assert shlex.split(args) == [*argv, "--resume"]
    corpus = snapshot(str(day / "corpus"))

    bring_back()
    stopped = snapshot(str(day))
    resume = shlex.split(args)
    other_events = [days["events3"] if a == days["events2"] else a for a in resume]
    for argv, differs in ((other_events, f"prepared from other inputs ({days['events2']}), not {days['events3']}"),
                          ([*resume, "--window-days", "2", "--max-tokens-per-doc", "3"],
                           "prepared with window_days none, not 2.0; max_tokens_per_doc none, not 3")):
        assert pipeline.refresh_job(argv) == 2
        err = capsys.readouterr().err.strip()
        assert err == (f"error: {day / 'corpus'}: {differs}; --resume trains on the corpus the refresh's first run "
                       "prepared: give that run's --events and prepare flags, or refresh into another --out"), err
    assert snapshot(str(day)) == stopped
    monkeypatch.chdir(os.path.dirname(days["events2"]))  # the same events, by a path relative to here
    assert pipeline.refresh_job([os.path.basename(a) if a == days["events2"] else a for a in resume]) == 0
    out = capsys.readouterr()
    assert f"resumed from v{version}" in out.err
    assert modeldir.load_manifest(model)[1]["epoch"] == 30
    assert snapshot(str(day / "corpus")) == corpus  # not prepared again
    assert sorted(os.listdir(day)) == sorted([outputs.MARKER, "corpus", "model", "exports", "index", "refresh.json",
                                              "report.html"])
    report = json.loads((day / "refresh.json").read_text())
    assert report["index"]["rows"] == Corpus(str(day / "corpus")).num_docs
    assert report["events"] == Corpus(str(day / "corpus")).meta["inputs"] == [days["events2"]]
    assert ds.dataset(str(day / "exports" / "users")).count_rows() == report["index"]["rows"]
    assert "outputs: " + str(day) in out.out
