"""The zoo: model definitions (`monet.zoo.models`) and prebuilt schedules for them.

Prebuilt schedules (solution files in ``schedules/``, described by ``index.json``; see
`monet.zoo.index`) cover MONeT's five configurations at its budgets and GPT-2 small; ``monet zoo
build`` (`monet.zoo.build`) regenerates them.  Use one as a file path with the ``zoo:`` prefix::

    MONeTWrapper(model, "zoo:resnet50-184-6GB", input_shape=(3, 224, 224))

or from the command line: ``monet zoo list``, ``monet zoo get NAME -o FILE``.
"""
from .index import ZooEntryError, list_entries, path_of, resolve

__all__ = ["ZooEntryError", "list_entries", "path_of", "resolve"]
