"""`mldebug attach`: debugpy injected into a live Python process, read through mldebug's own DAP client."""
