# The two set-up commands of the README.
#   make demo   install what is needed, bring up the sandbox cluster and run the maintenance campaign
#   make test   install what is needed and run every test (unit, integration on a sandbox, lint, types)
#   make test-debian13   the sandbox integration tests on Debian 13 (Slurm 24.11), in a Debian root
SANDBOX ?= chaos
SITE ?= site_configs/sandbox.yaml
OUT ?= runs
# A/A runs that measure the sandbox's run-to-run noise before the campaign (10 runs: 45 pairs).
AA_RUNS ?= 10
# Where Debian's python3 is externally managed, scripts/install-deps.sh installs into .venv here.
export PATH := $(CURDIR)/.venv/bin:$(PATH)

.PHONY: install demo test test-debian13 lint clean

install:
	bash scripts/install-deps.sh

demo: install
	slurm-chaos sandbox up --name $(SANDBOX)
	slurm-chaos plugin install --site $(SITE)
	run=$(OUT)/maintenance-$$(date +%Y%m%d-%H%M%S); \
	{ slurm-chaos calibrate --site $(SITE) --runs $(AA_RUNS) --out $$run-aa || test -f $$run-aa/calibration.json; } && \
	slurm-chaos campaign --site $(SITE) --suite maintenance --calibration $$run-aa/calibration.json --out $$run

test: install
	bash scripts/run-tests.sh

test-debian13:
	bash scripts/test-debian13.sh

lint:
	ruff check slurm_chaos tests bench
	mypy

clean:
	$(MAKE) -C spank_plugin clean
