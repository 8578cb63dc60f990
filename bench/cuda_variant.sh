#!/bin/sh
# cuda_variant.sh — a copy of cuda_bench with one CUDA source compiled with extra -D flags, so
# that one GPU call can time several shapes of a kernel (docs/perf-log.md, session 4: the flash
# attention shapes). Runs on the CPU machine, after build-cudaperf has built cuda_bench:
#   sh bench/cuda_variant.sh NAME SOURCE.cu "-DFA_WARPS=8 -DFA_SPLITS=4"
# writes .devbin/cb_NAME.gz (gzipped: the carried tree is limited to 64 MiB); on the GPU
# machine: gunzip -c .devbin/cb_NAME.gz > .devbin/cb_NAME; chmod +x .devbin/cb_NAME; then run
# it like cuda_bench (e.g. --prefill-only). The constants must be #ifndef-guarded in SOURCE.
# SOURCE may be several files in one argument ("a.cu b.cu"): each is compiled with the flags.
set -eu
[ $# -eq 3 ] || { echo "usage: $0 NAME SOURCE.cu \"-DFLAGS\"" >&2; exit 2; }
name=$1; src=$2; flags=$3
B=${CUDA_BUILD:-build-cudaperf}
[ -f "$B/libqwenrt.a" ] && [ -f "$B/CMakeFiles/cuda_bench.dir/linkLibs.rsp" ] ||
    { echo "$0: build $B first (cmake --build $B --target cuda_bench)" >&2; exit 1; }
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# the library's own CUDA flags and include paths, plus the variant's
cflags=$(sed -n 's/^CUDA_FLAGS = //p' "$B/CMakeFiles/qwenrt_lib.dir/flags.make")
defs=$(sed -n 's/^CUDA_DEFINES = //p' "$B/CMakeFiles/qwenrt_lib.dir/flags.make")
incs=$(cat "$B/CMakeFiles/qwenrt_lib.dir/includes_CUDA.rsp")
cp "$B/libqwenrt.a" "$tmp/lib.a"
for s in $src; do
    obj=$(basename "$s").o
    # shellcheck disable=SC2086
    nvcc $cflags $defs $incs $flags -c "$s" -o "$tmp/$obj"
    ar t "$tmp/lib.a" | grep -qx "$obj" || { echo "$0: $obj is not in $B/libqwenrt.a" >&2; exit 1; }
    (cd "$tmp" && ar r lib.a "$obj")
done
sed "s#libqwenrt.a#$tmp/lib.a#" "$B/CMakeFiles/cuda_bench.dir/linkLibs.rsp" >"$tmp/libs.rsp"
(cd "$B" && g++ @CMakeFiles/cuda_bench.dir/objects1 -o "$tmp/cb" @"$tmp/libs.rsp" \
    -L/usr/local/cuda/targets/x86_64-linux/lib/stubs -L/usr/local/cuda/targets/x86_64-linux/lib)
strip "$tmp/cb"
mkdir -p .devbin
gzip -c "$tmp/cb" >".devbin/cb_$name.gz"
echo "wrote .devbin/cb_$name.gz ($src with $flags)"
