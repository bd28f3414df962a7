"""kit: train on spot GPUs across AWS and GCP without babysitting."""

__version__ = "0.1.0"
