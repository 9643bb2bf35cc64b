"""Cache hits' results as JSON, by their inference cache key: a repeat answered from the
cache is rendered once, not on every hit. Rendering a `digits` result from its tensors and
serialising it was ~20-30 us of a hit's ~275 us in the proxy's application (measured in
process).

Looked up only once the cache itself has answered the key (a hit), so an entry that expired,
was evicted or was cleared is never answered from here. An answer rendered for a key is
the answer for that key, as long as the key holds: it covers the pipeline's definition (its
result template included), its models' versions and the request's inputs.
"""

from __future__ import annotations

from collections import OrderedDict


class Rendered:
    """Least recently used first out, bounded in bytes. Keys and values are bytes: nothing
    for the garbage collector to walk."""

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.bytes = 0
        self._entries: OrderedDict[bytes, bytes] = OrderedDict()

    def get(self, key: bytes) -> bytes | None:
        found = self._entries.get(key)
        if found is not None:
            self._entries.move_to_end(key)
        return found

    def put(self, key: bytes, text: bytes) -> None:
        size = len(key) + len(text)
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= len(key) + len(old)
        self._entries[key] = text
        self.bytes += size
        while self.bytes > self.max_bytes:
            dropped, value = self._entries.popitem(last=False)
            self.bytes -= len(dropped) + len(value)

    def clear(self, prefix: bytes) -> None:
        """Drop the results whose keys start with `prefix` (a pipeline's: `name\\0`)."""
        for key in [k for k in self._entries if k.startswith(prefix)]:
            self.bytes -= len(key) + len(self._entries.pop(key))
