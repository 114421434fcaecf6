# Two commands for a fresh machine (README.md):
#   make course   set up .venv and open the course in JupyterLab
#   make test     set up .venv and run the whole test suite (unit, notebooks, grading, browser)
# torch is installed first, pinned here only (the package itself never pins it, so Colab keeps
# its own build). Override for another build, e.g. make course TORCH_SPEC="torch==2.13.0".
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
TORCH_SPEC ?= torch==2.13.0

.PHONY: setup course test test-ipywidgets7 bench bench-lessons release clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/python -m pip install --quiet "$(TORCH_SPEC)"
	$(BIN)/python -m pip install --quiet -e ".[lab,grade,test]"
	touch $@

setup: $(VENV)/.installed

# JupyterLab refuses to run as root (containers, workshop VMs) unless told it may.
ROOT_FLAG := $(if $(filter 0,$(shell id -u 2>/dev/null)),--allow-root,)

course: setup
	$(BIN)/jupyter lab notebooks/ $(ROOT_FLAG)

# The widget unit tests again under ipywidgets 7.7 (Colab's): ipywidgets 7.7 and its one extra
# dependency in a folder put in front of the venv on PYTHONPATH; torch, traitlets and IPython
# are the venv's (no second torch). The 50-Run memory test does not depend on ipywidgets.
IPYW7 := $(VENV)/ipywidgets7

$(IPYW7)/.installed: | $(VENV)/.installed
	$(BIN)/python -m pip install --quiet --no-deps --target $(IPYW7) "ipywidgets==7.7.*" "ipython_genutils==0.2.*"
	touch $@

test-ipywidgets7: $(IPYW7)/.installed
	PYTHONPATH=$(abspath $(IPYW7))$(if $(PYTHONPATH),:$(PYTHONPATH)) COURSE_IPYWIDGETS=7.7 COURSE_SIZE=smoke OMP_NUM_THREADS=1 \
		$(BIN)/python -m pytest -n 2 --dist load tests/test_widgets.py -k "not memory_stays_flat"

# Notebooks run at the 'smoke' size; two workers, one notebook (or test module) each.
test: setup test-ipywidgets7
	COURSE_SIZE=smoke OMP_NUM_THREADS=1 $(BIN)/python -m pytest -n 2 --dist loadscope

bench: setup
	$(BIN)/course-bench --out bench-out

# The lesson benchmark: every lesson and exercise solution in a fresh kernel at the default size
# profile; a timing table (JSON + Markdown) under results/. Add EMULATE_AVX2=1 on a CPU with bf16
# instructions to run as on an AVX2-only CPU.
BENCH_DIR ?= results/lesson-timings-$(shell date +%F)$(if $(EMULATE_AVX2),-avx2,)
bench-lessons: setup
	$(BIN)/python tools/bench_lessons.py --out $(BENCH_DIR) $(if $(EMULATE_AVX2),--emulate-avx2,)

release: setup
	$(BIN)/course-grade release

clean:
	rm -rf $(VENV) bench-out .pytest_cache
