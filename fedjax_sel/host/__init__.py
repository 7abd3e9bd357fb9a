"""The host side of a run: the loop, records, checkpoints, the folder lock, tracking, figures,
the compilation cache."""
