#!/usr/bin/env bash
# install-deps.sh installs the local stand-ins the tests and the dev stack need, into .tools/
# (gitignored). Idempotent: every step is skipped when its result is already present; it is quiet
# unless it installs something. What it installs (versions pinned below, all verified on Debian 12
# with Go 1.26, Node.js 20 and Java 17, no Docker):
#   - DynamoDB Local 1.25.1, taken from the npm package amplify-dynamodb-simulator (~57 MB; Amazon's
#     licence forbids redistributing it, so it is fetched, never committed); it needs Java 17+ and is
#     started as `java -Djava.library.path=DynamoDBLocal_lib -jar DynamoDBLocal.jar -inMemory
#     -sharedDb -port PORT` (without -sharedDb, tables are per access key and region);
#   - versitygw (S3 gateway), `go install`ed (~2 min cold build, ~80 MB binary); it listens on all
#     interfaces unless given `--port 127.0.0.1:PORT`, and keeps metadata in xattrs (else --sidecar);
#   - the AWS Lambda Runtime Interface Emulator, `go install`ed; one function per process, and it
#     listens on 0.0.0.0:8080 unless given --runtime-interface-emulator-address;
#   - bubblewrap (apt-get, as root) for sandbox isolation; python3 and pip (apt-get, as root) for
#     the Python client's tests; the npm packages of the E2B SDK check.
set -euo pipefail

cd "$(dirname "$0")/.."
ROOT=$(pwd)
TOOLS="$ROOT/.tools"

DYNAMODB_SIM_VERSION=2.9.30
VERSITYGW_VERSION=v1.8.0
RIE_VERSION=v0.0.0-20261030222936-bef5c4ba774d

say() { printf 'install-deps: %s\n' "$*"; }
warn() { printf 'install-deps: WARNING: %s\n' "$*" >&2; }
die() { printf 'install-deps: ERROR: %s\n' "$*" >&2; exit 1; }

# Prerequisites that this script does not install.
command -v go >/dev/null 2>&1 || die "go is missing: install Go 1.26 (https://go.dev/dl/)"
command -v java >/dev/null 2>&1 || die "java is missing: install a Java 17+ runtime (apt-get install -y openjdk-17-jre-headless); DynamoDB Local needs it"
command -v node >/dev/null 2>&1 || die "node is missing: install Node.js 20; the E2B SDK check and npm need it"
command -v npm >/dev/null 2>&1 || die "npm is missing: install npm (Node.js 20); it fetches DynamoDB Local"

mkdir -p "$TOOLS/bin"

# DynamoDB Local (Amazon's; its licence forbids redistribution, so it is fetched, never committed).
if [[ ! -f "$TOOLS/dynamodb/DynamoDBLocal.jar" || ! -d "$TOOLS/dynamodb/DynamoDBLocal_lib" ]]; then
  say "installing DynamoDB Local (npm amplify-dynamodb-simulator@$DYNAMODB_SIM_VERSION) into .tools/dynamodb"
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  (cd "$tmp" && npm pack --silent "amplify-dynamodb-simulator@$DYNAMODB_SIM_VERSION" >/dev/null \
    && tar xzf "amplify-dynamodb-simulator-$DYNAMODB_SIM_VERSION.tgz")
  [[ -f "$tmp/package/emulator/DynamoDBLocal.jar" ]] || die "DynamoDBLocal.jar not found in the npm package"
  rm -rf "$TOOLS/dynamodb.partial" "$TOOLS/dynamodb"
  mkdir -p "$TOOLS/dynamodb.partial"
  cp -R "$tmp"/package/emulator/. "$TOOLS/dynamodb.partial/"
  mv "$TOOLS/dynamodb.partial" "$TOOLS/dynamodb"
  rm -rf "$tmp"
  trap - EXIT
fi

# Go-installed binaries, each pinned; a version stamp file makes the step idempotent.
go_install() { # name module version
  local name=$1 mod=$2 ver=$3 stamp="$TOOLS/bin/.$1.version"
  if [[ -x "$TOOLS/bin/$name" && -f "$stamp" && "$(cat "$stamp")" == "$mod@$ver" ]]; then
    return 0
  fi
  say "installing $name ($mod@$ver) into .tools/bin"
  GOBIN="$TOOLS/bin" go install "$mod@$ver"
  echo "$mod@$ver" >"$stamp"
}
go_install versitygw github.com/versity/versitygw/cmd/versitygw "$VERSITYGW_VERSION"
go_install aws-lambda-rie github.com/aws/aws-lambda-runtime-interface-emulator/cmd/aws-lambda-rie "$RIE_VERSION"

# apt_install WHAT CHECK PACKAGE...: when CHECK (a shell test) fails, install the Debian packages
# with apt-get as root; best effort (a warning says what to do otherwise).
apt_install() {
  local what=$1 check=$2; shift 2
  bash -c "$check" >/dev/null 2>&1 && return 0
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    say "installing $what (apt-get install $*)"
    if ! { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null \
        || { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null; }; }; then
      warn "could not install $what; the tests that need it will fail"
    fi
  else
    warn "$what is missing and cannot be installed here (need root and apt-get): apt-get install -y $*"
  fi
}

# bubblewrap (sandbox isolation on the host).
apt_install bubblewrap 'command -v bwrap' bubblewrap
# Python 3 and pip for the Python client's tests (clients/python; standard library only).
apt_install python3 'command -v python3' python3
apt_install pip 'python3 -m pip --version' python3-pip

# cfn-lint (Python) lints both templates in infra/stack's tests. The CI image has it with its
# Python, so it is not installed here; without it the lint test is skipped and says so.
command -v cfn-lint >/dev/null 2>&1 || warn "cfn-lint is missing: the template lint test is skipped (pip install cfn-lint)"

# npm packages for the E2B SDK compatibility check.
if [[ -f "$ROOT/test/e2b-sdk/package.json" ]]; then
  sdk="$ROOT/test/e2b-sdk"
  stamp="$sdk/node_modules/.install-deps.stamp"
  lock="$sdk/package-lock.json"
  want=$(cat "$sdk/package.json" "$lock" 2>/dev/null | sha256sum | cut -d' ' -f1)
  if [[ ! -f "$stamp" || "$(cat "$stamp")" != "$want" ]]; then
    if [[ -f "$lock" ]]; then
      say "installing npm packages in test/e2b-sdk (npm ci)"
      (cd "$sdk" && npm ci --silent --no-audit --no-fund)
    else
      say "installing npm packages in test/e2b-sdk (npm install)"
      (cd "$sdk" && npm install --silent --no-audit --no-fund)
    fi
    want=$(cat "$sdk/package.json" "$lock" 2>/dev/null | sha256sum | cut -d' ' -f1)
    echo "$want" >"$stamp"
  fi
fi

# Go modules (quiet and fast when the module cache is warm).
go mod download
