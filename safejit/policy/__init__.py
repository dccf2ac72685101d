"""Hardening: confinement to declared roots, the flag policy, key
completeness and the sandboxed compiler runner (DESIGN.md §7)."""
