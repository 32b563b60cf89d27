"""Feeds the crop-window JPEG decoder broken data, run as a script under AddressSanitizer.

``tests/test_jpeg_window_fuzz.py`` builds a second copy of ``transforms/_jpeg_window.c`` with ``-fsanitize=address``
and runs ``python jpeg_fuzz_probe.py PATH_TO_THAT_BUILD`` with libasan preloaded and ``PYTHONMALLOC=malloc``, so
every buffer handed to the decoder is its own malloc'd block and a read or write past one is a report on stderr
and a nonzero exit. libjpeg-turbo itself is not instrumented: its stores into ``out`` are checked here instead,
through guard bytes around a view of exactly ``out``'s length and the rows outside the window left as they were.

Every call must return a bool or raise the module's ``JpegError`` (argument checks: ValueError, TypeError,
BufferError, OverflowError). Everything is drawn from fixed seeds: the same decodes on every run. The last line
is ``decodes: N``; a broken promise is printed before it and makes the exit status 1.
"""

from __future__ import annotations

import importlib.util
import io
import random
import sys
import traceback

import numpy as np
from PIL import Image

FILL = 0xA5  # what `out` holds before a decode: a byte still FILL was (almost surely) not written
GUARD = 64  # guard bytes each side of a guarded `out`
DENOMS = (1, 2, 4, 8)
SIZES = ((1, 1), (5, 7), (9, 17), (16, 16), (200, 300))  # (height, width)
VARIANTS = {
    "4:4:4": ("RGB", {"subsampling": 0}),
    "4:2:2": ("RGB", {"subsampling": 1}),
    "4:2:0": ("RGB", {"subsampling": 2}),
    "gray": ("L", {}),
    "progressive 4:2:0": ("RGB", {"subsampling": 2, "progressive": True}),
    "progressive gray": ("L", {"progressive": True}),
    "restart every row 4:2:0": ("RGB", {"subsampling": 2, "restart_marker_rows": 1}),
    "restart every 3 blocks 4:2:2": ("RGB", {"subsampling": 1, "restart_marker_blocks": 3}),
    "optimized 4:2:0": ("RGB", {"subsampling": 2, "optimize": True}),
    "cmyk": ("CMYK", {}),
}
SOF = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
STUFFED_OR_RESTART = frozenset((0x00, *range(0xD0, 0xD8)))  # what FF may precede inside entropy-coded data
MARKER_BYTES = (0x00, 0xD0, 0xD3, 0xD7, 0xD8, 0xD9, 0xDA, 0xC4, 0xDB, 0xDD, 0xC0, 0xC2, 0xFF)
MUTATIONS = 80  # corrupted copies of each image, each decoded twice
# pixels: a corrupted header claiming more is given the original image's `out` (declined, quickly)
MAX_CLAIMED = 1 << 18


def load(path: str):
    spec = importlib.util.spec_from_file_location("_jpeg_window", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def picture(rng: np.random.Generator, height: int, width: int) -> np.ndarray:
    """A gradient with noise: smooth areas and busy ones, so the entropy data is neither tiny nor uniform."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([x * 255 // max(width - 1, 1), y * 255 // max(height - 1, 1), (x + y) * 7 % 256], axis=-1)
    return np.clip(base + rng.integers(-40, 41, (height, width, 3)), 0, 255).astype(np.uint8)


def encode(array: np.ndarray, mode: str, options: dict) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).convert(mode).save(buffer, "JPEG", quality=90, **options)
    return buffer.getvalue()


def layout(data: bytes):
    """(marker, payload offset, payload length) of each marker segment, and the (start, end) of each scan's
    entropy-coded data; tolerant of garbage (it stops where the structure does)."""
    segments, scans = [], []
    i = 2
    while i + 4 <= len(data) and data[i] == 0xFF and data[i + 1] != 0xD9:
        length = int.from_bytes(data[i + 2 : i + 4], "big")
        segments.append((data[i + 1], i + 4, max(length - 2, 0)))
        i += 2 + max(length, 2)
        if segments[-1][0] == 0xDA:
            j = data.find(b"\xff", i)
            while 0 <= j < len(data) - 1 and data[j + 1] in STUFFED_OR_RESTART:
                j = data.find(b"\xff", j + 2)
            j = len(data) - 1 if j < 0 else j
            scans.append((i, j))
            i = j
    return segments, scans


def claimed_size(data: bytes, fallback: tuple[int, int]) -> tuple[int, int]:
    """The size the (maybe corrupted) frame header claims, so that `out` fits it and the decode reaches libjpeg;
    the original size where there is none or it is absurd."""
    for marker, at, length in layout(data)[0]:
        if marker in SOF and length >= 5 and at + 5 <= len(data):
            height, width = (
                int.from_bytes(data[at + 1 : at + 3], "big"),
                int.from_bytes(data[at + 3 : at + 5], "big"),
            )
            if 0 < height * width <= MAX_CLAIMED:
                return height, width
            break
    return fallback


def scaled_size(size: tuple[int, int], denom: int) -> tuple[int, int]:
    return -(-size[0] // denom), -(-size[1] // denom)


def random_window(r: random.Random, height: int, width: int) -> tuple[int, int, int, int]:
    """Half the time a random window, else an edge case: a 1x1 at a corner or an edge, one row, one column,
    the whole image."""
    if r.random() < 0.5:
        top, left = r.randrange(height), r.randrange(width)
        return top, left, r.randint(1, height - top), r.randint(1, width - left)
    mid_row, mid_col, last_row, last_col = height // 2, width // 2, height - 1, width - 1
    return r.choice(
        [
            (0, 0, 1, 1),
            (0, last_col, 1, 1),
            (last_row, 0, 1, 1),
            (last_row, last_col, 1, 1),
            (mid_row, 0, 1, 1),
            (mid_row, last_col, 1, 1),
            (0, mid_col, 1, 1),
            (last_row, mid_col, 1, 1),
            (mid_row, 0, 1, width),
            (0, mid_col, height, 1),
            (0, 0, height, width),
        ]
    )


class Fuzz:
    def __init__(self, module):
        self.module = module
        self.decodes = 0
        self.outcomes = {True: 0, False: 0, "JpegError": 0}
        self.failures: list[str] = []

    def fail(self, label: str, what: str) -> None:
        self.failures.append(f"{label}: {what}")
        print(f"FAILED {label}: {what}", flush=True)

    def decode(self, data: bytes, size, denom: int, box, label: str):
        """One call of decode_into at 1/denom; in turn into an `out` of the image's size (for `size`) and one of
        the window's, each exactly malloc'd or a view between guard bytes. The filled `out` (None after a failure)
        and the result (True, False or "JpegError"), after checking what holds whatever the data."""
        top, left, rows, cols = box
        whole = self.decodes % 4 < 2
        height, width = scaled_size(size, denom) if whole else (rows, cols)
        count = height * width * 3
        guarded = self.decodes % 2 == 1
        if guarded:  # a view of exactly the length decode_into wants, between guard bytes
            backing = np.full(GUARD + count + GUARD, FILL, dtype=np.uint8)
            out = backing[GUARD : GUARD + count].reshape(height, width, 3)
        else:  # its own malloc'd block: ASan sees the extension stepping past it
            backing, out = None, np.full((height, width, 3), FILL, dtype=np.uint8)
        payload = np.frombuffer(data, dtype=np.uint8).copy()  # likewise for the data: no slack after its end
        label = f"{label}, 1/{denom}, window {box}, out {height}x{width}{' guarded' if guarded else ''}"
        self.decodes += 1
        try:
            result = self.module.decode_into(payload, out, top, left, rows, cols, denom)
        except self.module.JpegError:
            result = "JpegError"
        except Exception:  # noqa: BLE001 - any other exception is the failure being looked for
            self.fail(label, "raised\n" + traceback.format_exc())
            return None, None
        if result is not True and result is not False and result != "JpegError":
            self.fail(label, f"returned {result!r}")
            return None, None
        self.outcomes[result] += 1
        if guarded and not ((backing[:GUARD] == FILL).all() and (backing[GUARD + count :] == FILL).all()):
            self.fail(label, "wrote outside out")
        if whole and (top + rows > height or left + cols > width) and result is not False:
            self.fail(label, f"a window outside the image gave {result!r}")
        elif result is False and not (out == FILL).all():
            self.fail(label, "declined, yet wrote into out")
        elif whole and not ((out[:top] == FILL).all() and (out[top + rows :] == FILL).all()):
            self.fail(label, "wrote rows outside the window")
        return (out[top : top + rows, left : left + cols] if whole else out), result


def windows_of_valid_images(fuzz: Fuzz, r: random.Random, name: str, data: bytes, size) -> None:
    """Every scale, the edge windows and random ones: a valid image decodes, each window as the whole decode."""
    for denom in DENOMS:
        height, width = scaled_size(size, denom)
        label = f"{name} {size[0]}x{size[1]}"
        whole, result = fuzz.decode(data, size, denom, (0, 0, height, width), label)
        expected = name != "cmyk"  # CMYK is declined
        if result is not expected:
            fuzz.fail(f"{label}, 1/{denom}", f"a valid image gave {result!r}, not {expected}")
            continue
        for _ in range(8):
            box = random_window(r, height, width)
            window, result = fuzz.decode(data, size, denom, box, label)
            top, left, rows, cols = box
            if result is not expected:
                fuzz.fail(f"{label}, 1/{denom}, window {box}", f"a valid image gave {result!r}")
            elif result and not np.array_equal(window, whole[top : top + rows, left : left + cols]):
                fuzz.fail(f"{label}, 1/{denom}, window {box}", "the window differs from the whole decode")


def truncations(fuzz: Fuzz, r: random.Random, name: str, data: bytes, size) -> None:
    """Cut points through the headers (every few bytes, from the first) and a spread through the entropy data,
    each as cut (declined early: no EOI at the end) and with FF D9 put back (libjpeg reads up to the cut)."""
    scans = layout(data)[1]
    headers_end = scans[0][0] if scans else len(data)
    cuts = {*range(0, min(headers_end, 16)), *range(r.randrange(4), headers_end, 5)}
    cuts |= {r.randrange(headers_end, len(data)) for _ in range(40)} if headers_end < len(data) else set()
    for cut in sorted(cuts):
        for tail in (b"", b"\xff\xd9"):
            denom = r.choice(DENOMS)
            box = random_window(r, *scaled_size(size, denom))
            fuzz.decode(data[:cut] + tail, size, denom, box, f"{name} cut at {cut}{' + EOI' if tail else ''}")


def header_mutation(r: random.Random, data: bytearray) -> str:
    """Corrupts one field of one marker segment: frame size, precision, component count, sampling factors,
    table selectors, Huffman counts and values, quantization values, scan parameters, restart interval, or a
    segment's length."""
    segments = [s for s in layout(bytes(data))[0] if s[1] + s[2] <= len(data) - 2]
    if not segments:  # an earlier corruption broke the structure: flip bits anywhere before the EOI
        for _ in range(r.randint(1, 4)):
            data[r.randrange(max(len(data) - 2, 1))] ^= 1 << r.randrange(8)
        return "bit flips"
    marker, at, length = r.choice(segments)
    if r.random() < 0.1:
        data[at - 2 : at] = r.choice(
            [0, 1, 2, 3, length + 1, length + 3, 0xFFFF, r.randrange(0x10000)]
        ).to_bytes(2, "big")
        return f"length of FF {marker:02X}"
    if marker in SOF and length >= 6:
        field = r.choice(["precision", "height", "width", "components", "id", "sampling", "table"])
        if field == "precision":
            data[at] = r.choice([0, 1, 7, 9, 12, 16, 255])
        elif field in ("height", "width"):
            offset = at + 1 if field == "height" else at + 3
            now = int.from_bytes(data[offset : offset + 2], "big")
            new = r.choice(
                [0, 1, 2, 7, 8, 9, 15, 16, 17, 31, 33, now - 1, now + 1, now * 2, now + 8, 255, 4096, 65535]
            )
            data[offset : offset + 2] = (new % 0x10000).to_bytes(2, "big")
        elif field == "components":
            data[at + 5] = r.choice([0, 1, 2, 3, 4, 5, 255])
        else:
            component = at + 6 + 3 * r.randrange(max((length - 6) // 3, 1))
            which = {"id": 0, "sampling": 1, "table": 2}[field]
            choices = {
                "id": [0, 1, 2, 3, 4, r.randrange(256)],
                "sampling": [
                    0x00,
                    0x11,
                    0x12,
                    0x21,
                    0x22,
                    0x14,
                    0x41,
                    0x44,
                    0x33,
                    0x88,
                    0xFF,
                    r.randrange(256),
                ],
                "table": [0, 1, 2, 3, 4, 255],
            }[field]
            if component + which < len(data) - 2:
                data[component + which] = r.choice(choices)
        return f"SOF {field}"
    if marker == 0xC4 and length >= 17:
        spot = r.choice(["class", "counts", "values"])
        if spot == "class":
            data[at] = r.choice([0x00, 0x01, 0x10, 0x11, 0x02, 0x13, 0x20, 0xFF, r.randrange(256)])
        elif spot == "counts":
            data[at + 1 + r.randrange(16)] = r.choice([0, 1, 2, 16, 200, 255, r.randrange(256)])
        elif length > 17:
            data[at + 17 + r.randrange(length - 17)] = r.randrange(256)
        return f"DHT {spot}"
    if marker == 0xDB and length >= 65:
        if r.random() < 0.3:
            data[at] = r.choice([0x00, 0x01, 0x04, 0x10, 0x13, 0xFF])
            return "DQT precision/table"
        for _ in range(r.randint(1, 8)):
            data[at + 1 + r.randrange(64)] = r.choice([0, 1, 255, r.randrange(256)])
        return "DQT values"
    if marker == 0xDA and length >= 4:
        spot = r.randrange(length)
        data[at + spot] = r.choice([0, 1, 2, 3, 4, 5, 0x11, 0x3F, 0x40, 0xFF, r.randrange(256)])
        return f"SOS byte {spot}"
    if marker == 0xDD and length >= 2:
        data[at : at + 2] = r.choice([0, 1, 2, 0xFFFF, r.randrange(0x10000)]).to_bytes(2, "big")
        return "DRI interval"
    for _ in range(r.randint(1, 4)):
        data[at + r.randrange(max(length, 1))] ^= 1 << r.randrange(8)
    return f"bit flips in FF {marker:02X}"


def entropy_mutation(r: random.Random, data: bytearray) -> str:
    """Corrupts the entropy-coded data of one scan: bit flips, overwritten bytes, a marker dropped in, a chunk
    cut out or repeated."""
    scans = [s for s in layout(bytes(data))[1] if s[1] > s[0]]
    if not scans:
        return header_mutation(r, data)
    start, end = r.choice(scans)
    kind = r.choice(["flips", "bytes", "marker", "cut", "repeat"])
    if kind == "flips":
        for _ in range(r.randint(1, 16)):
            data[r.randrange(start, end)] ^= 1 << r.randrange(8)
    elif kind == "bytes":
        for _ in range(r.randint(1, 8)):
            data[r.randrange(start, end)] = r.choice([0x00, 0xFF, r.randrange(256)])
    elif kind == "marker":
        at = r.randrange(start, end)
        data[at : at + 2] = bytes([0xFF, r.choice(MARKER_BYTES)])
    else:
        a = r.randrange(start, end)
        b = r.randrange(a, min(end, a + 64) + 1)
        data[a:b] = b"" if kind == "cut" else data[a:b] * 2
    return f"entropy {kind}"


def mutations(fuzz: Fuzz, r: random.Random, name: str, data: bytes, size, count: int) -> None:
    """Seeded corruptions of headers and entropy data, each decoded at a random scale and window, into an `out`
    sized for the size the corrupted header claims."""
    for _ in range(count):
        mutated = bytearray(data)
        done = [
            (header_mutation if r.random() < 0.5 else entropy_mutation)(r, mutated)
            for _ in range(r.choice([1, 1, 2, 3]))
        ]
        if mutated[-2:] != b"\xff\xd9":
            mutated += b"\xff\xd9"
        mutated = bytes(mutated)
        claimed = claimed_size(mutated, size)
        for _ in range(2):
            denom = r.choice(DENOMS)
            fuzz.decode(
                mutated,
                claimed,
                denom,
                random_window(r, *scaled_size(claimed, denom)),
                f"{name} {', '.join(done)}",
            )


def arguments(fuzz: Fuzz, r: random.Random) -> None:
    """Bad arguments raise ValueError, TypeError, BufferError or OverflowError, or are declined; never a crash."""
    module = fuzz.module
    data = encode(picture(np.random.default_rng(1), 9, 17), "RGB", {"subsampling": 2})
    count = 9 * 17 * 3
    read_only = np.zeros(count, dtype=np.uint8)
    read_only.flags.writeable = False
    big = 2**70
    cases = [
        ("out one byte short", (data, np.zeros(count - 1, np.uint8), 0, 0, 1, 1, 1), False),
        ("out one byte long", (data, np.zeros(count + 1, np.uint8), 0, 0, 1, 1, 1), False),
        ("out empty", (data, np.zeros(0, np.uint8), 0, 0, 1, 1, 1), False),
        ("out sized for another scale", (data, np.zeros(count, np.uint8), 0, 0, 1, 1, 2), False),
        ("out is bytes", (data, bytes(count), 0, 0, 1, 1, 1), TypeError),
        ("out is a read-only array", (data, read_only, 0, 0, 1, 1, 1), (TypeError, ValueError, BufferError)),
        (
            "out is not contiguous",
            (data, np.zeros((9, 34, 3), np.uint8)[:, ::2], 0, 0, 1, 1, 1),
            (TypeError, ValueError, BufferError),
        ),
        ("out is None", (data, None, 0, 0, 1, 1, 1), TypeError),
        ("window below the image", (data, np.zeros(count, np.uint8), 9, 0, 1, 1, 1), False),
        ("window right of the image", (data, np.zeros(count, np.uint8), 0, 17, 1, 1, 1), False),
        ("window taller than the image", (data, np.zeros(count, np.uint8), 0, 0, 10, 1, 1), False),
        ("window wider than the image", (data, np.zeros(count, np.uint8), 0, 0, 1, 18, 1), False),
        ("window far outside", (data, np.zeros(count, np.uint8), 2**62, 2**62, 2**62, 2**62, 1), False),
        ("negative top", (data, np.zeros(count, np.uint8), -1, 0, 1, 1, 1), ValueError),
        ("negative left", (data, np.zeros(count, np.uint8), 0, -1, 1, 1, 1), ValueError),
        ("negative height", (data, np.zeros(count, np.uint8), 0, 0, -1, 1, 1), ValueError),
        ("negative width", (data, np.zeros(count, np.uint8), 0, 0, 1, -5, 1), ValueError),
        ("zero height", (data, np.zeros(count, np.uint8), 0, 0, 0, 1, 1), ValueError),
        ("zero width", (data, np.zeros(count, np.uint8), 0, 0, 1, 0, 1), ValueError),
        ("most negative top", (data, np.zeros(count, np.uint8), -(2**63), 0, 1, 1, 1), ValueError),
        ("top past a C long", (data, np.zeros(count, np.uint8), big, 0, 1, 1, 1), OverflowError),
        ("denominator past a C int", (data, np.zeros(count, np.uint8), 0, 0, 1, 1, big), OverflowError),
        ("a float", (data, np.zeros(count, np.uint8), 0.0, 0, 1, 1, 1), TypeError),
        ("data is text", ("not a jpeg", np.zeros(count, np.uint8), 0, 0, 1, 1, 1), TypeError),
        ("data is None", (None, np.zeros(count, np.uint8), 0, 0, 1, 1, 1), TypeError),
        ("data is empty", (b"", np.zeros(count, np.uint8), 0, 0, 1, 1, 1), False),
        ("data is only EOI", (b"\xff\xd9", np.zeros(count, np.uint8), 0, 0, 1, 1, 1), False),
        ("data is SOI, EOI", (b"\xff\xd8\xff\xd9", np.zeros(count, np.uint8), 0, 0, 1, 1, 1), "JpegError"),
        (
            "data is zeros ending in EOI",
            (bytes(100) + b"\xff\xd9", np.zeros(count, np.uint8), 0, 0, 1, 1, 1),
            "JpegError",
        ),
        ("too few arguments", (data, np.zeros(count, np.uint8), 0, 0, 1, 1), TypeError),
        ("too many arguments", (data, np.zeros(count, np.uint8), 0, 0, 1, 1, 1, 1), TypeError),
        ("out is a bytearray", (data, bytearray(count), 0, 0, 9, 17, 1), True),
        ("out is a uint16 array", (data, np.zeros(count // 2 + 1, np.uint16), 0, 0, 1, 1, 1), False),
    ]
    cases += [
        (f"denominator {d}", (data, np.zeros(count, np.uint8), 0, 0, 1, 1, d), ValueError)
        for d in (0, 3, 5, 16, -1, -8)
    ]
    for name, args, expected in cases:
        fuzz.decodes += 1
        try:
            got = module.decode_into(*args)
        except module.JpegError:
            got = "JpegError"
        except (ValueError, TypeError, BufferError, OverflowError) as err:
            got = type(err)
        except Exception:  # noqa: BLE001 - any other exception is a failure
            fuzz.fail(f"argument check: {name}", "raised\n" + traceback.format_exc())
            continue
        allowed = expected if isinstance(expected, tuple) else (expected,)
        if got not in allowed:
            fuzz.fail(f"argument check: {name}", f"gave {got!r}, expected {expected!r}")


def main(path: str) -> int:
    module = load(path)
    fuzz = Fuzz(module)
    r = random.Random(20261126)
    rng = np.random.default_rng(20261126)
    arguments(fuzz, r)
    for size in SIZES:
        array = picture(rng, *size)
        for name, (mode, options) in VARIANTS.items():
            try:
                data = encode(array, mode, options)
            except (OSError, TypeError, ValueError) as err:  # an option this Pillow cannot write
                print(f"skipped {name} {size[0]}x{size[1]}: Pillow could not write it ({err})")
                continue
            if "restart" in name and b"\xff\xdd" not in data:
                print(f"note: Pillow wrote {name} {size[0]}x{size[1]} without restart markers")
            windows_of_valid_images(fuzz, r, name, data, size)
            truncations(fuzz, r, name, data, size)
            mutations(fuzz, r, name, data, size, MUTATIONS)
    print(f"outcomes: {fuzz.outcomes}")
    print(f"failures: {len(fuzz.failures)}")
    print(f"decodes: {fuzz.decodes}", flush=True)
    return 1 if fuzz.failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
