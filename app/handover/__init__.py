"""Leader hand-over: the journal of countable events, the Lease watermarks, settling held edges.

See docs/leadership.md.
"""
