"""Samplers whose choices travel over the wire to the worker."""
