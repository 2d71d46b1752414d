"""The file sink: output events as JSON lines, one file per kind, fsynced, rotated, never written twice.

One component folder: :mod:`~sinks.files.sink` holds :class:`FileSink`; :mod:`~sinks.files.disk` appends, rotates
and reads the files back; :mod:`~sinks.files.ids` names the files and the events' ids; :mod:`~sinks.files.config`
is the ``[file_sink]`` section and :mod:`~sinks.files.factory` the component the daemon builds from it.
"""

from sinks.files.config import FileSinkConfig
from sinks.files.factory import FACTORY
from sinks.files.ids import event_id, file_name
from sinks.files.sink import FileSink

__all__ = ["FACTORY", "FileSink", "FileSinkConfig", "event_id", "file_name"]
