"""Scripts beside c2jax, by purpose (tools/README.md): run one as a module from the
checkout root, `python -m tools.<folder>.<name>`, with no PYTHONPATH."""
