"""Thin adapters with side effects: docker engine, kube API, local processes."""
