"""The report's findings, one script each, and the analyses beside them
(experiments/README.md); `common` is what they share."""
