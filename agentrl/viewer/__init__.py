"""`agentrl view`: a local web page to browse recorded runs (see docs/viewer.md)."""

from agentrl.viewer.catalog import Catalog, RunView
from agentrl.viewer.server import ViewerServer

__all__ = ["Catalog", "RunView", "ViewerServer"]
