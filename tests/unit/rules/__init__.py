"""The pure group rules and the intervals of reports and comparisons."""
