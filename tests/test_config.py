"""config.py: every field with choices is checked where a config is made, and one width for a table's rows."""

import dataclasses
from types import SimpleNamespace

import pytest

from doc2vec_dist.config import SECTIONS, TableSpec, TrainConfig, build
from doc2vec_dist.errors import UserError
from doc2vec_dist.ps import table_specs

CHOICE_FIELDS = [(cls, f.name, f.metadata["choices"]) for cls in SECTIONS for f in dataclasses.fields(cls)
                 if f.metadata.get("choices")]


def test_the_choice_fields_are_the_ones_with_choices():
    assert {(cls.__name__, name) for cls, name, _ in CHOICE_FIELDS} == {
        ("PrepareConfig", "format"), ("PrepareConfig", "time_unit"), ("PrepareConfig", "engine"), ("TrainConfig", "mode"),
        ("TrainConfig", "optimizer"), ("TrainConfig", "kernel"), ("TrainConfig", "first_epoch"),
        ("TrainConfig", "schedule"), ("TrainConfig", "dtype"), ("TrainConfig", "rounding"),
        ("TrainConfig", "device_rows")}


@pytest.mark.parametrize("cls, name, choices", CHOICE_FIELDS, ids=[f"{c.__name__}.{n}" for c, n, _ in CHOICE_FIELDS])
def test_a_bad_choice_is_one_line_naming_the_field(cls, name, choices):
    line = f"bad value for {name}: 'bogus' (choose from {', '.join(choices)})"
    with pytest.raises(UserError) as built:  # a library caller building the config
        cls(**{name: "bogus"})
    assert str(built.value) == line
    with pytest.raises(UserError) as loaded:  # YAML and flags go through build()
        build(cls, {name: "bogus"})
    assert str(loaded.value) == line
    for good in choices:
        assert getattr(cls(**{name: good}), name) == good


@pytest.mark.parametrize("fields, message", [
    ({"dim": 0}, "dim must be > 0"), ({"epochs": 0}, "epochs must be > 0"),
    ({"negative": 0}, "negative must be > 0"), ({"window": 0}, "window must be > 0"),
    ({"alpha": 0}, "alpha must be > 0"), ({"min_alpha": 1.0}, "min_alpha must lie in [0, alpha]"),
])
def test_a_config_no_run_could_train_is_refused_when_it_is_made(fields, message):
    with pytest.raises(UserError, match=r"^bad training config: " + message.replace("[", r"\[").replace("]", r"\]")):
        TrainConfig(**fields)
    with pytest.raises(UserError, match="dim must be > 0"):  # a copy with a bad field, too
        dataclasses.replace(TrainConfig(), dim=-1)


def test_a_field_assigned_after_construction_is_checked_by_validate():
    config = TrainConfig()
    config.epochs = 0
    with pytest.raises(UserError, match="epochs must be > 0"):
        config.validate()


@pytest.mark.parametrize("optimizer, width", [("sgd", 16), ("adagrad", 17)])
def test_a_tables_width_is_its_vector_and_the_optimisers_state(optimizer, width):
    config = TrainConfig(dim=16, optimizer=optimizer, mode="dm")
    tables = table_specs(config, SimpleNamespace(num_docs=10, vocab_size=7))
    assert list(tables) == ["docs", "words", "words_out"]
    assert {name: (t.name, t.rows, t.width) for name, t in tables.items()} == {
        "docs": ("docs", 10, width), "words": ("words", 7, width), "words_out": ("words_out", 7, width)}
    assert [t.init for t in tables.values()] == ["uniform", "uniform", "zeros"]
    assert TableSpec("x", 5, 16).width == 16 and TableSpec("x", 5, 16, state=1).width == 17


def test_a_table_spec_is_listed_in_a_plan_as_before():
    spec = TrainConfig(dim=8, optimizer="adagrad").table("words_out", 3, init="zeros")
    assert spec.to_json() == {"rows": 3, "dim": 8, "init": "zeros", "state": 1}
    assert TableSpec.from_json("words_out", spec.to_json()) == spec


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_table_is_half_the_bytes_with_its_accumulator_float32(dtype):
    spec = TrainConfig(dim=8, optimizer="adagrad", dtype=dtype).table("words_out", 3, init="zeros")
    assert spec.dtype == dtype and spec.width == 9  # the worker's float32 matrices are as wide as ever
    assert spec.row_bytes == 8 * 2 + 4 and TrainConfig(dim=8, optimizer="adagrad").table("x", 3).row_bytes == 36
    assert spec.to_json()["dtype"] == dtype and TableSpec.from_json("words_out", spec.to_json()) == spec


# --- issue 26, item 13: values are checked against their field's type, not coerced ------------------------

@pytest.mark.parametrize("text, message", [
    ("dim: 100.7", "bad value for dim: 100.7 (a whole number expected)"),  # was 100
    ("dim: true", "bad value for dim: True (a whole number expected)"),  # was 1
    ("overwrite: ture", "bad value for overwrite: 'ture' (true or false expected)"),  # was False
    ("epochs: '10'", "bad value for epochs: '10' (a whole number expected)"),
    ("alpha: false", "bad value for alpha: False (a number expected)"),
    ("time_col: 3", "bad value for time_col: 3 (text or null expected)"),
    ("mode: 1", "bad value for mode: 1 (one of dbow, dm expected)"),
    ("input: [a, 2]", "bad value for input: ['a', 2] (a path or a list of paths expected)"),
])
def test_a_yaml_value_of_the_wrong_type_is_refused_naming_the_file_and_key(tmp_path, text, message):
    from doc2vec_dist.config import load_yaml

    path = tmp_path / "c.yaml"
    path.write_text(text + "\n")
    with pytest.raises(UserError) as refused:
        load_yaml(str(path))
    assert str(refused.value) == f"{path}: {message}"


def test_a_library_caller_gets_the_same_check_and_what_loses_nothing_is_converted(tmp_path):
    import pathlib

    import numpy as np

    from doc2vec_dist.config import JobConfig, PrepareConfig, load_yaml

    with pytest.raises(UserError, match=r"^bad value for dim: 100.7 \(a whole number expected\)$"):
        TrainConfig(dim=100.7)
    with pytest.raises(UserError, match=r"^bad value for dbow_words: 'yes' \(true or false expected\)$"):
        TrainConfig(dbow_words="yes")
    config = TrainConfig(dim=np.int64(16), sample=0, alpha=np.float64(0.05), dbow_words=1,
                         init_from=pathlib.Path("m"))
    assert (config.dim, type(config.dim), config.sample, type(config.sample)) == (16, int, 0.0, float)
    assert (config.alpha, config.dbow_words, config.init_from) == (0.05, True, "m")  # gensim writes dbow_words=1
    assert JobConfig(input="events").input == ["events"]
    assert PrepareConfig(max_vocab=None).max_vocab is None
    config.dim = 8.5  # assigned after construction: validate() checks it
    with pytest.raises(UserError, match="bad value for dim: 8.5"):
        config.validate()
    path = tmp_path / "c.yaml"
    path.write_text("dbow_words: 1\nsample: 0\nmin_alpha: 1e-4\n")  # PyYAML reads 1e-4 as text: still a number
    assert load_yaml(str(path)) == {"dbow_words": True, "sample": 0.0, "min_alpha": 1e-4}
    path.write_text("dim: 1e2\n")
    with pytest.raises(UserError, match=r"bad value for dim: '1e2' \(a whole number expected\)"):
        load_yaml(str(path))


# --- issue 47: an unknown YAML key gets the closest known key, as argparse gives for a flag -------------------

@pytest.mark.parametrize("key, meant", [("epochz", "epochs"), ("min_alfa", "min_alpha"), ("num-worker", "num_workers"),
                                        ("vector_sise", "vector_size")])
def test_an_unknown_yaml_key_names_the_closest_known_key(tmp_path, key, meant):
    from doc2vec_dist.config import load_yaml

    path = tmp_path / "c.yaml"
    path.write_text(f"{key}: 3\n")
    with pytest.raises(UserError) as err:
        load_yaml(str(path))
    assert str(err.value) == f"{path}: unknown config key(s): {key.replace('-', '_')} (did you mean '{meant}'?)"


def test_an_unknown_yaml_key_like_none_gets_no_guess_and_every_unknown_key_is_named(tmp_path):
    from doc2vec_dist.config import load_yaml

    path = tmp_path / "c.yaml"
    path.write_text("zzqx: 1\nepochz: 3\n")
    with pytest.raises(UserError) as err:
        load_yaml(str(path))
    assert str(err.value) == f"{path}: unknown config key(s): epochz (did you mean 'epochs'?), zzqx"


def test_a_search_space_key_that_is_no_setting_names_the_closest_one():
    from doc2vec_dist.search_space import tune_space

    with pytest.raises(UserError, match=r"^space.yaml: 'epochz' is not a training setting \(TrainConfig field\); "
                                        r"did you mean 'epochs'\?$"):
        tune_space({"epochz": {"choice": [1, 2]}}, where="space.yaml")
