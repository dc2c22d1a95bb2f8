"""Where the bytes of an LMDB file are: the pages its last commit uses, its free pages, the unused
parts of used pages. Read from the file itself (LMDB 0.9's page format, 64-bit), so a test can
damage a shard exactly where no record lies.

Page layout (lmdb/mdb.c): a 16-byte header (pgno u64, pad u16, flags u16, then lower u16 and
upper u16, or an overflow page's page count u32). Meta pages 0 and 1 hold two MDB_db records
(the free list's and the main database's; 48 bytes each: pad u32, flags u16, depth u16, branch,
leaf and overflow page counts, entries, root, u64 each), the last page number and the transaction
id. Branch and leaf pages hold u16 node offsets from byte 16 to `lower`, free bytes up to `upper`,
and nodes from `upper` to the page's end. A node is lo u16, hi u16, flags u16, key size u16, the
key, then the data: a leaf's data has lo | hi << 16 bytes (or is an overflow page number,
F_BIGDATA, or a named database's MDB_db, F_SUBDATA); a branch's child page is lo | hi << 16 |
flags << 32. The free list's values are page-number lists: a count, then the page numbers.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from pathlib import Path

_HEADER = 16
_P_BRANCH, _P_LEAF, _P_OVERFLOW = 0x01, 0x02, 0x04
_F_BIGDATA, _F_SUBDATA = 0x01, 0x02
_DB = struct.Struct("<IHHQQQQQ")  # MDB_db: pad, flags, depth, branch/leaf/overflow pages, entries, root
_META_DBS = _HEADER + 4 + 4 + 8 + 8  # after magic, version, address, map size
_NO_PAGE = 0xFFFFFFFFFFFFFFFF  # P_INVALID: an empty database's root


@dataclass
class PageMap:
    page_size: int
    last_pgno: int
    used: set[int] = field(default_factory=set)  # pages the newest meta page reaches (meta pages included)
    free: set[int] = field(default_factory=set)  # pages the free list names
    gaps: list[tuple[int, int]] = field(default_factory=list)  # [start, end) byte ranges unused inside used pages


def page_map(path: Path) -> PageMap:
    data = Path(path).read_bytes()
    page_size = 4096
    metas = []
    for page in (0, 1):
        offset = page * page_size + _META_DBS
        free_db, main_db = _DB.unpack_from(data, offset), _DB.unpack_from(data, offset + _DB.size)
        last_pgno, txnid = struct.unpack_from("<QQ", data, offset + 2 * _DB.size)
        metas.append((txnid, free_db, main_db, last_pgno))
    _, free_db, main_db, last_pgno = max(metas)
    pages = PageMap(page_size, last_pgno, used={0, 1})
    free_values: list[bytes] = []
    _walk(data, pages, free_db[7], free_values, named=False)
    subdatabases: list[bytes] = []
    _walk(data, pages, main_db[7], subdatabases, named=True)
    for record in subdatabases:
        _walk(data, pages, _DB.unpack(record)[7], [], named=False)
    for value in free_values:
        count = struct.unpack_from("<Q", value)[0]
        pages.free.update(struct.unpack_from(f"<{count}Q", value, 8))
    assert not pages.used & pages.free, f"{path}: pages both used and free: {sorted(pages.used & pages.free)}"
    return pages


def _walk(data: bytes, pages: PageMap, root: int, values: list[bytes], named: bool) -> None:
    """Mark the pages of one B-tree used; collect its leaf values (named: only named databases' records)."""
    if root == _NO_PAGE:
        return
    stack = [root]
    size = pages.page_size
    while stack:
        pgno = stack.pop()
        base = pgno * size
        pages.used.add(pgno)
        flags, lower, upper = struct.unpack_from("<HHH", data, base + 10)
        assert flags & (_P_BRANCH | _P_LEAF), f"page {pgno}: flags {flags:#x}, expected a branch or leaf page"
        pages.gaps.append((base + lower, base + upper))
        for slot in range((lower - _HEADER) // 2):
            node = base + struct.unpack_from("<H", data, base + _HEADER + 2 * slot)[0]
            low, high, node_flags, key_size = struct.unpack_from("<HHHH", data, node)
            data_at = node + 8 + key_size
            if flags & _P_BRANCH:
                stack.append(low | high << 16 | node_flags << 32)
            elif node_flags & _F_BIGDATA:
                length = low | high << 16
                first = struct.unpack_from("<Q", data, data_at)[0]
                count = struct.unpack_from("<I", data, first * size + 12)[0]
                pages.used.update(range(first, first + count))
                end = first * size + _HEADER + length
                pages.gaps.append((end, (first + count) * size))  # the last page's unused tail
                if not named:
                    values.append(data[first * size + _HEADER : end])
            elif node_flags & _F_SUBDATA or not named:
                values.append(data[data_at : data_at + (low | high << 16)])
