"""`mldebug drill`: inject each classic failure into a real job, run the diagnosis a user would run,
and score whether it named the right rank, and how fast."""
