"""The test suite (a regular package, so that a dependency shipping its own top-level ``tests``
package, as verl 0.9.1 does, cannot shadow it)."""
