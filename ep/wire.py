"""What moves between rank 0 and an expert rank for one MoE layer, independent of how it moves: the
header (command, layer, chunking, per-expert counts), the packed route rows (each route's hidden row
in the model dtype with its float32 gate weight appended as raw bytes), and the chunk layout that
splits a large exchange into bounded collectives the same way on every rank."""
from __future__ import annotations

import dataclasses

import torch

CMD_STOP = 0
CMD_RUN = 1
WEIGHT_BYTES = 4  # one float32 gate weight per route, carried in the same row as its hidden vector


@dataclasses.dataclass(frozen=True, slots=True)
class Header:
    """One layer's instruction to the expert ranks. counts: routes per expert, for the experts the
    receiver reads (all E in a broadcast header, the receiver's own in a point-to-point one)."""
    cmd: int
    layer: int = -1
    rows_per_chunk: int = 0  # dispatch rows per rank per collective (0: not chunked)
    out_rows_per_chunk: int = 0  # combine rows per rank per collective
    counts: tuple[int, ...] = ()
    total_routes: int = 0  # the step's routes on every rank together: each rank picks its expert kernel from it

    FIXED = 5  # cmd, layer, rows_per_chunk, out_rows_per_chunk, total_routes

    @classmethod
    def size(cls, n_counts: int) -> int:
        return cls.FIXED + n_counts

    def encode(self, n_counts: int) -> torch.Tensor:
        """[FIXED + n_counts] int64 on the host; STOP pads its counts with zeros."""
        counts = list(self.counts) + [0] * (n_counts - len(self.counts))
        return torch.tensor([self.cmd, self.layer, self.rows_per_chunk, self.out_rows_per_chunk, self.total_routes,
                             *counts], dtype=torch.int64)

    @classmethod
    def decode(cls, t: torch.Tensor) -> Header:
        v = t.tolist()  # the one host read an expert rank makes per layer: routing needs the counts
        return cls(v[0], v[1], v[2], v[3], tuple(v[cls.FIXED:]), v[4])


def row_bytes(hidden_size: int, dtype: torch.dtype) -> int:
    """Bytes of one packed route row: the hidden vector in the model dtype, then the weight."""
    return hidden_size * dtype.itemsize + WEIGHT_BYTES


def pack_rows(out: torch.Tensor, rows: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """out: [>= n, row_bytes] uint8 scratch; rows: [n, H] model dtype; weight: [n] float32.
    Returns out[:n] holding both, byte for byte (no rounding: the weight stays float32)."""
    n, h = rows.shape
    rb = h * rows.element_size()
    dst = out[:n]
    dst[:, :rb].copy_(rows.contiguous().view(torch.uint8))  # [n, H*es]
    dst[:, rb:].copy_(weight.to(torch.float32).contiguous().view(torch.uint8).view(n, WEIGHT_BYTES))
    return dst


def unpack_rows(packed: torch.Tensor, hidden_size: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """packed: [n, row_bytes] uint8 -> (rows [n, H] dtype, weight [n] float32), both fresh tensors."""
    n = packed.shape[0]
    rb = hidden_size * dtype.itemsize
    rows = packed[:, :rb].contiguous().view(dtype)  # [n, H]
    weight = packed[:, rb:].contiguous().view(torch.float32).view(n)  # [n]
    return rows, weight


def rows_per_chunk(chunk_bytes: int, bytes_per_row: int, n_peers: int) -> int:
    """Rows each peer moves per collective so that one collective carries at most chunk_bytes
    (at least one row)."""
    return max(1, chunk_bytes // (bytes_per_row * max(1, n_peers)))


def n_chunks(sizes: list[int], per_chunk: int) -> int:
    """Collectives needed to move `sizes` rows per peer, per_chunk rows of each peer at a time."""
    biggest = max(sizes, default=0)
    return 0 if biggest == 0 else -(-biggest // per_chunk)


def chunk_sizes(sizes: list[int], per_chunk: int, c: int) -> list[int]:
    """Rows of each peer in chunk c: rows [c*per_chunk, (c+1)*per_chunk) of that peer's span."""
    return [max(0, min(per_chunk, n - c * per_chunk)) for n in sizes]


def chunk_major_order(sizes: list[int], per_chunk: int) -> list[int]:
    """Positions (into the peer-major concatenation of the spans) listed chunk by chunk, so that each
    chunk's rows are one contiguous slice, peers in rank order inside it."""
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    order: list[int] = []
    for c in range(n_chunks(sizes, per_chunk)):
        for start, n in zip(starts, sizes):
            lo = c * per_chunk
            order.extend(range(start + lo, start + min(n, lo + per_chunk)))
    return order
