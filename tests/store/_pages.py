"""How much of a cache's files this process has mapped in: the resident pages of its LMDB maps.

py-lmdb reads records straight from the memory map, so a page of a shard file is resident in
this process (its RSS) once anything here has touched it. Tests measure the bytes an operation
touches as the growth of that figure (/proc/self/smaps, Linux): deterministic, unlike timings.
"""

from __future__ import annotations

from pathlib import Path

import pytest

needs_smaps = pytest.mark.skipif(not Path("/proc/self/smaps").exists(), reason="reads /proc/self/smaps (Linux)")


def mapped_bytes(folder: Path) -> int:
    """Resident bytes of this process's mappings of files under `folder`."""
    total, current = 0, False
    prefix = str(Path(folder).resolve())
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            first = line.split(" ", 1)[0]
            if "-" in first and all(c in "0123456789abcdef-" for c in first):  # a mapping's header line
                current = prefix in line
            elif current and line.startswith("Rss:"):
                total += int(line.split()[1]) * 1024
    return total
