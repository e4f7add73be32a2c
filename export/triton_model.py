"""The Python-backend model of an ``elmo export triton`` repository (copied there as
``1/model.py``; it runs inside Triton's Python backend, which provides
``triton_python_backend_utils``). See ``export/triton_repo.py`` for inputs and outputs.

Every request of a dynamic batch goes through the backend in one ``embed_sentences`` call, which
sorts the sentences by length; a request with a token that is not UTF-8 gets its own error and
the others their vectors.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
import triton_python_backend_utils as pb_utils  # provided by Triton's Python backend

from elmo_core import pool_tokens
from elmo_core.vectors import VectorRequest
from inference import Embedder
from inference.outputs import non_finite_rows


def decode_tokens(tokens: np.ndarray) -> list[list[str]]:
    """Shape: (B, T) object array of bytes, padded with b"" -> B token lists (padding dropped)."""
    return [[t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in row if len(t)] for row in tokens]


def padded(vectors: list[np.ndarray], width: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    """Shape: B arrays (T_i, D) -> (B, width, D) float32 zero-padded, mask (B, width)."""
    out = np.zeros((len(vectors), width, dim), np.float32)
    mask = np.zeros((len(vectors), width), bool)
    for i, v in enumerate(vectors):
        out[i, : len(v)] = v
        mask[i, : len(v)] = True
    return out, mask


class TritonPythonModel:
    def initialize(self, args: dict) -> None:
        config = json.loads(args["model_config"])
        params = {k: v["string_value"] for k, v in config.get("parameters", {}).items()}
        device = f"cuda:{args['model_instance_device_id']}" if args["model_instance_kind"] == "GPU" else "cpu"
        model_dir = Path(args["model_repository"]) / args["model_version"] / "model"
        threads = int(params["threads"]) if params.get("threads") else None
        self.embedder = Embedder.open(model_dir, params.get("backend"), device=device, threads=threads)  # a ModelRun
        self.dim = self.embedder.config.output_dim

    def execute(self, requests: list) -> list:
        batches, errors = [], []
        for request in requests:
            tokens = pb_utils.get_input_tensor_by_name(request, "TOKENS").as_numpy()  # (B, T)
            try:
                batches.append(decode_tokens(tokens))
                errors.append(None)
            except UnicodeDecodeError as e:
                batches.append([])
                errors.append(f"TOKENS: a token is not UTF-8 ({e})")
        vectors = self.embedder.vectors([s for b in batches for s in b], VectorRequest("mixed"),
                                        check_finite=False)  # each request's own, below: one does not fail the batch
        responses, start = [], 0
        for sentences, error, request in zip(batches, errors, requests):
            mine, start = vectors[start : start + len(sentences)], start + len(sentences)
            if error is None and any(non_finite_rows(v).any() for v in mine):
                error = "the model's vectors of this request hold inf or NaN: check the model"
            if error is not None:
                responses.append(pb_utils.InferenceResponse(error=pb_utils.TritonError(error)))
                continue
            width = pb_utils.get_input_tensor_by_name(request, "TOKENS").as_numpy().shape[1]
            emb, mask = padded(mine, width, self.dim)  # (B, T, D), (B, T)
            pooled = np.nan_to_num(pool_tokens(torch.from_numpy(emb), torch.from_numpy(mask), "mean").numpy())  # (B, D)
            responses.append(pb_utils.InferenceResponse(output_tensors=[
                pb_utils.Tensor("EMBEDDINGS", emb), pb_utils.Tensor("SENTENCE_EMBEDDINGS", pooled.astype(np.float32))]))
        return responses

    def finalize(self) -> None:
        self.embedder.close()
