"""Reading what the console rendered: the rows of its tables by their data attributes."""

from __future__ import annotations

import html
import re

_MESSAGE_ROW = re.compile(r'<tr class="message" data-partition="(\d+)" data-offset="(\d+)">')


def message_positions(page: str) -> list[tuple[int, int]]:
    """(partition, offset) of each record row, in page order."""
    return [(int(p), int(o)) for p, o in _MESSAGE_ROW.findall(page)]


def next_url(page: str) -> str | None:
    found = re.search(r'id="next-page" href="([^"]+)"', page)
    return None if found is None else html.unescape(found.group(1))


def element_text(page: str, element_id: str) -> str:
    found = re.search(rf'id="{element_id}"[^>]*>(.*?)</', page, re.S)
    if found is None:
        raise AssertionError(f"no element #{element_id} on the page")
    return html.unescape(found.group(1)).strip()


def progress_rows(page: str) -> dict[int, tuple[int, int, int, int]]:
    """partition -> (from, scanned up to, end, records scanned) of the search's report."""
    rows = re.findall(
        r'<tr data-partition="(\d+)">\s*<td>\d+</td><td class="num">(\d+)</td>'
        r'<td class="num scanned-to">(\d+)</td><td class="num">(\d+)</td><td class="num">(\d+)</td>',
        page,
    )
    return {int(p): (int(a), int(b), int(c), int(d)) for p, a, b, c, d in rows}


def row_cells(page: str, table_id: str, **data: object) -> list[str]:
    """The text of the cells of the row of table ``table_id`` whose data attributes match."""
    table = re.search(rf'<table id="{table_id}".*?</table>', page, re.S)
    if table is None:
        raise AssertionError(f"no table #{table_id} on the page")
    attrs = "".join(rf'[^>]*data-{k}="{re.escape(str(v))}"' for k, v in data.items())
    row = re.search(rf"<tr{attrs}[^>]*>(.*?)</tr>", table.group(0), re.S)
    if row is None:
        raise AssertionError(f"no row {data} in #{table_id}")
    cells = re.findall(r"<td[^>]*>(.*?)</td>", row.group(1), re.S)
    return [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in cells]
