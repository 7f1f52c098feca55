#!/usr/bin/env bash
# A stand-in for the tools docs/deploy.md calls (aws, cdk, sam, npm, go,
# curl, make and the binaries the Makefile builds). It appends its name
# and arguments, shell-quoted, to $STUB_LOG, answers what the guide reads
# from it, and fails where the real tool would on what the guide gives it.
set -euo pipefail
name=$(basename "$0")
{ printf '%s' "$name"; ((($#))) && printf ' %q' "$@"; printf '\n'; } >>"$STUB_LOG"
die() { echo "$name (stub): $*" >&2; exit 1; }
arg_after() { # flag args...: the value after flag
  local flag=$1; shift
  while (($#)); do [[ $1 == "$flag" ]] && { echo "${2-}"; return; }; shift; done
}

case $name in
make)
  # The real make, on the copy of the Makefile, with these stubs on PATH.
  exec "$REAL_MAKE" "$@" ;;
aws)
  case "${1-} ${2-}" in
  "sts get-caller-identity") echo 123456789012 ;;
  "configure get") [[ ${3-} == region ]] && echo eu-west-1 ;;
  "cloudformation describe-stacks")
    [[ $(arg_after --stack-name "$@") == SandboxBroker ]] || die "no such stack"
    case $(arg_after --query "$@") in
    *"'ApiUrl'"*) echo https://abc123.execute-api.eu-west-1.amazonaws.com ;;
    *"'OutputBucketName'"*) echo sandboxbroker-outputbucket-1a2b3c ;;
    *"'E2BApiKeySecretArn'"*) echo arn:aws:secretsmanager:eu-west-1:123456789012:secret:E2BApiKeySecret-AbCdEf ;;
    *) die "unknown output query" ;;
    esac ;;
  "cloudformation describe-stack-resources")
    [[ $(arg_after --stack-name "$@") == SandboxBroker ]] || die "no such stack"
    printf 'Table\tSandboxBroker-Table-1A2B\nTokenKey\t1234abcd-12ab-34cd-56ef-1234567890ab\n' ;;
  "secretsmanager put-secret-value")
    [[ $(arg_after --secret-id "$@") == arn:aws:secretsmanager:* ]] || die "ResourceNotFoundException: --secret-id is not the secret" ;;
  "cognito-idp create-user-pool") echo eu-west-1_AbCdEf ;;
  "cognito-idp create-user-pool-client") echo 1a2b3c4d5e6f7g8h9i0j ;;
  "cognito-idp initiate-auth") echo eyJ.token.sig ;;
  "cognito-idp admin-create-user" | "cognito-idp admin-set-user-password") ;;
  *) die "unexpected call" ;;
  esac ;;
cdk)
  case ${1-} in
  bootstrap)
    [[ ${2-} =~ ^aws://[0-9]{12}/[a-z]{2}(-[a-z]+)+-[0-9]$ ]] || die "bootstrap environment '${2-}' is not aws://<account>/<region>" ;;
  deploy)
    # The stack's parameters without a default must be given.
    for p in JwtIssuer JwtAudience; do
      [[ " $* " == *" --parameters $p="* ]] || die "the stack's parameter $p has no value"
    done
    app=$(arg_after --app "$@")
    if [[ -z $app ]]; then
      [[ -f cdk.json ]] || die "--app is required when there is no cdk.json"
      app=$(sed -n 's/^ *"app": *"\(.*\)",\{0,1\}$/\1/p' cdk.json)
      [[ -n $app ]] || die "cdk.json has no app"
    fi
    if [[ ! -d $app ]]; then CDK_OUTDIR=cdk.out sh -c "$app" || die "the app failed: $app"; fi ;;
  *) die "unexpected command" ;;
  esac ;;
npm)
  prefix=$(arg_after --prefix "$@")
  [[ ${1-} == install && -n $prefix ]] || die "unexpected call"
  mkdir -p "$prefix/node_modules/.bin"
  cp "$0" "$prefix/node_modules/.bin/cdk" ;;
go)
  case ${1-} in
  env) echo amd64 ;;
  build)
    out=$(arg_after -o "$@")
    [[ -n $out ]] || die "build without -o"
    mkdir -p "$(dirname "$out")"
    cp "$0" "$out" ;;
  run)
    mkdir -p "${CDK_OUTDIR:-cdk.out}"
    echo '{}' >"${CDK_OUTDIR:-cdk.out}/SandboxBroker.template.json" ;;
  *) die "unexpected command" ;;
  esac ;;
sbx)
  [[ ${1-} == s3-env ]] && echo 'export S3_BUCKET=outputs S3_PREFIX=outputs S3_ENDPOINT=http://127.0.0.1:9000' ;;
smoke.sh)
  for v in API_URL TOKEN BUCKET; do
    [[ -n ${!v-} && ${!v} != *"<"* ]] || die "$v is '${!v-}'"
  done
  printf 'smoke.sh env API_URL=%s BUCKET=%s\n' "$API_URL" "$BUCKET" >>"$STUB_LOG" ;;
esac
