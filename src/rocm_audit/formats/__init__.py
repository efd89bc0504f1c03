"""One parser per container format: bytes in, frozen dataclasses out, FormatError on bad input."""
