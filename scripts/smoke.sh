#!/usr/bin/env bash
# Smoke test of a sandbox-broker deployment: acquire a sandbox for a fresh
# thread, run a command in it that writes outputs/smoke.txt, release it, and
# check that the file reached the output bucket.
#
# Needs: the sbx CLI (`make build` puts it in .build/bin/), python3, and AWS
# credentials that may list the output bucket (the AWS SDK's usual
# configuration: AWS_PROFILE, AWS_REGION, ...).
#
#   API_URL=https://<id>.execute-api.<region>.amazonaws.com \
#   TOKEN=<a JWT from your issuer> \
#   BUCKET=<the stack's OutputBucketName> \
#   scripts/smoke.sh
#
# Optional: TENANT (default: read from the token's claim TENANT_CLAIM,
# default "tenant"; Cognito: TENANT_CLAIM=custom:tenant), PREFIX (the stack's
# OutputPrefix, default outputs), SBX (the sbx binary), SMOKE_USER.
# Against `make run`'s local stack: see docs/deploy.md ("Try the smoke test
# locally"). Exits 0 when every step passed, 1 otherwise.
set -euo pipefail

die() { echo "smoke: $*" >&2; exit 1; }
step() { echo "smoke: $*" >&2; }

: "${API_URL:?set API_URL to the ApiUrl output of the stack}"
: "${TOKEN:?set TOKEN to a JWT your issuer signed (or a token of the local stack)}"
: "${BUCKET:?set BUCKET to the OutputBucketName output of the stack}"
PREFIX=${PREFIX:-outputs}
TENANT_CLAIM=${TENANT_CLAIM:-tenant}
SMOKE_USER=${SMOKE_USER:-smoke}

if [[ -z "${SBX:-}" ]]; then
  root=$(cd "$(dirname "$0")/.." && pwd)
  if command -v sbx >/dev/null; then SBX=sbx; else SBX=$root/.build/bin/sbx; fi
fi
[[ -x "$(command -v "$SBX")" ]] || die "no sbx binary at $SBX (run make build, or set SBX)"

if [[ -z "${TENANT:-}" ]]; then
  # The tenant is the token's claim TENANT_CLAIM (JWT payload, base64url).
  TENANT=$(python3 -c 'import base64, json, sys
payload = sys.argv[1].split(".")[1]
print(json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))[sys.argv[2]])' \
    "$TOKEN" "$TENANT_CLAIM" 2>/dev/null) || true
  [[ -n "$TENANT" ]] || die "cannot read claim $TENANT_CLAIM from TOKEN: set TENANT"
fi

thread="smoke-$(date +%s)-$RANDOM"
sbx() { "$SBX" --api-url "$API_URL" --token "$TOKEN" --tenant "$TENANT" "$@"; }

step "acquire for $SMOKE_USER/$thread (tenant $TENANT)"
id=$(sbx acquire --user "$SMOKE_USER" --thread "$thread") || die "acquire failed"
[[ -n "$id" ]] || die "acquire printed no sandbox id"

step "exec in $id"
want="smoke $thread"
sbx exec --user "$SMOKE_USER" --thread "$thread" "$id" -e "SMOKE_TEXT=$want" \
  -c 'mkdir -p outputs && printf "%s\n" "$SMOKE_TEXT" > outputs/smoke.txt && cat outputs/smoke.txt' ||
  die "exec failed"

step "release $id"
sbx release "$id" || die "release failed"

step "look for outputs/smoke.txt in s3://$BUCKET/$PREFIX/$TENANT/$SMOKE_USER/$thread/"
listing=$(sbx --json ls-outputs --user "$SMOKE_USER" --thread "$thread" --bucket "$BUCKET" --prefix "$PREFIX") ||
  die "listing the bucket failed"
size=$(python3 -c 'import json, sys
print(next((o["size"] for o in json.load(sys.stdin) or [] if o["path"] == "outputs/smoke.txt"), ""))' <<<"$listing")
[[ "$size" == "$(( ${#want} + 1 ))" ]] || die "outputs/smoke.txt not in the bucket as written (listing: $listing)"

echo "smoke: ok: acquire, exec, release and the object in S3 ($id, thread $thread)"
