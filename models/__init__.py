"""Builders of the model repository (`python -m models.build`)."""
