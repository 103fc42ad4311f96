"""Sweeps, findings scripts and notebooks (experiments/README.md): run a findings script as
`python -m experiments.findings.<name>` from the checkout root, with no PYTHONPATH."""
