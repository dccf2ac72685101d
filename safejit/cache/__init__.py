"""The cache tiers (DESIGN.md §5, §6, §11).

- ``layout``: :class:`~safejit.cache.layout.CacheLayout`, every on-disk path shape.
- ``memory``: :class:`~safejit.cache.memory.MemoryTier`, bounded and single-flight; the
  one owner of ``max_staleness_s``.
- ``leaf``: the manifest's strict schema, a leaf's files, and ``verify_closure`` (a
  closure checked against this machine's files, for every tier).
- ``disk``: :class:`~safejit.cache.disk.DiskTier`, lookup and the publish protocol.
- ``staging``: work directories prepared ahead, locked while a compile uses them.
- ``early``: a leaf's files written into its stage ahead of the publish.
- ``fsio``: durable writes, renames, no-follow deletes, flock.
- ``statmemo``: the per-user memory of stats that verified.
- ``maintenance`` and ``usage``: whole-cache operations and usage records.
- ``remote/``: :class:`~safejit.cache.remote.tier.RemoteTier` and its engines.
"""
