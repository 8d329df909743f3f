"""Measured costs cached on disk (``cpu``'s and ``cuda``'s): where (``cache_dir``), the file (``DiskCache``), and
the one-line warnings the cost models print (``warn``)."""

from __future__ import annotations

import json
import os
import sys

from taso_mlir.dialect.errors import one_line


def cache_dir() -> str:
    """Where measured costs are cached: ``$TASO_CACHE_DIR``, else ``taso-mlir`` in the user's cache folder
    (``$XDG_CACHE_HOME``, else ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.environ.get("TASO_CACHE_DIR") or os.path.join(base, "taso-mlir")


def warn(msg: str) -> None:
    sys.stderr.write(f"taso-mlir: warning: {msg}\n")


class DiskCache:
    """Measured costs on disk, ``{"version": 1, "devices": {device: {key: ms}}}`` in one JSON file that
    processes share: ``get``/``put`` for one device (the measured models' device strings: which CPU, or which
    GPU, driver and libraries), ``flush`` merges this instance's new entries into the file atomically (temp file
    and rename; other processes' entries survive). An unreadable file is ignored with a warning, and replaced
    at the next flush."""

    def __init__(self, path: str, device: str):
        self.path, self.device = path, device
        self._new: dict = {}
        self._disk = self._load().get(device, {})

    def get(self, key: str):
        """The cached ms of ``key`` on this device, or None."""
        v = self._disk.get(key)
        return None if v is None else float(v)

    def put(self, key: str, ms: float) -> None:
        self._disk[key] = self._new[key] = ms

    def __len__(self) -> int:
        return len(self._disk)

    def _load(self) -> dict:
        """The cache file's {device: {key: ms}}; {} if missing, a warning if unreadable."""
        try:
            with open(self.path, encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as e:
            warn(f"ignoring the unreadable cost cache {self.path} ({one_line(e)})")
            return {}
        devices = data.get("devices") if isinstance(data, dict) else None
        if not isinstance(devices, dict) or not all(
                isinstance(v, dict) and all(isinstance(x, (int, float)) for x in v.values()) for v in devices.values()):
            warn(f"ignoring the cost cache {self.path}: not a taso-mlir cost cache")
            return {}
        return devices

    def flush(self) -> None:
        """Merge the new entries into the file (a warning where it cannot be written)."""
        if not self._new:
            return
        try:
            os.makedirs(os.path.dirname(self.path) or ".", exist_ok=True)
            devices = self._load() if os.path.exists(self.path) else {}  # other processes' entries survive
            devices.setdefault(self.device, {}).update(self._new)
            tmp = f"{self.path}.{os.getpid()}.tmp"
            with open(tmp, "w", encoding="utf-8") as f:
                json.dump({"version": 1, "devices": devices}, f, sort_keys=True, indent=0)
            os.replace(tmp, self.path)
            self._new = {}
        except OSError as e:
            warn(f"cannot write the cost cache {self.path} ({one_line(e)})")
