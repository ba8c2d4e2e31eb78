"""Writing a file that readers may open at any moment: the one atomic writer of the package
(a temporary file in the same folder, renamed over the target), used by the Prometheus
metrics file, the launcher's measurement reports, the site model the controller publishes
and psbatch's compiled front end.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Union


def write_atomic(path: Union[str, Path], content: Union[str, bytes], mode: int = 0o644) -> None:
    """Write ``content`` to ``path`` with permissions ``mode``: a reader sees the old file
    or the new one, never half of one.

    Raises:
        OSError: the folder cannot be written (nothing is left behind).
    """
    target = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=".%s." % target.name, suffix=".tmp", dir=str(target.parent))
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(content.encode("utf-8") if isinstance(content, str) else content)
            os.fchmod(handle.fileno(), mode)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
