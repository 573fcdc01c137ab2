import itertools

import pytest

from farm.plan import plan_chunks


def covered(chunks):
    return [f for _, first, last in chunks for f in range(first, last + 1)]


@pytest.mark.parametrize("frames", [1, 29, 30, 31, 59, 60, 61, 90, 119, 1000, 15474])
@pytest.mark.parametrize("nodes", [1, 2, 3, 4])
def test_covers_every_frame_once_in_order(frames, nodes):
    chunks = plan_chunks(frames, nodes)
    assert covered(chunks) == list(range(frames))
    assert [c[0] for c in chunks] == list(range(len(chunks)))
    for (_, _, last), (_, first, _) in itertools.pairwise(chunks):
        assert first == last + 1


@pytest.mark.parametrize("frames", [30, 59, 61, 90, 200, 479, 15474])
def test_no_chunk_below_min_chunk(frames):
    for nodes in (1, 3, 4, 16):
        chunks = plan_chunks(frames, nodes, min_chunk=30)
        assert min(last - first + 1 for _, first, last in chunks) >= 30


def test_about_per_node_chunks_per_node():
    assert len(plan_chunks(15474, 4)) == 16
    assert len(plan_chunks(15474, 3, per_node=3)) == 9
    lengths = {last - first + 1 for _, first, last in plan_chunks(15474, 4)}
    assert lengths == {967, 968}  # as even as whole frames allow


def test_min_chunk_caps_the_count():
    assert len(plan_chunks(90, 4, min_chunk=30)) == 3
    assert len(plan_chunks(119, 4, min_chunk=30)) == 3


@pytest.mark.parametrize("frames", [1, 5, 29])
def test_tiny_job_is_one_chunk(frames):
    assert plan_chunks(frames, 4) == [(0, 0, frames - 1)]


@pytest.mark.parametrize("args", [(0, 1), (10, 0), (-5, 2)])
def test_rejects_nonsense(args):
    with pytest.raises(ValueError):
        plan_chunks(*args)
