"""Pure decisions, no processes (DESIGN.md §7).

- ``roots``: declared roots and strict path confinement.
- ``flags``: the compiler flag policy and define checks.
- ``completeness``: every file a build read lies under a declared root.
- ``trust``: leaf signatures.

Running untrusted processes is ``safejit.sandbox``'s job; the facts about what a
build read are ``safejit.closure``'s.
"""
