"""Verification: the lake's state compared with MongoDB, and the drift healed.

=================  ==========================================================================
module             what it is for
=================  ==========================================================================
``verification``   ``verify_replica_set``: keys that changed left out, repairs landed as a raw
                   batch, the report
``comparison``     one collection against its state: digests per range and cell, the documents
                   of differing cells compared; a shard's part of a cluster (``ShardScope``)
``key_order``      MongoDB's ``_id`` order from normalised keys: which range a state row is in
``digest``         a 128-bit hash of each document, in bulk; per-range sums in any order
=================  ==========================================================================

The report is the lake's ``verification_log`` (``raw/<prefix>/_verifications``).
"""
