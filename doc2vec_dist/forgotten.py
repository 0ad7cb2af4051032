"""The forget list: salted hashes of the keys of users who asked to be forgotten, never the keys.

Changes when how a forgotten user is recorded or recognised changes; the `forget` command that fills
the list and erases the users is forget.py's.

    MODEL/forget.arrow, CORPUS/forget.arrow    salt fixed_size_binary(16), hash fixed_size_binary(32)

hash = blake2b(salt + key as UTF-8, 32 bytes). A list keeps the keys' hashes only: the list says
nothing of who was forgotten to someone who does not already hold the key, yet recognises the key
when it comes back in tomorrow's logs. Each model draws its own random salt the first time it forgets
someone (the schema's metadata names it, with the ids of the models it was made for); the same key
hashes differently in two models, so two lists cannot be joined to find the users both forgot.

A list travels with what descends from its model: `forget --corpus` writes it into the corpus,
`prepare --base` into the refreshed corpus (the base's list and its model's, together), and a model
takes its corpus's list when training starts (checkpoint.start_model_dir). Entries keep the salt they
were hashed with, so a list gathered from several models still recognises each key.

A model's own list records the models it was made for (`model_ids`); one that names none of the
model's lineage (its id and the ids it was trained --init-from) came from another model, copied by
hand: refused in one line, since it would forget people of another population (another id scheme)
whose keys happen to be spelled alike, and would not forget this model's.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from .errors import UserError

FILE = "forget.arrow"
SALT_BYTES = 16
HASH_BYTES = 32
SCHEMA = pa.schema([("salt", pa.binary(SALT_BYTES)), ("hash", pa.binary(HASH_BYTES))])
METADATA_KEY = b"doc2vec_dist.forget"


def key_hash(salt: bytes, key: str) -> bytes:
    """blake2b(salt + key), 32 bytes."""
    return hashlib.blake2b(salt + key.encode("utf-8"), digest_size=HASH_BYTES).digest()


@dataclass
class ForgetList:
    """The hashes of forgotten keys, by the salt they were hashed with."""

    hashes: dict[bytes, set[bytes]] = field(default_factory=dict)
    salt: bytes | None = None                          # the salt new entries take (the model's own)
    model_ids: list[str] = field(default_factory=list)  # the models this list was made for
    path: str | None = None                            # where it was read from, for messages

    def __len__(self) -> int:
        return sum(len(found) for found in self.hashes.values())

    @classmethod
    def read(cls, path: str) -> ForgetList:
        """The list at `path` (an empty one when there is none); one line naming the file when it is not one."""
        if not os.path.exists(path):
            return cls(path=path)
        try:
            with pa.memory_map(path) as source:
                table = pa.ipc.open_file(source).read_all()
        except (pa.ArrowException, OSError) as exc:
            raise UserError(f"{path}: not a forget list ({exc})") from None
        if table.schema.remove_metadata() != SCHEMA:
            raise UserError(f"{path}: not a forget list (expected columns salt binary[{SALT_BYTES}], "
                            f"hash binary[{HASH_BYTES}])")
        meta = {}
        raw = (table.schema.metadata or {}).get(METADATA_KEY)
        if raw:
            try:
                meta = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                raise UserError(f"{path}: its metadata is not JSON; the forget list is damaged") from None
        found = cls(salt=bytes.fromhex(meta["salt"]) if meta.get("salt") else None,
                    model_ids=list(meta.get("model_ids") or []), path=path)
        for salt, hashed in zip(table.column("salt").to_pylist(), table.column("hash").to_pylist(), strict=True):
            found.hashes.setdefault(salt, set()).add(hashed)
        return found

    def write(self, path: str) -> None:
        """Write the list at `path` whole (a temporary name, then a rename): a reader never sees half of it."""
        from .storage import write_local

        rows = sorted((salt, h) for salt, found in self.hashes.items() for h in found)
        meta = {"salt": self.salt.hex() if self.salt else None, "model_ids": self.model_ids}
        schema = SCHEMA.with_metadata({METADATA_KEY: json.dumps(meta).encode()})
        table = pa.table({"salt": pa.array([r[0] for r in rows], pa.binary(SALT_BYTES)),
                          "hash": pa.array([r[1] for r in rows], pa.binary(HASH_BYTES))}, schema=schema)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, schema) as writer:
            writer.write_table(table)
        write_local(path, sink.getvalue().to_pybytes())

    def matches(self, keys: pa.Array | pa.ChunkedArray) -> np.ndarray:
        """Which of `keys` (strings) the list holds, as a bool per key: each distinct key hashed once per salt."""
        if isinstance(keys, pa.ChunkedArray):
            keys = keys.combine_chunks()
        found = np.zeros(len(keys), bool)
        if not self.hashes or not len(keys):
            return found
        encoded = pc.dictionary_encode(keys)
        distinct = encoded.dictionary.to_pylist()
        listed = np.zeros(len(distinct), bool)
        for salt, hashed in self.hashes.items():
            listed |= np.fromiter(((k is not None and key_hash(salt, k) in hashed) for k in distinct), bool,
                                  count=len(distinct))
        indices = encoded.indices
        valid = indices.is_valid().to_numpy(zero_copy_only=False)
        found[valid] = listed[indices.drop_null().to_numpy()]
        return found

    def holds(self, key: str) -> bool:
        return bool(self.matches(pa.array([key], pa.string()))[0])

    def add(self, keys: Iterable[str]) -> int:
        """Add keys by their hash with this list's salt (drawn now if it has none); returns how many were new."""
        if self.salt is None:
            self.salt = secrets.token_bytes(SALT_BYTES)
        found = self.hashes.setdefault(self.salt, set())
        before = len(found)
        found.update(key_hash(self.salt, k) for k in keys)
        return len(found) - before

    def merge(self, other: ForgetList) -> ForgetList:
        """Both lists' entries in one (this one's salt and models first)."""
        merged = ForgetList({salt: set(found) for salt, found in self.hashes.items()}, self.salt or other.salt,
                            list(dict.fromkeys(self.model_ids + other.model_ids)), self.path)
        for salt, found in other.hashes.items():
            merged.hashes.setdefault(salt, set()).update(found)
        return merged

    def check_belongs(self, lineage: list[str], model: str) -> None:
        """Refuse a model's list that was made for none of the models of its lineage (copied from another model)."""
        if self.model_ids and lineage and not set(self.model_ids) & set(lineage):
            raise UserError(f"{self.path}: a forget list of another model (made for model id "
                            f"{self.model_ids[0][:8]}, and {model} is {lineage[0][:8]}"
                            + (f", trained from {', '.join(i[:8] for i in lineage[1:])}" if lineage[1:] else "")
                            + "): it would forget the users of another population whose keys are spelled alike; "
                            f"remove it from {model}, and forget this model's users by their keys "
                            "(doc2vec-dist forget --model … --keys FILE)")


def lineage_of(manifest: dict) -> list[str]:
    """A model's id and the ids it descends from (a manifest's model_id, then derived_from)."""
    return [i for i in [manifest.get("model_id"), *(manifest.get("derived_from") or [])] if i]


def of_model(path: str, manifest: dict) -> ForgetList:
    """MODEL/forget.arrow, checked to belong to the model whose LATEST manifest is `manifest`."""
    found = ForgetList.read(os.path.join(path, FILE))
    found.check_belongs(lineage_of(manifest), path)
    return found


def of_corpus(path: str) -> ForgetList:
    """CORPUS/forget.arrow (empty when there is none)."""
    return ForgetList.read(os.path.join(path, FILE))


def copy_for_new_model(corpus: str, model_dir: str) -> None:
    """A new model takes its corpus's list: its entries, each with its salt, but no salt of its own yet
    (it draws one when it first forgets someone) and no model id (the list names the models it was made
    for once forget extends it there)."""
    found = of_corpus(corpus)
    if len(found):
        ForgetList(found.hashes, None, [], None).write(os.path.join(model_dir, FILE))
