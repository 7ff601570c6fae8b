"""A stand-in for a CUDA build of vLLM, as far as its parser and platform are asked (see README.md)."""

__version__ = "0.0.0+standin.cuda"
