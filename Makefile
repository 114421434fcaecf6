# Two commands for a fresh machine (README.md):
#   make course   set up .venv with the course's runtime and open JupyterLab on lesson 01
#   make test     set up .venv with the test tools too and run the whole test suite
# torch is installed first, pinned here only (the package itself never pins it, so Colab keeps
# its own build), by tools/install_torch.py: on Linux without an NVIDIA GPU the CPU build from
# PyTorch's CPU wheel index, else (or where that index cannot be reached) the standard wheel.
# Another version: make course TORCH_SPEC="torch==X.Y"; another build: install it into the venv
# first (a torch that imports is kept).
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0
# The learner's runtime (JupyterLab, the nbstripout filter, Hugging Face for lesson 02) and, for
# `make test` and `make release`, the grader and the test tools on top.
COURSE_EXTRAS ?= lab,hf
TEST_EXTRAS ?= lab,hf,grade,test
# The notebook JupyterLab opens first; the file browser is rooted at the repository.
FIRST_LESSON := $(firstword $(sort $(wildcard notebooks/01_*.ipynb)))
LAB_ARGS ?=

.PHONY: setup setup-test git-filter lab course test test-ipywidgets7 test-matrix bench bench-lessons bench-grading release wheel zip clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.course: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python tools/install_torch.py "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[$(COURSE_EXTRAS)]"
	touch $@

$(VENV)/.test: pyproject.toml $(VENV)/.course
	$(BIN)/python -m pip install --quiet -e ".[$(TEST_EXTRAS)]"
	touch $@

# Outputs of the lessons you run stay in your files and out of git: nbstripout's git filter,
# with --keep-id because the grader matches cells by id, and the kernel's details that a save
# adds to language_info stripped too. .gitattributes (tracked) names the filter; this writes the
# filter's command into .git/config. Skipped outside a git checkout.
LANGUAGE_INFO_KEYS := $(foreach k,codemirror_mode file_extension mimetype nbconvert_exporter \
	pygments_lexer version,metadata.language_info.$(k))
# `git update-index --refresh` first, while no filter is set: it rewrites an index that is still
# "racily clean" (written in the same second as the files, as right after `git clone`); left so,
# the first `git status` with the filter would run nbstripout on every notebook (~45 s measured).
git-filter:
	@if git rev-parse --is-inside-work-tree >/dev/null 2>&1; then \
	  git update-index -q --refresh; \
	  $(BIN)/nbstripout --install --attributes .gitattributes && \
	  git config filter.nbstripout.clean '"$(abspath $(BIN))/python" -m nbstripout --keep-id' && \
	  git config filter.nbstripout.extrakeys "$(LANGUAGE_INFO_KEYS)" && \
	  echo "git filter: nbstripout --keep-id strips outputs from notebooks as git reads them"; \
	else echo "not a git checkout: no output filter needed"; fi

setup: $(VENV)/.course git-filter

setup-test: $(VENV)/.test git-filter

# JupyterLab refuses to run as root (containers, workshop VMs) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

# Serve JupyterLab rooted here (notebooks/ and exercises/ both reachable), open on lesson 01.
# jupyter_server_config.py: after each save, refresh git's view of a notebook that the filter
# finds unchanged, so that `git status` stays clean.
lab:
	$(BIN)/jupyter lab --config="$(CURDIR)/jupyter_server_config.py" \
	  --ServerApp.root_dir="$(CURDIR)" $(ROOT_FLAG) $(LAB_ARGS) $(FIRST_LESSON)

course: setup
	$(MAKE) --no-print-directory lab

# The widget unit tests again under ipywidgets 7.7 (Colab's): ipywidgets 7.7 and its one extra
# dependency in a folder put in front of the venv on PYTHONPATH; torch, traitlets and IPython
# are the venv's (no second torch). The 50-Run memory test does not depend on ipywidgets.
IPYW7 := $(VENV)/ipywidgets7

$(IPYW7)/.installed: | $(VENV)/.test
	$(BIN)/python -m pip install --quiet --no-deps --target $(IPYW7) "ipywidgets==7.7.*" "ipython_genutils==0.2.*"
	touch $@

test-ipywidgets7: $(IPYW7)/.installed
	PYTHONPATH=$(abspath $(IPYW7))$(if $(PYTHONPATH),:$(PYTHONPATH)) COURSE_IPYWIDGETS=7.7 COURSE_SIZE=smoke COURSE_STRICT_ESTIMATES=1 OMP_NUM_THREADS=1 \
		$(BIN)/python -m pytest -n 2 --dist load tests/test_dashboard.py -k "not memory_stays_flat"

# Notebooks run at the 'smoke' size; two workers, one notebook (or test module) each. A measurement
# that differs from the analytic estimate fails the run (COURSE_STRICT_ESTIMATES=1, course_utils.measure).
test: setup-test test-ipywidgets7
	COURSE_SIZE=smoke COURSE_STRICT_ESTIMATES=1 OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadscope

# The support matrix (noxfile.py): lessons, solutions and widget tests on Colab's versions, the
# declared floor and the newest torch, each in its own environment (about 3 GB of PyPI's torch
# each); writes results/support-matrix/<stack>.json. STACKS="colab" runs one. Not part of CI.
# Where pyenv is installed, its Pythons are made visible to nox's interpreter search.
test-matrix: $(VENV)/.course
	$(BIN)/python -m pip install --quiet "nox>=2024.4"
	$(if $(shell command -v pyenv 2>/dev/null),PYENV_VERSION=$(shell pyenv versions --bare | paste -sd: -),) \
	  $(BIN)/nox -f noxfile.py $(if $(STACKS),-s $(STACKS),)

bench: setup
	$(BIN)/course-bench --out bench-out

# The lesson benchmark: every lesson and exercise solution in a fresh kernel at the default size
# profile; a timing table (JSON + Markdown) under results/. Add EMULATE_AVX2=1 on a CPU with bf16
# instructions to run as on an AVX2-only CPU.
BENCH_DIR ?= results/lesson-timings-$(shell date +%F)$(if $(EMULATE_AVX2),-avx2,)
bench-lessons: setup-test
	$(BIN)/python tools/bench_lessons.py --out $(BENCH_DIR) $(if $(EMULATE_AVX2),--emulate-avx2,)

# The grading benchmark: 24 submissions (solutions and exercises, 3 copies) graded with -j 1
# and -j 2; times and identical scores as JSON + Markdown under results/ (docs/instructors.md).
GRADING_BENCH_DIR ?= results/grading-times-$(shell date +%F)
bench-grading: setup-test
	$(BIN)/python tools/bench_grading.py --out $(GRADING_BENCH_DIR)

release: setup-test
	$(BIN)/course-grade release
	$(BIN)/python tools/editions.py
	$(BIN)/course-grade release --source ko/solutions --dest ko/exercises

# The course for Colab without a public repository (README.md, "Start on Colab"): a wheel of
# the package (course_utils and course_grade, no notebooks) and a zip of everything committed
# (solutions/ included: for graded work, zip the student bundle of `course-grade release
# --student` instead). Both go to dist/; the setup cell finds either one uploaded next to it.
DIST ?= dist
COURSE_NAME := amp-checkpointing-course

wheel: | $(BIN)/python
	$(BIN)/python -m pip install --quiet "setuptools>=77"
	$(BIN)/python -m pip wheel --quiet --no-deps --no-build-isolation --wheel-dir $(DIST) .
	@ls $(DIST)/course_utils-*.whl

zip:
	@mkdir -p $(DIST)
	git archive --format=zip --prefix=$(COURSE_NAME)/ --output=$(DIST)/$(COURSE_NAME).zip HEAD
	@echo "$(DIST)/$(COURSE_NAME).zip: the course at $$(git rev-parse --short HEAD) (uncommitted changes are not in it)"

# Removing the venv removes the filter's program, so the filter's git config goes too.
clean:
	rm -rf $(VENV) bench-out .pytest_cache $(DIST) build
	git config --remove-section filter.nbstripout 2>/dev/null || true
	git config --remove-section diff.ipynb 2>/dev/null || true
