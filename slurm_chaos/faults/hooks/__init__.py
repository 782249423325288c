"""Prolog and epilog hooks of node-level fault injection (installed by ``install_hooks``)."""
