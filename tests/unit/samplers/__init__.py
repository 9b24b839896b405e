"""Each server sampler on a memory store, and the sampler registry."""
