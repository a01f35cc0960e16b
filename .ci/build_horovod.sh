#!/usr/bin/env bash
# Build Horovod 0.28.1 (PyTorch + gloo, CPU) against torch 2.14.1 and cache
# the wheel, then install it into the given Python's environment.
#
#   PY=.venv/bin/python bash .ci/build_horovod.sh
#
# Horovod 0.28.1 (the latest, sdist only) does not build against torch 2.14
# as published: torch's headers need C++20 but Horovod's CMake appends
# -std=c++14/17 (CXXFLAGS cannot override it), so a CXX wrapper rewrites the
# flag; and FindPytorch.cmake is forced to a CPU build (otherwise it wants
# cudart and nvcc). Takes ~3 minutes on 2 cores; later runs reuse the wheel.
set -euo pipefail
PY=${PY:-.venv/bin/python}
PY="$(cd "$(dirname "$PY")" && pwd)/$(basename "$PY")"
CACHE=${COMMPROF_WHEEL_CACHE:-$HOME/.cache/commprof/wheels}
mkdir -p "$CACHE"
if ! ls "$CACHE"/horovod-0.28.1-*.whl >/dev/null 2>&1; then
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    "$PY" -m pip download -q --no-deps --no-binary :all: horovod==0.28.1 -d "$tmp"
    tar -xzf "$tmp"/horovod-0.28.1.tar.gz -C "$tmp"
    src="$tmp/horovod-0.28.1"
    # CPU build: never look for CUDA in torch
    sed -i 's/^string(TOUPPER "${Pytorch_CUDA}" Pytorch_CUDA)/set(Pytorch_CUDA FALSE)/' \
        "$src/cmake/Modules/FindPytorch.cmake"
    cat > "$tmp/cxx" <<'WRAP'
#!/usr/bin/env bash
args=()
for a in "$@"; do
    case "$a" in -std=c++11|-std=c++14|-std=c++17) args+=(-std=c++20) ;; *) args+=("$a") ;; esac
done
exec g++ "${args[@]}"
WRAP
    chmod +x "$tmp/cxx"
    "$PY" -m pip install -q cloudpickle psutil pyyaml packaging cffi
    (cd "$src" && CXX="$tmp/cxx" HOROVOD_WITH_PYTORCH=1 HOROVOD_WITH_GLOO=1 HOROVOD_WITHOUT_MPI=1 \
        HOROVOD_WITHOUT_TENSORFLOW=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CPU_OPERATIONS=gloo \
        MAKEFLAGS=-j2 "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$CACHE" .)
fi
"$PY" -m pip install -q --no-deps "$CACHE"/horovod-0.28.1-*.whl
"$PY" -m pip install -q cloudpickle psutil pyyaml packaging cffi
"$PY" -c "import horovod.torch as hvd; print('horovod', hvd.__version__ if hasattr(hvd, '__version__') else 'ok')"
