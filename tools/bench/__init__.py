"""Timings on this machine or a device (tools/bench/README.md)."""
