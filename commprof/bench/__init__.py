"""``commprof bench``: the collective micro-benchmark on the process groups
training uses (gloo, NCCL, MPI), with nccl-tests' definitions.

- :mod:`.worker`  what runs in every rank: sizes x ops x dtypes, warm-up,
  timed iterations, out-of-place and in-place, a correctness check (#wrong)
- :mod:`.launch`  the command: runs the worker under ``--nproc`` (torchrun)
  or any launcher given after ``--``, prints the table, writes JSON and
  the alpha-beta model

The table format and nccl-tests log import live in
:mod:`commprof.convert.nccltests`, the alpha-beta fit in
:mod:`commprof.analyzers.alphabeta`."""
