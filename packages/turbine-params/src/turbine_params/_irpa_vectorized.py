"""The IRPA parser's numpy fast path: a well-formed entry table read as columns (:class:`EntryTable`).

Archives of hundreds of thousands of entries open in milliseconds because their tables are
checked with vectorized numpy instead of one Python object per entry. The path only accepts
tables whose every check passes; for anything else (external entries, non-ASCII names, any
inconsistency) it answers ``None`` and the exact parser (:mod:`._irpa_parser`) reads the table and
names the problem.
"""

from __future__ import annotations

import numpy as np

from ._irpa_format import DATA_SIZE, ENTRY_HEADER, SPLAT_SIZE, EntryType, RawEntry

__all__ = ["EntryTable"]


# One entry-table row as numpy sees it (fields of every entry type, by offset).
_ROW = np.dtype(
    {
        "names": [
            "size",
            "type",
            "name_off",
            "name_len",
            "md_off",
            "md_len",
            "min_align",
            "tail0",
            "tail1",
            "pattern",
            "plen",
        ],
        "formats": [
            "<u8",
            "<u4",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            "<u8",
            ("u1", (16,)),
            "u1",
        ],
        "offsets": [0, 8, 20, 28, 36, 44, 52, 60, 68, 68, 84],
        "itemsize": 96,
    }
)


class EntryTable:
    """A well-formed entry table parsed with vectorized numpy (columns, not objects).

    Only tables whose every check passes are represented this way; see :func:`parse_archive`.
    """

    __slots__ = (
        "count",
        "data_offset",
        "entry_offset",
        "length",
        "md_len",
        "md_off",
        "metadata",
        "min_align",
        "name_len",
        "name_off",
        "pattern",
        "plen",
        "type",
    )
    count: int
    data_offset: np.ndarray
    entry_offset: np.ndarray
    length: np.ndarray
    md_len: np.ndarray
    md_off: np.ndarray
    metadata: bytes
    min_align: np.ndarray
    name_len: np.ndarray
    name_off: np.ndarray
    pattern: np.ndarray | None
    plen: np.ndarray
    type: np.ndarray

    @staticmethod
    def parse(
        table: bytes,
        metadata: bytes,
        count: int,
        base: int,
        entry_off: int,
        stor_off: int,
        stor_len: int,
    ) -> EntryTable | None:
        entry_len = len(table)
        k = (entry_len + 15) // 16
        buf = np.zeros(k * 16 + 128, dtype=np.uint8)
        buf[:entry_len] = np.frombuffer(table, dtype=np.uint8)
        sizes = buf[: k * 16].view("<u8")[::2]
        big = sizes > np.uint64(1 << 40)
        size_i = np.where(big, 0, sizes).astype(np.int64)
        pos = np.arange(k, dtype=np.int64)
        ok = ~big & (size_i >= ENTRY_HEADER.size) & (size_i <= entry_len - pos * 16)
        nxt = np.minimum(pos + (size_i + 15) // 16, k)
        step = int(nxt[0]) if ok[0] else 0
        seq = pos[: count * step : step] if step else pos[:0]
        if len(seq) != count or not (ok[seq].all() and (nxt[seq[:-1]] == seq[1:]).all()):
            # Mixed entry sizes: follow the chain by pointer doubling, O(k log count).
            jump = np.concatenate([np.where(ok, nxt, k + 1), [k + 1, k + 1]])
            seq = np.zeros(1, dtype=np.int64)
            while len(seq) < count:
                seq = np.concatenate([seq, jump[seq]])
                jump = jump[jump]
            seq = seq[:count]
            if (seq >= k).any() or not ok[seq].all():
                return None
        p = seq * 16
        rows = np.lib.stride_tricks.as_strided(buf, shape=(k, _ROW.itemsize), strides=(16, 1))
        rec = rows[seq].view(_ROW).reshape(-1)
        etype = rec["type"]
        size = size_i[seq]
        name_off, name_len = rec["name_off"], rec["name_len"]
        md_off, md_len = rec["md_off"], rec["md_len"]
        min_align = rec["min_align"]
        meta_n = np.uint64(len(metadata))

        def in_meta(o: np.ndarray, n: np.ndarray) -> np.ndarray:
            return (n == 0) | ((o <= meta_n) & (n <= meta_n - np.minimum(o, meta_n)))

        is_splat = etype == EntryType.SPLAT
        is_data = etype == EntryType.DATA
        sized = (
            ((etype == EntryType.SKIP) & (size >= ENTRY_HEADER.size))
            | (is_splat & (size >= SPLAT_SIZE))
            | (is_data & (size >= DATA_SIZE))
        )
        if not (
            sized.all() and in_meta(name_off, name_len).all() and in_meta(md_off, md_len).all()
        ):
            return None  # external entries, unknown types, bad sizes or refs: exact parser
        if len(metadata) and int(np.frombuffer(metadata, dtype=np.uint8).max()) >= 0x80:
            return None  # non-ASCII names need per-name UTF-8 validation
        # DATA: storage ref and alignment; SPLAT: pattern (the same bytes, read per type).
        d_off, d_len = rec["tail0"], rec["tail1"]
        s_n = np.uint64(stor_len)
        data_in = (d_len == 0) | ((d_off <= s_n) & (d_len <= s_n - np.minimum(d_off, s_n)))
        one = np.uint64(1)
        pow2 = (min_align & (min_align - one)) == 0
        safe_align = np.where(min_align == 0, one, min_align)
        abs_data = np.uint64(base + stor_off) + np.where(is_data & data_in, d_off, 0).astype(
            np.uint64
        )
        aligned = (d_len == 0) | (abs_data % safe_align == 0)
        if not (~is_data | (data_in & pow2 & aligned)).all():
            return None
        plen = rec["plen"].astype(np.uint64)
        splat_len = d_off  # a splat's length is the u64 at +60
        plen_ok = (plen > 0) & (plen <= 16) & ((plen & (plen - one)) == 0)
        safe_plen = np.where(plen_ok, plen, one)
        if not (~is_splat | (plen_ok & (splat_len % safe_plen == 0))).all():
            return None
        t = EntryTable()
        t.count = count
        t.type = etype
        t.entry_offset = p + (base + entry_off)
        t.name_off, t.name_len, t.md_off, t.md_len = name_off, name_len, md_off, md_len
        t.min_align = min_align
        t.length = np.where(is_data, d_len, np.where(is_splat, splat_len, 0))
        t.data_offset = np.where(is_data, abs_data, 0)
        t.pattern = rec["pattern"] if is_splat.any() else None
        t.plen = plen
        t.metadata = metadata
        return t

    def keys(self) -> list[str]:
        md = self.metadata
        return [
            md[o : o + n].decode("ascii")
            for o, n in zip(self.name_off.tolist(), self.name_len.tolist())
        ]

    def raw_entries(self) -> list[RawEntry]:
        md = self.metadata
        out = []
        for i, key in enumerate(self.keys()):
            et = EntryType(int(self.type[i]))
            mo, mn = int(self.md_off[i]), int(self.md_len[i])
            pattern = b""
            if et == EntryType.SPLAT and self.pattern is not None:
                pattern = bytes(self.pattern[i, : int(self.plen[i])])
            out.append(
                RawEntry(
                    et,
                    key,
                    md[mo : mo + mn],
                    int(self.entry_offset[i]),
                    int(self.length[i]),
                    data_offset=int(self.data_offset[i]),
                    minimum_alignment=int(self.min_align[i]) if et == EntryType.DATA else 0,
                    splat_pattern=pattern,
                )
            )
        return out
