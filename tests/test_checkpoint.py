"""Model directories written directly with the checkpoint functions: no Ray, no training."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from doc2vec_dist import checkpoint, modeldir, storage
from doc2vec_dist.errors import UserError
from doc2vec_dist.sharding import global_rows, rows_on_shard

ROWS, DIM, SHARDS = 11, 4, 2


def full_matrix(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, DIM)).astype(np.float32)


def write_version(model: str, matrix: np.ndarray, keep: int = 2, commit: bool = True) -> int:
    """Write `matrix` as the docs table split over SHARDS servers (row r on shard r % S); commit it."""
    version = checkpoint.next_version(model)
    parts = []
    for shard in range(SHARDS):
        ids = np.arange(shard, len(matrix), SHARDS, dtype=np.int64)
        # a small rows_per_batch so that a part holds several record batches
        parts.append(checkpoint.write_slice(model, version, "docs", shard, SHARDS, ids, matrix[ids],
                                            rows_per_batch=2))
    if commit:
        checkpoint.commit(model, version, {"docs": parts}, {"docs": DIM}, {"epoch": version}, keep=keep)
    return version


def versions_on_disk(model: str) -> list[str]:
    return sorted(os.listdir(os.path.join(model, "checkpoints")))


def part_path(model: str, shard: int) -> str:
    vdir, manifest = modeldir.load_manifest(model)
    return os.path.join(vdir, manifest["tables"]["docs"]["parts"][shard]["path"])


def test_two_shard_round_trip_gives_back_the_exact_matrix(tmp_path):
    model = str(tmp_path / "m")
    matrix = full_matrix()
    write_version(model, matrix)

    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), matrix)
    _, manifest = modeldir.load_manifest(model)
    spec = manifest["tables"]["docs"]
    assert (spec["rows"], spec["dim"], spec["dtype"]) == (ROWS, DIM, "float32")
    assert [p["path"] for p in spec["parts"]] == [os.path.join("docs", modeldir.part_name(s, SHARDS))
                                                  for s in range(SHARDS)]
    assert manifest["epoch"] == 1  # extra keys are kept in the manifest

    parts = [(np.concatenate([b[0] for b in part]), np.concatenate([b[1] for b in part]))
             for part in modeldir.ModelDir(model).parts("docs")]
    assert len(parts) == SHARDS
    for shard, (ids, vectors) in enumerate(parts):
        np.testing.assert_array_equal(ids, np.arange(shard, ROWS, SHARDS))
        np.testing.assert_array_equal(vectors, matrix[ids])


def test_latest_points_at_the_newest_committed_version(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))
    newest = full_matrix(1)
    write_version(model, newest)

    with open(os.path.join(model, "LATEST")) as fh:
        assert fh.read().strip() == "v2"
    vdir, manifest = modeldir.load_manifest(model)
    assert vdir == modeldir.version_dir(model, 2) and manifest["version"] == 2
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), newest)


def test_keep_prunes_older_versions_only_after_a_commit(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0), keep=2)
    write_version(model, full_matrix(1), keep=2)
    assert versions_on_disk(model) == ["v1", "v2"]

    # v3's parts are written but not committed: nothing is pruned and LATEST still reads v2
    write_version(model, full_matrix(2), keep=2, commit=False)
    assert versions_on_disk(model) == ["v1", "v2", "v3"]
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), full_matrix(1))

    parts = [checkpoint.write_slice(model, 3, "docs", 0, 1, np.arange(ROWS), full_matrix(2))]
    checkpoint.commit(model, 3, {"docs": parts}, {"docs": DIM}, {}, keep=2)
    assert versions_on_disk(model) == ["v2", "v3"]
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), full_matrix(2))


def test_a_flipped_byte_in_a_part_is_a_checksum_error(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    path = part_path(model, 1)
    with open(path, "r+b") as fh:
        fh.seek(os.path.getsize(path) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))

    with pytest.raises(UserError, match="checksum") as err:
        modeldir.ModelDir(model).read_table("docs")
    assert path in str(err.value)


def test_a_part_path_with_dotdot_in_the_manifest_is_refused(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    manifest_path = os.path.join(modeldir.version_dir(model, 1), "manifest.json")
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    manifest["tables"]["docs"]["parts"][0]["path"] = os.path.join("..", "..", "..", "etc", "passwd")
    with open(manifest_path, "w") as fh:
        json.dump(manifest, fh)

    with pytest.raises(UserError, match="escapes the model directory"):
        modeldir.load_manifest(model)


def test_a_model_without_latest_is_an_error_naming_the_directory(tmp_path):
    model = str(tmp_path / "not-a-model")
    os.makedirs(model)
    with pytest.raises(UserError, match="LATEST") as err:
        modeldir.load_manifest(model)
    assert model in str(err.value)


def test_asking_for_an_untrained_table_names_the_tables_there_are(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    with pytest.raises(UserError, match=r"'words' was not trained.*docs"):
        modeldir.ModelDir(model).read_table("words")


def test_a_missing_part_file_is_a_user_error_naming_it(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    path = part_path(model, 0)
    os.remove(path)
    with pytest.raises(UserError, match="part-00000-of-00002"):
        modeldir.ModelDir(model).read_table("docs")


# ---------------------------------------------------------------------------------------------------
# resharding: a checkpoint written by S servers read back by any other number
# ---------------------------------------------------------------------------------------------------

def write_sharded(model: str, matrix: np.ndarray, state: np.ndarray | None, num_shards: int,
                  table: str = "docs", keep: int = 2) -> int:
    """Write `matrix` (and its optimiser state) as ps.save does with `num_shards` servers; commit it."""
    version = checkpoint.next_version(model)
    parts = []
    for shard in range(num_shards):
        ids = global_rows(shard, num_shards, len(matrix))
        parts.append(checkpoint.write_slice(model, version, table, shard, num_shards, ids, matrix[ids],
                                            state=None if state is None else state[ids], rows_per_batch=3))
    checkpoint.commit(model, version, {table: parts}, {table: matrix.shape[1]}, {"epoch": 1}, keep=keep)
    return version


def gather_shards(model: str, num_shards: int, rows: int, **options) -> tuple[np.ndarray, np.ndarray | None]:
    """read_shard of every shard, put back at each row's global id."""
    vectors, state = np.full((rows, DIM), np.nan, np.float32), None
    for shard in range(num_shards):
        mine, mine_state = modeldir.read_shard(model, "docs", shard, num_shards, **options)
        assert mine.shape == (rows_on_shard(shard, num_shards, rows), DIM)
        vectors[global_rows(shard, num_shards, rows)] = mine
        if mine_state is not None:
            state = np.full((rows, 1), np.nan, np.float32) if state is None else state
            state[global_rows(shard, num_shards, rows)] = mine_state
    return vectors, state


@pytest.mark.parametrize("read_with", [1, 2, 3, 5])
def test_written_by_three_servers_read_by_any_number(tmp_path, read_with):
    model = str(tmp_path / "m")
    rows = 23
    matrix = np.random.default_rng(0).standard_normal((rows, DIM)).astype(np.float32)
    state = np.random.default_rng(1).random((rows, 1)).astype(np.float32)
    write_sharded(model, matrix, state, num_shards=3)

    vectors, got_state = gather_shards(model, read_with, rows)
    np.testing.assert_array_equal(vectors, matrix)
    np.testing.assert_array_equal(got_state, state)
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), matrix)


def test_read_shard_fills_a_given_table_with_vectors_then_state(tmp_path):
    model = str(tmp_path / "m")
    matrix = full_matrix()
    state = np.arange(ROWS, dtype=np.float32)[:, None]
    write_sharded(model, matrix, state, num_shards=3)
    out = np.zeros((rows_on_shard(1, 2, ROWS), DIM + 1), np.float32)  # a PS table: vectors, then adagrad

    vectors, got_state = modeldir.read_shard(model, "docs", 1, 2, out=out)
    assert vectors.base is out and got_state.base is out
    np.testing.assert_array_equal(out[:, :DIM], matrix[1::2])
    np.testing.assert_array_equal(out[:, DIM:], state[1::2])


def test_a_checkpoint_without_state_reads_as_none(tmp_path):
    model = str(tmp_path / "m")
    write_sharded(model, full_matrix(), None, num_shards=2)
    vectors, state = modeldir.read_shard(model, "docs", 0, 3)
    assert state is None
    np.testing.assert_array_equal(vectors, full_matrix()[0::3])


def test_read_shard_opens_only_the_parts_that_can_hold_its_rows(tmp_path):
    model = str(tmp_path / "m")
    write_sharded(model, full_matrix(), None, num_shards=2)
    os.remove(part_path(model, 1))  # rows 1, 3, 5, …
    # with 4 servers, shards 0 and 2 hold only even rows: part 1 is never opened
    np.testing.assert_array_equal(modeldir.read_shard(model, "docs", 2, 4)[0], full_matrix()[2::4])
    with pytest.raises(UserError, match="part-00001-of-00002.*missing"):
        modeldir.read_shard(model, "docs", 1, 4)


def test_read_shard_of_a_pinned_version(tmp_path):
    model = str(tmp_path / "m")
    write_sharded(model, full_matrix(0), None, num_shards=2)
    write_sharded(model, full_matrix(1), None, num_shards=3)
    np.testing.assert_array_equal(modeldir.read_shard(model, "docs", 0, 1)[0], full_matrix(1))
    np.testing.assert_array_equal(modeldir.read_shard(model, "docs", 0, 1, version=1)[0], full_matrix(0))
    np.testing.assert_array_equal(modeldir.read_shard(model, "docs", 1, 2, version=1)[0], full_matrix(0)[1::2])
    np.testing.assert_array_equal(modeldir.ModelDir(model, version=1).read_table("docs"), full_matrix(0))


def test_read_shard_verifies_checksums(tmp_path):
    model = str(tmp_path / "m")
    write_sharded(model, full_matrix(), None, num_shards=2)
    flip_a_byte(part_path(model, 0))
    with pytest.raises(UserError, match="checksum"):
        modeldir.read_shard(model, "docs", 0, 3)


def flip_a_byte(path: str) -> None:
    with open(path, "r+b") as fh:
        fh.seek(os.path.getsize(path) // 2)
        byte = fh.read(1)
        fh.seek(-1, os.SEEK_CUR)
        fh.write(bytes([byte[0] ^ 0xFF]))


def test_write_slice_refuses_rows_of_another_shard(tmp_path):
    with pytest.raises(ValueError, match="mod 2"):
        checkpoint.write_slice(str(tmp_path / "m"), 1, "docs", 0, 2, np.array([0, 1]), full_matrix()[:2])


# ---------------------------------------------------------------------------------------------------
# the manifest is validated before use; every failure names the file and the field
# ---------------------------------------------------------------------------------------------------

def _set(path: list, value):
    def edit(manifest):
        target = manifest
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return edit


def _drop(path: list):
    def edit(manifest):
        target = manifest
        for key in path[:-1]:
            target = target[key]
        del target[path[-1]]
    return edit


def _duplicate_part(manifest):
    parts = manifest["tables"]["docs"]["parts"]
    parts[1] = dict(parts[0])


PARTS = ["tables", "docs", "parts"]
BAD_MANIFESTS = {
    "format_version": (_set(["format_version"], 2), "'format_version'"),
    "version of another directory": (_set(["version"], 7), "'version'"),
    "version not an int": (_set(["version"], "1"), "'version'"),
    "no tables": (_set(["tables"], {}), "'tables'"),
    "unknown table": (lambda m: m["tables"].update(users=m["tables"]["docs"]), "unknown table 'users'"),
    "negative dim": (_set(["tables", "docs", "dim"], -4), "'tables.docs.dim'"),
    "dim as a string": (_set(["tables", "docs", "dim"], "4"), "'tables.docs.dim'"),
    "zero dim": (_set(["tables", "docs", "dim"], 0), "'tables.docs.dim'"),
    "negative rows": (_set(["tables", "docs", "rows"], -1), "'tables.docs.rows'"),
    "rows not the sum of parts": (_set(["tables", "docs", "rows"], ROWS + 1), "'tables.docs.rows'"),
    "dtype": (_set(["tables", "docs", "dtype"], "float64"), "'tables.docs.dtype'"),
    "no parts": (_set(PARTS, []), "'tables.docs.parts'"),
    "part rows": (_set([*PARTS, 0, "rows"], 2.5), "'tables.docs.parts[0].rows'"),
    "part rows bool": (_set([*PARTS, 0, "rows"], True), "'tables.docs.parts[0].rows'"),
    "short sha256": (_set([*PARTS, 0, "sha256"], "abc"), "'tables.docs.parts[0].sha256'"),
    "uppercase sha256": (_set([*PARTS, 1, "sha256"], "A" * 64), "'tables.docs.parts[1].sha256'"),
    "missing sha256": (_drop([*PARTS, 0, "sha256"]), "'tables.docs.parts[0].sha256'"),
    "negative bytes": (_set([*PARTS, 0, "bytes"], -1), "'tables.docs.parts[0].bytes'"),
    "absolute part path": (_set([*PARTS, 0, "path"], "/etc/passwd"), "escapes the model directory"),
    "dotdot part path": (_set([*PARTS, 0, "path"], "docs/../../../x.arrow"), "escapes the model directory"),
    "URI part path": (_set([*PARTS, 0, "path"], "s3://elsewhere/docs/part-00000-of-00002.arrow"),
                      "escapes the model directory"),
    "part of another table": (_set([*PARTS, 0, "path"], "words/part-00000-of-00002.arrow"),
                              "'tables.docs.parts[0].path'"),
    "part path not a part name": (_set([*PARTS, 0, "path"], "docs/vectors.arrow"), "'tables.docs.parts[0].path'"),
    "part path not a string": (_set([*PARTS, 0, "path"], 3), "'tables.docs.parts[0].path'"),
    "the same part twice": (_duplicate_part, "'tables.docs.parts[1].path'"),
    "epoch": (_set(["epoch"], "3"), "'epoch'"),
    "negative epoch": (_set(["epoch"], -1), "'epoch'"),
    "positions": (_set(["positions"], {"worker": 0}), "'positions'"),
    "config": (_set(["config"], ["dim", 4]), "'config'"),
    "lr": (_set(["lr"], "fast"), "'lr'"),
    "top level not an object": (lambda m: None, "'(top level)'"),
}


@pytest.mark.parametrize("case", list(BAD_MANIFESTS))
def test_a_bad_manifest_field_is_a_user_error_naming_it(tmp_path, case):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    manifest_path = os.path.join(modeldir.version_dir(model, 1), "manifest.json")
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    edit, expected = BAD_MANIFESTS[case]
    manifest = [] if case == "top level not an object" else manifest
    if manifest != []:
        edit(manifest)
    with open(manifest_path, "w") as fh:
        json.dump(manifest, fh)

    for read in (modeldir.load_manifest, lambda m: modeldir.read_shard(m, "docs", 0, 1)):
        with pytest.raises(UserError) as err:
            read(model)
        assert manifest_path in str(err.value) and expected in str(err.value)


def test_optional_manifest_keys_of_the_right_type_are_accepted(tmp_path):
    model = str(tmp_path / "m")
    version = checkpoint.next_version(model)
    parts = [checkpoint.write_slice(model, version, "docs", 0, 1, np.arange(ROWS), full_matrix())]
    extra = {"epoch": 2, "positions": [{"unit": 0, "row": 5}, None], "config": {"dim": DIM}, "lr": 0.0125,
             "num_ps": 1, "losses": [0.5, 0.4]}
    checkpoint.commit(model, version, {"docs": parts}, {"docs": DIM}, extra, keep=2)
    _, manifest = modeldir.load_manifest(model)
    assert {k: manifest[k] for k in extra} == extra


def test_commit_refuses_a_manifest_it_could_not_read_back(tmp_path):
    model = str(tmp_path / "m")
    parts = [checkpoint.write_slice(model, 1, "docs", 0, 1, np.arange(ROWS), full_matrix())]
    with pytest.raises(UserError, match="'lr'"):
        checkpoint.commit(model, 1, {"docs": parts}, {"docs": DIM}, {"lr": "high"}, keep=2)
    with pytest.raises(ValueError, match="version"):
        checkpoint.commit(model, 1, {"docs": parts}, {"docs": DIM}, {"version": 9}, keep=2)
    assert not storage.Store.of(model).is_file("LATEST")


def test_commit_refuses_a_version_whose_part_is_missing(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))
    parts = [checkpoint.write_slice(model, 2, "docs", s, 2, np.arange(s, ROWS, 2), full_matrix(1)[s::2])
             for s in range(2)]
    os.remove(os.path.join(modeldir.version_dir(model, 2), parts[1]["path"]))
    with pytest.raises(UserError, match="part-00001-of-00002.*missing"):
        checkpoint.commit(model, 2, {"docs": parts}, {"docs": DIM}, {}, keep=2)
    assert modeldir.latest_version(model) == 1
    assert not os.path.exists(os.path.join(modeldir.version_dir(model, 2), "manifest.json"))


def test_latest_naming_a_version_without_manifest_is_an_error(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    with open(os.path.join(model, "LATEST"), "w") as fh:
        fh.write("v9\n")
    with pytest.raises(UserError, match="v9.*manifest.json.*missing|manifest.json: missing"):
        modeldir.load_manifest(model)
    with open(os.path.join(model, "LATEST"), "w") as fh:
        fh.write("../../etc\n")
    with pytest.raises(UserError, match="expected a version like v3"):
        modeldir.load_manifest(model)


def test_relative_paths_cannot_leave_the_model_directory(tmp_path):
    model = str(tmp_path / "m")
    for bad in ("../x.json", "/etc/passwd", "a/../../b", "s3://b/k", "", "a//b"):
        with pytest.raises(UserError, match="escapes the model directory"):
            storage.Store.of(model).write_json(bad, {})
        with pytest.raises(UserError, match="escapes the model directory"):
            storage.Store.of(model).read_json(bad)
    assert not os.path.exists(tmp_path / "x.json")


def test_json_helpers_round_trip_atomically(tmp_path):
    model = str(tmp_path / "m")
    assert not storage.Store.of(model).is_file("config.json")
    storage.Store.of(model).write_json("config.json", {"dim": 4, "alpha": 0.025})
    assert storage.Store.of(model).is_file("config.json")
    assert storage.Store.of(model).read_json("config.json") == {"dim": 4, "alpha": 0.025}
    assert os.listdir(model) == ["config.json"]  # no temporary file left beside it
    with open(os.path.join(model, "broken.json"), "w") as fh:
        fh.write("{")
    with pytest.raises(UserError, match="broken.json: not valid JSON"):
        storage.Store.of(model).read_json("broken.json")
    with pytest.raises(UserError, match="nothing.json: missing"):
        storage.Store.of(model).read_json("nothing.json")
    assert storage.location("rel/model") == os.path.abspath("rel/model")
    assert storage.location("s3://b/m?scheme=http") == "s3://b/m?scheme=http"
    assert modeldir.local_copy(model) == model  # a local model is used where it is


# ---------------------------------------------------------------------------------------------------
# partial versions, pruning, keep-K
# ---------------------------------------------------------------------------------------------------

def test_a_partial_version_is_skipped_then_pruned_once_a_newer_one_is_committed(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))
    write_version(model, full_matrix(1), commit=False)   # v2: parts, no manifest
    write_version(model, full_matrix(2), commit=False)   # v3: the same
    assert checkpoint.next_version(model) == 4  # a partial version's number is never reused
    assert modeldir.latest_version(model) == 1

    checkpoint._prune_store(storage.Store.of(model), keep=1)  # what each commit runs after moving LATEST
    assert versions_on_disk(model) == ["v1", "v2", "v3"]  # nothing newer than LATEST is touched

    parts = [checkpoint.write_slice(model, 4, "docs", 0, 1, np.arange(ROWS), full_matrix(4))]
    checkpoint.commit(model, 4, {"docs": parts}, {"docs": DIM}, {}, keep=2)
    assert versions_on_disk(model) == ["v1", "v4"]  # partial v2, v3 deleted; v1 is the 2nd kept
    np.testing.assert_array_equal(modeldir.ModelDir(model, version=1).read_table("docs"), full_matrix(0))


@pytest.mark.parametrize("keep", [1, 2, 3])
def test_keep_k_keeps_the_k_newest_committed_versions(tmp_path, keep):
    model = str(tmp_path / "m")
    for i in range(4):
        write_version(model, full_matrix(i), keep=keep)
    assert versions_on_disk(model) == [f"v{v}" for v in range(5 - keep, 5)]
    for v in range(5 - keep, 5):
        np.testing.assert_array_equal(modeldir.ModelDir(model, version=v).read_table("docs"), full_matrix(v - 1))


def test_commit_never_moves_latest_backwards(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))
    write_version(model, full_matrix(1))
    parts = [checkpoint.write_slice(model, 1, "docs", 0, 1, np.arange(ROWS), full_matrix(2))]
    with pytest.raises(ValueError, match="LATEST is already v2"):
        checkpoint.commit(model, 1, {"docs": parts}, {"docs": DIM}, {}, keep=2)


# ---------------------------------------------------------------------------------------------------
# interrupted checkpoints: a full disk, a kill
# ---------------------------------------------------------------------------------------------------

class FullDisk(pafs.FileSystemHandler):
    """The local filesystem, except that writes fail with ENOSPC once `budget` bytes were written
    (counting only files whose path contains `only`, when given)."""

    def __init__(self, budget: int, only: str | None = None):
        self.local, self.budget, self.only = pafs.LocalFileSystem(), budget, only

    def open_output_stream(self, path, metadata):
        inner, handler, counted = self.local.open_output_stream(path), self, self.only is None or self.only in path

        class Writer:
            closed = False

            def write(self, data):
                size = memoryview(data).nbytes
                if counted:
                    if size > handler.budget:
                        raise OSError(errno.ENOSPC, "No space left on device")
                    handler.budget -= size
                return inner.write(data)

            def tell(self):
                return inner.tell()

            def flush(self):
                inner.flush()

            def close(self):
                inner.close()
                Writer.closed = True

            def writable(self):
                return True

        return pa.PythonFile(Writer(), mode="w")

    # everything else is the local filesystem's
    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def get_type_name(self):
        return "full-disk"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.local.get_file_info(paths)

    def get_file_info_selector(self, selector):
        return self.local.get_file_info(selector)

    def create_dir(self, path, recursive):
        self.local.create_dir(path, recursive=recursive)

    def delete_dir(self, path):
        self.local.delete_dir(path)

    def delete_dir_contents(self, path, missing_dir_ok=False):
        self.local.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)

    def delete_root_dir_contents(self):
        raise OSError("refusing to empty the root")

    def delete_file(self, path):
        self.local.delete_file(path)

    def move(self, src, dest):
        self.local.move(src, dest)

    def copy_file(self, src, dest):
        self.local.copy_file(src, dest)

    def open_input_stream(self, path):
        return self.local.open_input_stream(path)

    def open_input_file(self, path):
        return self.local.open_input_file(path)

    def open_append_stream(self, path, metadata):
        raise OSError("not supported")


def temporary_files(model: str) -> list[str]:
    return [name for _, _, files in os.walk(model) for name in files if ".tmp-" in name]


@pytest.mark.parametrize("fails_in", ["a part", "the manifest", "LATEST"])
def test_a_full_disk_during_a_checkpoint_leaves_the_previous_version_loadable(tmp_path, fails_in):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))
    _, v1 = modeldir.load_manifest(model)
    part_bytes = sum(p["bytes"] for p in v1["tables"]["docs"]["parts"])
    handler = {"a part": FullDisk(part_bytes // 2), "the manifest": FullDisk(20, only="manifest.json"),
               "LATEST": FullDisk(0, only="LATEST")}[fails_in]
    full = pafs.PyFileSystem(handler)

    root = os.path.abspath(model)
    with pytest.raises(storage.CheckpointWriteError, match="no space left on device") as err:
        version = checkpoint.next_version(root, fs=full)
        assert version == 2
        parts = [checkpoint.write_slice(root, version, "docs", s, SHARDS, np.arange(s, ROWS, SHARDS),
                                        full_matrix(1)[s::SHARDS], fs=full) for s in range(SHARDS)]
        checkpoint.commit(root, version, {"docs": parts}, {"docs": DIM}, {"epoch": 2}, keep=1, fs=full)
    assert err.value.errno == errno.ENOSPC and str(err.value).startswith(f"cannot write to {root}/")
    assert str(err.value).endswith(": no space left on device")  # what became of the model is the caller's to say

    assert modeldir.latest_version(model) == 1
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), full_matrix(0))  # loads and verifies
    assert os.path.exists(os.path.join(modeldir.version_dir(model, 1), "manifest.json"))
    if fails_in != "LATEST":
        assert not os.path.exists(os.path.join(modeldir.version_dir(model, 2), "manifest.json"))
    assert temporary_files(model) == []

    # the disk has room again: the next version does not reuse v2, and its commit clears v2 away
    assert write_version(model, full_matrix(2), keep=1) == 3
    assert versions_on_disk(model) == ["v3"]
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), full_matrix(2))


KILLED_WRITER = """
import sys
import numpy as np
from doc2vec_dist import checkpoint, modeldir
model = sys.argv[1]
rng = np.random.default_rng(0)
shards = 1000
for shard in range(shards):
    ids = np.arange(shard, 200 * shards, shards, dtype=np.int64)
    checkpoint.write_slice(model, 2, "docs", shard, shards, ids, rng.random((len(ids), 4096), dtype=np.float32))
    if shard == 0:
        print("writing", flush=True)
"""


def test_a_writer_killed_mid_checkpoint_leaves_the_previous_version_loadable(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, model], stdout=subprocess.PIPE,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    try:
        assert writer.stdout.readline().strip() == b"writing"
        time.sleep(0.2)
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    assert os.path.isdir(modeldir.version_dir(model, 2))

    assert modeldir.latest_version(model) == 1
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), full_matrix(0))
    assert checkpoint.next_version(model) == 3
    write_version(model, full_matrix(1), keep=2)
    assert versions_on_disk(model) == ["v1", "v3"]  # the killed v2, stale files and all, is gone


# ---------------------------------------------------------------------------------------------------
# issue 26, item 5: a version that cannot be written whole leaves nothing behind
# ---------------------------------------------------------------------------------------------------

def test_a_checkpoint_that_fails_midway_is_deleted_and_the_last_one_kept(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))

    def save(version):  # one server wrote its part, the other found the disk full
        part = checkpoint.write_slice(model, version, "docs", 0, SHARDS, np.arange(0, ROWS, SHARDS),
                                      full_matrix(1)[0::SHARDS])
        assert os.path.exists(os.path.join(modeldir.version_dir(model, version), part["path"]))
        raise storage.CheckpointWriteError("cannot write to it: no space left on device", errno.ENOSPC)

    with pytest.raises(storage.CheckpointWriteError):
        checkpoint.commit_training(model, None, None, save, 2, None, [])
    assert versions_on_disk(model) == ["v1"] and modeldir.latest_version(model) == 1
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), full_matrix(0))


def test_a_resumed_run_removes_the_versions_a_stopped_run_left_after_latest(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0))
    for version in (2, 3):  # killed while writing them: parts, no manifest, LATEST still v1
        checkpoint.write_slice(model, version, "docs", 0, SHARDS, np.arange(0, ROWS, SHARDS), full_matrix(1)[0::SHARDS])
    assert checkpoint.discard_partial_versions(model) == [2, 3]
    assert versions_on_disk(model) == ["v1"] and checkpoint.next_version(model) == 2
    assert modeldir.committed_versions(model) == [1]


def test_a_write_error_keeps_its_errno_and_file_across_processes():
    import pickle

    err = storage.CheckpointWriteError("cannot write to m/x: no space left on device", errno.ENOSPC, "m/x")
    again = pickle.loads(pickle.dumps(err))  # a parameter server's error reaches the driver pickled
    assert (str(again), again.errno, again.path) == (str(err), errno.ENOSPC, "m/x")


def test_the_checkpoint_size_estimate_is_what_is_written(tmp_path):
    from doc2vec_dist.config import TableSpec

    model = str(tmp_path / "m")
    rows, dim = 70_000, 8  # two record batches in one part
    parts = [checkpoint.write_slice(model, 1, "docs", s, 2, np.arange(s, rows, 2), np.ones((rows // 2, dim), np.float32),
                                    state=np.ones((rows // 2, 1), np.float32)) for s in range(2)]
    written = sum(p["bytes"] for p in parts)
    estimate = checkpoint.version_bytes([TableSpec("docs", rows, dim, state=1)], parts=2)
    assert written <= estimate <= written * 1.01 + 8192, (written, estimate)


def test_a_model_directory_that_cannot_be_started_is_removed_again(tmp_path, sample_corpus, tmpfs):
    disk = tmpfs.mount("disk", "256k")  # the sample's key tables (about 470 kB) do not fit
    out = os.path.join(disk, "new", "model")
    with pytest.raises(storage.CheckpointWriteError, match=f"^cannot write to {out}/.*: no space left on device$"):
        checkpoint.start_model_dir(out, sample_corpus[0], overwrite=False)
    assert os.listdir(disk) == []


# -- the model's id (issue 26, item 2) -----------------------------------------------------------------

def test_a_model_gets_an_id_at_its_first_version_and_every_later_version_keeps_it(tmp_path):
    model, other = str(tmp_path / "m"), str(tmp_path / "other")
    write_version(model, full_matrix())
    first = modeldir.load_manifest(model)[1]["model_id"]
    assert len(first) == 32 and int(first, 16) >= 0
    write_version(model, full_matrix(1))  # a resumed run's next version
    assert modeldir.load_manifest(model)[1]["model_id"] == first
    write_version(other, full_matrix())  # the same rows, another model
    assert modeldir.load_manifest(other)[1]["model_id"] != first


def test_a_model_from_before_ids_gets_one_at_its_next_version_and_its_lineage_is_kept(tmp_path):
    model = str(tmp_path / "m")
    version = write_version(model, full_matrix())
    path = os.path.join(modeldir.version_dir(model, version), "manifest.json")
    with open(path) as fh:
        manifest = json.load(fh)
    manifest.pop("model_id")
    manifest["derived_from"] = ["a" * 32]
    with open(path, "w") as fh:
        json.dump(manifest, fh)
    assert "model_id" not in modeldir.ModelDir(model).manifest  # read as before: no id, no error
    write_version(model, full_matrix(1))
    resumed = modeldir.load_manifest(model)[1]
    assert len(resumed["model_id"]) == 32 and resumed["derived_from"] == ["a" * 32]


@pytest.mark.parametrize("field, value", [("model_id", "not-an-id"), ("derived_from", "b" * 32)])
def test_a_manifest_with_a_bad_id_is_refused_naming_the_field(tmp_path, field, value):
    model = str(tmp_path / "m")
    version = write_version(model, full_matrix())
    path = os.path.join(modeldir.version_dir(model, version), "manifest.json")
    with open(path) as fh:
        manifest = json.load(fh)
    manifest[field] = value
    with open(path, "w") as fh:
        json.dump(manifest, fh)
    with pytest.raises(UserError, match=f"field '{field}' must be"):
        modeldir.ModelDir(model)


# ---------------------------------------------------------------------------------------------------
# issue 47, item 6: one writer per model directory
# ---------------------------------------------------------------------------------------------------

# a run that takes the lock and is killed holding it (SIGKILL: no finally runs)
KILLED_HOLDER = """
import os, signal, sys
from doc2vec_dist import checkpoint, modeldir
with checkpoint.writing(sys.argv[1]):
    os.kill(os.getpid(), signal.SIGKILL)
"""


def lock_of(model: str) -> dict:
    with open(os.path.join(model, checkpoint.WRITER_FILE)) as fh:
        return json.load(fh)


def killed_holder(model: str) -> dict:
    """The lock a run killed while writing `model` left there."""
    done = subprocess.run([sys.executable, "-c", KILLED_HOLDER, model], capture_output=True, text=True, check=False,
                          cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    assert done.returncode == -9, done.stderr
    return lock_of(model)


def held_line(model: str, held: dict) -> str:
    return (f"{model} is being written by another run (host {held['host']}, pid {held['pid']}, started "
            f"{held['started']}, `{held['command']}`)")


def test_a_second_writer_is_refused_in_one_line_naming_the_first_and_the_lock_goes_with_the_first(tmp_path):
    import socket

    model = str(tmp_path / "m")
    with checkpoint.writing(model):
        held = lock_of(model)
        assert (held["host"], held["pid"]) == (socket.gethostname(), os.getpid())
        for second in (lambda: checkpoint.writing(model).__enter__(), lambda: checkpoint.refuse_other_writer(model)):
            with pytest.raises(UserError) as err:
                second()
            assert str(err.value) == held_line(model, held) + "; wait for it to end, or give another --out"
    assert not os.path.exists(model)  # the lock made the directory, and removed it again with itself


@pytest.mark.parametrize("raised", [UserError("refused"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_the_lock_is_released_on_every_way_out(tmp_path, raised):
    model = str(tmp_path / "m")
    os.makedirs(model)
    with pytest.raises(type(raised)), checkpoint.writing(model):
        raise raised
    assert os.listdir(model) == []  # a directory it did not make stays
    with checkpoint.writing(model):
        pass


def test_a_lock_left_by_a_killed_run_is_taken_over_with_one_line(tmp_path, logged):
    model = str(tmp_path / "m")
    os.makedirs(model)
    left = killed_holder(model)
    checkpoint.refuse_other_writer(model)  # not refused: its run is gone
    with checkpoint.writing(model):
        assert lock_of(model)["pid"] == os.getpid()
    taken = [r.getMessage() for r in logged.records if "taking over" in r.getMessage()]
    assert taken == [(f"warning: {model}: taking over the lock of a run that is gone (host {left['host']}, pid "
                     f"{left['pid']}, started {left['started']}, `{left['command']}`): its process no longer runs")]


def test_a_lock_whose_pid_now_runs_another_process_is_taken_over(tmp_path, logged):
    model = str(tmp_path / "m")
    os.makedirs(model)
    left = killed_holder(model)
    left["pid"] = os.getppid()  # a live process, started before the one that held the lock
    with open(os.path.join(model, checkpoint.WRITER_FILE), "w") as fh:
        json.dump(left, fh)
    with checkpoint.writing(model):
        pass
    assert any(f"pid {left['pid']}" in r.getMessage() and r.getMessage().endswith(": its process no longer runs")
               for r in logged.records)


def test_a_lock_of_another_host_holds_while_its_heartbeat_is_fresh_and_expires_after(tmp_path, logged):
    model = str(tmp_path / "m")
    os.makedirs(model)
    left = killed_holder(model)
    left.update(host="elsewhere", boot_id="another-boot")
    path = os.path.join(model, checkpoint.WRITER_FILE)
    with open(path, "w") as fh:
        json.dump(left, fh)
    with pytest.raises(UserError) as err:
        checkpoint.refuse_other_writer(model)
    assert str(err.value).startswith(held_line(model, left) + "; wait for it to end, or give another --out (a run "
                                     f"that died on another host holds it until {checkpoint.STALE_SECONDS:g} s after its "
                                     "last heartbeat, until ")
    old = time.time() - checkpoint.STALE_SECONDS - 100
    os.utime(path, (old, old))
    with checkpoint.writing(model):
        pass
    assert any(r.getMessage().startswith(f"warning: {model}: taking over the lock of a run that is gone (host "
                                         "elsewhere, ") and r.getMessage().endswith(" s")
               and ": no heartbeat for " in r.getMessage() for r in logged.records)


def test_the_holder_keeps_its_lock_alive_with_a_heartbeat(tmp_path):
    model = str(tmp_path / "m")
    with checkpoint.writing(model) as writer:
        path = os.path.join(model, checkpoint.WRITER_FILE)
        old = time.time() - 1000
        os.utime(path, (old, old))
        writer.beat()
        assert os.path.getmtime(path) > old + 900


def test_overwrite_keeps_the_lock_and_a_directory_holding_only_a_lock_is_empty(tmp_path, sample_corpus,
                                                                             small_models):
    model = small_models.make(tmp_path / "m", seed=1)
    with checkpoint.writing(model):
        assert checkpoint.refuse_existing_model(model, overwrite=True) is True
        checkpoint.start_model_dir(model, sample_corpus[0], overwrite=True)
        assert checkpoint.WRITER_FILE in os.listdir(model) and "LATEST" not in os.listdir(model)
        assert lock_of(model)["pid"] == os.getpid()
    fresh = str(tmp_path / "fresh")
    os.makedirs(fresh)
    killed_holder(fresh)  # a fresh run killed as soon as it took the lock
    assert checkpoint.refuse_existing_model(fresh, overwrite=False) is False


# ---------------------------------------------------------------------------------------------------
# issue 47, item 8: which version a resume starts from, verified before any actor starts
# ---------------------------------------------------------------------------------------------------

def remove_part(model: str, version: int, shard: int = 1) -> str:
    rel = f"docs/{modeldir.part_name(shard, SHARDS)}"
    os.remove(os.path.join(modeldir.version_dir(model, version), rel))
    return rel


def test_a_damaged_latest_version_falls_back_to_the_newest_intact_one_in_one_line(tmp_path, logged):
    model = str(tmp_path / "m")
    for seed in range(3):
        write_version(model, full_matrix(seed), keep=3)
    gone = remove_part(model, 3)
    point = checkpoint.resume_point(model)
    assert (point.version, point.latest, point.damaged) == (2, 3, {3: f"{gone}: part file missing"})
    assert point.manifest["version"] == 2
    said = [r.getMessage() for r in logged.records if "damaged" in r.getMessage()]
    assert said == [(f"warning: {model}: checkpoint v3 is damaged ({gone}: part file missing); resuming from v2, the newest "
                    "intact version")]
    # a flipped byte is found too (the checksum), before anything starts
    path = os.path.join(modeldir.version_dir(model, 2), "docs", modeldir.part_name(0, SHARDS))
    with open(path, "r+b") as fh:
        fh.seek(40)
        byte = fh.read(1)
        fh.seek(40)
        fh.write(bytes([byte[0] ^ 1]))
    point = checkpoint.resume_point(model)
    assert point.version == 1 and point.damaged[2] == f"docs/{modeldir.part_name(0, SHARDS)}: checksum mismatch"


def test_with_no_intact_version_resume_stops_naming_each_damage_and_no_version(tmp_path):
    model = str(tmp_path / "m")
    for seed in range(2):
        write_version(model, full_matrix(seed))
    gone = [remove_part(model, v) for v in (1, 2)]
    with pytest.raises(UserError) as err:
        checkpoint.resume_point(model)
    assert str(err.value) == (f"{model}: no intact checkpoint to resume from: v2 is damaged ({gone[1]}: part file missing), v1 "
                              f"is damaged ({gone[0]}: part file missing); train it afresh with --overwrite")


def test_resume_from_a_version_asked_for_is_verified_and_a_missing_one_named(tmp_path):
    model = str(tmp_path / "m")
    for seed in range(4):
        write_version(model, full_matrix(seed), keep=3)  # v2, v3, v4 kept
    point = checkpoint.resume_point(model, 3)
    assert (point.version, point.latest, point.damaged) == (3, 4, {})
    with pytest.raises(UserError) as err:
        checkpoint.resume_point(model, 1)
    assert str(err.value) == f"{model}: --resume-from v1: no such checkpoint (it keeps v2, v3, v4)"
    gone = remove_part(model, 4)
    with pytest.raises(UserError) as err:
        checkpoint.resume_point(model, 4)
    assert str(err.value) == (f"{model}: checkpoint v4 is damaged ({gone}: part file missing); resume from v3, the newest intact "
                              "version, with --resume-from v3")
