"""Launchers that run DLRover training nodes (master, PS, worker) as real processes."""
