"""Split a job's frames into chunks: about `per_node` per node (Remotion Lambda's model), and none
longer than one chunk's render-time bound, so that the count grows with the video instead of the
chunks."""

from __future__ import annotations

import math


def plan_chunks(frames: int, nodes: int, *, min_chunk: int = 30, per_node: int = 4,
                max_chunk: int | None = None) -> list[tuple[int, int, int]]:
    """(index, first_frame, last_frame) inclusive, covering [0, frames-1] once and in order.

    About `per_node` chunks per node (so faster nodes, which pull more, even out the job), none
    shorter than `min_chunk` frames unless the whole job is, and none longer than `max_chunk`
    (the bound wins over min_chunk); lengths differ by at most one frame.
    """
    if frames < 1 or nodes < 1 or min_chunk < 1 or per_node < 1 or (max_chunk is not None and max_chunk < 1):
        raise ValueError(f"frames, nodes, min_chunk, per_node, max_chunk must be >= 1: {frames}, {nodes}, "
                         f"{min_chunk}, {per_node}, {max_chunk}")
    count = max(1, min(nodes * per_node, frames // min_chunk))
    if max_chunk is not None:
        count = max(count, math.ceil(frames / max_chunk))
    base, extra = divmod(frames, count)
    chunks, first = [], 0
    for index in range(count):
        length = base + (index < extra)
        chunks.append((index, first, first + length - 1))
        first += length
    return chunks
