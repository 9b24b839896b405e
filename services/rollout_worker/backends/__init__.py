"""Generation backends behind one interface (transformers; vLLM as the optional ``gpu`` extra)."""
