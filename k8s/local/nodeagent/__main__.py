"""python -m nodeagent (with k8s/local on sys.path)."""

from .cli import main

main()
