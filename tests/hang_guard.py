"""The one wall-clock limit the suite's subprocesses run under: a hang guard, not a time budget.

A launcher started by a test ends in seconds on an idle machine and in minutes on a loaded one;
the guard only stops a process that will never end (a deadlock), so it is far above what a
loaded CI machine needs. No test asserts how long anything took.
"""

HANG_GUARD_S = 3600  # Seconds after which a test's subprocess is taken as hung.
