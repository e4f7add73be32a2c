"""pipelines: see README."""
