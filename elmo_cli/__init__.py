"""The ``elmo`` command line."""
