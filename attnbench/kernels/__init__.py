"""Attention kernels written for attnbench. Submodules import their compiler lazily-safe:
importing this package never imports triton."""
