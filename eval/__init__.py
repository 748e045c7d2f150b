"""eval: see its issue; imports kair_runtime, never the other way."""
