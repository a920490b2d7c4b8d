"""Verification: the lake's state compared with MongoDB, and the drift healed.

=================  ==========================================================================
module             what it is for
=================  ==========================================================================
``verification``   ``verify_replica_set``: range digests, documents compared where they
                   differ, keys that changed left out, repairs landed as a raw batch, report
``key_order``      MongoDB's ``_id`` order from normalised keys: which range a state row is in
``digest``         a 128-bit hash of each document, in bulk; per-range sums in any order
=================  ==========================================================================

The report is the lake's ``verification_log`` (``raw/<prefix>/_verifications``).
"""
