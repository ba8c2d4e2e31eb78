"""The submit path: ``psbatch`` (job-script reading, sbatch options, the profile token it writes),
``psbatch --pipeswift=check`` and the launcher that runs inside the allocation.

Runs on every submission, so it stays lean: it imports the core lazily and never imports
``logging``, SQLAlchemy, click, the store, the controller or the reports.
"""
