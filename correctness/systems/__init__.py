"""The small systems the property tests check, which no perf test measures.

- ``checkpoint``: a crash-safe checkpoint protocol (versioned shards, SHA256 manifest, atomic
  publish), with planted bugs (``bugs=``) that test_planted_bugs.py must find.
- ``alltoall``: a token dispatch/combine round trip over ``all_to_all`` (MoE routing), also
  with planted bugs.

They live here, not in perfgate/workloads/, because they serve correctness/ only: the
workloads package holds what the perf suite measures.
"""
