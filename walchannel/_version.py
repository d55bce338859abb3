"""The package's version: the one source (pyproject.toml reads it, ``[tool.hatch.version]``).

A leaf module, so the modules that report the version (the CLI, the
metrics' instrumentation scope) need not import the package ``__init__``.
"""

__version__ = "0.1.0"
