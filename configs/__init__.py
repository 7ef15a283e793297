"""ddpkit.configs: example job files (TOML), one per scenario; default.toml is `ddpkit run`'s."""
