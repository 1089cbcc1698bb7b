"""Leader hand-over: the journal of countable events, the Lease watermarks, settling held edges.

One entry point, ``app.handover.handover.HandOver``, builds the counting pipeline and every part of the
hand-over in one call. See docs/leadership.md.
"""
