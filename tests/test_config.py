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
        ("PrepareConfig", "format"), ("PrepareConfig", "time_unit"), ("TrainConfig", "mode"),
        ("TrainConfig", "optimizer"), ("TrainConfig", "kernel"), ("TrainConfig", "first_epoch")}


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
