"""training: see README."""
