"""Search spaces: which keys of an experiment a hyper-parameter search varies, and how.

Only reading and checking space files lives here (no TensorFlow); the search itself
trains every trial like ``slipway train`` does, so it lives in ``training.search``.
"""
