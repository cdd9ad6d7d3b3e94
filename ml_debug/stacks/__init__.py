"""Stack dumps of live processes and core files, merged STAT-style, with the odd rank named.

- ``dumpers``: py-spy, py-spy --nonblocking, pystack, gdb behind one call with hard timeouts
- ``ptrace``: may we attach, and the exact fix when not
- ``collect``: every target of a node in parallel, once or ``--samples`` times
- ``merge``: normalise, group, prefix tree, suspects and the verdict line
- ``report`` / ``command`` / ``render``: the dump-stacks bundle, local or merged from many nodes
- ``cores`` / ``elfcore``: core-bt
"""
