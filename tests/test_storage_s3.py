"""Checkpoints on S3: a real S3-compatible server (moto's, in this process) on loopback, reached
through pyarrow's S3FileSystem with the endpoint taken from the model URI's query or from the
standard AWS variables."""

from __future__ import annotations

import logging

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
import pytest
from conftest import free_ports
from moto import server as moto_server  # a dev dependency: moto[s3] and flask

from doc2vec_dist import checkpoint, modeldir, storage
from doc2vec_dist.errors import UserError
from doc2vec_dist.sharding import global_rows

ROWS, DIM = 29, 6
BUCKET = "models"


@pytest.fixture(scope="module")
def s3():
    """An S3 server on 127.0.0.1 with one bucket; yields (endpoint host:port, the S3FileSystem of the bucket)."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port, = free_ports(1)  # not from the ephemeral range: see free_ports
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"127.0.0.1:{port}"
    with pytest.MonkeyPatch.context() as env:
        for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "us-east-1",
                            "AWS_EC2_METADATA_DISABLED": "true"}.items():
            env.setenv(name, value)
        env.delenv("AWS_PROFILE", raising=False)
        fs = pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", access_key="testing",
                               secret_key="testing", region="us-east-1", allow_bucket_creation=True)
        fs.create_dir(BUCKET)
        try:
            yield endpoint, fs
        finally:
            server.stop()


def uri(s3, name: str) -> str:
    return f"s3://{BUCKET}/{name}?endpoint_override={s3[0]}&scheme=http"


def matrix(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((ROWS, DIM)).astype(np.float32)


def write_version(model: str, seed: int, num_shards: int = 3, keep: int = 2, commit: bool = True) -> int:
    version = checkpoint.next_version(model)
    m, state = matrix(seed), np.full((ROWS, 1), seed, np.float32)
    parts = [checkpoint.write_slice(model, version, "docs", s, num_shards, global_rows(s, num_shards, ROWS),
                                    m[s::num_shards], state=state[s::num_shards], rows_per_batch=4)
             for s in range(num_shards)]
    if commit:
        checkpoint.commit(model, version, {"docs": parts}, {"docs": DIM}, {"epoch": version}, keep=keep)
    return version


def objects(s3, name: str) -> list[str]:
    infos = s3[1].get_file_info(pafs.FileSelector(f"{BUCKET}/{name}", recursive=True, allow_not_found=True))
    return sorted(i.path[len(f"{BUCKET}/{name}/"):] for i in infos if i.type == pafs.FileType.File)


def test_two_versions_written_and_read_back_through_s3(s3):
    model = uri(s3, "roundtrip")
    assert write_version(model, 0) == 1
    assert write_version(model, 1) == 2

    assert modeldir.latest_version(model) == 2
    assert s3[1].open_input_stream(f"{BUCKET}/roundtrip/LATEST").read() == b"v2\n"
    vdir, manifest = modeldir.load_manifest(model)
    assert vdir == modeldir.version_dir(model, 2) and manifest["epoch"] == 2
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), matrix(1))
    np.testing.assert_array_equal(modeldir.ModelDir(model, version=1).read_table("docs"), matrix(0))
    ids = np.concatenate([ids for part in modeldir.ModelDir(model).parts("docs") for ids, _ in part])
    assert sorted(ids) == list(range(ROWS))
    for shard in range(2):
        vectors, state = modeldir.read_shard(model, "docs", shard, 2)
        np.testing.assert_array_equal(vectors, matrix(1)[shard::2])
        np.testing.assert_array_equal(state, np.full((len(vectors), 1), 1, np.float32))
    # parts went straight to their names (no rename on S3): nothing temporary is left
    assert not [o for o in objects(s3, "roundtrip") if ".tmp-" in o]


def test_endpoint_from_the_standard_aws_variables(s3, monkeypatch):
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://{s3[0]}")
    model = f"s3://{BUCKET}/from-env"
    write_version(model, 3, num_shards=1)
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), matrix(3))
    assert "LATEST" in objects(s3, "from-env")


def test_a_tampered_object_is_a_checksum_error_naming_it_without_the_query(s3, tmp_path):
    model = uri(s3, "tampered")
    write_version(model, 0)
    _, manifest = modeldir.load_manifest(model)
    key = f"{BUCKET}/tampered/checkpoints/v1/{manifest['tables']['docs']['parts'][1]['path']}"
    data = bytearray(s3[1].open_input_stream(key).read())
    data[len(data) // 2] ^= 0xFF
    with s3[1].open_output_stream(key) as out:
        out.write(bytes(data))

    for read in (lambda: modeldir.ModelDir(model).read_table("docs"), lambda: modeldir.read_shard(model, "docs", 0, 2),
                 lambda: modeldir.local_copy(model, cache=str(tmp_path))):
        with pytest.raises(UserError, match="checksum mismatch") as err:
            read()
        assert f"s3://{key}" in str(err.value) and "endpoint_override" not in str(err.value)
    # the part that was not touched still reads
    np.testing.assert_array_equal(modeldir.read_shard(model, "docs", 0, 3)[0], matrix(0)[0::3])


def test_prune_and_partial_versions_on_s3(s3):
    model = uri(s3, "pruned")
    write_version(model, 0, keep=2)
    write_version(model, 1, keep=2)
    write_version(model, 2, keep=2, commit=False)  # v3: parts only, as a crash would leave it
    assert modeldir.latest_version(model) == 2
    assert checkpoint.next_version(model) == 4
    write_version(model, 3, keep=2)
    versions = {o.split("/")[1] for o in objects(s3, "pruned") if o.startswith("checkpoints/")}
    assert versions == {"v2", "v4"}
    np.testing.assert_array_equal(modeldir.ModelDir(model).read_table("docs"), matrix(3))
    np.testing.assert_array_equal(modeldir.ModelDir(model, version=2).read_table("docs"), matrix(1))


@pytest.fixture
def key_files(tmp_path):
    """A corpus directory holding just the key tables a model keeps (docs.arrow, vocab.arrow)."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    tables = {"docs.arrow": pa.table({"key": [f"user{i}" for i in range(ROWS)], "id": np.arange(ROWS),
                                      "length": np.ones(ROWS, np.int64)}),
              "vocab.arrow": pa.table({"token": ["a", "b"], "count": [3, 2], "id": np.arange(2, dtype=np.int32)})}
    for name, table in tables.items():
        with pa.OSFile(str(corpus / name), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
    return str(corpus)


def test_a_model_on_s3_is_loaded_and_exported(s3, key_files, tmp_path, monkeypatch):
    from doc2vec_dist import Model
    from doc2vec_dist.export import export

    monkeypatch.setenv("DOC2VEC_DIST_CACHE", str(tmp_path / "cache"))
    model = uri(s3, "served")
    checkpoint.start_model_dir(model, key_files, overwrite=False)
    storage.Store.of(model).write_json("config.json", {"dim": DIM, "ns_exponent": 0.75})
    write_version(model, 5)
    assert storage.Store.of(model).is_file("config.json") and storage.Store.of(model).read_json("config.json")["dim"] == DIM
    with pytest.raises(UserError, match="already holds a model; pass --overwrite to replace it"):
        checkpoint.refuse_existing_model(model, overwrite=False)

    loaded = Model(model)
    np.testing.assert_array_equal(loaded.vector("user7"), matrix(5)[7])
    assert loaded.neighbors("user7", k=3).num_rows == 3

    out = str(tmp_path / "docs.parquet")
    result = export(model, "docs", out, progress=False)
    assert result["rows"] == ROWS
    table = pq.read_table(out)
    rows = [int(k[len("user"):]) for k in table.column("key").to_pylist()]
    np.testing.assert_array_equal(modeldir.matrix_of(table.column("vector"), DIM), matrix(5)[rows])

    # a newer version replaces the cached one
    write_version(model, 6)
    np.testing.assert_array_equal(Model(model).vector("user7"), matrix(6)[7])

    # overwrite empties the model directory before the key tables are copied again
    checkpoint.start_model_dir(model, key_files, overwrite=True)
    assert objects(s3, "served") == [".doc2vec-dist.json", "docs.arrow", "vocab.arrow"]


def test_training_checkpoints_to_s3_and_resumes_from_it(s3, ray_cluster, sample_corpus):
    """Parameter-server actors write their slices to s3:// themselves; --resume reads them back."""
    from doc2vec_dist.config import TrainConfig
    from doc2vec_dist.model import Model
    from doc2vec_dist.trainer import resumed_config, train

    model = uri(s3, "trained")
    train(sample_corpus[0], model, TrainConfig(dim=16, epochs=2, sample=0, progress=False))
    assert modeldir.latest_version(model) == 2  # one per epoch end
    docs = modeldir.ModelDir(model).read_table("docs")
    summary = train(sample_corpus[0], model, resumed_config(model, {"epochs": 3, "num_ps": 3}))
    assert summary["resumed_from_epoch"] == 2 and summary["servers_loaded_from"] == [2, 2, 2]
    _, manifest = modeldir.load_manifest(model)
    assert manifest["epoch"] == 3 and manifest["num_ps"] == 3
    final = modeldir.ModelDir(model).read_table("docs")
    assert not np.array_equal(final, docs)
    served = Model(model)  # from a verified local copy of LATEST
    first = served.keys("docs")[0].as_py()
    np.testing.assert_array_equal(served.vectors([first])[0], final[0])


def test_a_model_on_s3_has_one_writer_at_a_time(s3):
    """The writer lock on an object store: an object written after finding none, read back (best effort)."""
    model = uri(s3, "locked")
    with checkpoint.writing(model) as writer:
        assert objects(s3, "locked") == [checkpoint.WRITER_FILE]
        for second in (lambda: checkpoint.refuse_other_writer(model), lambda: checkpoint.writing(model).__enter__()):
            with pytest.raises(UserError, match=rf"^s3://{BUCKET}/locked is being written by another run \(host .*, "
                                                rf"pid {writer.held['pid']}, started "):
                second()
        writer.beat()  # the heartbeat rewrites the object
        assert objects(s3, "locked") == [checkpoint.WRITER_FILE]
    assert objects(s3, "locked") == []


def test_a_pairs_dataset_on_s3_is_read_as_a_table(s3):
    """evaluate --pairs s3://…/pairs/ (a Parquet dataset, as --labels reads one) was read as a Lee matrix: 'not a
    numeric similarity matrix'."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from doc2vec_dist.evaluate import read_pairs

    table = pa.table({"key1": ["a", "c"], "key2": ["b", "d"], "score": [0.5, 1.0]})
    pq.write_table(table, f"{BUCKET}/pairs/part-0.parquet", filesystem=s3[1])
    keys1, keys2, scores = read_pairs(uri(s3, "pairs"))
    assert (keys1, keys2, scores.tolist()) == (["a", "c"], ["b", "d"], [0.5, 1.0])
