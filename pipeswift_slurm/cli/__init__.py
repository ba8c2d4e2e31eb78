"""The command line: the ``pipeswift`` group (``main``) and one module per command group.

An adapter at the edge: it may import every other part; nothing imports it.
"""
