"""A site's history of campaigns: the results store, and regressions between windows (#32)."""
