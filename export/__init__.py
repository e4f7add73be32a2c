"""export: see README."""
