"""The Slurm side: backends (Slurm commands, pyslurm, in-memory simulation), the site config
and the controller tick that reads the cluster, runs the policy, records and acts.

An adapter: it imports the core, the policies and the store; never the CLI, reports or sim.
"""
