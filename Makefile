# localinference.vllm — the two commands are `make lab` and `make test`.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

VENV        := .venv
BIN         := $(VENV)/bin
LAB         := .lab
COLLECTION  := $(LAB)/collections/ansible_collections/localinference/vllm
SANITY_ROOT := $(LAB)/sanity/ansible_collections/localinference/vllm
export ANSIBLE_CONFIG := $(CURDIR)/ansible.cfg
export PATH := $(CURDIR)/$(BIN):$(PATH)
export PODMAN_IGNORE_CGROUPSV1_WARNING := 1
export LOCALINFERENCE_LAB_DIR := $(CURDIR)/.lab
MOLECULE    := cd $(CURDIR) && $(BIN)/molecule
LAB_INVENTORY := inventories/lab/hosts.yml

.PHONY: help bootstrap system-packages images lab lab-up lab-down lab-clean test test-unit lint sanity \
        test-molecule test-lab test-lab-faults test-lab-extended test-lab-clients test-lab-tune tune test-scale scale-up scale-down test-onehost build bench bench-smoke soak soak-smoke \
        test-release docs release

help:
	@echo "make lab        build the two-node lab and run site.yml against it (leaves it up)"
	@echo "make test       unit tests, the release test, ansible-lint, ansible-test sanity, molecule test"
	@echo "make lab-up     create the lab hosts only;  make lab-down  remove the lab"
	@echo "make test-lab   the lab tests (tests/lab: state, then faults) against a lab made by 'make lab'"
	@echo "make test-lab-extended  the long fault scenarios CI's hour leaves out, against 'make lab'"
	@echo "make test-lab-clients   Claude Code, Codex and Qwen Code for real through their generated configs;"
	@echo "                         opencode and Claude Code finishing a turn across a wedge"
	@echo "make tune       playbooks/tune.yml against 'make lab': the qualification's findings tried as recipe"
	@echo "                changes through the upgrade path (writes .lab/tune/: tune.json, tuned-recipe.diff, trials.png)"
	@echo "make test-lab-tune the tune's lab proof (tests/lab/tune) against 'make lab'"
	@echo "make test-scale the three-host lab (molecule/scale): create, converge, idempotence, test, destroy"
	@echo "make scale-up   create and converge the three-host lab and leave it up;  make scale-down  remove it"
	@echo "make test-onehost the one-host lab (molecule/onehost): create, converge, idempotence, test, destroy"
	@echo "make bench      every benchmark against 'make lab': prints the ratios, writes .lab/bench.json"
	@echo "make soak       agent-shaped traffic over TLS with the key through a run of faults, one at a time,"
	@echo "                against 'make lab' (SOAK_MINUTES, default 20): as many as fit; SOAK_MINUTES=60 causes"
	@echo "                all seven (a wedged TP rank, the head's server killed, the link down SOAK_FLAP_S, a key"
	@echo "                rotation, an upgrade reverted, one promoted, Caddy stopped); SOAK_FAULTS=wedge,caddy_stop"
	@echo "                picks. Writes .lab/soak.json (outage and failed requests per fault, TTFT before/during/"
	@echo "                after, the incidents, the goals); exits 1 when the endpoint never answered, a fault went"
	@echo "                wrong or was not recovered, or availability outside fault windows is below"
	@echo "                SOAK_MIN_AVAILABILITY (default 99.0); not part of make test"
	@echo "make soak-smoke the same for 3 minutes with one wedge (part of make test)"
	@echo "make bench-smoke the benchmarks' short form: verify on less data, the no-op run (part of make test)"
	@echo "make test-release  build the tarball, install it offline, ansible-doc and --syntax-check from it"
	@echo "make docs       the modules', plugins' and roles' docs as HTML in .lab/docs/html (antsibull-docs)"
	@echo "make release    cut the version in galaxy.yml from changelogs/fragments (antsibull-changelog)"

$(BIN)/ansible-playbook: requirements.txt
	bash lab/bin/system-packages
	python3 -m venv $(VENV)
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt
	touch $@

$(COLLECTION):
	mkdir -p $(dir $@)
	ln -sfn $(CURDIR) $@

bootstrap: $(BIN)/ansible-playbook $(COLLECTION)

# Installs the missing Debian packages of lab/system-packages.txt (as root;
# otherwise names them), the same list .ci/run uses.
system-packages:
	bash lab/bin/system-packages

images: bootstrap system-packages
	bash molecule/default/host-image.sh
	bash lab/bin/lab-assets

lab-up: images
	$(MOLECULE) create
	$(MOLECULE) prepare --force

lab: lab-up
	$(BIN)/ansible-playbook -i $(LAB_INVENTORY) playbooks/site.yml | tee $(LAB)/site.log
	@bash lab/bin/lab-summary

lab-down: bootstrap
	$(MOLECULE) destroy
	rm -f $(LAB)/endpoint

lab-clean: lab-down
	podman rmi --ignore localhost/localinference-lab-host:trixie localhost/localinference-vllm-cpu:0.32.0
	rm -rf $(LAB)

# The lab's assets (vLLM venv, model, wheelhouse, vLLM image: mostly downloads
# and I/O) build in the background while the unit tests, lint and sanity run.
test: bootstrap
	bash molecule/default/host-image.sh
	@bash lab/bin/lab-assets > $(LAB)/lab-assets.log 2>&1 & assets=$$!; \
	  status=0; $(MAKE) --no-print-directory test-unit test-release lint sanity || status=$$?; \
	  if ! wait $$assets; then tail -30 $(LAB)/lab-assets.log; exit 1; fi; \
	  echo "lab assets: $$(tail -1 $(LAB)/lab-assets.log)"; \
	  exit $$status
	$(MAKE) --no-print-directory test-molecule
	$(MAKE) --no-print-directory test-onehost

# The real Quadlet generator (Podman >= 4.4) for the unit tests, taken from
# the lab host image: this machine's Podman 4.3 has none.
$(LAB)/tools/quadlet:
	bash molecule/default/host-image.sh
	mkdir -p $(dir $@)
	podman run --rm --runtime=runc --ulimit nofile=20000:20000 --ulimit nproc=32768:32768 \
	  --entrypoint cat localhost/localinference-lab-host:trixie /usr/libexec/podman/quadlet > $@.tmp
	chmod +x $@.tmp && mv $@.tmp $@

# promtool (`promtool check rules`, `promtool test rules`) for the unit tests of the
# monitoring's rules, taken out of Debian's package without installing it (trixie
# ships it as `promtool`, bookworm inside `prometheus`): no service is set up.
$(LAB)/tools/promtool:
	rm -rf $(LAB)/tools/promtool-deb && mkdir -p $(LAB)/tools/promtool-deb
	cd $(LAB)/tools/promtool-deb && { apt-get download -qq promtool 2>/dev/null || apt-get download -qq prometheus; }
	dpkg-deb -x $(LAB)/tools/promtool-deb/*.deb $(LAB)/tools/promtool-deb/root
	cp $(LAB)/tools/promtool-deb/root/usr/bin/promtool $@.tmp && chmod +x $@.tmp && mv $@.tmp $@
	rm -rf $(LAB)/tools/promtool-deb

test-unit: bootstrap $(LAB)/tools/quadlet $(LAB)/tools/promtool
	$(BIN)/pytest tests/unit -q
	$(BIN)/ruff check .

# The release (tests/release, about 15 s): `ansible-galaxy collection build`, the
# tarball installed with --offline into an empty collections path whose
# dependencies come from the pinned `ansible` package, then ansible-doc on every
# module, lookup and role and --syntax-check on every playbook from that copy.
test-release: bootstrap
	$(BIN)/pytest tests/release -q -p no:cacheprovider

lint: bootstrap
	$(BIN)/ansible-lint

# ansible-test wants the collection under ansible_collections/<ns>/<name>; run
# it on a copy of the tracked files, locally (no Docker).
sanity: bootstrap
	v=$$(grep -o "pip='[0-9.]*'" $(VENV)/lib/python3.*/site-packages/ansible_test/_internal/python_requirements.py | cut -d"'" -f2); \
	  mkdir -p ~/.ansible/test/cache && cp lab/get-pip-offline.py ~/.ansible/test/cache/get_pip_$${v//./_}.py
	rm -rf $(SANITY_ROOT) && mkdir -p $(SANITY_ROOT)
	git ls-files -z --cached --others --exclude-standard | rsync -a --from0 --files-from=- ./ $(SANITY_ROOT)/
	cd $(SANITY_ROOT) && git init -q && git add -A && \
	  $(CURDIR)/$(BIN)/ansible-test sanity --local --python 3.11 --color no \
	    --skip-test pylint --skip-test shellcheck

# The lab tests: tests/lab/state is read-only (molecule verify runs it);
# tests/lab/faults changes the lab and puts it back.
LAB_PYTEST := $(BIN)/pytest -q -p no:cacheprovider --durations=0 --durations-min=20

# molecule test's sequence, one step at a time, with the fault tests between
# verify and destroy, which runs whatever happens. No $(MAKE) in the chain:
# `make -n` would run it. LOCALINFERENCE_LAB_REQUIRED: a lab test that cannot
# reach the lab fails instead of skipping.
test-molecule: export LOCALINFERENCE_LAB_REQUIRED := 1
test-molecule: images
	$(MOLECULE) destroy
	trap '$(MOLECULE) destroy' EXIT; \
	  $(MOLECULE) syntax; \
	  $(MOLECULE) create; \
	  $(MOLECULE) converge; \
	  $(MOLECULE) idempotence; \
	  $(MOLECULE) verify; \
	  $(MAKE) --no-print-directory soak-smoke bench-smoke; \
	  $(LAB_PYTEST) -m "not extended" tests/lab/faults

# Against a lab made by `make lab`: the state tests, then the fault tests.
test-lab: bootstrap
	$(LAB_PYTEST) tests/lab/state tests/lab/faults

test-lab-faults: bootstrap
	$(LAB_PYTEST) tests/lab/faults

# The fault scenarios that do not fit CI's hour (each states its measured time),
# against a lab made by `make lab`.
test-lab-extended: bootstrap
	$(LAB_PYTEST) -m extended tests/lab/faults

# Claude Code, Codex and Qwen Code for real through their generated configs, on a
# lab made by `make lab` (tests/lab/clients; about 8 min once installed), then
# opencode (installed by `make lab`) and Claude Code across a wedge the watchdog
# recovers (test_clients_across_wedge.py: one restart, about 3-4 min more). The
# pinned clients (lab/agent-clients.txt) are installed first: about 900 MB from
# npm and 3-4 min on a fresh machine, which is why CI does not run this.
test-lab-clients: bootstrap
	for client in claude_code codex qwen_code; do bash lab/bin/agent-client $$client >/dev/null || exit 1; done
	$(LAB_PYTEST) tests/lab/clients

# The qualification's findings become recipe changes tried, qualified, and promoted or reverted
# through upgrade.yml (roles/tune); a second run with nothing to gain tries nothing.
tune: bootstrap
	$(BIN)/ansible-playbook -i $(LAB_INVENTORY) playbooks/tune.yml $(TUNE_ARGS)

# The tune's lab proof: a candidate the planner refuses is never booted, one that is no better is
# reverted while the endpoint keeps serving, the lab's recipe has nothing left to gain (docs/testing.md).
test-lab-tune: bootstrap
	$(LAB_PYTEST) tests/lab/tune

# Every benchmark (benchmarks/bench.py; BENCH_ARGS="--only verify,noop" picks
# parts): prints the ratios and writes $(LAB)/bench.json. The lab parts need
# `make lab` and put back what they change; LOCALINFERENCE_LAB_LOCK=FILE makes
# them wait for and hold the shared lab's lock.
bench: bootstrap
	$(BIN)/python benchmarks/bench.py $(BENCH_ARGS)

# The benchmarks' short form `make test` runs (so they cannot rot): the verify part on less data
# and the no-op site.yml (about 1 min); exits 1 when a part measured nothing or the no-op changed
# or restarted anything. Writes $(LAB)/bench-smoke.json.
bench-smoke: bootstrap
	$(BIN)/python benchmarks/bench.py --short --only verify,noop --output $(LAB)/bench-smoke.json

# Bounded agent-shaped traffic (2-4 sessions, tool turns, growing context) against the lab's
# ingress for SOAK_MINUTES, as a client talks to it (TLS with the ingress's CA, the key), through
# the faults that fit the minutes, spaced evenly (benchmarks/_soak_schedule.py: 60 minutes is all
# seven; SOAK_FAULTS picks), each put back whatever happens (benchmarks/soak.py; SOAK_SESSIONS,
# SOAK_DEADLINE_S, SOAK_FAULTS, SOAK_FLAP_S, SOAK_CADDY_S, SOAK_READY_S, SOAK_MIN_AVAILABILITY,
# SOAK_ENDPOINT, SOAK_CA_FILE, SOAK_KEY_FILE). Writes $(LAB)/soak.json and
# $(LAB)/soak-requests.jsonl; stops by itself and exits 1 when the endpoint never answered before
# any fault (nothing written), a fault was not caused, went wrong or was not recovered, or
# availability outside fault windows is below its floor.
# soak-smoke: 3 minutes, one wedge; `make test` runs it on the molecule lab before the fault tests.
SOAK_MINUTES ?= 20
soak: bootstrap
	SOAK_MINUTES=$(SOAK_MINUTES) $(BIN)/python benchmarks/soak.py

soak-smoke: bootstrap
	SOAK_MINUTES=3 SOAK_FAULTS=wedge $(BIN)/python benchmarks/soak.py --output $(LAB)/soak-smoke.json

# molecule's test sequence for the scenario $(1), one step at a time, destroy
# running whatever happens and removing the controller files $(2) with it.
define scenario_test
	$(MOLECULE) destroy -s $(1)
	trap '$(MOLECULE) destroy -s $(1); rm -f $(2)' EXIT; \
	  $(MOLECULE) syntax -s $(1); \
	  $(MOLECULE) create -s $(1); \
	  $(MOLECULE) converge -s $(1); \
	  $(MOLECULE) idempotence -s $(1); \
	  $(MOLECULE) verify -s $(1)
endef

# The three-host lab (molecule/scale, inventories/lab-scale): pipeline parallel 3
# across three hosts, beside the default lab (its own names, networks and port).
# create -> converge -> idempotence -> tests/lab/scale -> destroy, which runs
# whatever happens. Not part of `make test` (README: its measured time).
test-scale: export LOCALINFERENCE_LAB_REQUIRED := 1
test-scale: images
	bash lab/bin/tiny-model-layers > /dev/null
	$(call scenario_test,scale,$(LAB)/scale-endpoint)

# The three-host lab left up (for benchmarks/growth.py or a look around):
# create and converge only; scale-down removes it.
scale-up: export LOCALINFERENCE_LAB_REQUIRED := 1
scale-up: images
	bash lab/bin/tiny-model-layers > /dev/null
	$(MOLECULE) create -s scale
	$(MOLECULE) converge -s scale

scale-down: bootstrap
	$(MOLECULE) destroy -s scale
	rm -f $(LAB)/scale-endpoint

# The one-host lab (molecule/onehost, inventories/lab-onehost): one systemd host
# standing in for one machine with two RTX PRO 6000 cards, tensor parallel 2
# inside it on CPU (mp, Quadlet), no cluster network, beside the default lab
# (its own host rtx-host, network, port 18082 and .lab/onehost/).
# create -> converge -> idempotence -> tests/lab/onehost -> destroy, which runs
# whatever happens. `make test` runs it after test-molecule.
test-onehost: export LOCALINFERENCE_LAB_REQUIRED := 1
test-onehost: images
	$(call scenario_test,onehost,$(LAB)/onehost/endpoint)

build: bootstrap
	$(BIN)/ansible-galaxy collection build --force --output-path $(LAB)

# A release: set `version` in galaxy.yml, add a release_summary fragment, then
# `make release` folds changelogs/fragments into changelogs/changelog.yaml and
# CHANGELOG.rst (the fragments are removed: commit that).
release: bootstrap
	$(BIN)/antsibull-changelog lint
	$(BIN)/antsibull-changelog release --reload-plugins

# The collection's docs as HTML in $(LAB)/docs/html with antsibull-docs and Sphinx
# (requirements-docs.txt, pinned, installed into $(VENV) in one resolve with
# requirements.txt). Offline: no intersphinx inventories. Not part of `make test`.
DOCS := $(LAB)/docs
$(VENV)/.docs-tools: requirements.txt requirements-docs.txt | $(BIN)/ansible-playbook
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements.txt -r requirements-docs.txt
	touch $@

docs: bootstrap $(VENV)/.docs-tools
	rm -rf $(DOCS) && mkdir -p $(DOCS)/site && chmod og-w $(DOCS)/site
	$(BIN)/antsibull-docs sphinx-init --use-current --squash-hierarchy --lenient \
	  --project localinference.vllm --title localinference.vllm --html-short-title localinference.vllm \
	  --dest-dir $(DOCS)/site localinference.vllm > /dev/null
	echo 'intersphinx_mapping = {}' >> $(DOCS)/site/conf.py
	mkdir -p $(DOCS)/site/rst && chmod og-w $(DOCS)/site/rst
	$(BIN)/antsibull-docs --config-file $(DOCS)/site/antsibull-docs.cfg collection --use-current \
	  --squash-hierarchy --cleanup everything --dest-dir $(DOCS)/site/rst localinference.vllm \
	  > $(DOCS)/antsibull-docs.log 2>&1 || { tail -30 $(DOCS)/antsibull-docs.log; exit 1; }
	@echo "antsibull-docs: $$(grep -c 'No documentation available for filter' $(DOCS)/antsibull-docs.log || true) filters without docs," \
	  "$$(grep -c 'validation error' $(DOCS)/antsibull-docs.log || true) roles whose specs it refuses (their pages say so; $(DOCS)/antsibull-docs.log)"
	$(BIN)/sphinx-build -M html $(DOCS)/site/rst $(DOCS)/site/build -c $(DOCS)/site -q 2> $(DOCS)/sphinx.log \
	  || { tail -30 $(DOCS)/sphinx.log; exit 1; }
	ln -sfn site/build/html $(DOCS)/html
	@echo "docs: $(DOCS)/html/index.html ($$(grep -c WARNING $(DOCS)/sphinx.log || true) Sphinx warnings, $(DOCS)/sphinx.log)"
