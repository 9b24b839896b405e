"""The prioreplay command line: commands, compare, demo."""
