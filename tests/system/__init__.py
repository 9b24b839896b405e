"""Tests that start servers, processes, Redis or a model, one folder per part of the code."""
