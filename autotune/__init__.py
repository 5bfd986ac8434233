"""autotune: the largest training batch that fits in GPU memory, per sequence length."""

__version__ = "0.1.0"
