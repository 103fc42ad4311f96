"""Builders of task suites and eval cases (tools/tasks/README.md)."""
