"""workloads/make_dataset.py: JPEG folders and TFRecords of the same real
images; DALI's file and TFRecord readers yield the same labels as the
native ImageFolder loader for the same files."""
import os
import sys

import numpy as np
import pytest

tfrec = pytest.importorskip("nvidia.dali.tfrecord")  # imported up front: DALI adds an import hook
dali = pytest.importorskip("nvidia.dali")
fn, pipeline_def = dali.fn, dali.pipeline_def

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "workloads"))
from make_dataset import crc32c, make  # noqa: E402


def test_crc32c_known_value():
    # RFC 3720 test vector: 32 bytes of zeros
    assert crc32c(b"\x00" * 32) == 0x8A9136AA
    assert crc32c(b"123456789") == 0xE3069283


@pytest.fixture(scope="module")
def digits(tmp_path_factory):
    out = str(tmp_path_factory.mktemp("digits"))
    counts = make(out, size=32)
    return out, counts


def test_splits_and_files(digits):
    out, counts = digits
    assert counts == {"train": 1442, "val": 355} and sum(counts.values()) == 1797
    assert sorted(os.listdir(os.path.join(out, "train"))) == [str(i) for i in range(10)]
    assert sorted(os.listdir(os.path.join(out, "tfrecord"))) == ["train.tfrecord", "train.tfrecord.idx",
                                                                 "val.tfrecord", "val.tfrecord.idx"]


def test_dali_readers_match_native_labels(digits):
    from torchvision import datasets

    out, counts = digits
    val = os.path.join(out, "val")
    native = [y for _, y in datasets.ImageFolder(val).samples]

    @pipeline_def
    def files():
        _, labels = fn.readers.file(file_root=val, random_shuffle=False, name="r")
        return labels

    @pipeline_def
    def records():
        rec = os.path.join(out, "tfrecord", "val.tfrecord")
        inp = fn.readers.tfrecord(path=rec, index_path=rec + ".idx", random_shuffle=False, name="r",
                                  features={"image/encoded": tfrec.FixedLenFeature((), tfrec.string, ""),
                                            "image/class/label": tfrec.FixedLenFeature([1], tfrec.int64, -1)})
        images = fn.decoders.image(inp["image/encoded"], device="cpu")
        return inp["image/class/label"], fn.shapes(images)

    def labels(p):
        p.build()
        got = []
        while len(got) < len(native):
            got += [int(np.array(x).ravel()[0]) for x in p.run()[0]]
        return got[:len(native)]

    kw = dict(batch_size=32, num_threads=1, device_id=None)
    assert labels(files(**kw)) == native
    assert labels(records(**kw)) == native
    assert sorted(set(native)) == list(range(10))
