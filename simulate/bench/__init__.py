"""Benchmarks that print figures (`edgegrove bench <name>`); each takes --json."""
