"""trainmedic: diagnose failing ML training and serving logs."""
__version__ = "0.1.0"
