"""The entry points' summaries (demo, compare-trl), without running them."""
