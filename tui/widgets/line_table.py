"""A table drawn with Textual's line API: the mechanics the rank and node tables share.

DataTable re-renders every visible cell whenever any cell changes, which at
64 ranks updating ten times a second saturates a core. A line table keeps
its rows as texts keyed by an id (a rank, a node), draws a line as a string
join and a Strip, and keeps the cursor on its id, not its position, through
re-sorts and filtering. Subclasses say what the header is and how a row
is coloured.

A table wider than its view scrolls sideways a column at a time (left,
right), with its first FROZEN columns kept in place, as a spreadsheet keeps
its key column: a rank's numbers scrolled into view still say whose they are.
"""

from __future__ import annotations

from typing import Any

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.binding import Binding
from textual.geometry import Region, Size
from textual.scroll_view import ScrollView
from textual.strip import Strip

GAP = "  "


class LineTable(ScrollView, can_focus=True):
    PREFIX = ""
    """The subclass's component-class prefix: its styles are PREFIX--header, --cursor..."""
    FROZEN = 1
    """Leading columns that stay in view when the table scrolls sideways: the row's key."""

    BINDINGS = [
        Binding("up", "cursor(-1)", show=False),
        Binding("down", "cursor(1)", show=False),
        Binding("pageup", "page(-1)", show=False),
        Binding("pagedown", "page(1)", show=False),
        Binding("home", "cursor(-1000000)", show=False),
        Binding("end", "cursor(1000000)", show=False),
        Binding("left", "column(-1)", show=False),
        Binding("right", "column(1)", show=False),
    ]

    def __init__(self, header: list[str], optional: frozenset[int] = frozenset(), **kwargs: Any) -> None:
        """optional: the columns left out until a row has something in them other than "-"
        (tokens/s, in a job that reads no token ids)."""
        super().__init__(**kwargs)
        self._header = header
        self._optional = optional
        self._hidden: frozenset[int] = frozenset()
        self._widths = [0 if i in optional else len(label) for i, label in enumerate(header)]
        self._order: list[int] = []
        self._cursor: int | None = None
        self._styles: dict[str, Style] = {}

    @property
    def row_count(self) -> int:
        return len(self._order)

    def notify_style_update(self) -> None:
        """CSS or theme changed: the cached component styles are stale."""
        super().notify_style_update()
        self._styles = {}

    def _style(self, name: str) -> Style:
        """A component style ("base" is the widget's own), resolved once per CSS change."""
        if name not in self._styles:
            self._styles[name] = self.rich_style if name == "base" else self.get_component_rich_style(f"{self.PREFIX}--{name}")
        return self._styles[name]

    def hide(self, columns: frozenset[int]) -> bool:
        """Leave these columns out whatever their rows hold (what a kind of job cannot have),
        and bring back those hidden before; the rows shown next widen them again. Whether
        that changed the columns."""
        if columns == self._hidden:
            return False
        self._hidden = columns
        self._widths = [0 if i in columns or i in self._optional else len(label) for i, label in enumerate(self._header)]
        return True

    def _widen(self, texts: list[str]) -> None:
        for i, text in enumerate(texts):
            if i in self._hidden:
                continue
            if self._widths[i] or text != "-":
                self._widths[i] = max(self._widths[i], len(text), len(self._header[i]))

    def _line(self, texts: list[str]) -> str:
        return " " + GAP.join(t.ljust(w) for t, w in zip(texts, self._widths) if w) + " "

    def _set_order(self, order: list[int]) -> None:
        """New rows are in place: keep the cursor on its id, size the view, redraw."""
        self._order = order
        if self._cursor not in order:
            self._cursor = order[0] if order else None
        shown = [w for w in self._widths if w]
        size = Size(sum(shown) + len(GAP) * (len(shown) - 1) + 2, len(order) + 1)
        if size != self.virtual_size:  # a new virtual size costs a layout pass
            self.virtual_size = size
        self.refresh()

    def _starts(self) -> list[int]:
        """Where each column starts in the line's cells, as _line lays them out (a hidden
        column, of width 0, at where the next shown one starts)."""
        starts, at = [], 1
        for width in self._widths:
            starts.append(at)
            if width:
                at += width + len(GAP)
        return starts

    def _column_starts(self) -> list[int]:
        """Where each shown column after the frozen ones starts, in the line's cells."""
        return [start for start, width in zip(self._starts(), self._widths) if width][self.FROZEN :]

    def _frozen_width(self) -> int:
        """The cells that stay put when the table scrolls sideways: up to its first unfrozen column."""
        starts = self._column_starts()
        return starts[0] if starts else 0

    def _row_segments(self, key: int, line: str, base: Style) -> list[Segment]:
        """One row's segments; base already has the cursor or zebra style."""
        raise NotImplementedError

    def _row_texts(self, key: int) -> list[str]:
        raise NotImplementedError

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        width = self.size.width
        if y == 0:
            segments = [Segment(self._line(self._header), self._style("header"))]
        else:
            index = scroll_y + y - 1
            if index >= len(self._order):
                return Strip.blank(width, self._style("base"))
            key = self._order[index]
            base = self._style("base")
            if key == self._cursor and self.has_focus:
                base += self._style("cursor")
            elif index % 2:
                base += self._style("zebra")
            segments = self._row_segments(key, self._line(self._row_texts(key)), base)
        line = Strip(segments)
        frozen = min(self._frozen_width(), width) if scroll_x else 0
        if frozen:
            line = Strip.join([line.crop(0, frozen), line.crop(frozen + scroll_x, scroll_x + width)])
        else:
            line = line.crop(scroll_x, scroll_x + width)
        return line.adjust_cell_length(width, self._style("base"))

    def _move_to(self, index: int) -> None:
        if not self._order:
            return
        index = max(0, min(len(self._order) - 1, index))
        self._cursor = self._order[index]
        self.scroll_to_region(Region(0, index + 1, 1, 1), animate=False, spacing=None)
        self.refresh()

    def action_cursor(self, delta: int) -> None:
        current = self._order.index(self._cursor) if self._cursor in self._order else 0
        self._move_to(current + delta)

    def action_column(self, direction: int) -> None:
        """Scroll sideways to the next column's start (direction 1) or the previous one's (-1)."""
        frozen = self._frozen_width()
        offsets = [start - frozen for start in self._column_starts()]
        x = self.scroll_offset.x
        target = next((o for o in offsets if o > x), x) if direction > 0 else max((o for o in offsets if o < x), default=0)
        self.scroll_to(x=min(target, self.max_scroll_x), animate=False)

    def action_page(self, direction: int) -> None:
        self.action_cursor(direction * max(1, self.size.height - 2))

    def on_click(self, event: events.Click) -> None:
        if event.y > 0:
            self._move_to(self.scroll_offset.y + event.y - 1)

    def on_focus(self) -> None:
        self.refresh()

    def on_blur(self) -> None:
        self.refresh()
