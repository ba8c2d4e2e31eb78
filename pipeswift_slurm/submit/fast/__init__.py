"""psbatch's compiled front end: ``psbatch.c`` (shipped as package data) and ``build``,
which generates its tables from the Python modules and compiles it."""
