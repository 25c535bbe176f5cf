"""What crosses package boundaries as files, written down once.

Every other package (``research``, ``training``, ``compression``, ``serving``, ``ops``)
may import this one and it imports none of them: atomic writes and file digests, the
dataset manifest and its feature spec, the ``slipway.json`` model manifest, and the
YAML loader whose errors name the file, the line and the key.
"""
