"""The console script, called in-process: flags of the contract, config precedence, clean errors."""

from __future__ import annotations

import json
import os
import shutil

import pyarrow.parquet as pq
import pytest

from doc2vec_dist.cli import main

CONTRACT_FLAGS = {
    "generate": "--users --urls --out --seed",
    "prepare": "--out --format --doc-col --token-col --time-col --min-count --max-vocab --holdout --holdout-out",
    "train": "--corpus --out --config --dim --epochs --mode --dbow-words --window --negative --sample --alpha "
             "--min-alpha --ns-exponent --optimizer --num-ps --num-workers --gpus-per-worker --cache-rows "
             "--checkpoint-every --keep-checkpoints --seed --resume --address",
    "export": "--model --table --out --format",
    "index": "--model --table --vectors --out --kind",
    "neighbors": "--model --key --table --against --k",
    "evaluate": "--model --heldout --k --pairs",
}
CONTRACT_FLAGS["baseline"] = CONTRACT_FLAGS["train"]  # "same training flags"


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def assert_clean_error(code: int, err: str, *needles: str) -> None:
    """Exit 2, one 'error:' line naming what is wrong, and no traceback."""
    assert code == 2
    assert "Traceback" not in err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    for needle in needles:
        assert needle in lines[0]


@pytest.fixture
def model_copy(trained_model, tmp_path) -> str:
    """A private copy of the trained model, for commands that write next to it."""
    return shutil.copytree(trained_model, str(tmp_path / "model"))


@pytest.mark.parametrize("command", sorted(CONTRACT_FLAGS))
def test_help_of_each_subcommand_lists_the_contract_flags(capsys, command):
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    listed = {word.rstrip(",") for word in out.split() if word.startswith("--")}
    missing = [flag for flag in CONTRACT_FLAGS[command].split() if flag not in listed]
    assert not missing, f"{command} --help lacks {missing}"


def test_flags_override_the_yaml_config_and_the_resolved_config_is_saved(ray_cluster, sample_corpus, tmp_path,
                                                                           capsys):
    config = tmp_path / "small.yaml"
    config.write_text("epochs: 2\ndim: 16\nmin-alpha: 0.0002\n")
    out = str(tmp_path / "model")
    code, stdout, _ = run(capsys, "train", "--corpus", sample_corpus[0], "--out", out, "--config", str(config),
                          "--dim", "24", "--no-progress")
    assert code == 0
    assert "tokens" in stdout
    with open(os.path.join(out, "config.json")) as fh:
        resolved = json.load(fh)
    assert (resolved["epochs"], resolved["dim"], resolved["min_alpha"]) == (2, 24, 0.0002)
    assert resolved["negative"] == 5  # untouched default
    assert os.path.isfile(os.path.join(out, "LATEST"))


def test_an_unknown_yaml_key_is_refused_naming_the_file(sample_corpus, tmp_path, capsys):
    config = tmp_path / "typo.yaml"
    config.write_text("epochs: 2\nepocks: 3\n")
    code, _, err = run(capsys, "train", "--corpus", sample_corpus[0], "--out", str(tmp_path / "m"),
                       "--config", str(config))
    assert_clean_error(code, err, "unknown config key", str(config), "epocks")
    assert not os.path.exists(tmp_path / "m")


@pytest.mark.parametrize("flags, needle", [
    (["--mode", "dm", "--dbow-words"], "dbow_words applies to --mode dbow only"),
    (["--shared-negatives", "-3"], "shared_negatives must be >= 0"),
    (["--window", "0"], "window must be > 0"),
])
def test_bad_training_flags_are_refused_in_one_line(sample_corpus, tmp_path, capsys, flags, needle):
    code, _, err = run(capsys, "train", "--corpus", sample_corpus[0], "--out", str(tmp_path / "m"), *flags)
    assert_clean_error(code, err, needle)
    assert not os.path.exists(tmp_path / "m")


def test_train_into_an_existing_model_needs_overwrite(sample_corpus, model_copy, capsys):
    with open(os.path.join(model_copy, "LATEST")) as fh:
        before = fh.read()
    code, _, err = run(capsys, "train", "--corpus", sample_corpus[0], "--out", model_copy, "--no-progress")
    assert_clean_error(code, err, model_copy, "--overwrite")
    with open(os.path.join(model_copy, "LATEST")) as fh:
        assert fh.read() == before


def test_prepare_of_a_missing_path_exits_2(tmp_path, capsys):
    missing = str(tmp_path / "no-such-events")
    code, _, err = run(capsys, "prepare", missing, "--out", str(tmp_path / "corpus"), "--no-progress")
    assert_clean_error(code, err, "no-such-events")
    assert not os.path.exists(tmp_path / "corpus")


def test_neighbors_prints_ranked_lines(trained_model, capsys):
    from doc2vec_dist.export import keys_of

    key = keys_of(trained_model, "docs")[0].as_py()
    code, out, _ = run(capsys, "neighbors", "--model", trained_model, "--key", key, "--k", "5")
    assert code == 0
    rows = [line.split("\t") for line in out.strip().splitlines()]
    assert [r[1] for r in rows] == ["1", "2", "3", "4", "5"]
    assert all(r[0] == key and r[2] != key for r in rows)
    scores = [float(r[3]) for r in rows]
    assert scores == sorted(scores, reverse=True)


def test_neighbors_of_an_unknown_key_is_a_clean_error(trained_model, capsys):
    code, _, err = run(capsys, "neighbors", "--model", trained_model, "--key", "no-such-user")
    assert_clean_error(code, err, "unknown docs key 'no-such-user'")


def test_export_of_an_untrained_table_is_a_clean_error(trained_model, tmp_path, capsys):
    code, _, err = run(capsys, "export", "--model", trained_model, "--table", "words", "--out",
                       str(tmp_path / "w.parquet"), "--no-progress")
    assert_clean_error(code, err, "'words' was not trained")
    assert os.listdir(tmp_path) == []


def test_evaluate_heldout_prints_recall_and_saves_it_next_to_the_model(model_copy, sample_corpus, capsys):
    code, out, _ = run(capsys, "evaluate", "--model", model_copy, "--heldout", sample_corpus[1], "--k", "10")
    assert code == 0
    printed = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert 0 < float(printed["model_recall@10"]) <= 1
    with open(os.path.join(model_copy, "eval-heldout.json")) as fh:
        saved = json.load(fh)
    assert saved["model_recall@10"] == pytest.approx(float(printed["model_recall@10"]), abs=1e-4)
    assert saved["users"] > 1000


def test_evaluate_without_a_source_is_a_clean_error(trained_model, capsys):
    code, _, err = run(capsys, "evaluate", "--model", trained_model)
    assert_clean_error(code, err, "--heldout")


def test_generate_writes_events_with_user_url_and_time(tmp_path, capsys):
    out = str(tmp_path / "gen")
    code, stdout, _ = run(capsys, "generate", "--users", "50", "--urls", "40", "--out", out, "--seed", "3",
                          "--no-progress")
    assert code == 0
    assert json.loads(stdout)["users"] == 50
    events = pq.read_table(os.path.join(out, "events"))
    assert {"user_id", "url", "ts"} <= set(events.column_names)
    assert events.num_rows > 0
    assert len(set(events.column("user_id").to_pylist())) <= 50
    assert len(set(events.column("url").to_pylist())) <= 40


def test_generate_into_a_non_empty_directory_is_a_clean_error(tmp_path, capsys):
    (tmp_path / "keep.txt").write_text("x")
    code, _, err = run(capsys, "generate", "--users", "5", "--urls", "20", "--out", str(tmp_path), "--no-progress")
    assert_clean_error(code, err, str(tmp_path))
    assert os.listdir(tmp_path) == ["keep.txt"]


@pytest.mark.parametrize("name", sorted(os.listdir(os.path.join(os.path.dirname(__file__), "..", "jobs", "configs"))))
def test_every_shipped_config_loads_and_validates(name):
    from doc2vec_dist.config import TrainConfig, build, load_yaml

    path = os.path.join(os.path.dirname(__file__), "..", "jobs", "configs", name)
    build(TrainConfig, load_yaml(path)).validate()
