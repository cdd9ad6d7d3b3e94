"""Helpers around :mod:`ml_debug.nicertrace`: reading and comparing the trace files it writes."""
