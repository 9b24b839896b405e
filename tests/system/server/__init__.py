"""The priority server over gRPC: RPCs, bad input, delivery, pulls, processes, metrics."""
