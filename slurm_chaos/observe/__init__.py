"""The observability loop: probe heartbeats, a node health check, a Prometheus exporter, monitoring daemons.

Kept import-light: the health check runs every few seconds on every node.
"""
