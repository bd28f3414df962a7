"""Backends: how a cluster is created, listed, bootstrapped and torn down, one module per kind.

``base.Backend`` is the interface the watcher (and ``kit train``) act through; ``cloud`` drives
AWS/GCP through Terraform + Ansible; the local backend runs nodes as processes.
"""
