"""Integer codes and distinct values (analyzers/codes.py) against numpy's
np.unique, on the ranges where they count and where they sort; strings
taken by code against the column pandas makes of numpy's take."""
import numpy as np
import pandas as pd
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.analyzers.codes import distinct, int_codes, strings_at


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(-5, 40), max_size=60), st.sampled_from([0, 1 << 20, -(1 << 40)]),
       st.sampled_from([np.int64, np.int32, np.uint16, np.int8, np.int16, np.uint64]), st.booleans())
def test_distinct_and_codes_are_numpys_unique(values, shift, dtype, wide):
    v = np.array(values, np.int64) + (shift if dtype == np.int64 else 0)
    if dtype in (np.uint16, np.uint64):
        v = np.abs(v)
    if wide and dtype in (np.int8, np.int16) and len(v):     # a range past the type's half: v - min overflows it
        v[0] = np.iinfo(dtype).min + 1
        v[-1] = np.iinfo(dtype).max - 1
    v = v.astype(dtype)
    want, inv = np.unique(v, return_inverse=True)
    got = distinct(v)
    assert got.dtype == want.dtype and got.tolist() == want.tolist()
    u, codes = int_codes(v)
    assert u.tolist() == want.tolist() and codes.tolist() == inv.ravel().tolist()


def test_distinct_of_a_wide_range_or_no_integer():
    v = np.array([3, 1 << 50, 3, -7], np.int64)
    assert distinct(v).tolist() == [-7, 3, 1 << 50]
    assert distinct(np.array([2.5, 1.0, 2.5])).tolist() == [1.0, 2.5]
    assert distinct(np.zeros(0, np.int64)).tolist() == []


@settings(max_examples=100, deadline=None)
@given(st.lists(st.one_of(st.none(), st.text(max_size=4)), min_size=1, max_size=6, unique=True),
       st.lists(st.integers(0, 1000), max_size=40), st.sampled_from([np.int64, np.int32, np.int8]))
def test_strings_taken_by_code_are_the_column_pandas_makes(names, picks, dtype):
    codes = np.array([p % (2 * len(names)) - len(names) for p in picks], dtype)    # from the end too
    want = pd.Series(np.array(names, dtype=object)[codes])
    got = pd.Series(strings_at(names, codes))
    assert got.dtype == want.dtype
    pd.testing.assert_series_equal(got, want)


def test_strings_at_keeps_values_that_are_not_strings():
    got = pd.Series(strings_at(["a", 3], np.array([1, 0, 1])))
    assert got.tolist() == [3, "a", 3] and got.dtype == object
    assert pd.Series(strings_at([None], np.array([0, 0]))).dtype == object     # no string: as pandas infers


def test_codes_from_the_end_of_a_narrow_type_do_not_overflow():
    names = [str(i) for i in range(200)]
    assert pd.Series(strings_at(names, np.array([-1, -128, 5], np.int8))).tolist() == ["199", "72", "5"]
