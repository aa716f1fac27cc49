"""Multi-seed fits, their alignment, and the report of which quantities are stable across fits."""
