"""Row → (shard, local row) routing.

Changes when rows are placed on servers differently.

Row r of a table lives on parameter server r % S at local row r // S. Ids are given by descending
frequency, so the modulo spreads the hot rows evenly over the servers.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def shard_of(rows: np.ndarray, num_shards: int) -> np.ndarray:
    return rows % num_shards


def local_row(rows: np.ndarray, num_shards: int) -> np.ndarray:
    return rows // num_shards


def global_rows(shard: int, num_shards: int, num_rows: int) -> np.ndarray:
    """The global ids held by one shard, in local-row order."""
    return np.arange(shard, num_rows, num_shards, dtype=np.int64)


def rows_on_shard(shard: int, num_shards: int, num_rows: int) -> int:
    return len(range(shard, num_rows, num_shards))


@dataclass
class Routing:
    """How a sorted set of unique global rows splits over the shards.

    `order` lists the unique rows grouped by shard (stable, so each group stays sorted); the
    compact local matrix a worker trains on is laid out in that order, so shard s owns the
    contiguous slice `bounds[s]:bounds[s+1]` of it — pulls fill it and pushes read it without a
    gather. `position[i]` is where unique row i sits in that layout.
    """

    local: list[np.ndarray]    # per shard: local row ids to pull/push
    bounds: np.ndarray         # int64 [S+1] slice bounds of each shard in the compact layout
    position: np.ndarray       # int64 [n_unique] compact position of each unique row

    @classmethod
    def of(cls, uniq: np.ndarray, num_shards: int) -> Routing:
        shards = shard_of(uniq, num_shards)
        order = np.argsort(shards, kind="stable")
        counts = np.bincount(shards, minlength=num_shards)
        bounds = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        grouped = uniq[order]
        local = [local_row(grouped[bounds[s]:bounds[s + 1]], num_shards) for s in range(num_shards)]
        position = np.empty(len(uniq), dtype=np.int64)
        position[order] = np.arange(len(uniq), dtype=np.int64)
        return cls(local=local, bounds=bounds, position=position)
