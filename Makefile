# sandbox-broker developer entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO          ?= go
LAMBDA_ARCH ?= amd64
FUNCTIONS   := acquire release sync reconcile
COMMANDS    := sandbox-host sbx devstack
BUILD       := .build

.PHONY: help deps build run test bench fuzz vet fmt clean synth deploy

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'
	@echo "  variables: LAMBDA_ARCH=$(LAMBDA_ARCH) (amd64|arm64, for the Lambda bootstraps)"

deps: ## install local stand-ins into .tools/ (DynamoDB Local, versitygw, aws-lambda-rie, npm, Go modules)
	@scripts/install-deps.sh

build: ## build the Lambda bootstraps (.build/<fn>/bootstrap) and the binaries (.build/bin/)
	@for fn in $(FUNCTIONS); do \
	  GOOS=linux GOARCH=$(LAMBDA_ARCH) CGO_ENABLED=0 $(GO) build -trimpath -ldflags="-s -w" -tags lambda.norpc \
	    -o $(BUILD)/$$fn/bootstrap ./functions/$$fn; \
	done
	@for cmd in $(COMMANDS); do \
	  $(GO) build -o $(BUILD)/bin/$$cmd ./cmd/$$cmd; \
	done

run: deps build ## start the local stack (devstack); SANDBOX_* and BROKER_* env vars pass through
	exec $(BUILD)/bin/devstack

test: deps build ## run all tests with the race detector
	$(GO) test -race -count=1 -timeout 20m ./...

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
#   make synth CDK_CONTEXT_JSON='{"auth":"iam","reservedConcurrency":false}'
# and deploy-time settings from CloudFormation parameters:
#   make deploy CDK_DEPLOY_ARGS='--parameters JwtIssuer=https://... --parameters JwtAudience=...'
CDK_CLI_VERSION ?= 2.1148.1
CDK_CLI         := .tools/cdk/node_modules/.bin/cdk
CDK_DEPLOY_ARGS ?=
export CDK_CONTEXT_JSON

synth: ## write the CloudFormation template offline (cdk.out/SandboxBroker.template.json, arm64 bootstraps)
	$(MAKE) --no-print-directory build LAMBDA_ARCH=arm64
	rm -rf cdk.out
	JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION=20 CDK_OUTDIR=cdk.out $(GO) run ./infra
	@echo "wrote cdk.out/SandboxBroker.template.json"

deploy: synth ## cdk deploy cdk.out to the current AWS account (needs credentials and `cdk bootstrap`)
	@test -x $(CDK_CLI) || npm install --prefix .tools/cdk --no-save --no-audit --no-fund aws-cdk@$(CDK_CLI_VERSION)
	CDK_DISABLE_CLI_TELEMETRY=true $(CDK_CLI) deploy --app cdk.out $(CDK_DEPLOY_ARGS) SandboxBroker
