"""The stores without Redis: the memory store's invariants, store URLs, error kinds."""
