# sandbox-broker developer entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO          ?= go
FUNCTIONS   := acquire status release sync reconcile
COMMANDS    := sandbox-host sbx devstack
BUILD       := .build
# Local bootstraps (make run, the tests) are built for this machine into
# $(BUILD)/<fn>/; what a deploy uploads is built for the functions'
# architecture (template.yaml's Architectures) into $(DEPLOY_BUILD)/<fn>/,
# the CDK stack's asset directory, exactly as `sam build` builds it.
LAMBDA_ARCH  ?= $(shell $(GO) env GOARCH)
DEPLOY_ARCH  := arm64
DEPLOY_BUILD ?= $(BUILD)/deploy

.PHONY: help deps build deploy-build print-deploy-build run test test-short bench fuzz vet fmt clean synth deploy preflight

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'
	@echo "  variables: LAMBDA_ARCH=$(LAMBDA_ARCH) (local bootstraps; deploys are always $(DEPLOY_ARCH))"

deps: ## install local stand-ins into .tools/ (DynamoDB Local, versitygw, aws-lambda-rie, npm, Go modules)
	@scripts/install-deps.sh

# The binaries are built static and -trimpath, as the bootstraps are: with
# the same compile settings (CGO_ENABLED and -trimpath change every
# package's build), one compile of the packages they share serves both,
# and a fresh machine's make build takes about 60 s instead of 100.
LOCAL_GO_BUILD := CGO_ENABLED=0 $(GO) build -trimpath

build: ## build the local Lambda bootstraps for this machine (.build/<fn>/bootstrap) and the binaries (.build/bin/)
	@for fn in $(FUNCTIONS); do \
	  GOOS=linux GOARCH=$(LAMBDA_ARCH) $(LOCAL_GO_BUILD) -ldflags="-s -w" -tags lambda.norpc \
	    -o $(BUILD)/$$fn/bootstrap ./functions/$$fn; \
	done
	@for cmd in $(COMMANDS); do \
	  $(LOCAL_GO_BUILD) -o $(BUILD)/bin/$$cmd ./cmd/$$cmd; \
	done

# The bootstraps a deploy uploads: static arm64 binaries without symbols or
# DWARF (-s -w) and without this machine's paths (-trimpath), about a third
# of an unstripped build. Both deploy paths run deploy_bootstrap: the CDK
# asset build (deploy-build) and `sam build` (template.yaml's BuildMethod
# makefile runs build-<LogicalId> with ARTIFACTS_DIR set), so they ship the
# same bytes.
DEPLOY_FLAGS := -trimpath -ldflags="-s -w" -tags lambda.norpc
deploy_bootstrap = GOOS=linux GOARCH=$(DEPLOY_ARCH) CGO_ENABLED=0 $(GO) build $(DEPLOY_FLAGS) -o $(2) ./functions/$(1)

deploy-build: ## build the arm64 bootstraps a deploy uploads (.build/deploy/<fn>/bootstrap)
	@for fn in $(FUNCTIONS); do \
	  $(call deploy_bootstrap,$$fn,$(DEPLOY_BUILD)/$$fn/bootstrap); \
	done

# sam build: build-AcquireFunction builds functions/acquire, and so on.
build-%Function:
	@test -n "$(ARTIFACTS_DIR)" || { echo "ARTIFACTS_DIR is not set (sam build sets it)" >&2; exit 1; }
	$(call deploy_bootstrap,$(shell echo '$*' | tr '[:upper:]' '[:lower:]'),$(ARTIFACTS_DIR)/bootstrap)

print-deploy-build:
	@echo $(DEPLOY_BUILD)

run: deps build ## start the local stack (devstack); SANDBOX_* and BROKER_* env vars pass through
	exec $(BUILD)/bin/devstack

# The fault and end-to-end suites are named first so that they start first:
# their cases mostly wait (on deadlines, lapsing leases and reconcile's
# schedule), so they run four at a time (-parallel), beside the packages
# that keep the CPUs busy rather than alone at the end. The engine's slow
# tests and the store's tests, which wait on DynamoDB Local, run four at a
# time too.
TEST_FLAGS := -race -count=1 -shuffle=on -timeout 20m -parallel 4

test: deps build ## run all tests with the race detector, in shuffled order
	$(GO) test $(TEST_FLAGS) ./test/faults ./test/e2e ./...

# The fast tier: unit tests and the engine's tests on the in-memory store,
# no stand-in started (testenv.NeedsStandIns skips the tests that need
# DynamoDB Local or versitygw under -short). The end-to-end, fault and CDK
# synth suites are make test's. -p 8: most of these packages' time is
# waiting (timers, subprocesses), which overlaps well beyond the CPUs.
SHORT_PKGS := ./internal/... ./pkg/... ./cmd/... ./functions/...

test-short: ## run the unit and in-memory engine tests (no emulators; under a minute warm)
	$(GO) test -short -race -count=1 -p 8 $(SHORT_PKGS)

bench: ## run the benchmarks
	$(GO) test -run '^$$' -bench . -benchmem ./...

FUZZTIME ?= 10s

fuzz: ## run every Fuzz* target briefly (FUZZTIME=10s each; corpus in the Go build cache)
	@targets=$$(grep -rlE --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*\(' pkg cmd functions internal 2>/dev/null || true); \
	[ -n "$$targets" ] || { echo "no fuzz targets" >&2; exit 1; }; \
	for f in $$targets; do \
	  dir=./$$(dirname $$f); \
	  for fn in $$(grep -oE '^func Fuzz[A-Za-z0-9_]*' $$f | cut -d' ' -f2); do \
	    echo "fuzz $$dir $$fn ($(FUZZTIME))"; \
	    $(GO) test -run '^$$' -fuzz "^$$fn$$" -fuzztime $(FUZZTIME) $$dir; \
	  done; \
	done

vet: ## go vet
	$(GO) vet ./...

fmt: ## gofmt the tree
	gofmt -l -w $$(git ls-files -co --exclude-standard '*.go')

clean: ## remove build output (keeps .tools)
	rm -rf $(BUILD) cdk.out coverage*

# The CDK app (infra/) reads context from CDK_CONTEXT_JSON, e.g.
#   make synth CDK_CONTEXT_JSON='{"alarmTopicArn":"arn:aws:sns:..."}'
# and deploy-time settings from CloudFormation parameters (docs/deploy.md):
#   make deploy CDK_DEPLOY_ARGS='--parameters JwtIssuer=https://... --parameters JwtAudience=...'
CDK_CLI_VERSION ?= 2.1148.1
CDK_CLI         := .tools/cdk/node_modules/.bin/cdk
CDK_DEPLOY_ARGS ?=
export CDK_CONTEXT_JSON

# Flags of cmd/preflight, e.g. PREFLIGHT_ARGS='-waiting-tenants 3 -reserved 20'.
PREFLIGHT_ARGS ?=

preflight: ## read-only check that the account's Lambda concurrency fits the overflow policy and waiter limits
	$(GO) run ./cmd/preflight $(PREFLIGHT_ARGS)

synth: deploy-build ## write the CloudFormation template offline (cdk.out/SandboxBroker.template.json, arm64 bootstraps from .build/deploy)
	rm -rf cdk.out
	JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 CDK_OUTDIR=cdk.out $(GO) run ./infra
	@echo "wrote cdk.out/SandboxBroker.template.json"

deploy: synth ## cdk deploy cdk.out to the current AWS account (needs credentials and `cdk bootstrap`)
	@test -x $(CDK_CLI) || npm install --prefix .tools/cdk --no-save --no-audit --no-fund aws-cdk@$(CDK_CLI_VERSION)
	CDK_DISABLE_CLI_TELEMETRY=true $(CDK_CLI) deploy --app cdk.out $(CDK_DEPLOY_ARGS) SandboxBroker
