"""Model directories written directly with the checkpoint functions: no Ray, no training."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from doc2vec_dist import checkpoint
from doc2vec_dist.errors import UserError

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
    vdir, manifest = checkpoint.load_manifest(model)
    return os.path.join(vdir, manifest["tables"]["docs"]["parts"][shard]["path"])


def test_two_shard_round_trip_gives_back_the_exact_matrix(tmp_path):
    model = str(tmp_path / "m")
    matrix = full_matrix()
    write_version(model, matrix)

    np.testing.assert_array_equal(checkpoint.read_table(model, "docs"), matrix)
    _, manifest = checkpoint.load_manifest(model)
    spec = manifest["tables"]["docs"]
    assert (spec["rows"], spec["dim"], spec["dtype"]) == (ROWS, DIM, "float32")
    assert [p["path"] for p in spec["parts"]] == [os.path.join("docs", checkpoint.part_name(s, SHARDS))
                                                  for s in range(SHARDS)]
    assert manifest["epoch"] == 1  # extra keys are kept in the manifest

    parts = list(checkpoint.iter_parts(model, "docs"))
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
    vdir, manifest = checkpoint.load_manifest(model)
    assert vdir == checkpoint.version_dir(model, 2) and manifest["version"] == 2
    np.testing.assert_array_equal(checkpoint.read_table(model, "docs"), newest)


def test_keep_prunes_older_versions_only_after_a_commit(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix(0), keep=2)
    write_version(model, full_matrix(1), keep=2)
    assert versions_on_disk(model) == ["v1", "v2"]

    # v3's parts are written but not committed: nothing is pruned and LATEST still reads v2
    write_version(model, full_matrix(2), keep=2, commit=False)
    assert versions_on_disk(model) == ["v1", "v2", "v3"]
    np.testing.assert_array_equal(checkpoint.read_table(model, "docs"), full_matrix(1))

    parts = [checkpoint.write_slice(model, 3, "docs", 0, 1, np.arange(ROWS), full_matrix(2))]
    checkpoint.commit(model, 3, {"docs": parts}, {"docs": DIM}, {}, keep=2)
    assert versions_on_disk(model) == ["v2", "v3"]
    np.testing.assert_array_equal(checkpoint.read_table(model, "docs"), full_matrix(2))


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
        checkpoint.read_table(model, "docs")
    assert path in str(err.value)


def test_a_part_path_with_dotdot_in_the_manifest_is_refused(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    manifest_path = os.path.join(checkpoint.version_dir(model, 1), "manifest.json")
    with open(manifest_path) as fh:
        manifest = json.load(fh)
    manifest["tables"]["docs"]["parts"][0]["path"] = os.path.join("..", "..", "..", "etc", "passwd")
    with open(manifest_path, "w") as fh:
        json.dump(manifest, fh)

    with pytest.raises(UserError, match="escapes the model directory"):
        checkpoint.load_manifest(model)


def test_a_model_without_latest_is_an_error_naming_the_directory(tmp_path):
    model = str(tmp_path / "not-a-model")
    os.makedirs(model)
    with pytest.raises(UserError, match="LATEST") as err:
        checkpoint.load_manifest(model)
    assert model in str(err.value)


def test_asking_for_an_untrained_table_names_the_tables_there_are(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    with pytest.raises(UserError, match=r"'words' was not trained.*docs"):
        checkpoint.read_table(model, "words")


def test_a_missing_part_file_is_a_user_error_naming_it(tmp_path):
    model = str(tmp_path / "m")
    write_version(model, full_matrix())
    path = part_path(model, 0)
    os.remove(path)
    with pytest.raises(UserError, match="part-00000-of-00002"):
        checkpoint.read_table(model, "docs")
