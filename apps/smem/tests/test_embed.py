"""The in-process embedder, and the OpenAI-shaped HTTP client against a stub server on 127.0.0.1."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import JSONStub
from smem.embed import EmbedderError, HTTPEmbedder


def test_minilm_vectors_are_unit_length_and_mean_something(minilm):
    v = minilm.embed(["The cat sleeps on the mat.", "A kitten naps on a rug.", "Quarterly tax filing deadline."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    assert np.allclose(np.linalg.norm(v, axis=1), 1, atol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2
    # Padding in a batch does not change a text's vector.
    assert np.allclose(minilm.embed(["The cat sleeps on the mat."])[0], v[0], atol=1e-4)


@pytest.fixture
def stub():
    seen = []
    mode = {"answer": "ok"}

    def respond(path, body, headers):
        seen.append((path, body, headers.get("Authorization")))
        if mode["answer"] == "500":
            return 500, None
        dim = 2 if mode["answer"] == "wrong-dim" else 3
        # Reversed on purpose: the client must order by "index".
        data = [{"object": "embedding", "index": i, "embedding": [float(len(t)), 1.0, 0.0][:dim]}
                for i, t in reversed(list(enumerate(body["input"])))]
        return 200, {"object": "list", "data": data, "model": body["model"]}

    server = JSONStub(respond)
    yield server.url, seen, mode
    server.close()


def test_http_embedder_speaks_openai_embeddings(stub):
    url, seen, _ = stub
    e = HTTPEmbedder(url + "/", "embeddinggemma", dim=3, api_key="k")
    v = e.embed(["a", "bbb"])
    assert seen == [("/v1/embeddings", {"model": "embeddinggemma", "input": ["a", "bbb"]}, "Bearer k")]
    expected = np.array([[1, 1, 0], [3, 1, 0]], dtype=np.float32)
    assert np.allclose(v, expected / np.linalg.norm(expected, axis=1, keepdims=True))


@pytest.mark.parametrize("answer", ["500", "wrong-dim"])
def test_http_embedder_failures_are_embedder_errors(stub, answer):
    url, _, mode = stub
    mode["answer"] = answer
    with pytest.raises(EmbedderError):
        HTTPEmbedder(url, "m", dim=3).embed(["a"])


def test_http_embedder_unreachable_is_an_embedder_error():
    with pytest.raises(EmbedderError):
        HTTPEmbedder("http://127.0.0.1:9", "m", dim=3, timeout=5).embed(["a"])
