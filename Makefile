# sandbox-broker developer entry points. `make help` lists them.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c

GO          ?= go
LAMBDA_ARCH ?= amd64
FUNCTIONS   := acquire release sync reconcile
COMMANDS    := sandbox-host sbx devstack
BUILD       := .build

.PHONY: help deps build run test bench vet fmt clean synth deploy

help: ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-8s %s\n", $$1, $$2}'
	@echo "  variables: LAMBDA_ARCH=$(LAMBDA_ARCH) (amd64|arm64, for the Lambda bootstraps)"

deps: ## install local stand-ins into .tools/ (DynamoDB Local, versitygw, aws-lambda-rie, npm, Go modules)
	@scripts/install-deps.sh

build: ## build the Lambda bootstraps (.build/<fn>/bootstrap) and the binaries (.build/bin/)
	@for fn in $(FUNCTIONS); do \
	  GOOS=linux GOARCH=$(LAMBDA_ARCH) CGO_ENABLED=0 $(GO) build -trimpath -tags lambda.norpc \
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

vet: ## go vet
	$(GO) vet ./...

fmt: ## gofmt the tree
	gofmt -l -w $$(git ls-files -co --exclude-standard '*.go')

clean: ## remove build output (keeps .tools)
	rm -rf $(BUILD) cdk.out coverage*

synth: ## synthesize the CDK app
	@echo "not implemented yet: issue 6" >&2; exit 1

deploy: ## deploy to AWS
	@echo "not implemented yet: issue 6" >&2; exit 1
