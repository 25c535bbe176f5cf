"""Session-wide fixtures for serving and ops tests: shared models and servers."""
