"""SQLAlchemy history of jobs, runs, samples, models, plans, decisions and events."""
