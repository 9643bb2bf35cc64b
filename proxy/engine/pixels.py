"""The pixels of an uploaded image that its pipeline's limits count (`max_inflight_mpx`, and
the pace of engine/pace.py): those its preprocessing decodes.

A model that decodes the upload reports in its configuration the pixels its decode keeps at
least (protos/decoded.py); a baseline JPEG far larger is decoded at 1/2, 1/4 or 1/8 of its
size, and counted so. A model that does not report it (a foreign server, a model not asked
yet) has the image counted whole, as its header declares it.
"""

from __future__ import annotations

from protos import media
from protos.decoded import MIN_PIXELS_PARAMETER, decoded_pixels
from proxy.engine.plan import Plan
from proxy.transport.catalog import Catalog


def counted(plan: Plan, catalog: Catalog | None, body: bytes, width: int, height: int) -> int:
    """The pixels `body` (`width` x `height` as its header declares) is counted for: the
    most any step it is sent to decodes."""
    declared = width * height
    # Only a JPEG decodes smaller: any other upload is counted without a lookup.
    if catalog is None or not declared or media.sniff(body) != "jpeg" or not plan.decoders:
        return declared
    most = 0
    for target, tensor in plan.decoders:
        described = catalog.last(target.address, target.model, target.version)
        config = None if described is None else described.config
        said = None if config is None else config.parameters.get(MIN_PIXELS_PARAMETER + tensor)
        value = "" if said is None else said.string_value
        if not (value.isascii() and value.isdigit() and len(value) < 16):  # anyone's server
            return declared
        most = max(most, decoded_pixels(body, width, height, int(value)))
    return most
