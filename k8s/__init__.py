"""ddpkit.k8s: the Kubernetes engine: backend.py (K8sBackend), options.py ([k8s]), render.py
(pure: the manifests, built as data), checks.py, crds.py, api.py (the side effects, imported
on use, with client.py and companions.py), the pods' launch script (launch.sh), and local/,
the local control plane's scripts."""
