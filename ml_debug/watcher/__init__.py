"""`mldebug watch` running: the loop that samples the job and the collector of an incident's bundle.

The decisions and the bundle's format are :mod:`ml_debug.watch`'s (pure, no other feature). This
package sits one layer above the features, beside :mod:`ml_debug.checkup`, because it combines
them: top's sampler, dump-stacks' dumps, health and env.
"""
