"""A truncated or altered checkpoint part is refused the same way by every reader of a model.

Every reader goes through modeldir.ModelDir's one part reader (or, on a parameter server,
read_shard over the same opener), which checks each part's size, sha256, schema, nulls and row
count. Here one byte of one part is flipped, or the part loses its last bytes, and each reader must
stop with the one line that names that part file and says the checkpoint is damaged.
"""

import os
import shutil

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from doc2vec_dist import modeldir
from doc2vec_dist.errors import UserError
from doc2vec_dist.evaluate import heldout_metrics, labels_metrics
from doc2vec_dist.export import export
from doc2vec_dist.index import build_index
from doc2vec_dist.infer import infer
from doc2vec_dist.model import Model, neighbors


def _first_key(m: str) -> str:
    return modeldir.ModelDir(m).keys("docs")[0].as_py()


def _labels(m: str, tmp: str) -> str:
    keys = modeldir.ModelDir(m).keys("docs").to_pylist()[:200]
    path = os.path.join(tmp, "labels.parquet")
    pq.write_table(pa.table({"key": keys, "label": [str(i % 3) for i in range(len(keys))]}), path)
    return path


def _events(m: str, tmp: str) -> str:
    urls = modeldir.ModelDir(m).keys("words_out").to_pylist()[:20]
    path = os.path.join(tmp, "new.parquet")
    pq.write_table(pa.table({"user_id": ["a"] * 10 + ["b"] * 10, "url": urls}), path)
    return path


# reader name → (the table it must read, what it does with the model directory m in a scratch folder t)
READERS = {
    "export parquet directory": ("docs", lambda m, t, h: export(m, "docs", os.path.join(t, "e"), progress=False)),
    "export parquet file": ("docs", lambda m, t, h: export(m, "docs", os.path.join(t, "e.parquet"), progress=False)),
    "export npy": ("docs", lambda m, t, h: export(m, "docs", os.path.join(t, "e"), format="npy", progress=False)),
    "export word2vec": ("words_out", lambda m, t, h: export(m, "words_out", os.path.join(t, "w.txt"),
                                                             format="word2vec", progress=False)),
    "Model.vector": ("docs", lambda m, t, h: Model(m).vector(_first_key(m))),
    "Model.table": ("docs", lambda m, t, h: Model(m).table("docs")),
    "Model.neighbors against words_out": ("words_out",
                                          lambda m, t, h: Model(m).neighbors(_first_key(m), against="words_out")),
    "index build": ("docs", lambda m, t, h: build_index(os.path.join(t, "i"), kind="flat", model=m, progress=False)),
    "neighbors": ("docs", lambda m, t, h: neighbors(m, [_first_key(m)], k=3)),
    "evaluate heldout (users)": ("docs", lambda m, t, h: heldout_metrics(m, h, max_users=50)),
    "evaluate heldout (URLs)": ("words_out", lambda m, t, h: heldout_metrics(m, h, max_users=50)),
    "evaluate labels": ("docs", lambda m, t, h: labels_metrics(m, _labels(m, t))),
    "infer": ("words_out", lambda m, t, h: infer(m, [_events(m, t)], os.path.join(t, "v.parquet"), progress=False)),
    "parameter server restore (read_shard)": ("docs", lambda m, t, h: modeldir.read_shard(m, "docs", 1, 3)),
}


@pytest.mark.parametrize("damage", ["one byte flipped", "truncated"])
@pytest.mark.parametrize("reader", list(READERS))
def test_every_reader_refuses_a_damaged_part(trained_model, sample_corpus, tmp_path, reader, damage):
    model = str(tmp_path / "model")
    shutil.copytree(trained_model, model)
    table, read = READERS[reader]
    found = modeldir.ModelDir(model)
    part = found.spec(table)["parts"][-1]
    path = os.path.join(modeldir.version_dir(model, found.version), part["path"])
    with open(path, "r+b") as fh:
        if damage == "truncated":
            fh.truncate(part["bytes"] - 100)
        else:
            fh.seek(part["bytes"] // 2)
            byte = fh.read(1)
            fh.seek(part["bytes"] // 2)
            fh.write(bytes([byte[0] ^ 0x01]))
    scratch = tmp_path / "out"
    scratch.mkdir()
    why = "checksum mismatch" if damage == "one byte flipped" else f"{part['bytes'] - 100} bytes, the manifest says"
    with pytest.raises(UserError, match=f"{part['path'].split('/')[-1]}: {why}.*the checkpoint is damaged"):
        read(model, str(scratch), sample_corpus[1])
