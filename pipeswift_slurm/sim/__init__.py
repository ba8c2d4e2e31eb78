"""The simulator: workloads and a discrete-event loop that drives the same controller tick as
cron does, on the in-memory backend. No policy code lives here.
"""
