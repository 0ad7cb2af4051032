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
# "same training flags": the model's; the engine's own (--num-ps, --cache-rows, ...) are train's only (issue 13, item 13)
CONTRACT_FLAGS["baseline"] = ("--corpus --out --config --dim --epochs --mode --dbow-words --window --negative --sample "
                              "--alpha --min-alpha --ns-exponent --seed")


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
    from doc2vec_dist.modeldir import ModelDir

    key = ModelDir(trained_model).keys("docs")[0].as_py()
    code, out, _ = run(capsys, "neighbors", "--model", trained_model, "--key", key, "--k", "5")
    assert code == 0
    header, *lines = out.strip().splitlines()
    rows = [dict(zip(header.split("\t"), line.split("\t"))) for line in lines]
    assert [r["rank"] for r in rows] == ["1", "2", "3", "4", "5"]
    assert all(r["key"] == key and r["neighbor"] != key for r in rows)
    scores = [float(r["score"]) for r in rows]
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


def test_evaluate_says_when_it_samples_the_users_and_how_to_take_them_all(model_copy, sample_corpus, capsys):
    """issue 26, item 12: it sampled 20,000 users without a word."""
    code, out, _ = run(capsys, "evaluate", "--model", model_copy, "--heldout", sample_corpus[1], "--max-users", "300")
    assert code == 0
    lines = out.strip().splitlines()
    printed = dict(line.split(None, 1) for line in lines[:-1])
    total = int(printed["users_with_pairs"])
    assert int(printed["users"]) == 300 and total > 1000
    assert lines[-1] == (f"sampled 300 of the {total:,} users with held-out pairs (seed 0); --max-users N evaluates "
                         "N of them, --max-users all every one")
    code, out, _ = run(capsys, "evaluate", "--model", model_copy, "--heldout", sample_corpus[1], "--max-users", "all")
    printed = dict(line.split(None, 1) for line in out.strip().splitlines())
    assert code == 0 and printed["users"] == printed["users_with_pairs"] == str(total) and "sampled" not in out


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


# --- issue 13, item 11: every flag has a help line that shows its default once -----------------------------

def _subparsers():
    import argparse

    from doc2vec_dist.cli import make_parser

    parser = make_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sub.choices


def _config_defaults(command: str) -> dict:
    """--flag → the config field's own default (the flag itself defaults to None so that YAML is not overridden)."""
    import dataclasses

    from doc2vec_dist.config import PrepareConfig, TrainConfig

    out = {}
    for cls in {"prepare": [PrepareConfig], "train": [TrainConfig], "baseline": [TrainConfig],
                "plan": [TrainConfig]}.get(command, []):
        for f in dataclasses.fields(cls):
            if f.metadata.get("flag", True) and f.default is not dataclasses.MISSING:
                for name in (f.name, *f.metadata.get("aliases", ())):
                    out["--" + name.replace("_", "-")] = f.default
    return out


def _help_problems(command: str, parser) -> list[str]:
    import argparse
    import re

    defaults = _config_defaults(command)
    problems = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        name = "/".join(action.option_strings) or action.dest
        text = " ".join(parser._get_formatter()._expand_help(action).split()) if action.help else ""
        if not text:
            problems.append(f"{name}: no help")
            continue
        if action.option_strings and action.required:
            if "(required)" not in text:
                problems.append(f"{name}: does not say it is required: {text!r}")
        elif action.option_strings and not isinstance(action, (argparse._StoreTrueAction, argparse._StoreFalseAction)):
            default = defaults.get(action.option_strings[0], action.default) if action.default is None \
                else action.default
            if default is not None and f"(default: {default})" not in text:
                problems.append(f"{name}: default {default} not shown: {text!r}")
        parens = re.findall(r"\([^()]*\)", text)
        if len(parens) != len(set(parens)) or text.count("default:") > 1 or "(default: None)" in text:
            problems.append(f"{name}: a parenthetical repeated or empty: {text!r}")
    return problems


def test_every_flag_of_every_subcommand_has_help_showing_its_default_once():
    subparsers = _subparsers()
    problems = [f"{command} {p}" for command, sp in sorted(subparsers.items()) for p in _help_problems(command, sp)]
    assert not problems, "\n".join(problems)
    # the ones the issue names, checked by hand as well
    for command, flag in [("train", "--corpus"), ("export", "--model"), ("generate", "--users"),
                          ("export", "--table"), ("neighbors", "--k"), ("neighbors", "--key")]:
        action = next(a for a in subparsers[command]._actions if flag in a.option_strings)
        assert action.help, (command, flag)
    assert "(required)" in subparsers["generate"].format_help()


@pytest.mark.parametrize("command", ["generate", "prepare", "train", "baseline", "plan"])
def test_help_output_has_no_default_none_and_no_doubled_parenthetical(capsys, command):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(default: None)" not in out
    assert "(optional) (default" not in out
    assert {"generate": "(default: 8)"}.get(command, "(default: 1)") in out  # --communities, --seed, --min-count


def test_the_job_script_help_still_runs_and_reads_well():
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    done = subprocess.run([sys.executable, os.path.join(root, "jobs", "train.py"), "--help"],
                          check=False, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = " ".join(done.stdout.split())
    assert "--vector-size" in out and "--num-ps" in out and "--min-count" in out
    assert "(default: None)" not in out
    assert "(default: 100)" in out  # --dim shows the field's default, not argparse's None


# --- issue 13, item 12: gensim's names are understood or pointed to ----------------------------------------

@pytest.mark.parametrize("command", ["train", "baseline", "plan"])
def test_vector_size_is_an_alias_of_dim(capsys, command):
    from doc2vec_dist.cli import make_parser

    argv = [command, "--corpus", "c"] + ([] if command == "plan" else ["--out", "o"])
    assert make_parser().parse_args(argv + ["--vector-size", "48"]).dim == 48
    assert make_parser().parse_args(argv + ["--dim", "48", "--vector-size", "48"]).dim == 48
    with pytest.raises(SystemExit):
        main([command, "--help"])
    assert "--vector-size" in capsys.readouterr().out


def test_dim_and_vector_size_that_disagree_are_one_clear_error(tmp_path, capsys):
    code, _, err = run(capsys, "train", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "m"),
                       "--dim", "50", "--vector-size", "60")
    assert_clean_error(code, err, "--dim", "--vector-size", "50", "60")
    config = tmp_path / "both.yaml"
    config.write_text("dim: 50\nvector_size: 60\n")
    code, _, err = run(capsys, "train", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "m"),
                       "--config", str(config))
    assert_clean_error(code, err, str(config), "dim", "vector_size")
    assert not os.path.exists(tmp_path / "m")


def test_yaml_vector_size_is_read_as_dim(tmp_path):
    from doc2vec_dist.config import TrainConfig, build, load_yaml

    config = tmp_path / "gensim.yaml"
    config.write_text("vector_size: 48\nepochs: 3\n")
    assert load_yaml(str(config)) == {"dim": 48, "epochs": 3}
    assert build(TrainConfig, load_yaml(str(config))).dim == 48
    config.write_text("vector-size: 48\ndim: 48\n")  # the same value twice is not a conflict
    assert load_yaml(str(config)) == {"dim": 48}


@pytest.mark.parametrize("command", ["train", "baseline", "plan"])
@pytest.mark.parametrize("flag, value", [("--min-count", "2"), ("--max-vocab", "1000"), ("--holdout", "0.2"),
                                         ("--time-col", "ts"), ("--min_count", "2")])
def test_a_prepare_flag_given_to_a_trainer_points_to_prepare(tmp_path, capsys, command, flag, value):
    out = [] if command == "plan" else ["--out", str(tmp_path / "m")]
    argv = [command, "--corpus", str(tmp_path / "c"), *out, flag, value]
    code, _, err = run(capsys, *argv)
    dashed = flag.replace("_", "-")
    assert_clean_error(code, err, f"{dashed} is a prepare option", "doc2vec-dist prepare", f"{dashed} {value}")
    assert not os.path.exists(tmp_path / "m")


def test_min_count_on_train_says_the_vocabulary_is_fixed_by_prepare_even_without_corpus(capsys):
    code, _, err = run(capsys, "train", "--min-count", "2")
    assert_clean_error(code, err, "--min-count is a prepare option", "vocabulary", "prepare", "--min-count 2")


@pytest.mark.parametrize("argv, needles", [
    (["train", "--workers", "4"], ["--workers", "--num-workers"]),
    (["plan", "--workers=4"], ["--workers", "--num-workers"]),
    (["train", "--vector_size", "50"], ["--vector_size", "--vector-size"]),
    (["baseline", "--ns_exponent", "0.5"], ["--ns_exponent", "--ns-exponent"]),
    (["train", "--iter", "5"], ["--iter", "--epochs"]),
    (["prepare", "events", "--out", "c", "--dim", "50"], ["--dim", "train"]),
])
def test_gensim_habits_get_one_line_that_names_our_flag(tmp_path, capsys, argv, needles):
    code, _, err = run(capsys, *argv, "--corpus" if argv[0] != "prepare" else "--seed",
                       str(tmp_path / "c") if argv[0] != "prepare" else "1")
    assert_clean_error(code, err, *needles)


# --- issue 26, item 7: gensim's names as YAML keys, prepare's keys in a trainer's YAML, switches -----------

GENSIM_HABITS = ["dm", "hs", "workers", "sg", "dm_mean", "dm_concat", "max_vocab_size", "max_final_vocab", "size",
                 "iter"]


@pytest.mark.parametrize("name", GENSIM_HABITS)
def test_a_gensim_name_gets_one_pointer_as_a_flag_and_as_a_yaml_key(tmp_path, capsys, name):
    """One table (config.GENSIM_NAMES) answers both, each in its own spelling; never the top-level usage."""
    from doc2vec_dist.config import gensim_pointer

    common = ["train", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "m")]
    for flag in ("--" + name.replace("_", "-"), "--" + name):
        code, _, err = run(capsys, *common, flag, "1")
        assert_clean_error(code, err, f"error: {flag} is gensim's name; doc2vec-dist train uses "
                                      f"{gensim_pointer(name, as_flags=True)}")
    config = tmp_path / "gensim.yaml"
    config.write_text(f"{name}: 1\nepochs: 3\n")
    code, _, err = run(capsys, *common, "--config", str(config))
    assert_clean_error(code, err, f"error: {config}: {name} is gensim's name; doc2vec-dist uses "
                                  f"{gensim_pointer(name, as_flags=False)}")
    assert not os.path.exists(tmp_path / "m")


def test_the_pointers_spell_our_settings_as_flags_and_as_keys():
    from doc2vec_dist.config import gensim_pointer

    assert gensim_pointer("dm", as_flags=True) == "--mode dm (or --mode dbow)"
    assert gensim_pointer("dm", as_flags=False) == "mode: dm (or mode: dbow)"
    assert gensim_pointer("--max-vocab-size", as_flags=True).startswith("prepare's --max-vocab")
    assert gensim_pointer("workers", as_flags=False) == "num_workers (worker actors) and cpus_per_worker (threads each)"
    assert gensim_pointer("window", as_flags=True) is None  # ours too


@pytest.mark.parametrize("command", ["train", "baseline", "plan"])
def test_a_prepare_key_in_a_trainers_yaml_gets_the_line_its_flag_gets(tmp_path, capsys, command):
    out = [] if command == "plan" else ["--out", str(tmp_path / "m")]
    common = [command, "--corpus", str(tmp_path / "c"), *out]
    code, _, err = run(capsys, *common, "--min-count", "50")
    flag_line = err.strip().removeprefix("error: ")
    config = tmp_path / "c.yaml"
    config.write_text("epochs: 3\nmin_count: 50\n")
    code, _, err = run(capsys, *common, "--config", str(config))
    assert_clean_error(code, err, f"error: {config}: min_count is a prepare option")
    assert err.strip().split(" is a prepare option", 1)[1] == flag_line.split(" is a prepare option", 1)[1]
    assert "--min-count 50, then " + command in err
    assert not os.path.exists(tmp_path / "m")


def test_a_whole_jobs_yaml_keeps_working_for_a_trainer_and_says_its_prepare_keys_are_the_jobs(tmp_path, capsys):
    """jobs/configs/sample.yaml holds prepare's keys for jobs/train.py: a trainer uses its training keys."""
    import argparse

    from doc2vec_dist.cli import _trainer_yaml

    sample = os.path.join(os.path.dirname(__file__), "..", "jobs", "configs", "sample.yaml")
    values = _trainer_yaml(argparse.Namespace(config=sample, command="train"))
    assert values == {"dim": 64, "epochs": 10, "sample": 0.0, "num_ps": 2, "num_workers": 1,
                      "dtype": "float32"}
    assert "prepare keys (time_col, min_count, holdout, holdout_out) are for jobs/train.py" in capsys.readouterr().err


@pytest.mark.parametrize("argv, expected", [
    (["--dbow_words", "1"], ("error: --dbow_words: flags are spelled with dashes here, and --dbow-words is a switch "
                             "that takes no value: write --dbow-words to turn it on")),
    (["--dbow-words", "1"], "error: --dbow-words is a switch and takes no value (given '1')"),
    (["--dbow-words", "0"], "error: --dbow-words is a switch and takes no value (given '0')"),
    (["--overwrite", "ture"], "error: --overwrite is a switch and takes no value (given 'ture')"),
    (["--resume=true"], "error: --resume is a switch and takes no value (given 'true')"),
])
def test_a_switch_given_a_value_is_one_line_whose_advice_works(tmp_path, capsys, argv, expected):
    from doc2vec_dist.cli import make_parser

    common = ["train", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "m")]
    code, _, err = run(capsys, *common, *argv)
    assert_clean_error(code, err, expected)
    advice = err.split(": write ", 1)[1].split()[0]  # the flag it says to write parses, and turns the switch on
    assert getattr(make_parser().parse_args([*common, advice]), advice[2:].replace("-", "_")) is True


def test_a_switch_followed_by_an_input_still_reads_the_input(tmp_path):
    from doc2vec_dist.cli import _parse_args

    args = _parse_args(["prepare", "--out", str(tmp_path / "c"), "--overwrite", "events.csv"])
    assert args.overwrite and args.inputs == ["events.csv"]


def test_an_unknown_flag_shows_the_commands_usage_not_the_top_level_one(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--corpus", str(tmp_path / "c"), "--out", str(tmp_path / "m"), "--bogus", "1"])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2
    assert err.startswith("usage: doc2vec-dist train ") and "doc2vec-dist train: error: unrecognized arguments: " \
        "--bogus 1" in err


def test_neighbors_prints_a_header_then_the_rows_of_model_neighbors(trained_model, capsys):
    from doc2vec_dist import Model
    from doc2vec_dist.modeldir import ModelDir

    key = ModelDir(trained_model).keys("docs")[3].as_py()
    for extra in ([], ["--against", "words_out"]):
        code, out, _ = run(capsys, "neighbors", "--model", trained_model, "--key", key, "--k", "4", *extra)
        assert code == 0
        table = Model.load(trained_model).neighbors(key, k=4, against=extra[1] if extra else None)
        lines = out.strip().splitlines()
        assert lines[0] == "key\tneighbor\tscore\trank" == "\t".join(table.column_names)
        assert lines[1:] == [f"{r['key']}\t{r['neighbor']}\t{r['score']:.4f}\t{r['rank']}" for r in table.to_pylist()]


def test_prepare_reads_the_directory_that_generate_wrote(tmp_path, capsys):
    gen = str(tmp_path / "gen")
    assert main(["generate", "--users", "200", "--urls", "100", "--out", gen, "--seed", "1", "--no-progress"]) == 0
    capsys.readouterr()
    code, _, err = run(capsys, "prepare", gen, "--out", str(tmp_path / "corpus"), "--no-progress")
    assert code == 0, err
    assert f"{gen}: a `generate` output; reading its events in {os.path.join(gen, 'events')}" in err.splitlines()
    # the same corpus as from its events directory: generate.json and truth/ were not read
    assert run(capsys, "prepare", os.path.join(gen, "events"), "--out", str(tmp_path / "direct"), "--no-progress")[0] == 0
    from doc2vec_dist.corpus import Corpus

    made, direct = Corpus(str(tmp_path / "corpus")), Corpus(str(tmp_path / "direct"))
    assert made.docs().equals(direct.docs()) and made.vocab().equals(direct.vocab())
    assert made.num_docs == pq.read_table(os.path.join(gen, "truth", "users.parquet")).num_rows

    # a directory that holds no events is still one clear line, naming the file and the column
    code, _, err = run(capsys, "prepare", os.path.join(gen, "truth"), "--out", str(tmp_path / "wrong"), "--no-progress")
    assert_clean_error(code, err, os.path.join(gen, "truth", "urls.parquet"), "column 'user_id' not found")
    assert not os.path.exists(tmp_path / "wrong")


def test_a_flag_given_twice_takes_the_last_and_its_gensim_name_beside_it_is_refused():
    # `--dim 8 --dim 16` was refused as "--dim and --vector-size (gensim's name) are one setting", which was
    # not given; any other flag given twice takes the last, as argparse does
    from doc2vec_dist.cli import _parse_args, _train_config
    from doc2vec_dist.errors import UserError

    args = _parse_args(["train", "--corpus", "c", "--out", "o", "--dim", "8", "--dim", "16", "--epochs", "2",
                        "--epochs", "3"])
    assert (args.dim, args.epochs) == (16, 3) and _train_config(args).dim == 16
    with pytest.raises(UserError, match=r"^--dim and --vector-size \(gensim's name\) are one setting, given both 8 "
                                        r"and 16; give one$"):
        _parse_args(["train", "--corpus", "c", "--out", "o", "--dim", "8", "--vector-size", "16"])
