"""SQLAlchemy history of jobs, runs, samples, models, plans, decisions and events (``store``), with
its jobs' identity (``identity``) and its Alembic schema migrations (``migrate``, ``migrations/``)."""
