"""Prefect tasks: thin wrappers that give library steps retries, names and UI visibility."""
