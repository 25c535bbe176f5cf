"""The ``slipway`` command line: one entry point over the five packages."""

# Every package of the project, the command line's own last.
PACKAGES = ("contracts", "research", "training", "compression", "serving", "ops", "slipway")
