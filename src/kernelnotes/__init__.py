"""Kernel Notes: math posts whose code is real, tested code.

Each topic is a subpackage with a NumPy reference (``reference.py``, imports without torch)
and a Triton kernel with its torch-facing launcher (``kernel.py``). Importing this package
imports nothing heavy.
"""

__version__ = "0.1.0"
