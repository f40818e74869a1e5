"""sparkctl: bootstrap, serve and troubleshoot clusters of NVIDIA DGX Sparks."""

__version__ = "0.1.0"
