"""An example user package: its own model, dataset and loss, used by ddpkit through import
paths (`--model mypkg.models:build_model` with `examples/` on PYTHONPATH). Nothing here
imports ddpkit: the kit calls these functions by the contracts in train/registry.py."""
