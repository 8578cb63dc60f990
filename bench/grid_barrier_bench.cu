/*
 * grid_barrier_bench.cu — what one grid-wide barrier costs in a persistent kernel (one block
 * per multiprocessor, cooperative launch), for the barrier forms the decode megakernel could
 * use. Each round every block writes one value (so the release has something to publish),
 * meets the others at the barrier, then reads another block's value (the acquire must make
 * it visible; a wrong value counts as an error). Prints microseconds per barrier.
 *
 *   nvcc -O3 -arch=sm_90a -o grid_barrier_bench bench/grid_barrier_bench.cu
 *   ./grid_barrier_bench [rounds]
 */
#include <cooperative_groups.h>
#include <stdio.h>
#include <stdlib.h>

struct bar_state {
    unsigned long long count; /* arrivals, monotonic */
    unsigned long long pad[15];
    unsigned long long epoch; /* form 2: published by the last arrival */
    unsigned long long pad2[15];
};

__device__ __forceinline__ unsigned long long ld_acquire(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.acquire.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long *p)
{
    unsigned long long v;
    asm volatile("ld.relaxed.gpu.global.u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory");
    return v;
}

/* form 0: thread 0 adds with release, polls with acquire loads (the megakernel's) */
__device__ void bar0(bar_state *s, unsigned long long *target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        *target += gridDim.x;
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&s->count) : "memory");
        while (ld_acquire(&s->count) < *target) {
        }
    }
    __syncthreads();
}

/* form 1: polls with relaxed loads, one acquire fence after */
__device__ void bar1(bar_state *s, unsigned long long *target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        *target += gridDim.x;
        asm volatile("red.release.gpu.global.add.u64 [%0], 1;" ::"l"(&s->count) : "memory");
        while (ld_relaxed(&s->count) < *target) {
        }
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    __syncthreads();
}

/* form 2: atom.add (acq_rel) returns the old count; the last arrival publishes the epoch,
 * the others poll it with relaxed loads (a different line from the arrivals) */
__device__ void bar2(bar_state *s, unsigned long long *target)
{
    __syncthreads();
    if (threadIdx.x == 0) {
        *target += gridDim.x;
        unsigned long long old;
        asm volatile("atom.acq_rel.gpu.global.add.u64 %0, [%1], 1;" : "=l"(old) : "l"(&s->count) : "memory");
        if (old + 1 == *target) {
            asm volatile("st.release.gpu.global.u64 [%0], %1;" ::"l"(&s->epoch), "l"(*target) : "memory");
        } else {
            while (ld_relaxed(&s->epoch) < *target) {
            }
            asm volatile("fence.acq_rel.gpu;" ::: "memory");
        }
    }
    __syncthreads();
}

/* form 3: cooperative groups */
__device__ void bar3(bar_state *, unsigned long long *)
{
    cooperative_groups::this_grid().sync();
}

template <int FORM>
__global__ void bench_kernel(bar_state *s, unsigned *vals, int rounds, unsigned *errors)
{
    unsigned long long target = 0;
    if (threadIdx.x == 0)
        target = ld_acquire(&s->count) / gridDim.x * gridDim.x;
    unsigned nb = gridDim.x, peer = (blockIdx.x + 1) % nb;
    for (int r = 0; r < rounds; r++) {
        if (threadIdx.x == 0)
            vals[blockIdx.x * 32] = (unsigned)r * 7u + blockIdx.x;
        if (FORM == 0) bar0(s, &target);
        if (FORM == 1) bar1(s, &target);
        if (FORM == 2) bar2(s, &target);
        if (FORM == 3) bar3(s, &target);
        if (threadIdx.x == 0 && __ldcg(&vals[peer * 32]) != (unsigned)r * 7u + peer)
            atomicAdd(errors, 1u);
        if (FORM == 0) bar0(s, &target); /* nobody writes before everybody has read */
        if (FORM == 1) bar1(s, &target);
        if (FORM == 2) bar2(s, &target);
        if (FORM == 3) bar3(s, &target);
    }
}

template <int FORM>
static void run(const char *name, int nb, int nt, int rounds)
{
    bar_state *s;
    unsigned *vals, *errors;
    cudaMalloc(&s, sizeof(*s));
    cudaMemset(s, 0, sizeof(*s));
    cudaMalloc(&vals, (size_t)nb * 32 * sizeof(unsigned));
    cudaMalloc(&errors, sizeof(unsigned));
    cudaMemset(errors, 0, sizeof(unsigned));
    void *args[] = {&s, &vals, &rounds, &errors};
    cudaEvent_t a, b;
    cudaEventCreate(&a);
    cudaEventCreate(&b);
    float best = 1e30f;
    for (int rep = 0; rep < 5; rep++) {
        cudaEventRecord(a);
        cudaError_t e = cudaLaunchCooperativeKernel((const void *)bench_kernel<FORM>, dim3(nb), dim3(nt), args, 0, 0);
        cudaEventRecord(b);
        cudaEventSynchronize(b);
        if (e != cudaSuccess) {
            printf("%s: launch failed: %s\n", name, cudaGetErrorString(e));
            return;
        }
        float ms = 0;
        cudaEventElapsedTime(&ms, a, b);
        best = ms < best ? ms : best;
    }
    unsigned h_err = 0;
    cudaMemcpy(&h_err, errors, sizeof(h_err), cudaMemcpyDeviceToHost);
    printf("| %-44s | %4d x %4d | %8.3f us | %u |\n", name, nb, nt, best * 1e3 / (2.0 * rounds), h_err);
    cudaFree(s);
    cudaFree(vals);
    cudaFree(errors);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 2000, nsm = 0;
    cudaDeviceGetAttribute(&nsm, cudaDevAttrMultiProcessorCount, 0);
    printf("| barrier form | blocks x threads | per barrier | errors |\n|---|---|---:|---:|\n");
    for (int nt = 256; nt <= 512; nt += 256) {
        run<0>("0: red.release + ld.acquire polling", nsm, nt, rounds);
        run<1>("1: red.release + relaxed polling + fence", nsm, nt, rounds);
        run<2>("2: atom.acq_rel, last publishes epoch", nsm, nt, rounds);
        run<3>("3: cooperative_groups grid.sync", nsm, nt, rounds);
    }
    return 0;
}
