"""Experiments and campaigns: render, submit, inject, watch, roll back, report."""
