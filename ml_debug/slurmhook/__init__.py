"""mldebug inside Slurm's own machinery: the node health check that drains and resumes nodes."""
