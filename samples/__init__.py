"""Seeded generators of inputs as users send them (margins, noise, colour, compression,
odd sizes; hostile uploads), for the tests, the benchmarks and the README's examples:
made by code, no downloaded data. Not part of the installed services."""
