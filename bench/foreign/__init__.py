"""Foreign v2 servers (MLServer, KServe's model server) from their own venvs, for the
swap-in tests (tests/foreign/), the contract suite and `bench foreign`."""
