"""`index --update`: a faiss index brought to a refreshed table without a rebuild, on real faiss and files.

The sources are (key, vector) Parquet files written here: clustered vectors (like users of a few
interest communities), then a refresh of them with keys removed, keys added, vectors replaced, and
vectors only rescaled (the same direction: unchanged once normalised).
"""

from __future__ import annotations

import json
import os
import re

import faiss
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist.errors import UserError
from doc2vec_dist.index import ServedIndex, build_index
from doc2vec_dist.index_update import update_index

DIM = 24
ROWS = 3000
CENTERS = np.random.default_rng(7).standard_normal((40, DIM))


def clustered(rng: np.random.Generator, rows: int) -> np.ndarray:
    return (CENTERS[rng.integers(len(CENTERS), size=rows)] + 0.4 * rng.standard_normal((rows, DIM))).astype(np.float32)


def unit(vectors: np.ndarray) -> np.ndarray:
    return (vectors / np.linalg.norm(vectors, axis=1, keepdims=True)).astype(np.float32)


def write_source(path: str, table: dict[str, np.ndarray], nulls: frozenset[str] = frozenset()) -> str:
    """A key/vector Parquet of `table`; the keys in `nulls` get a null vector (what infer writes for a user it
    cannot place)."""
    keys, vectors = list(table), np.stack(list(table.values())).astype(np.float32)
    mask = pa.array([k in nulls for k in keys]) if nulls else None
    pq.write_table(pa.table({"key": keys, "vector": pa.FixedSizeListArray.from_arrays(
        pa.array(vectors.ravel()), vectors.shape[1], mask=mask)}), path)
    return path


def refresh(table: dict[str, np.ndarray], seed: int, removed: int, replaced: int, added: int, rescaled: int,
            back: list[str] = ()) -> tuple[dict[str, np.ndarray], dict[str, list[str]]]:
    """A day's refresh of `table`: some keys gone, some vectors new, some only rescaled, new keys at
    the end (and `back`: keys removed earlier that return). Returns the new table and the keys of each."""
    rng = np.random.default_rng(seed)
    keys = list(table)
    picked = rng.permutation(len(keys))
    cut = np.cumsum([removed, replaced, rescaled])
    what = {"removed": [keys[i] for i in picked[:cut[0]]], "replaced": [keys[i] for i in picked[cut[0]:cut[1]]],
            "rescaled": [keys[i] for i in picked[cut[1]:cut[2]]]}
    new = {k: v for k, v in table.items() if k not in set(what["removed"])}
    for k, v in zip(what["replaced"], clustered(rng, replaced)):
        new[k] = v
    for k in what["rescaled"]:
        new[k] = table[k] * np.float32(3.0)  # the same direction, so the same normalised vector (to a few ulps)
    what["added"] = [f"new{seed}-{i}" for i in range(added)] + list(back)
    for k, v in zip(what["added"], clustered(rng, len(what["added"]))):
        new[k] = v
    return new, what


@pytest.fixture(scope="module")
def day0() -> dict[str, np.ndarray]:
    return dict(zip([f"u{i}" for i in range(ROWS)], clustered(np.random.default_rng(0), ROWS)))


@pytest.fixture(scope="module")
def day1(day0):
    return refresh(day0, seed=1, removed=100, replaced=150, added=200, rescaled=50)


def read_keys(index_dir: str) -> list[str | None]:
    return pq.read_table(os.path.join(index_dir, "keys.parquet")).column("key").to_pylist()


def read_params(index_dir: str) -> dict:
    with open(os.path.join(index_dir, "params.json")) as fh:
        return json.load(fh)


def search_keys(index_dir: str, queries: np.ndarray, k: int) -> tuple[list[list[str]], np.ndarray]:
    served = ServedIndex.load(index_dir)
    scores, found = served.search(queries, k)
    keys = served.keys.to_pylist()
    return [[keys[i] for i in row if i >= 0] for row in found], scores


def exact_neighbours(table: dict[str, np.ndarray], queries: list[str], k: int) -> list[set[str]]:
    keys = list(table)
    matrix = unit(np.stack(list(table.values())))
    scores = unit(np.stack([table[q] for q in queries])) @ matrix.T
    return [{keys[i] for i in np.argsort(-row)[:k + 1]} - {q} for q, row in zip(queries, scores)]


def recall_vs_exact(index_dir: str, table: dict[str, np.ndarray], queries: list[str]) -> float:
    found, _ = search_keys(index_dir, unit(np.stack([table[q] for q in queries])), 11)
    exact = exact_neighbours(table, queries, 10)
    return float(np.mean([len((set(f) - {q}) & e) / 10 for q, f, e in zip(queries, found, exact)]))


def ivf_ids(index: faiss.IndexIVF) -> np.ndarray:
    """Every id stored in an IVF index's lists."""
    lists = index.invlists
    return np.sort(np.concatenate([faiss.rev_swig_ptr(lists.get_ids(i), lists.list_size(i)).copy()
                                   for i in range(index.nlist) if lists.list_size(i)]))


def assert_ids_are_rows(index_dir: str, table: dict[str, np.ndarray]) -> dict[str, int]:
    """faiss id i = row i of keys.parquet (= row i of vectors.npy): every live id holds its key's
    normalised vector, every key of the source has one live id, dead ids are null keys that no
    search returns. Returns key → id."""
    keys, params = read_keys(index_dir), read_params(index_dir)
    live = np.array([k is not None for k in keys])
    id_of = {k: i for i, k in enumerate(keys) if k is not None}
    assert len(id_of) == live.sum() == len(table) == params["rows"]  # each key once
    assert set(id_of) == set(table)
    assert params.get("ids", len(keys)) == len(keys) and params.get("dead", 0) == (~live).sum()
    wanted = unit(np.stack([table[k] for k in keys if k is not None]))
    index = faiss.read_index(os.path.join(index_dir, "index.faiss"))
    if params["kind"] == "ivfpq":
        np.testing.assert_array_equal(ivf_ids(index), np.flatnonzero(live))  # dead ids were removed from faiss
        stored = np.load(os.path.join(index_dir, "vectors.npy"))
        assert stored.shape == (len(keys), DIM) and not stored[~live].any()
    else:
        assert index.ntotal == len(keys)  # dead ids stay in faiss, kept out of results at search time
        stored = index.reconstruct_n(0, index.ntotal)
    np.testing.assert_allclose(stored[live], wanted, atol=1e-6)
    # every live row finds itself; no search returns a dead id
    served = ServedIndex.load(index_dir)
    _, found = served.search(wanted, 10)
    assert live[found[found >= 0]].all()
    assert np.mean([i in row for i, row in zip(np.flatnonzero(live), found)]) >= 0.99
    return id_of


@pytest.mark.parametrize("kind", ["ivfpq", "hnsw"])
def test_an_update_holds_what_a_rebuild_from_the_new_source_holds(day0, day1, tmp_path, kind):
    new, what = day1
    old_src, new_src = write_source(str(tmp_path / "day0.parquet"), day0), write_source(str(tmp_path / "day1.parquet"), new)
    old, updated, rebuilt = (str(tmp_path / name) for name in ("old", "updated", "rebuilt"))
    build_index(old, kind=kind, vectors_path=old_src, progress=False)
    params = update_index(old, updated, vectors_path=new_src, progress=False)
    build_index(rebuilt, kind=kind, vectors_path=new_src, progress=False)

    assert params == read_params(updated)
    assert {name: params["update"][name] for name in ("added", "replaced", "removed", "unchanged")} == {
        "added": 200, "replaced": 150, "removed": 100, "unchanged": ROWS - 100 - 150}  # the rescaled 50 unchanged
    assert params["rows"] == read_params(rebuilt)["rows"] == ROWS + 100
    assert params["recall_at_10_vs_exact"] >= params["target_recall"] - 0.01 and params["warning"] is None
    assert params["update"]["from"] == old and params["update"]["warning"] is None
    assert sorted(os.listdir(tmp_path)) == ["day0.parquet", "day1.parquet", "old", "rebuilt", "updated"]
    assert_ids_are_rows(updated, new)

    # against numpy's exact cosine on the new vectors, the update finds what the rebuild finds
    queries = list(new)[::15]
    recall_updated, recall_rebuilt = recall_vs_exact(updated, new, queries), recall_vs_exact(rebuilt, new, queries)
    assert recall_updated >= 0.95 and abs(recall_updated - recall_rebuilt) <= 0.03, (recall_updated, recall_rebuilt)

    # a replaced key's new vector finds that key first; an added key's finds it too
    probe = what["replaced"] + what["added"]
    found, scores = search_keys(updated, unit(np.stack([new[k] for k in probe])), 1)
    assert [f[0] for f in found] == probe
    np.testing.assert_allclose(scores[:, 0], 1.0, atol=1e-5)
    # a removed key is never returned, not even for its own old vector
    found, _ = search_keys(updated, unit(np.stack([day0[k] for k in what["removed"]] + list(new.values())[::10])), 20)
    assert not {k for row in found for k in row} & set(what["removed"])


def test_unchanged_rows_keep_their_ids_and_bits_and_nothing_is_trained_again(day0, day1, tmp_path):
    new, what = day1
    old, updated = str(tmp_path / "old"), str(tmp_path / "updated")
    build_index(old, kind="ivfpq", vectors_path=write_source(str(tmp_path / "day0.parquet"), day0), progress=False)
    update_index(old, updated, vectors_path=write_source(str(tmp_path / "day1.parquet"), new), progress=False)

    old_keys, new_keys = read_keys(old), read_keys(updated)
    assert new_keys[:ROWS] == [None if k in set(what["removed"]) else k for k in old_keys]  # same ids, same rows
    assert new_keys[ROWS:] == what["added"]  # new keys after the old ones, in source order
    before = np.load(os.path.join(old, "vectors.npy"))
    after = np.load(os.path.join(updated, "vectors.npy"))
    rescaled = [old_keys.index(k) for k in what["rescaled"]]
    # a rescaled vector normalises to within a few ulps: counted unchanged, its stored row left bit for bit
    assert np.abs(unit(np.stack([new[k] for k in what["rescaled"]])) - before[rescaled]).max() <= 1e-6
    assert after[rescaled].tobytes() == before[rescaled].tobytes()
    replaced = [old_keys.index(k) for k in what["replaced"]]
    np.testing.assert_allclose(after[replaced], unit(np.stack([new[k] for k in what["replaced"]])), atol=1e-6)

    # the coarse quantizer and the product quantizer are the old index's, not trained again
    a, b = (faiss.read_index(os.path.join(d, "index.faiss")) for d in (old, updated))
    np.testing.assert_array_equal(a.quantizer.reconstruct_n(0, a.nlist), b.quantizer.reconstruct_n(0, b.nlist))
    np.testing.assert_array_equal(faiss.vector_to_array(a.pq.centroids), faiss.vector_to_array(b.pq.centroids))


@pytest.mark.parametrize("kind", ["ivfpq", "hnsw"])
def test_an_update_from_the_same_source_changes_nothing(day0, tmp_path, kind):
    src, old, same = write_source(str(tmp_path / "day0.parquet"), day0), str(tmp_path / "old"), str(tmp_path / "same")
    built = build_index(old, kind=kind, vectors_path=src, progress=False)
    params = update_index(old, same, vectors_path=src, progress=False)

    assert {name: params["update"][name] for name in ("added", "replaced", "removed", "unchanged")} == {
        "added": 0, "replaced": 0, "removed": 0, "unchanged": ROWS}
    assert (params["rows"], params["ids"], params["dead"]) == (ROWS, ROWS, 0)
    assert read_keys(same) == read_keys(old)
    assert params["search"] == built["search"]  # tuned again on the same sample, to the same setting
    with open(os.path.join(old, "index.faiss"), "rb") as a, open(os.path.join(same, "index.faiss"), "rb") as b:
        assert a.read() == b.read()  # nothing removed, added or encoded
    if kind == "ivfpq":
        with open(os.path.join(old, "vectors.npy"), "rb") as a, open(os.path.join(same, "vectors.npy"), "rb") as b:
            assert a.read() == b.read()


@pytest.mark.parametrize("kind", ["ivfpq", "hnsw"])
def test_ids_stay_rows_of_keys_over_two_updates(day0, day1, tmp_path, kind):
    day2, what2 = refresh(day1[0], seed=2, removed=60, replaced=120, added=80, rescaled=30, back=day1[1]["removed"][:10])
    assert set(what2["replaced"]) & set(day1[1]["replaced"])  # some keys change on both days
    indexes = [str(tmp_path / f"day{d}.index") for d in range(3)]
    build_index(indexes[0], kind=kind, vectors_path=write_source(str(tmp_path / "day0.parquet"), day0), progress=False)
    for d, table in ((1, day1[0]), (2, day2)):
        src = write_source(str(tmp_path / f"day{d}.parquet"), table)
        params = update_index(indexes[d - 1], indexes[d], vectors_path=src, progress=False)
    assert params["update"]["added"] == 90 and params["update"]["removed"] == 60  # 10 came back: added again

    ids = [assert_ids_are_rows(path, table) for path, table in zip(indexes, (day0, day1[0], day2))]
    steady = set(day0) - set(day1[1]["removed"]) - set(day1[1]["replaced"]) - set(what2["removed"]) \
        - set(what2["replaced"])
    assert all(ids[0][k] == ids[1][k] == ids[2][k] for k in steady)  # a key that stays keeps its id
    for k in what2["replaced"]:  # ivfpq: the same id, its vector replaced; hnsw: a new id after the old ones
        assert (ids[2][k] == ids[1][k]) if kind == "ivfpq" else (ids[2][k] >= len(read_keys(indexes[1])))
    # ivfpq: ids for added keys only, dead ids for removed ones; hnsw: also a new id and a dead one per replaced key
    expected = {"ivfpq": (ROWS + 200 + 90, 100 + 60), "hnsw": (ROWS + 350 + 210, 250 + 180)}[kind]
    assert (params["ids"], params["dead"]) == expected and params["rows"] == len(day2) == expected[0] - expected[1]


def test_flat_update_answers_exactly_and_drops_its_dead_ids(day0, day1, tmp_path, logged):
    """faiss's flat index removes ids (remove_ids, renumbering those after them), so an update of a flat index
    leaves no dead id: keys.parquet loses the same rows (issue 47)."""
    new, _ = day1
    old, updated = str(tmp_path / "old"), str(tmp_path / "updated")
    build_index(old, kind="flat", vectors_path=write_source(str(tmp_path / "day0.parquet"), day0), progress=False)
    params = update_index(old, updated, vectors_path=write_source(str(tmp_path / "day1.parquet"), new),
                          progress=False, report=True)
    assert (params["kind"], params["update"]["replaced"], params["dead"], params["ids"], params["rows"]) == (
        "flat", 150, 0, ROWS + 100, ROWS + 100)
    assert params["update"]["dropped"] == 250 and params["update"]["dead_share"] == 0
    assert None not in read_keys(updated)
    assert any(m.startswith(f"updated from {old}: 200 added, 150 replaced, 100 removed, 2,750 unchanged in ") and
               m.endswith("(then recall measured); 250 dead ids dropped (flat removes them): none left")
               for m in logged.messages), logged.messages
    assert_ids_are_rows(updated, new)
    queries = list(new)[::20]
    found, _ = search_keys(updated, unit(np.stack([new[q] for q in queries])), 11)
    assert [set(f) - {q} for q, f in zip(queries, found)] == exact_neighbours(new, queries, 10)


def test_an_update_in_place_swaps_in_at_the_end_and_a_failure_leaves_the_old_index(day0, day1, tmp_path, snapshot,
                                                                                 monkeypatch, logged):
    from doc2vec_dist import index_update as index_module

    index = str(tmp_path / "users.index")
    build_index(index, kind="hnsw", vectors_path=write_source(str(tmp_path / "day0.parquet"), day0), progress=False)
    new_src = write_source(str(tmp_path / "day1.parquet"), day1[0])
    before = snapshot(index)

    def crash(*args, **kwargs):
        raise RuntimeError("killed while adding")

    added = index_module._add_rows
    monkeypatch.setattr(index_module, "_add_rows", crash)
    with pytest.raises(RuntimeError, match="killed while adding"):
        update_index(index, index, vectors_path=new_src, progress=False)
    assert snapshot(index) == before  # the old index, whole
    assert sorted(os.listdir(tmp_path)) == ["day0.parquet", "day1.parquet", "users.index"]  # no temporary left

    # only the crash is undone: `logged` patched the logger too, and undo() would take that back as well
    monkeypatch.setattr(index_module, "_add_rows", added)
    logged.clear()
    params = update_index(index, index, vectors_path=new_src, progress=False, report=True)
    assert read_params(index) == params and params["update"]["added"] == 200
    assert f"replacing the index at {index}" in logged.messages
    assert any(m.startswith(f"updated from {index}: 200 added, 150 replaced, 100 removed, 2,750 unchanged in ")
               for m in logged.messages)
    assert sorted(os.listdir(tmp_path)) == ["day0.parquet", "day1.parquet", "users.index"]
    assert_ids_are_rows(index, day1[0])


def test_refusals_name_the_path_and_touch_nothing(day0, tmp_path, snapshot):
    src = write_source(str(tmp_path / "day0.parquet"), day0)
    index = str(tmp_path / "users.index")
    build_index(index, kind="hnsw", vectors_path=src, progress=False)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("my notes")
    narrow = write_source(str(tmp_path / "dim16.parquet"), {k: v[:16] for k, v in list(day0.items())[:100]})
    keyless = str(tmp_path / "keyless.parquet")
    pq.write_table(pa.table({"key": pa.array(["a", None], pa.string()), "vector": pa.FixedSizeListArray.from_arrays(
        pa.array(np.ones(2 * DIM, np.float32)), DIM)}), keyless)
    out = str(tmp_path / "out")
    before = {p: snapshot(str(tmp_path / p)) for p in os.listdir(tmp_path)}

    cases = [
        ({"old": str(mine), "out": out, "vectors_path": src}, rf"{mine}: not an index made by doc2vec-dist \(it holds notes.txt\)"),
        ({"old": str(tmp_path / "gone"), "out": out, "vectors_path": src}, rf"{tmp_path / 'gone'}: does not exist"),
        ({"old": src, "out": out, "vectors_path": src}, rf"{src}: is not a directory"),
        ({"old": index, "out": out, "vectors_path": narrow},
         rf"{index}: indexes 24-dim vectors but {narrow} has 16 dims"),
        ({"old": index, "out": out, "vectors_path": src, "kind": "ivfpq"},
         rf"{index}: --update keeps the old index's kind \(hnsw\); drop --kind ivfpq"),
        ({"old": index, "out": str(mine), "vectors_path": src}, rf"{mine}: exists and is not a faiss index"),
        ({"old": index, "out": out, "vectors_path": keyless}, rf"{keyless}: row 1 has no 'key' \(1 row has a null key\)"),
    ]
    for kwargs, message in cases:
        with pytest.raises(UserError, match=message) as err:
            update_index(progress=False, **kwargs)
        assert "\n" not in str(err.value)
    assert {p: snapshot(str(tmp_path / p)) for p in os.listdir(tmp_path)} == before  # nothing written, nothing changed
    # the old index's own kind, or auto, is no conflict
    assert update_index(index, out, vectors_path=src, kind="auto", progress=False)["kind"] == "hnsw"
    assert update_index(index, out, vectors_path=src, kind="hnsw", progress=False)["kind"] == "hnsw"


def test_many_dead_ids_say_to_rebuild(day0, tmp_path, logged):
    old = str(tmp_path / "old")
    build_index(old, kind="hnsw", vectors_path=write_source(str(tmp_path / "day0.parquet"), day0), progress=False)
    new, _ = refresh(day0, seed=3, removed=300, replaced=1200, added=0, rescaled=0)
    params = update_index(old, str(tmp_path / "new"), vectors_path=write_source(str(tmp_path / "new.parquet"), new),
                          progress=False, report=True)
    assert params["dead"] == 1500 and params["update"]["dead_share"] == pytest.approx(1500 / 4200, abs=1e-4)
    assert "1,500 of 4,200 ids (36%) are dead" in params["update"]["warning"]
    assert f"warning: {params['update']['warning']}" in logged.messages
    assert "rebuild the index" in params["update"]["warning"]


def test_an_update_that_ends_below_its_target_warns_as_a_build_does(tmp_path, logged):
    # identical rows tie, and exact search and HNSW break ties differently: recall stays below 1.0
    vectors = np.random.default_rng(0).standard_normal((2000, 16)).astype(np.float32)
    vectors[:20] = vectors[0]
    table = {f"k{i}": v for i, v in enumerate(vectors)}
    src = write_source(str(tmp_path / "tied.parquet"), table)
    old = str(tmp_path / "old")
    build_index(old, kind="hnsw", vectors_path=src, progress=False)
    params = update_index(old, str(tmp_path / "new"), vectors_path=src, target_recall=1.0, progress=False, report=True)
    assert params["search"] == 1024 and params["tuning_recall"] < 1.0
    assert params["warning"].startswith("recall stayed at ") and "below the target 1.0" in params["warning"]
    assert f"warning: {params['warning']}" in logged.messages


def test_cli_index_update_round_trip(day0, day1, tmp_path, capsys):
    from doc2vec_dist.cli import main

    index = str(tmp_path / "users.index")
    old_src = write_source(str(tmp_path / "day0.parquet"), day0)
    new_src = write_source(str(tmp_path / "day1.parquet"), day1[0])
    assert main(["index", "--vectors", old_src, "--kind", "ivfpq", "--out", index, "--no-progress"]) == 0
    capsys.readouterr()

    assert main(["index", "--update", index, "--vectors", new_src, "--kind", "hnsw", "--out", index,
                 "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: {index}: --update keeps the old index's kind (ivfpq); drop --kind hnsw"]

    assert main(["index", "--update", index, "--vectors", new_src, "--out", index, "--no-progress"]) == 0
    printed = capsys.readouterr().out
    assert re.search(r"index ivfpq: 3,100 rows × 24, recall@10 vs exact: \d\.\d{3} \(1000 queries, nprobe \d+\)",
                     printed), printed
    assert re.search(rf"updated from {re.escape(index)}: 200 added, 150 replaced, 100 removed, 2,750 unchanged "
                     r"in \d+\.\ds \(then recall measured\); 100 dead ids of 3,200 \(3%\)", printed), printed
    assert_ids_are_rows(index, day1[0])


# -- which model an index belongs to (issue 26, item 2) -------------------------------------------------

def test_an_update_refuses_an_index_of_another_model_and_touches_nothing(small_models, tmp_path, snapshot):
    from doc2vec_dist.modeldir import ModelDir

    first, second = small_models.make(tmp_path / "first", 1), small_models.make(tmp_path / "second", 2)
    index = str(tmp_path / "first.index")
    build_index(index, kind="hnsw", model=first, progress=False)
    before = snapshot(index)
    with pytest.raises(UserError) as err:
        update_index(index, index, model=second, progress=False)
    ids = [ModelDir(m).manifest["model_id"][:8] for m in (first, second)]
    assert str(err.value) == (f"{index} was made from the model at {first} (id {ids[0]}, v1, table docs), another "
                              f"model than the model at {second} (id {ids[1]}, v1, table docs); their vectors live "
                              "in two embedding spaces: build a new index (index without --update)")
    assert snapshot(index) == before


def test_an_update_to_the_models_next_version_or_a_refresh_of_it_is_what_updates_are_for(small_models, tmp_path,
                                                                                           logged):
    from doc2vec_dist.modeldir import ModelDir

    base = small_models.make(tmp_path / "base", 1)
    index = str(tmp_path / "users.index")
    build_index(index, kind="ivfpq", model=base, progress=False)
    small_models.train_on(base, 2)  # the same model, v2
    params = update_index(index, index, model=base, progress=False)
    assert params["provenance"]["version"] == 2
    refreshed = small_models.make(tmp_path / "refreshed", 3, {"derived_from": [ModelDir(base).manifest["model_id"]]})
    params = update_index(index, index, model=refreshed, progress=False)
    assert params["provenance"]["model"] == refreshed and params["update"]["replaced"] > 0
    assert "warning" not in logged.text
    assert f"{index} was made from the model at {base} (id " in logged.text  # said, as information
    assert f"v2, table docs); updating it to the model at {refreshed} (id " in logged.text
    # and back to the older model: done, but said
    update_index(index, index, model=base, progress=False)
    assert "newer than the model at" in logged.text and "this update takes it back to older vectors" in logged.text


# -- rows with a null vector: users infer could not place (issue 47) ------------------------------------

@pytest.mark.parametrize("kind", ["flat", "hnsw", "ivfpq"])
def test_rows_with_a_null_vector_stay_out_of_a_build_and_of_an_update(day0, day1, tmp_path, kind, logged):
    """A source of two files, each with a user infer could not place: the index holds the other rows, with
    ids that are rows of keys.parquet, and the warning names the users left out."""
    nulls = frozenset({"u5", "u1700", "u2999"})
    items = list(day0.items())
    folder = tmp_path / "day0"
    folder.mkdir()
    write_source(str(folder / "part-0.parquet"), dict(items[:1500]), nulls)
    write_source(str(folder / "part-1.parquet"), dict(items[1500:]), nulls)
    index = str(tmp_path / "users.index")
    params = build_index(index, kind=kind, vectors_path=str(folder), progress=False)
    assert (params["rows"], params["null_vectors"]) == (ROWS - 3, 3)
    assert f"warning: {folder}: 3 rows with a null or all-zero vector (users infer could not place, rows never trained) left out of the index: u5, " \
           "u1700, u2999" in logged.messages
    assert_ids_are_rows(index, {k: v for k, v in day0.items() if k not in nulls})

    # an update: a key whose new vector is null is gone from the index, as a key gone from the source is
    new, what = day1
    placed_now = [k for k in new if k not in set(what["added"])][:2]
    updated = update_index(index, str(tmp_path / "updated"),
                           vectors_path=write_source(str(tmp_path / "day1.parquet"), new, frozenset(placed_now)),
                           progress=False)
    assert updated["null_vectors"] == 2 and updated["rows"] == len(new) - 2
    assert_ids_are_rows(str(tmp_path / "updated"), {k: v for k, v in new.items() if k not in placed_now})
