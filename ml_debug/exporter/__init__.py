"""`mldebug exporter`: node health and job progress as Prometheus metrics."""
