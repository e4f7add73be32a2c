"""Process plumbing: oneDNN cache caps and thread counts (settings.py), a local Ray cluster that ends with its driver (ray_local.py).
May import: elmo_core (tests/test_layers.py)."""
from .settings import bound_primitive_caches, check_threads, use_threads

bound_primitive_caches()  # before torch builds any oneDNN primitive (importing torch builds none)

__all__ = ["bound_primitive_caches", "check_threads", "use_threads"]
