"""The checks to run on a lent GPU (tools/device/README.md)."""
