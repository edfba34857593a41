"""Plain-text tables that fit a width without ever splitting a number, a header or a word.

Why not rich: rich shrinks every column to fit, so a 160-wide table squeezed into a long
test id showed `1,50` over `3` and `regression (not gate` cut at the edge. Here each column
says whether it may fold (names: test ids, metric names, provenance) or must stay whole
(numbers, units, verdict words). Whole columns and every header keep their full width;
what is left goes to the folding ones. Three layouts, the first that fits:

- wide: one line per row (the test id on every line, so a grep of a log finds it);
- stacked: the grouping column (the test id) becomes a heading line above its rows;
- cards: the whole columns alone are wider than the width (calibrate at 80 columns), so
  each row becomes wrapped ``header: value`` items.

A line is longer than the width only where a single unbreakable value is. Widths are
terminal cells (a CJK character of an imported source takes two), not characters.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Sequence

from rich.cells import cell_len

SEP = "  "
INDENT = "  "
MIN_FOLD = 12            # narrowest a folding column is made before a layout is given up
DEFAULT_LOG_WIDTH = 120  # width without a terminal and without COLUMNS (a CI log)


@dataclass(frozen=True)
class Column:
    header: str
    align: str = "left"    # "left" or "right"
    fold: bool = False     # may wrap over several lines (names); otherwise kept whole
    group: bool = False    # the row's subject (test id): a heading line of its own when narrow


@dataclass(frozen=True)
class Line:
    text: str
    style: str | None = None  # the row's style key (e.g. its outcome), None for titles and headers


# C0 and C1 controls (ESC, CR, LF, BEL, backspace, CSI...), DEL, line/paragraph separators and the
# bidirectional overrides that reorder what a reader sees
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: object) -> str:
    """``text`` safe to print on a terminal, in a log or in Markdown: control characters as their
    escapes (``\\x1b``, ``\\n``, ``\\x07``). Test ids, metric names, provenance and software strings
    come from test code and from hand-editable files; printed raw, an ESC sequence in one recolours
    or clears the terminal, and a CR or LF rewrites the line a person reads before approving a
    refresh. Every table (render), wrapped line (wrap_words) and report line goes through here."""
    return _UNPRINTABLE.sub(lambda m: m.group().encode("unicode_escape").decode("ascii"), str(text))


def resolve_width(*, isatty: bool, tty_width: int | None = None) -> int:
    """COLUMNS wins; else the terminal's width; else (a log file, a pipe) DEFAULT_LOG_WIDTH."""
    env = os.environ.get("COLUMNS", "").strip()
    if env.isdigit() and int(env) > 0:
        return int(env)
    if isatty and tty_width:
        return tty_width
    return DEFAULT_LOG_WIDTH


def stdout_width() -> int:
    import shutil
    import sys

    isatty = hasattr(sys.stdout, "isatty") and sys.stdout.isatty()
    return resolve_width(isatty=isatty, tty_width=shutil.get_terminal_size().columns if isatty else None)


def cells(text: str) -> int:
    return cell_len(text)


def pad(text: str, width: int, align: str = "left") -> str:
    fill = " " * max(0, width - cells(text))
    return fill + text if align == "right" else text + fill


def _hard_split(piece: str, width: int) -> list[str]:
    out, cur = [], ""
    for ch in piece:
        if cur and cells(cur + ch) > width:
            out.append(cur)
            cur = ""
        cur += ch
    return out + [cur]


_BREAK = re.compile(r"(?<=[/:\-_, =.])|(?=\[)")


def fold(text: str, width: int) -> list[str]:
    """Wrap a name at its natural joints (`/`, `::`, `-`, `_`, `,`, before `[`), never
    mid-piece unless one piece alone is wider than ``width``."""
    width = max(2, width)
    if cells(text) <= width:
        return [text]
    lines: list[str] = []
    cur = ""
    for piece in (p for p in _BREAK.split(text) if p):
        if cells(cur) + cells(piece) <= width:
            cur += piece
            continue
        if cur:
            lines.append(cur.rstrip() or cur)
        if cells(piece) > width:
            *whole, piece = _hard_split(piece, width)
            lines += whole
        cur = piece.lstrip() if lines else piece
    if cur:
        lines.append(cur)
    return lines


def wrap_words(text: str, width: int, indent: str = "", fold_long: bool = False) -> list[str]:
    """Wrap prose at spaces only: a number, a path or a command stays on one line.

    With ``fold_long``, a word wider than a continuation line (a long absolute path in a
    title) is folded at its joints instead of running past the width."""
    text = printable(text)
    body = text.lstrip(" ")
    lead = text[:len(text) - len(body)]
    words = body.split(" ")
    if fold_long:
        room = max(2, width - cells(indent))
        words = [piece for w in words for piece in (fold(w, room) if cells(w) > room else [w])]
    lines: list[str] = []
    cur = lead
    for w in words:
        candidate = f"{cur} {w}" if cur.strip() else cur + w
        prefix = indent if lines else ""
        if cur.strip() and cells(prefix + candidate) > width:
            lines.append(prefix + cur)
            cur = w
        else:
            cur = candidate
    lines.append((indent if lines else "") + cur)
    return lines


def pack(items: Sequence[str], width: int, indent: str = "", sep: str = SEP) -> list[str]:
    """Items side by side, as many per line as fit; an item is never split."""
    lines: list[str] = []
    cur = ""
    for item in items:
        if cur and cells(indent + cur + sep + item) > width:
            lines.append(indent + cur)
            cur = item
        else:
            cur = f"{cur}{sep}{item}" if cur else item
    if cur:
        lines.append(indent + cur)
    return lines


def _widths(columns: Sequence[Column], rows: Sequence[Sequence[str]], avail: int,
            keep_whole: set[int] = frozenset(), allow_fold: bool = True) -> list[int] | None:
    """Column widths within ``avail``, folding only fold columns (not those in keep_whole)."""
    natural = [max([cells(c.header)] + [cells(r[i]) for r in rows]) for i, c in enumerate(columns)]
    foldable = [i for i, c in enumerate(columns) if c.fold and i not in keep_whole and allow_fold]
    minimum = list(natural)
    for i in foldable:
        minimum[i] = min(natural[i], max(cells(columns[i].header), MIN_FOLD))
    seps = len(SEP) * (len(columns) - 1)
    if sum(minimum) + seps > avail:
        return None
    widths = list(minimum)
    spare = avail - seps - sum(minimum)
    want = {i: natural[i] - minimum[i] for i in foldable if natural[i] > minimum[i]}
    total_want = sum(want.values())
    if total_want <= spare:
        return natural
    for i, w in want.items():  # share the spare width in proportion to what each column lacks
        widths[i] += spare * w // total_want
    return widths


def _grid(columns: Sequence[Column], rows: Sequence[Sequence[str]], styles: Sequence[str | None],
          widths: list[int], indent: str = "") -> list[Line]:
    def cell(text: str, i: int) -> str:
        return pad(text, widths[i], columns[i].align)

    out = [Line((indent + SEP.join(cell(c.header, i) for i, c in enumerate(columns))).rstrip())]
    for row, style in zip(rows, styles):
        parts = [fold(text, widths[i]) if columns[i].fold else [text] for i, text in enumerate(row)]
        for k in range(max(len(p) for p in parts)):
            text = SEP.join(cell(p[k] if k < len(p) else "", i) for i, p in enumerate(parts))
            out.append(Line((indent + text).rstrip(), style))
    return out


def _groups(rows: Sequence[Sequence[str]], styles: Sequence[str | None], g: int):
    """Consecutive rows with the same value in column g."""
    out: list[tuple[str, list, list]] = []
    for row, style in zip(rows, styles):
        if not out or out[-1][0] != row[g]:
            out.append((row[g], [], []))
        out[-1][1].append([c for i, c in enumerate(row) if i != g])
        out[-1][2].append(style)
    return out


def render(columns: Sequence[Column], rows: Sequence[Sequence[str]], *, width: int, title: str | None = None,
           styles: Sequence[str | None] | None = None) -> list[Line]:
    """The table as lines no wider than ``width`` (see the module docstring for the layouts)."""
    rows = [[printable(c) for c in r] for r in rows]
    styles = list(styles) if styles is not None else [None] * len(rows)
    out = [Line(t) for t in wrap_words(title, width)] if title else []
    columns = [Column(printable(c.header), c.align, c.fold, c.group) for c in columns]
    group = next((i for i, c in enumerate(columns) if c.group), None)
    keep = {group} if group is not None else set()
    rest = [c for i, c in enumerate(columns) if i != group]
    sub_rows = [[c for i, c in enumerate(r) if i != group] for r in rows]
    for allow_fold in (False, True):  # folding a name only when no layout fits it whole
        widths = _widths(columns, rows, width, keep, allow_fold)
        if widths is not None:
            return out + _grid(columns, rows, styles, widths)
        sub_widths = _widths(rest, sub_rows, width - len(INDENT), allow_fold=allow_fold) if group is not None \
            else None
        if sub_widths is not None:
            out += _grid(rest, [], [], sub_widths, INDENT)
            for value, grows, gstyles in _groups(rows, styles, group):
                heading_style = gstyles[0] if len(set(gstyles)) == 1 else None
                out += [Line(t, heading_style) for t in fold(value, width)]
                out += _grid(rest, grows, gstyles, sub_widths, INDENT)[1:]
            return out
    return out + _cards(columns, rows, styles, width, group)


def _cards(columns: Sequence[Column], rows: Sequence[Sequence[str]], styles: Sequence[str | None], width: int,
           group: int | None) -> list[Line]:
    out: list[Line] = []
    last = None
    for row, style in zip(rows, styles):
        if group is not None and row[group] != last:
            last = row[group]
            out += [Line(t, None) for t in fold(row[group], width)]
        items = []
        for i, c in enumerate(columns):
            if i == group:
                continue
            item = f"{c.header}: {row[i]}"
            # a long name folds onto lines of its own; numbers stay whole items
            items += fold(item, width - len(INDENT)) if c.fold and cells(item) > width - len(INDENT) else [item]
        out += [Line(t, style) for t in pack(items, width, INDENT)]
    return out
