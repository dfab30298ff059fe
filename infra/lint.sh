#!/usr/bin/env bash
# Lints the deployment: cfn-lint on template.yaml as written, cfn-lint again on its SAM
# translation (what CloudFormation will really get: generated roles, permissions, the bucket's
# notification and its dependencies, the inlined state machine definition), and `sam validate
# --lint`. Any error or warning fails. Works offline: nothing here calls AWS.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=venv.sh
. "$root/infra/venv.sh"
batchgen_venv
cd "$root"

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

echo "lint: cfn-lint template.yaml" >&2
"$VENV/bin/cfn-lint" --non-zero-exit-code warning template.yaml

echo "lint: cfn-lint on the SAM translation" >&2
"$VENV/bin/python" infra/sam_translate.py template.yaml "$tmp/translated.json"
"$VENV/bin/cfn-lint" --non-zero-exit-code warning "$tmp/translated.json"

echo "lint: sam validate --lint" >&2
SAM_CLI_TELEMETRY=0 AWS_DEFAULT_REGION=${AWS_DEFAULT_REGION:-us-east-1} \
  "$VENV/bin/sam" validate --lint --template-file template.yaml >&2

echo "lint: checkov template.yaml" >&2
main_venv=$VENV
batchgen_venv checkov
checkov=$VENV/bin/checkov
VENV=$main_venv
# --skip-download: no policies or metadata fetched from the vendor's platform.
"$checkov" --quiet --compact --skip-download --framework cloudformation -f template.yaml >&2

echo "lint: template.yaml OK" >&2
