"""Maintenance scripts: generators of the committed documents (run them from the repository root)."""
