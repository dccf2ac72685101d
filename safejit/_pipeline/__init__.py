"""The one composer of the data path (DESIGN.md §1); only ``safejit.runtime`` uses it.

- ``parts``: what the first compile sets up (backend, sandbox, disk tier) and the
  sandboxed runner every compiler goes through.
- ``resolve``: a request becomes a confined, policy-checked BuildSpec and its key.
- ``pipeline``: disk lookup, lock, compile, closure check, publish, bypass.
- ``records``: explanations, manifests, artifacts, counters.
- ``nearest``: for a request no leaf has the key of, the nearest other build and what differs.
"""
