"""A tiny RGB canvas that saves itself as PNG: lines, rectangles and 3x5-pixel text.

Standard library only (``zlib``, ``struct``), so the demo needs no plotting package.
"""

from __future__ import annotations

import struct
import zlib
from pathlib import Path

Color = tuple[int, int, int]

WHITE: Color = (255, 255, 255)
BLACK: Color = (0, 0, 0)
GREY: Color = (200, 200, 200)
RED: Color = (214, 39, 40)

# 3 columns x 5 rows per glyph; "#" is ink.  Lower case is drawn as upper case.
_FONT = {
    " ": "...|...|...|...|...",
    "0": "###|#.#|#.#|#.#|###",
    "1": ".#.|##.|.#.|.#.|###",
    "2": "###|..#|###|#..|###",
    "3": "###|..#|.##|..#|###",
    "4": "#.#|#.#|###|..#|..#",
    "5": "###|#..|###|..#|###",
    "6": "###|#..|###|#.#|###",
    "7": "###|..#|.#.|.#.|.#.",
    "8": "###|#.#|###|#.#|###",
    "9": "###|#.#|###|..#|###",
    "A": ".#.|#.#|###|#.#|#.#",
    "B": "##.|#.#|##.|#.#|##.",
    "C": ".##|#..|#..|#..|.##",
    "D": "##.|#.#|#.#|#.#|##.",
    "E": "###|#..|##.|#..|###",
    "F": "###|#..|##.|#..|#..",
    "G": ".##|#..|#.#|#.#|.##",
    "H": "#.#|#.#|###|#.#|#.#",
    "I": "###|.#.|.#.|.#.|###",
    "J": "..#|..#|..#|#.#|.#.",
    "K": "#.#|#.#|##.|#.#|#.#",
    "L": "#..|#..|#..|#..|###",
    "M": "#.#|###|###|#.#|#.#",
    "N": "##.|#.#|#.#|#.#|#.#",
    "O": ".#.|#.#|#.#|#.#|.#.",
    "P": "##.|#.#|##.|#..|#..",
    "Q": ".#.|#.#|#.#|##.|.##",
    "R": "##.|#.#|##.|#.#|#.#",
    "S": ".##|#..|.#.|..#|##.",
    "T": "###|.#.|.#.|.#.|.#.",
    "U": "#.#|#.#|#.#|#.#|###",
    "V": "#.#|#.#|#.#|#.#|.#.",
    "W": "#.#|#.#|###|###|#.#",
    "X": "#.#|#.#|.#.|#.#|#.#",
    "Y": "#.#|#.#|.#.|.#.|.#.",
    "Z": "###|..#|.#.|#..|###",
    ":": "...|.#.|...|.#.|...",
    ".": "...|...|...|...|.#.",
    ",": "...|...|...|.#.|#..",
    "-": "...|...|###|...|...",
    "_": "...|...|...|...|###",
    "/": "..#|..#|.#.|#..|#..",
    "(": ".#.|#..|#..|#..|.#.",
    ")": ".#.|..#|..#|..#|.#.",
    "=": "...|###|...|###|...",
    "+": "...|.#.|###|.#.|...",
    "<": "..#|.#.|#..|.#.|..#",
    ">": "#..|.#.|..#|.#.|#..",
    "%": "#.#|..#|.#.|#..|#.#",
    "@": "###|#.#|###|#..|.##",
    "?": "###|..#|.#.|...|.#.",
    "{": ".##|.#.|##.|.#.|.##",
    "}": "##.|.#.|.##|.#.|##.",
}


class Canvas:
    def __init__(self, width: int, height: int, background: Color = WHITE) -> None:
        if width <= 0 or height <= 0:
            raise ValueError(f"canvas size must be positive, got {width}x{height}")
        self.width, self.height = width, height
        self.rows = [bytearray(bytes(background) * width) for _ in range(height)]

    def set(self, x: int, y: int, color: Color) -> None:
        if 0 <= x < self.width and 0 <= y < self.height:
            self.rows[y][3 * x : 3 * x + 3] = bytes(color)

    def rect(self, x0: int, y0: int, x1: int, y1: int, color: Color) -> None:
        """Fill the rectangle with corners (x0, y0) and (x1, y1), both included."""
        for y in range(max(0, min(y0, y1)), min(self.height, max(y0, y1) + 1)):
            for x in range(max(0, min(x0, x1)), min(self.width, max(x0, x1) + 1)):
                self.set(x, y, color)

    def hline(self, x0: int, x1: int, y: int, color: Color, dash: int = 0) -> None:
        for x in range(min(x0, x1), max(x0, x1) + 1):
            if not dash or (x // dash) % 2 == 0:
                self.set(x, y, color)

    def vline(self, x: int, y0: int, y1: int, color: Color) -> None:
        for y in range(min(y0, y1), max(y0, y1) + 1):
            self.set(x, y, color)

    def text(self, x: int, y: int, text: str, color: Color = BLACK, scale: int = 2) -> int:
        """Draw ``text`` with its top left corner at (x, y); return the x after it."""
        for char in text.upper():
            glyph = _FONT.get(char, _FONT["?"])
            for row, bits in enumerate(glyph.split("|")):
                for col, bit in enumerate(bits):
                    if bit == "#":
                        self.rect(
                            x + col * scale,
                            y + row * scale,
                            x + (col + 1) * scale - 1,
                            y + (row + 1) * scale - 1,
                            color,
                        )
            x += 4 * scale
        return x

    def png(self) -> bytes:
        raw = b"".join(b"\x00" + bytes(row) for row in self.rows)  # filter type 0 per row

        def chunk(kind: bytes, data: bytes) -> bytes:
            body = kind + data
            return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return (
            b"\x89PNG\r\n\x1a\n"
            + chunk(b"IHDR", header)
            + chunk(b"IDAT", zlib.compress(raw, 9))
            + chunk(b"IEND", b"")
        )

    def save(self, path: Path) -> None:
        path.write_bytes(self.png())
