"""The priority server: priority rules, stores (memory, redis), gRPC servicer, metrics."""
