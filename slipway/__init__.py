"""The ``slipway`` command line: one entry point over the five packages."""
