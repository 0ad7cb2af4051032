"""export: the trained sample model's tables as Parquet (file and directory), word2vec text and npy."""

from __future__ import annotations

import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import checkpoint, modeldir, outputs
from doc2vec_dist.corpus import Corpus
from doc2vec_dist.errors import UserError
from doc2vec_dist.export import export

DIM = 32  # the trained_model fixture's


@pytest.fixture(scope="module")
def doc_keys(sample_corpus) -> list[str]:
    """User ids of the corpus in row-id order."""
    return Corpus(sample_corpus[0]).docs().column("key").to_pylist()


@pytest.fixture(scope="module")
def doc_matrix(trained_model) -> np.ndarray:
    return modeldir.ModelDir(trained_model).read_table("docs")


def assert_matches_checkpoint(keys: list[str], vectors: np.ndarray, doc_keys: list[str], doc_matrix: np.ndarray):
    """Exported (key, vector) rows are exactly the corpus users with their checkpoint rows."""
    assert len(keys) == len(doc_keys)
    assert sorted(keys) == sorted(doc_keys)
    row_of = {key: i for i, key in enumerate(doc_keys)}
    np.testing.assert_array_equal(vectors, doc_matrix[[row_of[k] for k in keys]])


def read_key_vector(path: str) -> tuple[pa.Table, list[str], np.ndarray]:
    table = pq.read_table(path)
    vectors = modeldir.matrix_of(table.column("vector"), DIM)
    return table, table.column("key").to_pylist(), vectors


def test_parquet_file_has_key_and_fixed_size_vector_of_every_user(trained_model, doc_keys, doc_matrix, tmp_path):
    out = str(tmp_path / "docs.parquet")
    result = export(trained_model, "docs", out, progress=False)

    assert (result["rows"], result["dim"], result["format"]) == (len(doc_keys), DIM, "parquet")
    assert os.path.isfile(out)
    table, keys, vectors = read_key_vector(out)
    assert table.schema.field("key").type == pa.string()
    assert table.schema.field("vector").type == pa.list_(pa.float32(), DIM)
    assert_matches_checkpoint(keys, vectors, doc_keys, doc_matrix)
    assert os.listdir(tmp_path) == ["docs.parquet"]  # no temp file left beside it


def test_parquet_directory_holds_part_files_with_the_same_rows(trained_model, doc_keys, doc_matrix, tmp_path):
    out = str(tmp_path / "docs")
    export(trained_model, "docs", out, progress=False)

    assert os.path.isdir(out)
    parts = sorted(os.listdir(out))
    assert parts[0] == ".doc2vec-dist.json"  # the marker: pyarrow, Spark and pandas skip dot files
    parts = parts[1:]
    assert parts and all(p.startswith("part-") and p.endswith(".parquet") for p in parts)
    table, keys, vectors = read_key_vector(out)
    assert table.schema.field("vector").type == pa.list_(pa.float32(), DIM)
    assert_matches_checkpoint(keys, vectors, doc_keys, doc_matrix)
    assert os.listdir(tmp_path) == ["docs"]


def test_exporting_again_replaces_the_previous_export(trained_model, doc_keys, tmp_path):
    out = str(tmp_path / "docs")
    export(trained_model, "docs", out, progress=False)
    with open(os.path.join(out, "part-00099.parquet"), "w") as fh:  # a stale part of an older export
        fh.write("not parquet")
    export(trained_model, "docs", out, progress=False)
    assert "part-00099.parquet" not in os.listdir(out)
    assert pq.read_table(out).num_rows == len(doc_keys)


def test_a_directory_with_other_files_is_not_replaced(trained_model, tmp_path):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep me")
    with pytest.raises(UserError, match=r"mine: exists and is not an export made by doc2vec-dist \(it holds notes"):
        export(trained_model, "docs", str(out), progress=False)
    assert (out / "notes.txt").read_text() == "keep me"


def test_word2vec_text_loads_in_gensim_with_the_same_vectors(trained_model, doc_keys, doc_matrix, tmp_path):
    from gensim.models import KeyedVectors

    out = str(tmp_path / "docs.w2v.txt")
    export(trained_model, "docs", out, format="word2vec", progress=False)

    kv = KeyedVectors.load_word2vec_format(out, binary=False)
    assert kv.vector_size == DIM and len(kv.index_to_key) == len(doc_keys)
    assert set(kv.index_to_key) == set(doc_keys)
    row_of = {key: i for i, key in enumerate(doc_keys)}
    expected = doc_matrix[[row_of[k] for k in kv.index_to_key]]
    np.testing.assert_allclose(kv.vectors, expected, rtol=1e-5, atol=1e-6)  # text keeps 6 significant digits
    # and beside it the marker that says it is ours (the format has no room for one)
    assert sorted(os.listdir(tmp_path)) == ["docs.w2v.txt", "docs.w2v.txt.doc2vec-dist.json"]


def test_word2vec_of_words_out_has_the_urls(trained_model, sample_corpus, tmp_path):
    from gensim.models import KeyedVectors

    out = str(tmp_path / "urls.txt")
    export(trained_model, "words_out", out, format="word2vec", progress=False)
    kv = KeyedVectors.load_word2vec_format(out, binary=False)
    vocab = Corpus(sample_corpus[0]).vocab().column("token").to_pylist()
    assert sorted(kv.index_to_key) == sorted(vocab)
    # rows come part by part (one part per parameter server), each URL with its own word id's row
    id_of = {url: i for i, url in enumerate(vocab)}
    words_out = modeldir.ModelDir(trained_model).read_table("words_out")
    np.testing.assert_allclose(kv.vectors, words_out[[id_of[u] for u in kv.index_to_key]], rtol=1e-5, atol=1e-6)


def test_npy_vectors_are_aligned_with_keys_parquet(trained_model, doc_keys, doc_matrix, tmp_path):
    out = str(tmp_path / "npy")
    export(trained_model, "docs", out, format="npy", progress=False)

    assert sorted(os.listdir(out)) == [".doc2vec-dist.json", "keys.parquet", "vectors.npy"]
    vectors = np.load(os.path.join(out, "vectors.npy"))
    keys = pq.read_table(os.path.join(out, "keys.parquet")).column("key").to_pylist()
    assert vectors.dtype == np.float32 and vectors.shape == (len(doc_keys), DIM)
    assert keys == doc_keys  # row-id order
    np.testing.assert_array_equal(vectors, doc_matrix)
    assert os.listdir(tmp_path) == ["npy"]


def test_exporting_an_untrained_table_says_it_was_not_trained(trained_model, tmp_path):
    out = str(tmp_path / "words.parquet")
    with pytest.raises(UserError, match="'words' was not trained"):
        export(trained_model, "words", out, progress=False)
    assert os.listdir(tmp_path) == []


def test_unknown_format_is_a_user_error_and_writes_nothing(trained_model, tmp_path):
    with pytest.raises(UserError, match="unknown export format 'csv'"):
        export(trained_model, "docs", str(tmp_path / "docs.csv"), format="csv", progress=False)
    assert os.listdir(tmp_path) == []


def test_exporting_onto_the_model_directory_is_refused_and_keeps_the_model(trained_model, tmp_path):
    import shutil

    model = shutil.copytree(trained_model, str(tmp_path / "model"))
    with pytest.raises(UserError, match="model"):
        export(model, "docs", model, progress=False)
    assert os.path.isfile(os.path.join(model, "LATEST"))
    assert modeldir.ModelDir(model).read_table("docs").shape == modeldir.ModelDir(trained_model).read_table("docs").shape


def test_normalize_and_float16_export(trained_model, doc_keys, doc_matrix, tmp_path):
    out = str(tmp_path / "docs16.parquet")
    result = export(trained_model, "docs", out, progress=False, normalize=True, dtype="float16")
    assert result["dtype"] == "float16" and result["normalized"]
    table = pq.read_table(out)
    assert table.schema.field("vector").type == pa.list_(pa.float16(), doc_matrix.shape[1])
    vectors = np.stack(table.column("vector").to_numpy(zero_copy_only=False)).astype(np.float32)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=2e-3)
    row_of = {k: i for i, k in enumerate(doc_keys)}  # parts come shard by shard, not in id order
    rows = [row_of[k] for k in table.column("key").to_pylist()]
    expected = doc_matrix[rows] / np.linalg.norm(doc_matrix[rows], axis=1, keepdims=True)
    np.testing.assert_allclose(vectors, expected, atol=2e-3)


# --- per-part parallel export, exact text, npy options, bad keys -------------------------------------

def write_model(root, keys: list[str], matrix: np.ndarray, parts: int) -> str:
    """A model directory with only a docs table, sharded like `parts` parameter servers (row r in part r % parts)."""
    model = str(root)
    os.makedirs(model)
    schema = pa.schema([("key", pa.string()), ("id", pa.int64()), ("length", pa.int64())])
    ids = np.arange(len(keys), dtype=np.int64)
    with pa.OSFile(os.path.join(model, "docs.arrow"), "wb") as sink, pa.ipc.new_file(sink, schema) as writer:
        writer.write_table(pa.table({"key": keys, "id": ids, "length": np.ones(len(keys), np.int64)}, schema=schema))
    entries = [checkpoint.write_slice(model, 1, "docs", s, parts, ids[s::parts], matrix[s::parts], rows_per_batch=7)
               for s in range(parts)]
    checkpoint.commit(model, 1, {"docs": entries}, {"docs": matrix.shape[1]}, {}, keep=1)
    return model


@pytest.fixture
def three_part_model(tmp_path) -> tuple[str, list[str], np.ndarray]:
    """50 users × 6 dims over 3 parts, written in batches of 7 rows: many batches per part."""
    keys = [f"user-{i}" for i in range(50)]
    matrix = np.random.default_rng(3).standard_normal((50, 6)).astype(np.float32)
    return write_model(tmp_path / "model", keys, matrix, parts=3), keys, matrix


def test_directory_export_writes_one_file_per_checkpoint_part(three_part_model, tmp_path):
    model, keys, matrix = three_part_model
    out = str(tmp_path / "users")
    result = export(model, "docs", out, progress=False)

    assert sorted(os.listdir(out)) == [".doc2vec-dist.json", "part-00000.parquet", "part-00001.parquet",
                                       "part-00002.parquet"]
    assert [t["part"] for t in result["tasks"]] == [0, 1, 2] and sum(t["rows"] for t in result["tasks"]) == 50
    assert result["rows_per_second"] > 0 and result["peak_rss_bytes"] > 0
    for part in range(3):  # part p holds rows p, p+3, p+6, … with their own keys and vectors
        table = pq.read_table(os.path.join(out, f"part-{part:05d}.parquet"))
        assert table.column("key").to_pylist() == keys[part::3]
        np.testing.assert_array_equal(modeldir.matrix_of(table.column("vector"), 6), matrix[part::3])


def test_word2vec_floats_read_back_exactly(three_part_model, tmp_path):
    from gensim.models import KeyedVectors

    model, keys, matrix = three_part_model
    out = str(tmp_path / "users.txt")
    export(model, "docs", out, format="word2vec", progress=False)

    kv = KeyedVectors.load_word2vec_format(out, binary=False)
    assert len(kv.index_to_key) == 50
    np.testing.assert_array_equal(kv.vectors, matrix[[keys.index(k) for k in kv.index_to_key]])
    # the per-part pieces are gone; the marker that says the file is ours is beside it
    assert sorted(os.listdir(tmp_path)) == ["model", "users.txt", "users.txt" + outputs.MARKER]


def test_word2vec_refuses_a_key_with_whitespace_and_leaves_nothing(tmp_path):
    keys = ["a", "b c", "d"]
    model = write_model(tmp_path / "model", keys, np.ones((3, 4), np.float32), parts=2)
    with pytest.raises(UserError, match=r"key 'b c' \(row id 1\).*whitespace"):
        export(model, "docs", str(tmp_path / "out.txt"), format="word2vec", progress=False)
    assert os.listdir(tmp_path) == ["model"]


def test_npy_normalized_float16_from_three_parts(three_part_model, tmp_path):
    model, keys, matrix = three_part_model
    out = str(tmp_path / "npy")
    export(model, "docs", out, format="npy", normalize=True, dtype="float16", progress=False)

    vectors = np.load(os.path.join(out, "vectors.npy"))
    assert vectors.dtype == np.float16 and vectors.shape == (50, 6)
    assert pq.read_table(os.path.join(out, "keys.parquet")).column("key").to_pylist() == keys
    expected = matrix / np.linalg.norm(matrix, axis=1, keepdims=True)
    np.testing.assert_allclose(vectors.astype(np.float32), expected, atol=1e-3)


def test_a_damaged_part_stops_the_export_and_leaves_nothing(three_part_model, tmp_path):
    model, _, _ = three_part_model
    vdir, manifest = modeldir.load_manifest(model)
    part = os.path.join(vdir, manifest["tables"]["docs"]["parts"][1]["path"])
    with open(part, "r+b") as fh:  # flip bytes in the middle of the part file
        fh.seek(os.path.getsize(part) // 2)
        fh.write(b"\xff\xff\xff\xff")
    with pytest.raises(UserError, match="part-00001-of-00003.arrow: checksum mismatch"):
        export(model, "docs", str(tmp_path / "users"), progress=False)
    assert sorted(os.listdir(tmp_path)) == ["model"]


def test_words_table_of_a_model_without_words_is_a_clear_error(three_part_model, tmp_path):
    model, _, _ = three_part_model
    with pytest.raises(UserError, match="table 'words' was not trained in this model \\(it has: docs\\)"):
        export(model, "words", str(tmp_path / "words"), progress=False)


# -- one npy file, and what an export records of its model (issue 26, items 12 and 2) ----------------------

def test_npy_to_a_path_ending_in_npy_is_one_file_with_its_keys_beside_it(three_part_model, tmp_path):
    model, keys, matrix = three_part_model
    out = str(tmp_path / "users.npy")
    result = export(model, "docs", out, format="npy", progress=False)
    assert result["keys_path"] == str(tmp_path / "users.keys.parquet")
    assert sorted(os.listdir(tmp_path)) == ["model", "users.keys.parquet", "users.npy"]
    np.testing.assert_array_equal(np.load(out), matrix)  # a plain matrix: np.load reads it as it is
    assert pq.read_table(result["keys_path"]).column("key").to_pylist() == keys
    # again: the pair is ours (its keys file says so), and both are replaced
    export(model, "docs", out, format="npy", normalize=True, progress=False)
    np.testing.assert_allclose(np.linalg.norm(np.load(out), axis=1), 1.0, rtol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["model", "users.keys.parquet", "users.npy"]


def test_an_npy_file_of_the_users_is_not_replaced(three_part_model, tmp_path, snapshot):
    model, _, _ = three_part_model
    out = str(tmp_path / "mine.npy")
    np.save(out, np.ones((3, 2)))
    before = snapshot(str(tmp_path))
    with pytest.raises(UserError, match=f"{out}: exists and is not a file doc2vec-dist wrote"):
        export(model, "docs", out, format="npy", progress=False)
    assert snapshot(str(tmp_path)) == before


@pytest.mark.parametrize("name, format", [("users.npy", "parquet"), ("users.parquet", "npy")])
def test_a_path_ending_in_another_format_is_refused(three_part_model, tmp_path, name, format):
    model, _, _ = three_part_model
    ending = os.path.splitext(name)[1]
    with pytest.raises(UserError, match=f"ends in {ending}, but --format is {format}; give --format {ending[1:]}"):
        export(model, "docs", str(tmp_path / name), format=format, progress=False)
    assert os.listdir(tmp_path) == ["model"]


def test_exports_record_the_model_version_and_table(three_part_model, tmp_path):
    from doc2vec_dist.provenance import of_parquet

    model = three_part_model[0]
    expected = {"model": os.path.abspath(model), "model_id": modeldir.ModelDir(model).manifest["model_id"],
                "version": 1, "table": "docs", "derived_from": []}
    export(model, "docs", str(tmp_path / "one.parquet"), progress=False)
    export(model, "docs", str(tmp_path / "parts"), progress=False)
    export(model, "docs", str(tmp_path / "u.npy"), format="npy", progress=False)
    files = [str(tmp_path / "one.parquet"), str(tmp_path / "u.keys.parquet"),
             *(str(tmp_path / "parts" / f"part-{p:05d}.parquet") for p in range(3))]
    assert [of_parquet(f) for f in files] == [expected] * 5


def test_npy_data_offset_reads_the_preamble_of_every_header_version(tmp_path):
    """The offset of an .npy file's data from its preamble alone, as numpy's parse of the whole header
    finds it (that parse is not safe on threads in CPython 3.11), for versions 1 to 3 of the format."""
    from doc2vec_dist.export import npy_data_offset, open_npy

    rows = np.arange(12, dtype=np.float32).reshape(3, 4)
    for version in ((1, 0), (2, 0), (3, 0)):
        path = str(tmp_path / f"v{version[0]}.npy")
        with open(path, "wb") as fh:
            np.lib.format.write_array(fh, rows, version=version)
        mapped = open_npy(path)
        assert npy_data_offset(path) == mapped.offset
        with open(path, "rb") as fh:
            fh.seek(npy_data_offset(path))
            np.testing.assert_array_equal(np.frombuffer(fh.read(), dtype=np.float32).reshape(3, 4), rows)


# -- export --format projector (issue 52, item 4) -----------------------------------------------------

def projector_config_class():
    """tensorboard.projector.ProjectorConfig, built from TensorBoard's projector_config.proto (its fields and
    numbers as that file declares them; tensorboard is not installed here, protobuf is): its text format then
    parses a config as TensorBoard's plugin does (text_format into this message), unknown fields refused."""
    from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

    field = descriptor_pb2.FieldDescriptorProto
    proto = descriptor_pb2.FileDescriptorProto(name="projector_config.proto", package="tensorboard.projector",
                                               syntax="proto3")

    def message(name, *fields):
        m = proto.message_type.add(name=name)
        for number, (fname, ftype, repeated, type_name) in enumerate(fields, 1):
            added = m.field.add(name=fname, number=number, type=ftype,
                                label=field.LABEL_REPEATED if repeated else field.LABEL_OPTIONAL)
            if type_name:
                added.type_name = type_name

    string, uint32, nested = field.TYPE_STRING, field.TYPE_UINT32, field.TYPE_MESSAGE
    message("SpriteMetadata", ("image_path", string, False, None), ("single_image_dim", uint32, True, None))
    message("EmbeddingInfo", ("tensor_name", string, False, None), ("metadata_path", string, False, None),
            ("bookmarks_path", string, False, None), ("tensor_shape", uint32, True, None),
            ("sprite", nested, False, ".tensorboard.projector.SpriteMetadata"), ("tensor_path", string, False, None))
    message("ProjectorConfig", ("model_checkpoint_path", string, False, None),
            ("embeddings", nested, True, ".tensorboard.projector.EmbeddingInfo"),
            ("model_checkpoint_dir", string, False, None))
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("tensorboard.projector.ProjectorConfig"))


def read_projector(out) -> tuple[object, np.ndarray, list[list[str]]]:
    """The three files read as TensorBoard's projector reads them (tensorboard is not a dependency, nor installed
    here: a faithful reading of its documented formats, checked by hand against TensorBoard 2.21's own reader,
    see docs/commands.md): projector_config.pbtxt parsed by protobuf's text format into a ProjectorConfig;
    tensors.tsv as projector_plugin._read_tensor_tsv_file reads it (each non-empty line split on tabs, every
    field a float, float32); metadata.tsv, a header line of column names (the projector takes the first line as
    a header where there is more than one column) and then one row per tensor row."""
    from google.protobuf import text_format

    with open(os.path.join(out, "projector_config.pbtxt")) as fh:
        config = text_format.Parse(fh.read(), projector_config_class()())
    assert len(config.embeddings) == 1, config
    embedding = config.embeddings[0]
    with open(os.path.join(out, embedding.tensor_path)) as fh:
        tensors = np.array([[float(v) for v in line.split("\t")] for line in (raw.rstrip("\n") for raw in fh) if line],
                           dtype=np.float32)
    with open(os.path.join(out, embedding.metadata_path), encoding="utf-8") as fh:
        rows = [line.rstrip("\n").split("\t") for line in fh]
    assert len({len(row) for row in rows}) == 1 and len(rows[0]) > 1  # a header, every row as wide
    return embedding, tensors, rows


def test_projector_export_of_a_sample_of_users_and_of_the_urls(trained_model, doc_keys, doc_matrix, tmp_path):
    out = tmp_path / "users"
    result = export(trained_model, "docs", str(out), format="projector", sample=300, progress=False)
    embedding, tensors, rows = read_projector(out)
    assert result["rows"] == 300 and tensors.shape == (300, DIM) and len(rows) == 301
    assert rows[0] == ["key", "host", "count"]
    keys = [r[0] for r in rows[1:]]
    assert len(set(keys)) == 300 and set(keys) <= set(doc_keys)
    row_of = {key: i for i, key in enumerate(doc_keys)}
    np.testing.assert_array_equal(tensors, doc_matrix[[row_of[k] for k in keys]])  # the text loses no bit
    lengths = Corpus(modeldir.ModelDir(trained_model).corpus_path()).docs().column("length").to_pylist()
    assert [int(r[2]) for r in rows[1:]] == [lengths[row_of[k]] for k in keys]  # a user's count: its events
    assert all(r[1] and "/" not in r[1] for r in rows[1:])  # its most visited host
    assert embedding.tensor_name == "docs" and list(embedding.tensor_shape) in ([], [300, DIM])

    urls = tmp_path / "urls"
    export(trained_model, "words_out", str(urls), format="projector", sample=50, progress=False)
    _, url_tensors, url_rows = read_projector(urls)
    vocab = modeldir.ModelDir(trained_model).vocab()
    assert url_tensors.shape == (50, DIM) and [r[0] for r in url_rows[1:]] == vocab.column("token").to_pylist()[:50]
    assert [int(r[2]) for r in url_rows[1:]] == vocab.column("count").to_pylist()[:50]  # the most visited
    assert all(r[0].split("/")[2].removeprefix("www.") in r[0] and r[1] == r[0].split("/")[2] for r in url_rows[1:])
