"""Session-wide fixtures for data, training and compression tests: shared built artefacts."""
