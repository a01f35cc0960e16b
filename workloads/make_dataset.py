"""A small real image-classification dataset for every loader path.

scikit-learn's handwritten digits (1,797 8x8 grey images, 10 classes; the
package ships them, nothing is downloaded) upscaled to RGB and written

- as a JPEG ImageFolder: ``OUT/train/<class>/<n>.jpg``, ``OUT/val/...``
  (native DataLoader via torchvision ``ImageFolder``, or DALI's file reader);
- as TFRecord files ``OUT/tfrecord/{train,val}.tfrecord`` (tf.train.Example
  with ``image/encoded`` and ``image/class/label``) plus the DALI index files
  ``*.idx`` (DALI's TFRecord reader). Written without TensorFlow.

The split is deterministic (every 5th image of each class goes to val), and
the TFRecords hold the same files in the same order as the ImageFolder
lists them (classes, then file names, sorted).

    python workloads/make_dataset.py OUT [--size 32]
"""
from __future__ import annotations

import argparse
import io
import os
import struct

import numpy as np

# -- TFRecord (no TensorFlow) ---------------------------------------------------
_CRC_TABLE = []
for _i in range(256):
    _c = _i
    for _ in range(8):
        _c = (_c >> 1) ^ 0x82F63B78 if _c & 1 else _c >> 1
    _CRC_TABLE.append(_c)


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    table = _CRC_TABLE
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _varint(n: int) -> bytes:
    out = bytearray()
    n &= (1 << 64) - 1
    while True:
        b = n & 0x7F
        n >>= 7
        if n:
            out.append(b | 0x80)
        else:
            out.append(b)
            return bytes(out)


def _field(number: int, payload: bytes) -> bytes:  # length-delimited field
    return _varint(number << 3 | 2) + _varint(len(payload)) + payload


def example(image: bytes, label: int) -> bytes:
    """Serialized tf.train.Example{image/encoded: bytes, image/class/label: int64}."""
    bytes_feature = _field(1, _field(1, image))                  # Feature.bytes_list.value
    int_feature = _field(3, _field(1, _varint(label)))           # Feature.int64_list.value (packed)
    entries = (_field(1, _field(1, b"image/encoded") + _field(2, bytes_feature))
               + _field(1, _field(1, b"image/class/label") + _field(2, int_feature)))
    return _field(1, entries)                                    # Example.features


def write_tfrecord(path: str, records) -> None:
    """TFRecord file plus DALI's index (``offset size`` per record)."""
    offset = 0
    with open(path, "wb") as fh, open(path + ".idx", "w") as idx:
        for data in records:
            header = struct.pack("<Q", len(data))
            blob = header + struct.pack("<I", masked_crc(header)) + data + struct.pack("<I", masked_crc(data))
            fh.write(blob)
            idx.write(f"{offset} {len(blob)}\n")
            offset += len(blob)


# -- the dataset ------------------------------------------------------------------
def jpeg(img8: np.ndarray, size: int) -> bytes:
    from PIL import Image

    grey = (255 - img8 * (255.0 / 16.0)).clip(0, 255).astype(np.uint8)
    im = Image.fromarray(grey, mode="L").resize((size, size), Image.BILINEAR).convert("RGB")
    buf = io.BytesIO()
    im.save(buf, format="JPEG", quality=95)
    return buf.getvalue()


def make(out: str, size: int = 32) -> dict:
    from sklearn.datasets import load_digits

    digits = load_digits()
    counts = {"train": 0, "val": 0}
    records = {"train": [], "val": []}
    seen = {}
    for img, label in zip(digits.images, digits.target):
        label = int(label)
        k = seen.get(label, 0)
        seen[label] = k + 1
        split = "val" if k % 5 == 4 else "train"
        folder = os.path.join(out, split, f"{label}")
        os.makedirs(folder, exist_ok=True)
        name = f"{k:05d}.jpg"
        data = jpeg(img, size)
        with open(os.path.join(folder, name), "wb") as fh:
            fh.write(data)
        records[split].append((label, name, data))
        counts[split] += 1
    os.makedirs(os.path.join(out, "tfrecord"), exist_ok=True)
    for split, recs in records.items():
        recs.sort(key=lambda r: (str(r[0]), r[1]))  # the order ImageFolder lists them
        write_tfrecord(os.path.join(out, "tfrecord", f"{split}.tfrecord"), (example(d, lab) for lab, _, d in recs))
    return counts


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("out")
    p.add_argument("--size", type=int, default=32, help="image side in pixels")
    args = p.parse_args()
    counts = make(args.out, args.size)
    print(f"wrote {counts['train']} train and {counts['val']} val images (JPEG folders + TFRecord) to {args.out}")


if __name__ == "__main__":
    main()
