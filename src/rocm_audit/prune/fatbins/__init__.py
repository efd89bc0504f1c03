"""``prune --fatbins``: slim the fat binaries inside host libraries to the kept targets' code."""
