"""What a model has learnt: the word probe (``elmo probe``), its picture, and the sentence search over pooled ``elmo embed`` output.
May import: elmo_core, runtime, corpora, formats, inference, export, training, pipelines, serving (tests/test_layers.py)."""
