"""Events' column readers (analyzers/events.py) against Arrow's own
conversions, on the shapes a trace's chunks come in: several chunks (row
groups), slices that start inside a byte of bits, nulls, and dictionaries
that differ from chunk to chunk."""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import given, settings
from hypothesis import strategies as st

from commprof.analyzers.events import _bools, _codes, _floats, _ints

bools = st.lists(st.sampled_from([True, False, None]), max_size=40)


def _chunked(parts, offsets, typ=None, encode=False):
    """A chunked array of each list in ``parts``, every chunk a slice of a
    longer array that starts ``offsets[i]`` values in (``encode``: each
    dictionary-encoded before it is sliced, with a dictionary of its own)."""
    chunks = []
    for values, off in zip(parts, offsets):
        pad = [values[0] if values else None] * off
        whole = pa.array(pad + values, typ)
        chunks.append((whole.dictionary_encode() if encode else whole).slice(off))
    return pa.chunked_array(chunks, pa.dictionary(pa.int32(), typ) if encode else typ)


@settings(max_examples=200, deadline=None)
@given(st.lists(bools, min_size=1, max_size=4), st.lists(st.integers(0, 13), min_size=4, max_size=4))
def test_bools_are_arrows_with_null_as_false(parts, offsets):
    col = _chunked(parts, offsets, pa.bool_())
    want = pc.fill_null(col, False).to_numpy(zero_copy_only=False).astype(bool)
    got = _bools(col)
    assert got.dtype == bool and np.array_equal(got, want)
    for chunk in col.chunks:        # one array, not chunked
        assert np.array_equal(_bools(chunk), pc.fill_null(chunk, False).to_numpy(zero_copy_only=False))


def test_bools_of_a_column_with_no_value_or_no_chunk():
    assert _bools(pa.chunked_array([pa.nulls(5)])).tolist() == [False] * 5
    assert _bools(pa.chunked_array([], pa.bool_())).tolist() == []


names = st.lists(st.sampled_from(["step", "comm", "data", "odd", None]), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.lists(names, min_size=1, max_size=4), st.lists(st.integers(0, 9), min_size=4, max_size=4),
       st.booleans())
def test_codes_read_each_chunks_own_dictionary(parts, offsets, encoded):
    mapping = {"step": 0, "comm": 3, "data": 1}
    col = _chunked(parts, offsets, pa.string(), encode=encoded)
    want = [mapping.get(v, -1) if v is not None else -1 for v in col.to_pylist()]
    got = _codes(col, mapping)
    assert got.dtype == np.int8 and got.tolist() == want


numbers = st.lists(st.one_of(st.none(), st.integers(-2**40, 2**40)), max_size=30)


@settings(max_examples=200, deadline=None)
@given(st.lists(numbers, min_size=1, max_size=4), st.lists(st.integers(0, 11), min_size=4, max_size=4),
       st.sampled_from([pa.int64(), pa.int32(), pa.float64(), pa.float32()]))
def test_floats_are_arrows_with_null_as_nan(parts, offsets, typ):
    if not pa.types.is_int64(typ):      # values each type holds exactly
        parts = [[None if v is None else v % 2**20 for v in p] for p in parts]
    col = _chunked(parts, offsets, typ)
    want = col.to_numpy(zero_copy_only=False).astype(np.float64)
    got = _floats(col)
    assert got.dtype == np.float64 and got.tobytes() == want.tobytes()


@settings(max_examples=200, deadline=None)
@given(st.lists(numbers, min_size=1, max_size=4), st.lists(st.integers(0, 11), min_size=4, max_size=4),
       st.sampled_from([pa.int64(), pa.float64(), pa.null()]), st.data())
def test_items_of_some_rows_are_those_rows_of_the_whole_column(parts, offsets, typ, data):
    """A step's items read at its rows only: the values of the whole column
    converted, at those rows (a null, or no column at all, as NaN)."""
    from commprof.analyzers.events import Events

    if pa.types.is_null(typ):
        parts = [[None] * len(p) for p in parts]
    col = _chunked(parts, offsets, typ)
    n = len(col)
    rows = np.array(sorted(data.draw(st.sets(st.integers(0, max(n - 1, 0)), max_size=n))) if n else [], np.int64)
    table = pa.table({"rank": pa.array([0] * n, pa.int32()), "step": pa.array([0] * n, pa.int32()),
                      "category": pa.array(["step"] * n), "t_start": pa.array([0] * n, pa.int64()),
                      "t_end": pa.array([1] * n, pa.int64()), "items": col})
    want = np.full(len(rows), np.nan) if pa.types.is_null(typ) else _floats(col)[rows]
    got = Events.of(table).items_at(rows)
    assert got.dtype == np.float64 and got.tobytes() == want.tobytes()
    assert np.isnan(Events.of(table.drop_columns(["items"])).items_at(rows)).all()


@settings(max_examples=100, deadline=None)
@given(st.lists(st.lists(st.integers(-2**31, 2**31 - 1), max_size=20), min_size=1, max_size=4),
       st.lists(st.integers(0, 11), min_size=4, max_size=4))
def test_ints_are_arrows_cast(parts, offsets):
    col = _chunked(parts, offsets, pa.int32())
    got = _ints(col, np.int64)
    assert got.dtype == np.int64 and got.tolist() == [v for p in parts for v in p]


def test_ints_with_nulls_or_other_types_are_read_as_before():
    """A null or a non-integer chunk: the general conversion (null as 0)."""
    from commprof.analyzers.events import _np

    with_null = pa.chunked_array([pa.array([1, None, 3], pa.int32()), pa.array([4], pa.int32())])
    assert _ints(with_null, np.int64).tolist() == _np(with_null, np.int64).tolist() == [1, 0, 3, 4]
    mixed = pa.chunked_array([pa.array([1.0, 2.0]), pa.array([3.0])])
    assert _ints(mixed, np.int64).tolist() == [1, 2, 3]
