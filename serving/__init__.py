"""ELMo vectors over HTTP: a dynamic batcher in front of an ``inference.Embedder``, a FastAPI app
(``/embed``, OpenAI's ``/v1/embeddings``, health, readiness, info, Prometheus metrics), run by
uvicorn on one machine or by Ray Serve on a cluster. See docs/serving.md."""
