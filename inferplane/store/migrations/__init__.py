"""Alembic migrations for the store (shipped inside the package)."""
