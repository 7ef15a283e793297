"""Point upstream webhook configurations at a controller on 127.0.0.1.

The controllers' own manifests (read from the Go module cache, rendered with
`kubectl kustomize`) address their webhooks through an in-cluster Service.
The local control plane has no Service network, so each clientConfig becomes
`url: https://127.0.0.1:PORT<path>` with our self-signed CA as caBundle; names,
rules, selectors and failure policies stay as upstream wrote them.

usage: python3 webhooks.py PORT CA_FILE [--prefix P] [--only RESOURCE ...] < rendered.yaml
prints a v1 List (JSON) for `kubectl apply -f -`.
"""

import argparse
import base64
import json
import sys

import yaml

KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("ca_file")
    ap.add_argument(
        "--prefix", default="", help="name prefix (kustomize namePrefix of the release)"
    )
    ap.add_argument(
        "--only", nargs="*", default=None, help="keep webhooks for these resources only"
    )
    args = ap.parse_args()

    with open(args.ca_file, "rb") as f:
        ca_bundle = base64.b64encode(f.read()).decode()

    items = []
    for doc in yaml.safe_load_all(sys.stdin):
        if not doc or doc.get("kind") not in KINDS:
            continue
        doc["metadata"]["name"] = args.prefix + doc["metadata"]["name"]
        hooks = []
        for hook in doc.get("webhooks", []):
            resources = {r for rule in hook.get("rules", []) for r in rule.get("resources", [])}
            if args.only is not None and not resources & set(args.only):
                continue
            path = hook["clientConfig"].get("service", {}).get("path", "/")
            hook["clientConfig"] = {
                "url": f"https://127.0.0.1:{args.port}{path}",
                "caBundle": ca_bundle,
            }
            hooks.append(hook)
        if hooks:
            doc["webhooks"] = hooks
            items.append(doc)
    json.dump({"apiVersion": "v1", "kind": "List", "items": items}, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
