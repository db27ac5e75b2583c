#!/usr/bin/env bash
# The check on a GPU (issue 26), in one script that keeps under ten minutes on an NVIDIA H200
# (sm 90, 4.8 TB/s, nvcc 13, CMake, 16 cores, no network):
#   1. builds the pinned stock ggml with CUDA for that chip only (MOSS_TTS_GGML_CUDA=1,
#      CMAKE_CUDA_ARCHITECTURES=90) from the source carried in .gpu/ggml;
#   2. runs the ggml op tables and the device model tests on `cuda`
#      (MOSS_TTS_TEST_BACKEND: tests/ggml/test_ops.py, tests/models/test_device_backend.py);
#   3. benches decode steps at the real dimensions of Nano (f32, q8_0), Delay 8B (q8_0) and
#      Realtime (q4_K) on cuda beside the CPU, against the bandwidth floor (bench/device.py).
# Everything goes to stdout, and to $OUT/gpu_check.log (+ device_bench.json) when $OUT is set.
#
#   bench/gpu_check.sh prepare   here, on a machine with the ggml source cache and pip: copies
#                                the pinned ggml source into .gpu/ggml and the wheels the GPU
#                                machine lacks (gguf, soundfile, cffi, pycparser) into .gpu/whl;
#                                .gpu/ is git-ignored: carry it (`carry: [".gpu"]`, ~30 MB)
#   bench/gpu_check.sh           on the GPU machine, from the repository root
#   bench/gpu_check.sh --cpu     CUDA skipped (automatic without nvcc or a GPU): the tests and
#                                benches run on an RPC server serving the CPU, benches at tiny
#                                dims (--real for the real ones); --build also builds the carried
#                                source for the CPU, to check that path
#
# Environment: PYTHON (default python3), GPU_CHECK_BUDGET_S (default 570: the stages share it,
# each cut off with what is left), GPU_CHECK_CASES (bench/device.py --cases), GPU_CHECK_STEPS.
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
CARRY=$ROOT/.gpu
WORK=${GPU_CHECK_WORK:-/tmp/moss-tts-gpu-check}
BUDGET=${GPU_CHECK_BUDGET_S:-570}
DEVICE_GBS=4800            # H200 HBM3e read bandwidth, GB/s (the floor's divisor)
WHEELS="gguf==0.19.0 soundfile==0.14.0 cffi==2.0.0 pycparser==3.0"

prepare() {
    local src
    src=$("$PY" -c "from ggml_build.source import obtain_source; print(obtain_source().ggml_dir)") || exit 1
    rm -rf "$CARRY/ggml" && mkdir -p "$CARRY/whl"
    cp -r "$src" "$CARRY/ggml"
    # beside the tree, not in it: the tree hashes as the pinned one (doctor's source sha256)
    cp "$src/../LICENSE" "$CARRY/LICENSE" 2>/dev/null || true
    "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 -d "$CARRY/whl" $WHEELS || exit 1
    grep -qx '/.gpu/' .gitignore || echo '/.gpu/' >> .gitignore
    du -sh "$CARRY"
    echo "prepared: carry .gpu (the ggml source, $(ls "$CARRY/whl" | wc -l) wheels)"
}
if [ "${1:-}" = prepare ]; then prepare; exit; fi

MODE=auto TINY="" BUILD_CPU=0
for a in "$@"; do
    case $a in
        --cpu) MODE=cpu ;;
        --real) TINY=no ;;
        --build) BUILD_CPU=1 ;;
        *) echo "gpu_check.sh: unknown argument $a (prepare, --cpu, --real, --build)" >&2; exit 2 ;;
    esac
done
if [ $MODE = auto ]; then
    # nvcc alone is not a GPU (a CUDA toolkit on a CPU-only host): nvidia-smi must list one
    if command -v nvcc >/dev/null 2>&1 && nvidia-smi -L 2>/dev/null | grep -q '^GPU'; then
        MODE=cuda
    else
        MODE=cpu
    fi
fi
[ -z "$TINY" ] && { [ $MODE = cuda ] && TINY=no || TINY=yes; }
mkdir -p "$WORK"
LOG=${OUT:+$OUT/gpu_check.log}
LOG=${LOG:-$WORK/gpu_check.log}
exec > >(tee "$LOG") 2>&1
export PYTHONUNBUFFERED=1 PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
START=$SECONDS
FAILED=()

left() { echo $(( BUDGET - (SECONDS - START) )); }
stage() {   # stage NAME CAP_S COMMAND...: run with the smaller of its cap and what is left
    local name=$1 cap=$2 rest
    shift 2
    rest=$(left)
    (( rest < cap )) && cap=$rest
    echo
    echo "=== $name (limit ${cap}s, $(( SECONDS - START ))s in) ==="
    if (( cap <= 5 )); then
        echo "--- $name: NOT RUN (the ${BUDGET}s budget is spent)"
        FAILED+=("$name (not run)")
        return 1
    fi
    local t0=$SECONDS
    # through bash, so that a stage may be one of this script's (exported) functions
    timeout --kill-after=10 "$cap" bash -c '"$@"' "$name" "$@"
    local rc=$?
    echo "--- $name: rc $rc in $(( SECONDS - t0 ))s"
    (( rc == 0 )) || FAILED+=("$name (rc $rc)")
    return $rc
}

echo "moss-tts GPU check, $(date -u +%Y-%m-%dT%H:%M:%SZ), mode $MODE, $( [ $TINY = yes ] && echo tiny || echo real) dims, budget ${BUDGET}s"
echo "commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')$(git diff --quiet 2>/dev/null || echo ' (+ changes)')"
nproc | sed 's/^/cores: /'
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm,clocks.max.mem --format=csv
command -v nvcc >/dev/null && nvcc --version | tail -2
command -v cmake >/dev/null && cmake --version | head -1
"$PY" --version

# -- the Python packages the machine lacks, carried as wheels (prepare) ---------------------------
if ! "$PY" -c "import gguf, soundfile" 2>/dev/null; then
    if ls "$CARRY"/whl/*.whl >/dev/null 2>&1; then
        "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
            --target "$WORK/site" "$CARRY"/whl/*.whl || exit 1
        export PYTHONPATH=$PYTHONPATH:$WORK/site
    fi
    "$PY" -c "import gguf, soundfile" || { echo "missing gguf/soundfile: run 'bench/gpu_check.sh prepare' where pip works and carry .gpu"; exit 1; }
fi

# -- 1. ggml ------------------------------------------------------------------------------------
build_ggml() {   # build_ggml CUDA(0|1) ARCH_ARGS: the carried source into $WORK/lib
    [ -f "$CARRY/ggml/CMakeLists.txt" ] || { echo "no ggml source in $CARRY/ggml: run 'bench/gpu_check.sh prepare' and carry .gpu"; return 1; }
    # GIT_CEILING_DIRECTORIES: ggml asks git for its commit, which is not this repository's
    GIT_CEILING_DIRECTORIES=$CARRY MOSS_TTS_GGML_SOURCE=$CARRY/ggml MOSS_TTS_GGML_CUDA=$1 \
        MOSS_TTS_GGML_CMAKE_ARGS="$2" MOSS_TTS_CACHE=$WORK/cache \
        "$PY" -m ggml_build --target "$WORK/lib" || return 1
}
export -f build_ggml
export CARRY PY WORK
cublas_args() {   # CMake arguments that find cuBLAS, on stdout: none where the toolkit has it
    local bin inc whl
    bin=$(dirname "$(readlink -f "$(command -v nvcc)")")
    for inc in "$bin/../include" "$bin"/../targets/*/include; do
        [ -f "$inc/cublas_v2.h" ] && return 0
    done
    # a toolkit without its math libraries: the nvidia-cublas wheel PyTorch brings
    whl=$("$PY" -c 'import glob, site, sys, sysconfig
roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")} | set(site.getsitepackages())
roots |= {p for p in sys.path if p}
hits = sorted(h for r in roots for h in glob.glob(r + "/nvidia/*/include/cublas_v2.h"))
print(hits[0].rsplit("/include/", 1)[0] if hits else "")')
    if [ -z "$whl" ]; then
        echo "no cuBLAS: neither the CUDA toolkit nor an nvidia-cublas wheel has cublas_v2.h" >&2
        return 1
    fi
    echo "cuBLAS from $whl (the toolkit has none)" >&2
    # cuBLAS alone, in folders of its own: a CUDA 13 wheel shares nvidia/cu13/{include,lib} with
    # the runtime wheel's cudart and headers, which must not shadow the toolkit's own
    mkdir -p "$WORK/cublas/lib" "$WORK/cublas/include"
    for lib in "$whl"/lib/libcublas*.so.*; do
        ln -sf "$lib" "$WORK/cublas/lib/$(basename "$lib")"                 # run time: libcublas.so.13
        ln -sf "$lib" "$WORK/cublas/lib/$(basename "${lib%%.so.*}").so"     # link time: libcublas.so
    done
    ln -sf "$whl"/include/cublas*.h "$WORK/cublas/include/"
    # ggml_build's load check ignores LD_LIBRARY_PATH: the libraries carry the folder in their
    # RUNPATH (CMake adds the folders of what they link, outside the build, at install)
    echo "-DCMAKE_LIBRARY_PATH=$WORK/cublas/lib -DCMAKE_INSTALL_RPATH_USE_LINK_PATH=ON" \
         "-DCMAKE_CUDA_FLAGS=-I$WORK/cublas/include -DCMAKE_CXX_FLAGS=-I$WORK/cublas/include"
}
driver_args() {   # ggml links libcuda.so for its VMM pool: where CMake cannot find one (no
                  # stubs in the toolkit, none known to the dynamic linker) it does without
    local bin
    bin=$(dirname "$(readlink -f "$(command -v nvcc)")")
    ls "$bin"/../lib64/stubs/libcuda.so "$bin"/../targets/*/lib/stubs/libcuda.so 2>/dev/null \
        | grep -q . && return 0
    ldconfig -p 2>/dev/null | grep -q 'libcuda\.so ' && return 0
    echo "no libcuda.so to link: GGML_CUDA_NO_VMM=ON" >&2
    echo "-DGGML_CUDA_NO_VMM=ON"
}
if [ $MODE = cuda ]; then
    CUDA_ARGS=$(cublas_args) || exit 1
    CUDA_ARGS="$CUDA_ARGS $(driver_args)"
    stage "build ggml (CUDA, sm 90)" 400 build_ggml 1 "-DCMAKE_CUDA_ARCHITECTURES=90 $CUDA_ARGS" || exit 1
    export MOSS_TTS_GGML_LIB_DIR=$WORK/lib
elif [ $BUILD_CPU = 1 ]; then
    stage "build ggml (CPU, the carried source)" 600 build_ggml 0 "" || exit 1
    export MOSS_TTS_GGML_LIB_DIR=$WORK/lib
else
    echo
    echo "=== build ggml: skipped (no GPU; --build builds the carried source for the CPU) ==="
fi
stage "doctor" 60 "$PY" -m moss_tts doctor

# -- the device: cuda, or an RPC server serving the CPU ------------------------------------------
RPC_PID=""
stop_rpc() { [ -n "$RPC_PID" ] && kill -9 "$RPC_PID" 2>/dev/null; wait "$RPC_PID" 2>/dev/null; RPC_PID=""; }
trap stop_rpc EXIT
if [ $MODE = cuda ]; then
    DEVICE=cuda
else
    PORT=$("$PY" -c "import socket; s=socket.socket(); s.bind(('127.0.0.1',0)); print(s.getsockname()[1])")
    "$PY" -m moss_tts.ggml.rpc "127.0.0.1:$PORT" --threads 1 > "$WORK/rpc.log" 2>&1 &
    RPC_PID=$!
    DEVICE=rpc://127.0.0.1:$PORT
    for _ in $(seq 100); do   # until it listens (ggml's server prints nothing before that)
        "$PY" -c "import socket; socket.create_connection(('127.0.0.1', $PORT), 1).close()" \
            2>/dev/null && break
        sleep 0.2
    done
fi
echo "device: $DEVICE"

# -- 2. tests on the device ---------------------------------------------------------------------
# the op tables on the device; the model tests name it too (on RPC they need equal audio, on a
# GPU within tests/models/test_device_backend.py's DEVICE_AUDIO_ATOL)
stage "op tests on $DEVICE" 120 env MOSS_TTS_TEST_BACKEND=$DEVICE \
    "$PY" -m pytest -q -p no:cacheprovider tests/ggml/test_ops.py
stage "tiny-model tests on $DEVICE" 150 env MOSS_TTS_TEST_BACKEND=$DEVICE \
    "$PY" -m pytest -q -p no:cacheprovider tests/models/test_device_backend.py
if [ $MODE = cuda ]; then   # the CPU fallback of ggml's scheduler and the binding's device paths
    stage "scheduler and RPC tests" 90 "$PY" -m pytest -q -p no:cacheprovider \
        tests/ggml/test_sched.py tests/ggml/test_rpc.py
fi

# -- 3. decode steps: the device beside the CPU, against the bandwidth floor --------------------
BENCH_ARGS=(--backend "$DEVICE" --device-gbs $DEVICE_GBS --steps "${GPU_CHECK_STEPS:-8}"
            --data "$WORK/bench_data" --json "${OUT:-$WORK}/device_bench.json")
[ -n "${GPU_CHECK_CASES:-}" ] && BENCH_ARGS+=(--cases "$GPU_CHECK_CASES")
[ $TINY = yes ] && BENCH_ARGS+=(--tiny --threads 1)
stage "decode steps, $DEVICE beside the CPU" 600 "$PY" bench/device.py "${BENCH_ARGS[@]}"

stop_rpc
echo
echo "=== done in $(( SECONDS - START ))s: ${#FAILED[@]} stage(s) failed${FAILED[*]:+: ${FAILED[*]}} ==="
echo "log: $LOG"
(( ${#FAILED[@]} == 0 ))
