"""The wire: conversions, the byte-level sample and report paths, report splitting."""
