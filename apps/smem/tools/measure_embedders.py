"""Pick the in-process embedder by measurement: recall of LoCoMo evidence turns and embed speed.

    .venv/bin/python apps/smem/tools/measure_embedders.py /work/shared/bench-data/locomo10.json

The labelled set is made on the fly from the file, read in place: every dialogue turn of each
conversation is a passage ("Speaker: text"), every question of categories 1-4 is a query, and
its evidence dialogue ids are the relevant passages. Cosine top-k per conversation; recall@k is
the share of a question's evidence turns found in its top k, averaged over questions.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
from wordllama import WordLlama

from smem.embed import MiniLMEmbedder, normalise_rows, package_dir

KS = (1, 5, 10)


class WordLlamaEmbedder:
    """wordllama (static token embeddings), loaded from its own package directory: the hub is unreachable."""

    name = "wordllama-l2_supercat-256"
    dim = 256

    def __init__(self):
        self._wl = WordLlama.load(cache_dir=package_dir("wordllama"), disable_download=True, dim=self.dim)

    def embed(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return normalise_rows(np.asarray(self._wl.embed(texts), dtype=np.float32))


def labelled_set(path: str, conversations: int):
    for sample in json.load(open(path))[:conversations]:
        conv = sample["conversation"]
        turns = [t for key, v in conv.items() if key.startswith("session_") and isinstance(v, list) for t in v]
        ids = [t["dia_id"] for t in turns]
        texts = ["%s: %s" % (t["speaker"], t["text"]) for t in turns]
        known = set(ids)
        qa = [(q["question"], set(q["evidence"]) & known) for q in sample["qa"]
              if q.get("category") in (1, 2, 3, 4) and set(q.get("evidence", [])) & known]
        yield ids, texts, qa


def measure(embedder, data):
    hits = {k: [] for k in KS}
    passages = 0
    embed_s = 0.0
    query_lat = []
    for ids, texts, qa in data:
        t = time.perf_counter()
        corpus = embedder.embed(texts)
        embed_s += time.perf_counter() - t
        passages += len(texts)
        for question, evidence in qa:
            t = time.perf_counter()
            q = embedder.embed([question])[0]
            query_lat.append(time.perf_counter() - t)
            order = np.argsort(-(corpus @ q))
            for k in KS:
                top = {ids[i] for i in order[:k]}
                hits[k].append(len(top & evidence) / len(evidence))
    return {"questions": len(hits[KS[0]]), "passages": passages,
            **{"R@%d" % k: round(statistics.mean(v), 3) for k, v in hits.items()},
            "passages_per_s": round(passages / embed_s, 1),
            "query_ms_p50": round(1000 * statistics.median(query_lat), 2)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("locomo")
    ap.add_argument("--conversations", type=int, default=10)
    args = ap.parse_args()
    data = list(labelled_set(args.locomo, args.conversations))
    for make in (MiniLMEmbedder, WordLlamaEmbedder):
        t = time.perf_counter()
        emb = make()
        load_s = time.perf_counter() - t
        row = measure(emb, data)
        print(json.dumps({"embedder": emb.name, "dim": emb.dim, "load_s": round(load_s, 2), **row}), flush=True)


if __name__ == "__main__":
    main()
