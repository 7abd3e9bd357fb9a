"""The engine: round stages, compiled programs, data placement, the Simulator, runs as a batch
axis."""
