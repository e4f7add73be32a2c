"""Where bytes live: local paths, object stores (s3://), the model cache, checksums (locations.py); files written whole or not at all (atomic.py).
May import: elmo_core (tests/test_layers.py)."""
