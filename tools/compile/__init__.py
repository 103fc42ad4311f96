"""Deviceless compiler studies: compile for a target, never run (tools/compile/README.md)."""
