"""`index --vectors` (a build or an update) refuses rows an index cannot serve, and `neighbors --index` says
when an approximate index found fewer than k rows for some queries.

Before: a key given twice was indexed twice (an update counted it as added, and neighbours answered it
twice), a null key was indexed (neighbours answered a null neighbour), a NaN element made its key vanish
from every answer, an all-zero vector scored 0 against everything; and a query an IVF-PQ index found too
few rows for got a short answer without a word. Small files, no Ray.
"""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist.cli import main
from doc2vec_dist.errors import UserError
from doc2vec_dist.index import ServedIndex, build_index
from doc2vec_dist.index_update import update_index
from doc2vec_dist.scoring import ServingWarning

DIM = 8
ROWS = 200


def table(rows: int = ROWS, seed: int = 0, prefix: str = "u") -> tuple[list[str], np.ndarray]:
    return [f"{prefix}{i}" for i in range(rows)], np.random.default_rng(seed).standard_normal((rows, DIM)).astype(
        np.float32)


def write(path, keys: list, vectors: np.ndarray, null_vectors: tuple[int, ...] = ()) -> str:
    """A key/vector Parquet as export and infer write it (rows in null_vectors get a null vector)."""
    mask = pa.array(np.isin(np.arange(len(keys)), null_vectors)) if null_vectors else None
    pq.write_table(pa.table({"key": pa.array(keys, pa.string()), "vector": pa.FixedSizeListArray.from_arrays(
        pa.array(vectors.ravel()), DIM, mask=mask)}), str(path))
    return str(path)


def run(capsys, *argv: str) -> tuple[int, list[str]]:
    code = main(list(argv))
    return code, capsys.readouterr().err.strip().splitlines()


@pytest.fixture
def good_index(tmp_path, capsys) -> str:
    keys, vectors = table()
    index = str(tmp_path / "old.index")
    assert main(["index", "--vectors", write(tmp_path / "good.parquet", keys, vectors), "--kind", "flat",
                 "--out", index, "--no-progress"]) == 0
    capsys.readouterr()
    return index


def refused(tmp_path, capsys, command: str, source: str, good_index: str) -> list[str]:
    """The stderr lines of `index` (command "build") or `index --update` (command "update") of `source`,
    which must exit 2 and leave --out unwritten."""
    out = str(tmp_path / "new.index")
    update = ["--update", good_index] if command == "update" else []
    code, err = run(capsys, "index", *update, "--vectors", source, "--out", out, "--no-progress")
    assert code == 2 and not os.path.exists(out)
    return err


# -- bug A: rows an index cannot serve ---------------------------------------------------------------------

@pytest.mark.parametrize("command", ["build", "update"])
def test_a_key_given_twice_is_refused_naming_both_rows(tmp_path, capsys, good_index, command):
    keys, vectors = table()
    src = write(tmp_path / "dup.parquet", keys + ["u0", "u7", "u7"], np.vstack([vectors, table(3, seed=1)[1]]))
    assert refused(tmp_path, capsys, command, src, good_index) == [
        (f"error: {src}: row 200 repeats key 'u0' of row 0 (column 'key'; 3 rows repeat an earlier key); an index "
        "holds one vector per key: give each key once")]


@pytest.mark.parametrize("command", ["build", "update"])
def test_a_null_key_is_refused(tmp_path, capsys, good_index, command):
    keys, vectors = table()
    keys[5] = keys[9] = None
    src = write(tmp_path / "nullkey.parquet", keys, vectors)
    assert refused(tmp_path, capsys, command, src, good_index) == [
        f"error: {src}: row 5 has no 'key' (2 rows have a null key); an index answers with keys: give every row one"]


@pytest.mark.parametrize("command", ["build", "update"])
def test_a_nan_or_inf_element_is_refused(tmp_path, capsys, good_index, command):
    keys, vectors = table()
    vectors[1, 3], vectors[150, 0], vectors[151] = np.nan, -np.inf, np.nan
    src = write(tmp_path / "nan.parquet", keys, vectors)
    assert refused(tmp_path, capsys, command, src, good_index) == [
        (f"error: {src}: row 1 (key 'u1') has nan at element 3 of its 'vector' (3 rows hold NaN or inf); cosine needs "
        "finite vectors: drop those rows, or give them a null vector (the index leaves such rows out)")]


@pytest.mark.parametrize("command", ["build", "update"])
def test_an_all_zero_vector_is_left_out_and_named_as_a_null_one_is(tmp_path, capsys, good_index, command):
    """A row never trained (an export of words_out holds one for each URL seen only in held-out pairs) has no
    direction: it scored 0 against everything. It is left out, named, as a null vector is."""
    keys, vectors = table()
    vectors[0] = 0.0
    vectors[199] = -0.0
    src = write(tmp_path / "zero.parquet", keys, vectors, null_vectors=(5,))
    out = str(tmp_path / "new.index")
    update = ["--update", good_index] if command == "update" else []
    code, err = run(capsys, "index", *update, "--vectors", src, "--out", out, "--kind", "flat", "--no-progress")
    assert code == 0
    assert f"warning: {src}: 3 rows with a null or all-zero vector (users infer could not place, rows never trained) " \
           "left out of the index: u0, u5, u199" in err
    indexed = pq.read_table(os.path.join(out, "keys.parquet")).column("key")
    assert sorted(k for k in indexed.to_pylist() if k) == sorted(set(keys) - {"u0", "u5", "u199"})


def test_the_row_named_is_the_files_own_and_counts_cover_every_file(tmp_path, capsys, good_index):
    """A dataset of two files: the row named is the row in its file (null vectors before it counted), the
    count is over the dataset; a key repeated across files names both files."""
    keys, vectors = table()
    folder = tmp_path / "users"
    folder.mkdir()
    write(folder / "part-0.parquet", keys[:100], vectors[:100], null_vectors=(3,))
    bad = vectors[100:].copy()
    bad[[40, 60]] = np.inf  # rows 40 and 60 of part-1; 41 and 42 have a null vector
    part1 = write(folder / "part-1.parquet", keys[100:], bad, null_vectors=(10, 41, 42))
    assert refused(tmp_path, capsys, "build", str(folder), good_index) == [
        (f"error: {part1}: row 40 (key 'u140') has inf at element 0 of its 'vector' (2 rows of {folder} hold NaN or "
        "inf); cosine needs finite vectors: drop those rows, or give them a null vector (the index leaves such rows "
        "out)")]

    part1 = write(folder / "part-1.parquet", keys[100:150] + ["u3"] + keys[151:], vectors[100:])
    assert refused(tmp_path, capsys, "build", str(folder), good_index) == [
        (f"error: {part1}: row 50 repeats key 'u3' of row 3 of {folder / 'part-0.parquet'} (column 'key'; 1 row of "
        f"{folder} repeats an earlier key); an index holds one vector per key: give each key once")]


def test_an_update_of_a_key_given_twice_leaves_the_old_index_whole(tmp_path, good_index, snapshot):
    """Before, an update from a file with a key twice said "1 added" and gave that key a second id."""
    keys, vectors = table()
    src = write(tmp_path / "dup.parquet", keys + ["u42"], np.vstack([vectors, vectors[:1]]))
    before = snapshot(good_index)
    with pytest.raises(UserError, match=r"row 200 repeats key 'u42' of row 42 ") as err:
        update_index(good_index, good_index, vectors_path=src, progress=False)
    assert "\n" not in str(err.value)
    assert snapshot(good_index) == before


def test_null_vectors_are_still_left_out_and_a_clean_file_indexes_every_row(tmp_path, logged):
    keys, vectors = table()
    index = str(tmp_path / "users.index")
    params = build_index(index, kind="flat", vectors_path=write(tmp_path / "users.parquet", keys, vectors, (7,)),
                         progress=False)
    assert (params["rows"], params["null_vectors"]) == (ROWS - 1, 1)
    assert "left out of the index: u7" in logged.text
    assert pq.read_table(os.path.join(index, "keys.parquet")).column("key").to_pylist() == keys[:7] + keys[8:]


# -- bug B: a short answer from an approximate index ---------------------------------------------------------

@pytest.fixture
def narrow_ivfpq(small_models, tmp_path) -> tuple[str, str]:
    """(model, its ivfpq index searching 1 of its 4 lists): the lists hold 70 to 79 of the 300 users."""
    model = small_models.make(tmp_path / "model", 1, rows=300)
    index = str(tmp_path / "users.index")
    assert build_index(index, kind="ivfpq", model=model, progress=False)["nlist"] == 4
    set_search(index, 1)
    return model, index


def set_search(index: str, value: int) -> None:
    path = os.path.join(index, "params.json")
    with open(path) as fh:
        params = json.load(fh)
    params["search"] = value
    with open(path, "w") as fh:
        json.dump(params, fh)


def test_neighbors_says_how_many_queries_an_ivfpq_index_answered_short(narrow_ivfpq, tmp_path, capsys):
    model, index = narrow_ivfpq
    keys_file, out = str(tmp_path / "keys.parquet"), str(tmp_path / "neighbors.parquet")
    pq.write_table(pa.table({"key": [f"u{i}" for i in range(300)]}), keys_file)
    code, err = run(capsys, "neighbors", "--model", model, "--keys-file", keys_file, "--index", index, "--k", "75",
                    "--out", out)
    assert code == 0
    got = pq.read_table(out).group_by("key").aggregate([("neighbor", "count")]).column("neighbor_count").to_numpy()
    short = got[got < 75]
    assert len(got) == 300 and 0 < len(short) < 300  # the answer is what was found: nothing made up
    assert err == [
        (f"warning: {index}: {len(short)} of 300 queries got fewer than the 75 neighbours asked of this ivfpq index "
        f"(the fewest: {short.min()}), so their answers are short: "
        f"it searches nprobe 1 of its 4 lists, which hold too few rows near those queries; raise \"search\" in "
        f"{os.path.join(index, 'params.json')} (the nprobe a load uses), or index with --kind flat, which always "
        "finds k")]

    # the knob it names: every list searched, every query gets its 75, and nothing is said
    set_search(index, 4)
    code, err = run(capsys, "neighbors", "--model", model, "--keys-file", keys_file, "--index", index, "--k", "75",
                    "--out", out)
    assert code == 0 and err == []
    assert pq.read_table(out).num_rows == 300 * 75


def test_a_full_answer_and_measuring_recall_say_nothing(narrow_ivfpq, small_models, tmp_path):
    model, index = narrow_ivfpq
    served = ServedIndex.load(index)
    queries = np.random.default_rng(3).standard_normal((50, small_models.DIM)).astype(np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert (served.search(queries, 5)[1] >= 0).all()  # 5 rows: every list holds them
        served.search(queries, 200, warn_short=False)  # how _measure asks, tuning nprobe
        build_index(str(tmp_path / "again.index"), kind="ivfpq", model=model, progress=False)
    with pytest.warns(ServingWarning, match=rf"^{index}: \d+ of 50 queries got fewer than the 200 neighbours asked"):
        served.search(queries, 200)
