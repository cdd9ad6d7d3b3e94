"""Thin Typer commands over the library. Each module here registers its commands
with :func:`register` and keeps heavy imports (torch, paramiko, rich) inside the
command functions so that ``mldebug --help`` stays fast."""
