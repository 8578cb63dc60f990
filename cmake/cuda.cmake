# cmake/cuda.cmake — the CUDA backend (src/backend/cuda/*.cu), included by CMakeLists.txt after
# enable_language(CUDA) when nvcc exists and the .cu files are there.
#   - sm_90a machine code for Hopper (wgmma-capable) plus compute_80 PTX, which the driver
#     compiles for other GPUs at load;
#   - the CUDA runtime linked statically (the binary needs only the driver on the GPU machine),
#     cuBLASLt statically when the toolkit ships it, else the shared library with an RPATH;
#   - QWENRT_HAVE_CUDA for C code (cuda_stub.c steps aside);
find_package(CUDAToolkit REQUIRED)

target_sources(qwenrt_lib PRIVATE ${QWENRT_CUDA_SOURCES})
# CUDA_ARCHITECTURES off: the -gencode flags below say exactly what to build.
set_target_properties(qwenrt_lib PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17
                      CUDA_STANDARD_REQUIRED ON)
target_compile_options(qwenrt_lib PRIVATE
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_90a,code=sm_90a>
  $<$<COMPILE_LANGUAGE:CUDA>:-gencode=arch=compute_80,code=compute_80>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra,-Wno-unused-parameter>
  $<$<COMPILE_LANGUAGE:CUDA>:-Xptxas=-warn-spills>
  $<$<COMPILE_LANGUAGE:CUDA>:-lineinfo>)
target_compile_definitions(qwenrt_lib PUBLIC QWENRT_HAVE_CUDA)

if(TARGET CUDA::cublasLt_static AND EXISTS "${CUDAToolkit_LIBRARY_DIR}/libcublasLt_static.a")
  target_link_libraries(qwenrt_lib PUBLIC CUDA::cudart_static CUDA::cublasLt_static)
else()
  target_link_libraries(qwenrt_lib PUBLIC CUDA::cudart_static CUDA::cublasLt)
endif()

# bench/ll_chain_bench.cu: what a dependent decode step costs by synchronisation form, on a bare
# chain of products (standalone: no qwenrt code; docs/perf-log.md session 46). Built here so that
# it keeps compiling; run by hand on a GPU. ctest checks that a bad argument is named.
add_executable(ll_chain_bench ${CMAKE_SOURCE_DIR}/bench/ll_chain_bench.cu)
set_target_properties(ll_chain_bench PROPERTIES CUDA_ARCHITECTURES OFF CUDA_STANDARD 17)
target_compile_options(ll_chain_bench PRIVATE -gencode=arch=compute_90a,code=sm_90a)
target_link_libraries(ll_chain_bench PRIVATE CUDA::cudart_static)
add_test(NAME ll_chain_bench_args COMMAND ll_chain_bench --knock 7)
set_tests_properties(ll_chain_bench_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--tokens and --reps take 1 or more, --knock 0-3, --pad 0-220 KB")

# Benchmarks of the CUDA backend (run by hand; ctest only checks that a bad argument is named
# before any work starts, which needs no GPU).
add_executable(cuda_bench ${CMAKE_SOURCE_DIR}/bench/cuda_bench.c)
target_link_libraries(cuda_bench PRIVATE qwenrt_lib)
add_test(NAME cuda_bench_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --tg-variant no-such-variant)
set_tests_properties(cuda_bench_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--tg-variant \"no-such-variant\": no such decode variant; the names are: \"megakernel\"")
add_test(NAME cuda_bench_sweep_args COMMAND cuda_bench --arch qwen3-tiny --type q8_0 --sweep "1:0:2:2:0,1:8")
set_tests_properties(cuda_bench_sweep_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--sweep: expected P:W:R:L:KB\\[:H\\[:A\\[:I\\[:Q\\]\\]\\]\\]\\[\\+NAME=V...\\]\\[@STEP;...\\]\\[,...\\] \\(at most 32\\) at \"1:8\"")
add_test(NAME cuda_bench_sweep_field_args COMMAND cuda_bench --arch qwen3-tiny --type q8_0 --sweep "0:0:0:0:0+gemv_smem_warps=16+no_such=1")
set_tests_properties(cuda_bench_sweep_field_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--sweep: expected \\+NAME=VALUE with NAME one of the int32 options sweep_field lists at \"\\+no_such=1\"")
add_test(NAME cuda_bench_sweep_flag_args COMMAND cuda_bench --arch qwen3-tiny --type q8_0 --sweep "0:0:0:0:0+gemv_mma=1+gemv_mma=2")
set_tests_properties(cuda_bench_sweep_flag_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--sweep: expected \\+NAME=VALUE with NAME one of the int32 options sweep_field lists at \"\\+gemv_mma=2\" \\(or \\+gemv_mma=0\\|1\\)")
add_test(NAME cuda_bench_sweep_omit_args COMMAND cuda_bench --arch qwen3-tiny --type q8_0 --sweep "0:0:0:0:0,0:0:0:0:0@")
set_tests_properties(cuda_bench_sweep_omit_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--sweep: expected step labels \\(under 160 characters\\) after '@' at \"0:0:0:0:0@\"")
add_test(NAME cuda_bench_screen_sessions_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --screen-sessions 0)
set_tests_properties(cuda_bench_screen_sessions_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--screen-sessions 0: expected 1 to 64 sessions")
add_test(NAME cuda_bench_screen_pattern_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --screen-sessions 2 --screen-pattern SxU)
set_tests_properties(cuda_bench_screen_pattern_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--screen-pattern SxU: expected letters S")
add_test(NAME cuda_bench_gdn_chunked_args COMMAND cuda_bench --arch qwen35-tiny --type bf16 --gdn-chunked 3)
set_tests_properties(cuda_bench_gdn_chunked_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--gdn-chunked 3: expected 0 \\(the column scan\\), 1 \\(chunks\\) or 2 \\(chunks on the tensor cores\\)")
add_test(NAME cuda_bench_depth_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --sweep 0:0:0:0:0 --depth -5)
set_tests_properties(cuda_bench_depth_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--depth -5: expected 0 to 32768 prompt tokens before the decode")
add_test(NAME cuda_bench_gdn_scan_warps_args COMMAND cuda_bench --arch qwen35-tiny --type bf16 --gdn-scan-warps 12)
set_tests_properties(cuda_bench_gdn_scan_warps_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--gdn-scan-warps 12: expected 0 \\(the default\\), 8 or 16")
add_test(NAME cuda_bench_sweep_sampled_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --sweep 0:0:0:0:0 --sweep-sampled 300)
set_tests_properties(cuda_bench_sweep_sampled_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--sweep-sampled 300: expected 1 to 255 candidates \\(top_k\\) of the sweep's draws")
# integer options: a non-number, trailing text and a value out of range are each named
add_test(NAME cuda_bench_reps_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --reps abc)
set_tests_properties(cuda_bench_reps_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--reps abc: expected 1 to 64 repetitions a measurement")
add_test(NAME cuda_bench_n_gen_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --n-gen 12x)
set_tests_properties(cuda_bench_n_gen_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--n-gen 12x: expected 1 to 32768 tokens generated")
add_test(NAME cuda_bench_batch_check_args COMMAND cuda_bench --arch qwen3-tiny --type bf16 --batch-check 17)
set_tests_properties(cuda_bench_batch_check_args PROPERTIES
  PASS_REGULAR_EXPRESSION "--batch-check 17: expected 1 to 16 sessions")
