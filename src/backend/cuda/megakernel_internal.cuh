/*
 * megakernel_internal.cuh — what megakernel.cu (the persistent kernel, its launch and profile)
 * and megakernel_build.cu (the program built on the host) share: the ring's constants, the
 * phase and GEMV-table structs, the program, and the launch helpers the builder calls.
 * Private to those two files; the session's interface is megakernel.cuh.
 * The MK_* constants below that take -D overrides (bench/cuda_variant.sh) must reach both files:
 * pass both sources to the script ("megakernel.cu megakernel_build.cu").
 */
#ifndef QWENRT_BACKEND_CUDA_MEGAKERNEL_INTERNAL_CUH
#define QWENRT_BACKEND_CUDA_MEGAKERNEL_INTERNAL_CUH

#include "backend/cuda/megakernel.cuh"

#define MK_MAX_SEG 4
#define MK_U 4           /* 16-byte loads per lane issued before the first use (float rows) */
/* ring shape; -D overrides for bench/cuda_variant.sh */
#ifndef MK_STAGES
#define MK_STAGES 3      /* weight ring stages per block (3 x 64 KB: docs/perf-log.md, session 5) */
#endif
#ifndef MK_STAGE_MAX
#define MK_STAGE_MAX (64 << 10)
#endif
#ifndef MK_STAGE_MIN
#define MK_STAGE_MIN (24 << 10)
#endif
#define MK_XPT 8 /* x values per thread staged with one batch of loads */
#define MK_ATTN_SPLITS 32 /* attention / DeltaNet blocks per head at most */
#ifndef MK_ATT_U
#define MK_ATT_U 8 /* K/V positions whose loads a warp issues together in the attention phase (perf-log, session 10) */
#endif
#define MK_GDN_R 16 /* DeltaNet state rows a thread keeps in registers */
#define MK_PROF_SLOTS 5 /* per phase: x staging, ring waits, barrier, refills, GEMV rows */

enum mk_kind { MK_EMBED, MK_RMSNORM, MK_GEMV, MK_ATTN, MK_GDN_CONV, MK_GDN_CORE, MK_ADD, MK_SWIGLU };

struct mk_seg {
    const uint8_t *w;
    int64_t row_bytes;
    float *y;
    int32_t N, dtype;
};

/* One phase; each kind uses the fields it needs. */
struct mk_phase {
    int32_t kind;
    float *out;
    const float *in, *in2, *in3;
    const float *vec, *vec2, *vec3;
    int32_t width, K, group;
    float eps;
    /* GEMV */
    int32_t mode, n_seg, argmax, gidx; /* gidx: ordinal among the GEMV phases */
    struct mk_seg seg[MK_MAX_SEG];
    /* embed */
    const uint8_t *w;
    int64_t row_bytes;
    int32_t dtype;
    /* attention */
    float *kc, *vc;
    const double *inv_freq; /* [n_rot / 2] RoPE frequencies (device, the program's table) */
    int32_t n_head, n_head_kv, hd, q_stride, n_rot, kvw, gate;
    float theta;
    /* DeltaNet */
    float *state;
    const float *z, *gnorm_w;
    int32_t Hk, Hv, dk, dv, conv_k, tiled, gated;
    float geps;
    /* GEMV_SWIGLU with the down product fused (mk_down): the block's rows of h times the same
     * rows of the transposed down matrix (dseg: N = rows of h, a row = the down outputs), one
     * reduction per output into dseg.y (the residual) */
    int32_t has_down, down_g; /* down_g: the transposed matrix's GEMV table entry */
    struct mk_seg dseg;
};

struct mk_sync {
    unsigned long long count;  /* barrier arrivals since the buffer was zeroed */
    unsigned long long key[2]; /* argmax of the LM head, one per token parity */
};

struct mk_gdesc;

struct mk_params {
    const struct mk_phase *ph;
    int32_t n_ph;
    const struct mk_gdesc *gt; /* [n_g] the GEMVs in execution order */
    float *part;           /* attention partials [heads][MK_ATTN_SPLITS][hd + 2] */
    unsigned *cnt;         /* per-head arrival counters (zero between phases) */
    int32_t n_g;
    int32_t max_chunks;    /* schedule entries per block at most (shared memory reserved) */
    const struct mk_chunk *sched;  /* [nb][max_chunks] each block's schedule (mk_schedule_kernel) */
    const int32_t *gfirst;         /* [nb][n_g + 1] */
    int32_t stage_bytes;   /* bytes per ring stage (multiple of 128) */
    int32_t ph_in_smem;    /* the phases are copied to shared memory at start */
    int32_t scratch_floats; /* xs / attention / DeltaNet scratch after the ring */
    struct mk_sync *sync;
    int32_t *ids, *pos, *out_ids, *step;
    int32_t n_tok, gen;
    unsigned long long *times; /* profiling, or NULL: [1 + n_ph] globaltimer stamps after each
                                * barrier of token 0, then [n_ph][4] ns of block 0 in x staging,
                                * in ring waits, in the barrier and refilling, then [n_ph][nb]
                                * each block's arrival at the barrier */
};

struct mk_program {
    int32_t *kinds;           /* [n_ph] host copy of each phase's kind (profiles) */
    struct mk_phase *d_ph;
    struct mk_gdesc *d_gt;
    struct mk_chunk *d_sched; /* [nb][max_chunks] every block's chunk schedule, made once */
    int32_t *d_gfirst;        /* [nb][n_g + 1] */
    struct mk_sync *d_sync;
    float *d_part;
    unsigned *d_cnt;
    double *d_freq;
    void *d_wt;               /* the transposed down matrices of the fused phases (mk_down) */
    struct cuda_alloc_count *allocs; /* the session's allocation count (dev_malloc), or NULL */
    int32_t n_ph, n_g, nb, threads, stage_bytes, scratch_floats, ph_in_smem, max_chunks;
    size_t smem;
};

/* The GEMVs' weights as the ring streams them (megakernel.cu, "the weight ring"). */
struct mk_gdesc {
    const uint8_t *w[MK_MAX_SEG]; /* SwiGLU: w[0] gate, w[1] up, one "segment" of paired rows */
    int32_t N[MK_MAX_SEG], row_bytes[MK_MAX_SEG];
    int32_t rpc;                  /* rows per chunk */
    int32_t nseg, swiglu;
};

/* One chunk of a block's schedule: rows [r0, r0 + n) of segment seg of GEMV g. */
struct mk_chunk {
    int32_t r0, n;
    int16_t g, seg;
};

/* Launch helpers (megakernel.cu) for mk_build: the grid and shared memory checked for the
 * program's block size; every block's chunk schedule made on the device; one 16-bit matrix
 * transposed (dst [cols][rows] = src [rows][cols]). */
qwenrt_status mk_configure(struct mk_program *mk, int32_t n_sm, struct qwenrt_error *err);
qwenrt_status mk_make_schedules(struct mk_program *mk, struct qwenrt_error *err);
qwenrt_status mk_transpose16(void *dst, const void *src, int32_t rows, int32_t cols, struct qwenrt_error *err);

#endif
