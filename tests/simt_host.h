/*
 * simt_host.h — one CUDA thread block run on the host, for tests of kernels written against a
 * lanes object (src/backend/cuda/gdn_chunk_tc.cuh) on a machine without a GPU (CI).
 *
 * Each of the block's threads is a coroutine (ucontext) that runs until it reaches a block
 * barrier (sync), a warp-wide mma or its end. A scheduler resumes the runnable threads in a
 * shuffled order (a fixed seed), does a warp's mma once all 32 lanes have brought their
 * fragments, and releases a barrier once every thread waits at it; threads that can never go on
 * (a warp split between an mma and a barrier, a barrier some threads skip) fail the run with a
 * message instead of hanging.
 *
 * What it checks for a kernel that the GPU would also catch: indexing, fragment layouts (as the
 * PTX ISA documents mma.m16n8k8 for .tf32), the 3xTF32 split's accuracy, barriers missing
 * between a write and another thread's read of shared memory (the shuffled order makes that read
 * see the wrong phase), and reads of shared memory no one wrote (it starts as NaN). cp.async
 * copies land either at once or only at the wait (copy_at_wait): the first catches a copy that
 * overwrites a buffer another thread still reads, the second a read before the wait.
 * What it does not: timing, bank conflicts, the hardware's own rounding of the mma sums (done
 * here in double), and anything about how the GPU actually schedules warps.
 */
#ifndef QWENRT_TESTS_SIMT_HOST_H
#define QWENRT_TESTS_SIMT_HOST_H

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <ucontext.h>

#include <algorithm>
#include <functional>
#include <random>
#include <string>
#include <vector>

class simt_block;

/* The lanes object a kernel body receives: gdn_chunk_tc.cuh's L. */
struct simt_lanes {
    simt_block *b;
    int t;
    int tid() const { return t; }
    void sync();
    void copy16(float *dst, const float *src);
    void copy4(float *dst, const float *src);
    void commit() {}
    void wait_all();
    void mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&bf)[2]);
};

class simt_block {
  public:
    simt_block(int threads, bool copy_at_wait, unsigned seed)
        : n_(threads), copy_at_wait_(copy_at_wait), rng_(seed), ctx_(threads), stacks_(threads),
          state_(threads), slot_(threads), pending_(threads), lanes_(threads)
    {
        for (int t = 0; t < n_; t++)
            stacks_[t].resize(kStack), lanes_[t] = simt_lanes{this, t};
    }

    /* Runs body(lanes) on every thread; returns "" or what went wrong. */
    std::string run(const std::function<void(simt_lanes &)> &body)
    {
        body_ = &body;
        for (int t = 0; t < n_; t++) {
            getcontext(&ctx_[t]);
            ctx_[t].uc_stack.ss_sp = stacks_[t].data();
            ctx_[t].uc_stack.ss_size = kStack;
            ctx_[t].uc_link = &sched_;
            uintptr_t p = (uintptr_t)&lanes_[t];
            makecontext(&ctx_[t], (void (*)())entry, 2, (int)(uint32_t)(p >> 32), (int)(uint32_t)p);
            state_[t] = RUNNABLE;
            pending_[t].clear();
        }
        std::vector<int> order(n_);
        for (int t = 0; t < n_; t++)
            order[t] = t;
        for (;;) {
            std::shuffle(order.begin(), order.end(), rng_);
            for (int t : order)
                if (state_[t] == RUNNABLE)
                    swapcontext(&sched_, &ctx_[t]);
            if (release_warps())
                continue;
            int done = 0, at_sync = 0;
            for (int t = 0; t < n_; t++)
                done += state_[t] == DONE, at_sync += state_[t] == AT_SYNC;
            if (done == n_)
                return "";
            if (at_sync == n_) {
                for (int t = 0; t < n_; t++)
                    state_[t] = RUNNABLE;
                continue;
            }
            char msg[160];
            snprintf(msg, sizeof(msg), "stuck: %d threads at a barrier, %d at an mma, %d finished of %d", at_sync,
                     n_ - at_sync - done, done, n_);
            return msg;
        }
    }

  private:
    friend struct simt_lanes;
    enum state { RUNNABLE, AT_SYNC, AT_MMA, DONE };
    struct mma_slot {
        float d[4];
        uint32_t a[4], b[2];
    };
    struct copy {
        float *dst;
        const float *src;
        int bytes;
    };
    static constexpr size_t kStack = 64 * 1024;

    static void entry(int hi, int lo)
    {
        simt_lanes *l = (simt_lanes *)(((uintptr_t)(uint32_t)hi << 32) | (uintptr_t)(uint32_t)lo);
        (*l->b->body_)(*l);
        l->b->flush(l->t);
        l->b->state_[l->t] = DONE; /* uc_link returns to the scheduler */
    }

    void yield(int t, state s)
    {
        state_[t] = s;
        swapcontext(&ctx_[t], &sched_);
    }

    void add_copy(int t, float *dst, const float *src, int bytes)
    {
        if (copy_at_wait_)
            pending_[t].push_back(copy{dst, src, bytes});
        else
            memcpy(dst, src, bytes);
    }

    void flush(int t)
    {
        for (const copy &c : pending_[t])
            memcpy(c.dst, c.src, c.bytes);
        pending_[t].clear();
    }

    static double tf32_value(uint32_t u) /* the tensor cores read a .tf32 operand's top 19 bits */
    {
        u &= 0xffffe000u;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }

    /* Every warp whose 32 lanes wait at an mma: D = C + A B on the fragment layout. */
    bool release_warps()
    {
        bool any = false;
        for (int w = 0; w * 32 < n_; w++) {
            int at = 0;
            for (int l = 0; l < 32; l++)
                at += state_[32 * w + l] == AT_MMA;
            if (at != 32)
                continue;
            double A[16][8], B[8][8], D[16][8];
            for (int l = 0; l < 32; l++) {
                const mma_slot &s = slot_[32 * w + l];
                int g = l >> 2, t = l & 3;
                A[g][t] = tf32_value(s.a[0]), A[g + 8][t] = tf32_value(s.a[1]);
                A[g][t + 4] = tf32_value(s.a[2]), A[g + 8][t + 4] = tf32_value(s.a[3]);
                B[t][g] = tf32_value(s.b[0]), B[t + 4][g] = tf32_value(s.b[1]);
                D[g][2 * t] = s.d[0], D[g][2 * t + 1] = s.d[1];
                D[g + 8][2 * t] = s.d[2], D[g + 8][2 * t + 1] = s.d[3];
            }
            for (int i = 0; i < 16; i++)
                for (int c = 0; c < 8; c++)
                    for (int k = 0; k < 8; k++)
                        D[i][c] += A[i][k] * B[k][c];
            for (int l = 0; l < 32; l++) {
                mma_slot &s = slot_[32 * w + l];
                int g = l >> 2, t = l & 3;
                s.d[0] = (float)D[g][2 * t], s.d[1] = (float)D[g][2 * t + 1];
                s.d[2] = (float)D[g + 8][2 * t], s.d[3] = (float)D[g + 8][2 * t + 1];
                state_[32 * w + l] = RUNNABLE;
            }
            any = true;
        }
        return any;
    }

    int n_;
    bool copy_at_wait_;
    std::mt19937 rng_;
    ucontext_t sched_;
    std::vector<ucontext_t> ctx_;
    std::vector<std::vector<char>> stacks_;
    std::vector<state> state_;
    std::vector<mma_slot> slot_;
    std::vector<std::vector<copy>> pending_;
    std::vector<simt_lanes> lanes_;
    const std::function<void(simt_lanes &)> *body_ = nullptr;
};

inline void simt_lanes::sync() { b->yield(t, simt_block::AT_SYNC); }
inline void simt_lanes::copy16(float *dst, const float *src) { b->add_copy(t, dst, src, 16); }
inline void simt_lanes::copy4(float *dst, const float *src) { b->add_copy(t, dst, src, 4); }
inline void simt_lanes::wait_all() { b->flush(t); }
inline void simt_lanes::mma(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&bf)[2])
{
    simt_block::mma_slot &s = b->slot_[t];
    memcpy(s.d, d, sizeof(s.d)), memcpy(s.a, a, sizeof(s.a)), memcpy(s.b, bf, sizeof(s.b));
    b->yield(t, simt_block::AT_MMA);
    memcpy(d, s.d, sizeof(s.d));
}

#endif
