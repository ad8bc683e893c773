"""The loops that carry a job through its life on a launcher: the one observer (``observer``:
what ``controller.step`` sees of a running job), the profile (``profiling``: probes measured on
the job) and ``dlrover-rm train``'s supervisor (``run``). They decide nothing: each step's
actions come from ``optimizer.controller`` and are carried out by the launcher."""
