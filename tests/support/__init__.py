"""Helpers the tests share: waiting, ports, clients, clocks, processes and built artefacts.

Test modules import from here and never from one another, so a helper has one copy and
a test module can be read, moved or deleted on its own.
"""
