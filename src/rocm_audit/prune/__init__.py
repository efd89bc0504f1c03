"""`rocm-audit prune`: weigh device code per distribution and target, and remove the per-arch units
no kept target can load (records, units and plan, weight, apply and revert)."""
