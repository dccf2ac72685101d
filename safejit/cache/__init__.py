"""The two cache tiers: bounded in-memory (``memory``) and shared on disk (``disk``)."""
