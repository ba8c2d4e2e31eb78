"""The history store (SQLAlchemy): engine, schema, one tick's writes, and reads that return
core types. Imports the core only; nothing here knows Slurm, policies or the CLI.
"""
