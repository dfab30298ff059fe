"""Translate a SAM template into the plain CloudFormation that `sam deploy` would submit.

cfn-lint checks SAM templates without expanding them, so it cannot see what the SAM transform
generates: the roles, permissions and the S3 notification that make a bucket depend on its
event's function. Linting the translation catches, for example, a dependency cycle through that
notification. Local CodeUri paths become placeholder S3 URIs (as `sam validate` does) and a local
state machine DefinitionUri is inlined, so the definition is linted too.

Usage: sam_translate.py TEMPLATE OUTPUT
"""

import json
import os
import pathlib
import sys

from samtranslator.translator.transform import transform
from samtranslator.yaml_helper import yaml_parse


class _NoManagedPolicies:
    """Stands in for the IAM lookup of managed policy names; the template uses none."""

    def load(self):
        return {}


def main(argv):
    if len(argv) != 3:
        print(__doc__, file=sys.stderr)
        return 2
    # The translator asks boto for a region to resolve pseudo parameters; any region will do.
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    src = pathlib.Path(argv[1])
    template = yaml_parse(src.read_text())
    for name, res in template.get("Resources", {}).items():
        props = res.get("Properties", {})
        kind = res.get("Type")
        if kind == "AWS::Serverless::Function" and isinstance(props.get("CodeUri"), str):
            props["CodeUri"] = "s3://placeholder-bucket/" + name
        if kind == "AWS::Serverless::StateMachine" and isinstance(props.get("DefinitionUri"), str):
            path = src.parent / props.pop("DefinitionUri")
            props["Definition"] = json.loads(path.read_text())
    out = transform(template, {}, _NoManagedPolicies())
    pathlib.Path(argv[2]).write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
