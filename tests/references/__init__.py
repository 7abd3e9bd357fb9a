"""Plain NumPy transcriptions of the selection methods' public reference code (each module names
the repository, commit and functions it follows), for the tests that compare our parts with
them on fixed inputs."""
