"""What a build read: facts only, no decisions.

- ``hashing``: opening regular files without blocking or following twice, BLAKE3
  digests, stat snapshots and the racy-stat rule.
- ``anchors``: named declared roots and ``(anchor, relpath)`` paths.
- ``depfiles``: parsers of Make depfiles and linker lists.
- ``scan``: include names in a file's bytes, closure rows and states, negative
  lookups, and whether a closure still holds.

Decisions about these facts (what may be read) live in ``safejit.policy``.
"""
