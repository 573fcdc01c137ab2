# vcafleet: the two commands are `make lab` and `make test` (see README.md).
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
VENV := .venv
BIN := $(CURDIR)/$(VENV)/bin
export PATH := $(BIN):$(PATH)
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export ANSIBLE_FORCE_COLOR ?= 0
export PY_COLORS ?= 0

.PHONY: lab lab-down report test lint unit molecule image-test fresh-check bootstrap preflight images venv shrouds clean

$(VENV)/.installed: requirements.txt
	python3 -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -r requirements.txt
	touch $@

venv: $(VENV)/.installed

bootstrap:
	scripts/bootstrap-host.sh

# Every program the two commands run is here, or the missing ones are named with their package.
preflight:
	scripts/preflight.sh

images: bootstrap
	lab/image/build.sh >/dev/null

# Build the simulated fleet, converge site.yml on it, print the fleet report.
# The llama-server build (minutes) starts first and runs beside the rest; the lab image builds
# beside the venv.
lab: bootstrap preflight
	scripts/prebuild.sh
	$(MAKE) --no-print-directory -j2 venv images
	ansible-playbook playbooks/lab.yml -e state=present
	ansible-playbook site.yml
	ansible-playbook playbooks/report.yml
	@cat build/fleet-report.txt

report: venv
	ansible-playbook playbooks/report.yml
	@cat build/fleet-report.txt

lab-down: venv
	ansible-playbook playbooks/lab.yml -e state=absent

# Lint, unit tests and every molecule scenario, with a summary.
test: bootstrap venv images
	scripts/test-all.sh

lint: venv
	scripts/test-all.sh lint

unit: venv
	scripts/test-all.sh unit

molecule: bootstrap venv images
	scripts/test-all.sh molecule

image-test: bootstrap venv
	scripts/test-all.sh image

# Bootstrap and unit tests in a throwaway container from a bare Debian rootfs: a
# missing install step fails here, not on the next new machine.
fresh-check: bootstrap
	scripts/test-all.sh fresh

# The printable fan shrouds (shrouds/README.md): STLs in build/shrouds/, previews in shrouds/previews/.
shrouds: venv
	$(BIN)/python shrouds/build.py

clean:
	rm -rf build .pytest_cache .ruff_cache
