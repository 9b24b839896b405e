"""The benchmarks' calibration and decision rule."""
