"""Seeded generators of inputs as users send them (margins, noise, colour, compression,
odd sizes), made by the tests themselves: no downloaded data."""
