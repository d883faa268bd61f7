"""ddpdeploy: PyTorch DDP jobs from a local smoke test to N GPU nodes on Kubernetes."""

__version__ = "0.1.0"
