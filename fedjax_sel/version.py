"""The library's version: written into each run's provenance and checkpoint fingerprints, and the
package's version (`pyproject.toml` reads it from here)."""

__version__ = "0.3.0"
