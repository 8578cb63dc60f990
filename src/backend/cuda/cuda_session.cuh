/*
 * cuda_session.cuh — what the files of the CUDA session share: the session's struct, the decode
 * program's steps, a run's context, and the functions one file calls in another. Private to
 * them; the backend's interface is cuda_backend.h. The files:
 *   cuda_session.cu     a session's life: probing, weights, state, running ops and plans
 *   device_weights.cu   the weights' device copy, shared by the sessions of one model
 *   session_options.cu  cuda_default_options, the options' checks, the session's picks
 *   decode_program.cu   the fused decode program: steps, their launches, graph capture
 *   session_output.cu   what a run hands back: logits, top-k, the on-GPU generation loops
 *   session_measure.cu  profiles, the block time line, step counts (cuda_bench's questions)
 *   cuda_batch.cu       the server's batched step over several sessions
 *   cuda_microbench.cu  the launch floor and GEMV microbenchmarks (no session)
 */
#ifndef QWENRT_BACKEND_CUDA_SESSION_CUH
#define QWENRT_BACKEND_CUDA_SESSION_CUH

#include "backend/cuda/cuda_internal.cuh"
#include "backend/cuda/lm_screen.cuh"
#include "backend/cuda/cuda_matmul.cuh"
#include "backend/cuda/prefill_merge.h"
#include "backend/cuda/megakernel.cuh"

extern "C" {
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/l2_plan.h"
}

#define BATCH_BRANCHES 16 /* streams the batched step's per-sequence ops run on side by side */

enum step_kind { STEP_OP, STEP_NORM_GEMV, STEP_GEMV_ADD, STEP_ROPE_ATTN, STEP_GDN_GATED,
                 STEP_CONV_GDN_GATED, STEP_MLP, STEP_QKV_ATTN, STEP_ATTN_O };

/* One launch group of the decode program. */
struct step {
    enum step_kind kind;
    int32_t op;          /* first op of the run */
    int32_t n_ops;       /* ops of the plan it covers */
    int32_t mm[GEMV_MAX_SEG]; /* STEP_NORM_GEMV: the matmul/logits ops (n_mm of them) */
    int32_t n_mm;
    bool swiglu;         /* STEP_NORM_GEMV: mm[0] = gate, mm[1] = up, then swiglu
                          * STEP_MLP: the same, then mm[2] = down and the residual add */
    int32_t gate_op;     /* STEP_ROPE_ATTN, STEP_ATTN_O: sigmoid_gate op or -1
                          * (STEP_ATTN_O: a STEP_ROPE_ATTN and the o product + residual after
                          * it, mm[0] = that matmul op) */
    bool early;          /* STEP_ROPE_ATTN, STEP_ATTN_O: attn_args.early; STEP_(CONV_)GDN_GATED: gdn_args.early
                          * (mark_early_reads) */
    bool after_wait;     /* STEP_NORM_GEMV: its kernel starts the next launch only after its own
                          * wait, whatever the session's pick (mark_early_reads) */
    bool ahead;          /* STEP_GEMV_ADD: its kernel starts the next launch before its own wait,
                          * whatever the session's pick (cuda_options.gemv_launch_ahead) */
    bool ahead_cl;       /* the same only in the graphs of the cluster-merged attention (cl_variant 1) */
    bool copy_out;       /* STEP_GEMV_ADD: its results also into cs->mlp_acc (the STEP_MLP after
                          * it, mlp_rows 3, reads the residual from there) */
    int32_t rope_op;     /* STEP_QKV_ATTN (a STEP_NORM_GEMV of q, k, v and the STEP_ROPE_ATTN
                          * after it): the rope op of the second */
    struct l2_range pf;  /* a later step's weights its launch asks into the L2 (plan_l2_prefetch) */
};


struct hostdev {
    const void *host;
    size_t bytes;
    size_t off; /* offset in the arena */
};

struct cuda_session {
    const struct plan *plans; /* [2] */
    struct cuda_options opt;
    int32_t n_ctx, n_layer, n_vocab;
    cudaStream_t stream;
    uint8_t *arena;           /* weights: weights->arena */
    size_t arena_bytes;
    struct cuda_weights *weights; /* the copy that holds them, maybe shared (device_weights.cu) */
    struct hostdev *map;      /* host pointer -> arena offset */
    int32_t n_map, cap_map;
    struct dop *dops[2];      /* [n_ops] per phase */
    /* state */
    float *state;             /* one allocation: KV, conv, ssm */
    size_t state_bytes;
    size_t rec_bytes;         /* the recurrent layers' conv and state rows: the first bytes of state */
    void *snap;               /* cuda_session_snapshot's copy of them (made on first use) */
    bool snap_saved;          /* snap holds a saved state */
    void **kc, **vc;          /* [n_layer] device KV caches in state (f32, or f16 with
                               * opt.kv_f16: kv_elem_bytes), or NULL */
    float **conv, **ssm;      /* [n_layer] device pointers into state, or NULL */
    double *rope_freq;        /* theta^(-2i/n_rot) of the session's RoPE ops (one theta and
                               * n_rot for all: rope_theta / rope_n_rot), or NULL */
    float rope_theta;
    int32_t rope_n_rot;
    float *att_part;          /* decode attention split-K partials [n_head][splits][hd + 2] */
    unsigned *att_count;      /* [n_head] arrival counters of the splits (kept zeroed) */
    int32_t att_splits;       /* splits per head for decode attention (1: none) */
    int64_t att_part_floats;  /* att_part's size */
    int32_t att_heads;        /* att_count's size */
    int32_t kv_width, conv_rows, conv_dim;
    int64_t ssm_len;
    /* activations */
    float *pbufs[PLAN_MAX_BUFS]; /* prefill: [cap_T][width] (logits: [cap_rows][V]), or a view */
    int32_t cap_T, cap_rows;
    struct merge_layout pm;      /* the prefill's merged products and the views of their
                                  * outputs (prefill_merge.h) */
    float *dbufs[PLAN_MAX_BUFS]; /* decode: one token */
    float *bbufs[PLAN_MAX_BUFS]; /* batched decode led by this session: [cap_batch][width] */
    int32_t cap_batch;
    int32_t b_seq_steps;      /* per-sequence steps its last batched step launched for all
                               * sessions at once (cuda_batch_seq_steps) */
    float *b_part;            /* its multi-session attention's partials: [cap_batch] att_part's */
    unsigned *b_count;        /* [cap_batch][att_heads] their arrival counters (kept zeroed) */
    uint8_t *b_qpre;          /* its quantised products' x, quantised once a product
                               * (gemv_args.q_pre, cuda_options.gemvq_batch_pre), or NULL */
    /* the batched step this session leads (batch_step): its members, the graph of their step */
    const struct cuda_session **b_key; /* [cap_batch] the last step's sessions, in order */
    int32_t *b_pos;           /* [cap_batch] the sessions' positions in its batched step (device) */
    int32_t *b_stage;         /* pinned: [cap_batch] ids, then [cap_batch] positions */
    int8_t b_level;           /* its batched attention's splits (enum batch_level, batch_split_floor) */
    bool b_own_pos;           /* its last batched step ran per-session steps (side streams),
                               * which read each session's own d_pos */
    int32_t b_n;                       /* their number, negative when the logits went to the host */
    uint64_t b_gen;                    /* bumped by every change of members */
    cudaGraphExec_t g_batch;           /* the step captured for b_n sessions ... */
    int32_t g_batch_n;
    uint64_t g_batch_gen;              /* ... at this b_gen (another: to be captured again) */
    cudaStream_t b_side[BATCH_BRANCHES]; /* the per-sequence ops' branches (made on first use) */
    cudaEvent_t b_ev[BATCH_BRANCHES + 1]; /* [0] the fork, [1 + b] branch b's join */
    bool b_side_ready;
    /* as a member of a batch: the leader and its b_gen of the last capture that took this
     * session, and its row there (a graph is replayed only if every member still says so) */
    const struct cuda_session *b_leader;
    uint64_t b_leader_gen;
    int32_t b_row;
    int32_t *d_ids;           /* [n_ctx] */
    int32_t *d_pos;           /* position of token 0 of the run */
    int32_t *d_step;          /* greedy loop: steps done */
    int32_t *d_out;           /* greedy loop: ids [n_ctx] */
    int32_t *h_stage;         /* pinned: [0] id, [1] pos, [2] step */
    bool unsynced;            /* a run returned without waiting (h_stage may be in flight) */
    const float *last_row;    /* device: the last position's logits of the latest run */
    bool row_stale;           /* last_row still to be computed: a screened generation loop left it
                               * for the LM head over its last hidden state (session_row_ready,
                               * before any read of it) */
    int32_t *d_mk_top;        /* [2] the megakernel's argmax of the latest single decode step
                               * (id, the logit's bits) */
    bool mk_top_ready;        /* d_mk_top belongs to last_row */
    uint64_t row_gen;         /* bumped whenever last_row's contents or the state change */
    /* a pick started ahead (cuda_session_top_start): its arguments and last_row's row_gen then;
     * its results arrive in h_top (gather ids in h_top's gather block) */
    bool top_pending;
    float top_t;
    int32_t top_m, top_n_gather;
    uint64_t top_gen;
    /* sampling support (made on first use): cuda_session_top's scratch keys, its device and
     * pinned result blocks ([m ids][m vals][gather ids][gather vals], 32-bit words), and a
     * pinned logits row for cuda_session_logits */
    unsigned long long *d_topk;
    int32_t *d_top, *h_top;
    int32_t *h_top_dev;       /* h_top as the device addresses it (cuda_sessions_top_start) */
    cudaEvent_t top_ev;       /* the end of a pick this session launched for a group */
    int32_t topk_keys;        /* keys the top-m kernel's last block holds on this device (topk_prepare) */
    float *h_row;
    struct gemm_ctx gemm;
    bool gemm_ready;
    int32_t n_sm;             /* multiprocessors of the device */
    int32_t smem_per_sm;      /* shared memory per multiprocessor, bytes */
    int32_t cc_major;         /* its compute capability's major number */
    float *mlp_part;          /* STEP_MLP's partial sums [MLPF_MAX_CLUSTERS][hidden] */
    unsigned *mlp_count;      /* STEP_MLP's arrival counter and mlp_rows.cu's flag (kept zeroed) */
    void *mlp_acc;            /* mlp_rows.cu's accumulator [hidden] (8 bytes each; kept zeroed) */
    float *ao_part;           /* STEP_ATTN_O's per-head partial sums [n_head][hidden] */
    unsigned *ao_count;       /* its arrival counters per row slice [16] (kept zeroed) */
    float *scratch;           /* prefill scratch (DeltaNet scan / conv), grown on demand */
    int64_t scratch_cap;      /* bytes */
    /* decode program and graphs */
    struct step *steps;
    int32_t n_steps;
    /* the graphs, per attention variant v (cl_variant: 0 the default split and merge, 1 the
     * cluster-merged splits, cuda_options.attn_cluster) */
    cudaGraphExec_t g_decode[2], g_gen[2];
    cudaGraphExec_t g_gen_k[2]; /* gen_graph_steps (> 1) greedy steps in one graph, or NULL */
    cudaGraphExec_t g_prefill; /* the last prefill's graph (cuda_options.prefill_graph), or NULL */
    int64_t prefill_graphs[3]; /* prefills run: instantiated, updated in place, outside a graph */
    char prefill_why[192];     /* why the last one outside a graph was, or "" */
    cudaGraphExec_t g_samp[2], g_samp_k[2]; /* the same with sample.cu's draw instead of the
                               * argmax (cuda_session_generate_sampled), for samp_t and samp_m */
    float samp_t;             /* the temperature and the candidates (top_k) those graphs rank */
    int32_t samp_m;
    struct cuda_sample_params *d_sp, *h_sp; /* the draws' parameters: device, pinned staging */
    int32_t cl_mode;          /* the attention's cluster merge: 0 never, 1 always, 2 for graph
                               * launches whose positions lie in [cl_from, cl_until) */
    int32_t cl_from, cl_until; /* that window (cuda_options.attn_cluster_from / _until, or
                               * ATTN_CLUSTER_FROM / _UNTIL) */
    int32_t cl_variant;       /* the variant being captured or enqueued (rope_attn_args reads it) */
    int64_t gen_launches;     /* graph launches of cuda_session_generate */
    struct mk_program *mk;    /* the decode megakernel, or NULL (mk_why says why) */
    bool fast_prefill;        /* opt.prefill_bf16 and fast_prefill_applies(prefill plan) */
    bool decode_pdl;          /* the decode steps launch with PDL: opt.pdl, or opt.gemv_smem with
                               * 16-bit layer weights, quantised ones among them or not
                               * (decode_pdl_applies) */
    int32_t x_terms;          /* the fast products' bf16 terms of x (opt.prefill_x_terms) */
    int32_t gs_warps, gs_kb;  /* gemv_smem's block shape: the options', or pick_gemv_smem_shape's */
    int32_t gs_min_blocks;    /* its warps halved below this many blocks (same) */
    int32_t gs_res_min_blocks; /* the same for GEMV + residual launches */
    int32_t gs_pair_min_blocks; /* for the norm + gate|up + SwiGLU launches */
    int32_t gs_multi_min_blocks; /* and for a norm into several matrices (q|k|v, in_proj) */
    bool gs_after_wait;       /* its blocks start the next launch after their wait (same) */
    bool gs_norm_late;        /* its fused norms' 1 / rms after the sums (same) */
    int32_t gq_rows;          /* gemvq rows per warp below the LM head (pick_gemvq_rows) */
    int32_t gq_warps, gq_kb;  /* gemvq's warps per block and KB reserved (pick_gemvq_shape) */
    bool gq_after_wait;       /* gemvq blocks start the next launch after their wait (same) */
    bool gq_int8;             /* gemvq's x in 8 bits (same) */
    struct argmax_scratch am; /* the greedy loop's argmax (opt.argmax_blocks) */
    struct lm_screen *screen; /* the generation loops' screened LM head (opt.lm_screen) over the
                               * weights' shared copy, made by the first call (lm_screen_ready), or NULL */
    bool screen_tried;        /* lm_screen_ready ran (screen NULL: the plain head serves) */
    unsigned long long *tl;   /* while cuda_session_timeline captures: [n_steps][TL_MAX_BLOCKS][TL_SLOTS] stamps */
    char mk_why[160];
};

/* ------------------------------------------------------------------ running ops */

struct run_ctx {
    struct cuda_session *cs;
    const struct plan *p;
    const struct dop *d;
    float **b;       /* buffers of this run */
    int32_t T;
    bool all_logits;
    bool pdl;        /* launch with programmatic dependent launch (decode) */
    cudaStream_t stream; /* where the run's work goes (a batch runs every session's ops on
                          * the first session's stream) */
    int32_t pos0;        /* host copy of the first token's position */
    bool x_reuse;        /* run_plan_ops: the next product reads the same, unchanged input as
                          * the previous one (q, k, v; gate, up) */
    const int32_t *ld;   /* the buffers' row strides (merged products), NULL: their widths */
    const int32_t *merge; /* the prefill's merged products (merge_layout.run), or NULL */
    const struct l2_range *pf; /* run_step: the step's L2 prefetch (run_matmul passes it on), or NULL */
    unsigned long long *stamps; /* the decode timeline: this step's stamps (tl_stamp), or NULL */
    bool ahead;          /* run_step: the step's GEMV starts the next launch before its own wait */
    float *y_copy;       /* run_step: the step's GEMV + residual also stores its results here */
};

static inline int32_t bw(const struct plan *p, int32_t id) { return p->bufs[id].width; }

static inline bool is_mm(const struct plan_op *op)
{
    return op->kind == OP_MATMUL || op->kind == OP_LOGITS;
}

/* The positions where the decode attention splits as the cluster-merged variant does
 * (attn_args.win_from / win_until): every position with cl_mode 1, the window with 2 — in every
 * variant and in the batched step, so a position's sums do not depend on which graph or how many
 * sessions run it. */
static inline void attn_window(const struct cuda_session *cs, struct attn_args &a)
{
    a.win_from = 0, a.win_until = cs->cl_mode == 1 ? INT32_MAX : cs->cl_mode == 2 ? cs->cl_until : 0;
    if (cs->cl_mode == 2)
        a.win_from = cs->cl_from;
}

/* What a captured decode step does after the decode: nothing (the logits stay), the argmax, or
 * sample.cu's draw over topk.cu's candidates; the latter two feed the token to the next step. */
enum gen_mode { GEN_NONE, GEN_ARGMAX, GEN_SAMPLE };

/* cuda_session.cu */

/* Frees bufs; own (NULL: every buffer owns its memory) names the views to leave alone. a: the
 * session's allocation count (cuda_options.allocs, for dev_free). */
void free_bufs(struct cuda_alloc_count *a, float **b, const int32_t *own = NULL);
/* Allocates bufs for T tokens (the logits buffer for rows rows). With own / off / ld (merged
 * products): buffer i is a view at column off[i] of buffer own[i], rows ld[i] floats long. */
qwenrt_status alloc_bufs(struct cuda_alloc_count *a, const struct plan *p, float **b, int32_t T, int32_t rows,
                         struct qwenrt_error *err, const int32_t *own = NULL, const int32_t *off = NULL,
                         const int32_t *ld = NULL);
/* The DeltaNet core's arguments for op i over T tokens (no scratch, no fused norm). */
struct gdn_args gdn_args_of(const struct run_ctx *r, int32_t i, int32_t T);
/* Op i of r's plan, alone. */
qwenrt_status run_op(struct run_ctx *r, int32_t i, struct qwenrt_error *err);
/* The RoPE frequency table for op when it is the session's (same theta and n_rot), else NULL. */
const double *rope_table(const struct cuda_session *cs, const struct plan_op *op);
/* The context of the decode program's steps: one token, the session's decode buffers. */
struct run_ctx decode_ctx(struct cuda_session *cs);
/* The generation loops' screened LM head (opt.lm_screen): made on the first call where it
 * applies, over the 8-bit copy the session's weights hold (weights_screen_copy: made by the
 * first session that asks, shared by the rest) (cs->screen stays NULL where it does not apply,
 * or where the device has no room for the copy or the session's buffers: the plain head
 * serves, so it always returns QWENRT_OK); the graphs of GEN_ARGMAX, and of
 * GEN_SAMPLE with opt.lm_screen 2 for top_k up to lm_screen_best_limit, then pick through it and leave the logits
 * buffer partly written, which enqueue_last_logits fills from the last hidden state when the
 * row is first read (cs->row_stale). */
qwenrt_status lm_screen_ready(struct cuda_session *cs, struct qwenrt_error *err);
/* Whether the graphs of gen (enum gen_mode) pick through the screen; fills a when they do. */
bool lm_screen_takes(const struct cuda_session *cs, int gen, struct lm_screen_args *a);
qwenrt_status enqueue_last_logits(struct cuda_session *cs, struct qwenrt_error *err);
/* last_row ready to read: a screened generation loop leaves it (cs->row_stale) for the plain
 * LM head step over its last hidden state, enqueued here on the first read; most loops never
 * read it (the API's greedy loop calls cuda_session_generate every 16 tokens). INVALID_ARG
 * when nothing has run. */
qwenrt_status session_row_ready(struct cuda_session *cs, struct qwenrt_error *err);
/* Row stride of buffer id in this run (a merged product's outputs share one buffer). */
int32_t ld_of(const struct run_ctx *r, int32_t id);
/* The session's choices of GEMV kernel and shape (options and picks) into a launch's args. */
void gemv_session_args(const struct cuda_session *cs, bool pdl, struct gemv_args *a);
/* y = x · Wᵀ for T tokens through the GEMV (small T) or the GEMM. */
qwenrt_status run_matmul(struct run_ctx *r, const struct dop *d, const float *x, int32_t ldx, float *y,
                         int32_t ldy, int32_t T, bool accumulate, struct qwenrt_error *err);
/* Copies ids and pos0 to the device (stream-ordered). */
qwenrt_status stage_inputs(struct cuda_session *cs, const int32_t *ids, int32_t T, int32_t pos0,
                           struct qwenrt_error *err);

/* decode_program.cu */

/* Tries the decode program's fusions at op i; fills *st and returns true when one applies. */
bool match_step(const struct plan *p, int32_t i, struct step *st);
/* The decode plan as steps (cs->steps), with the SwiGLU + down merges; finish_program adds
 * the fusions that depend on the session's shape picks. */
qwenrt_status build_program(struct cuda_session *cs, struct qwenrt_error *err);
qwenrt_status finish_program(struct cuda_session *cs, struct qwenrt_error *err);
/* A STEP_NORM_GEMV's launch arguments; a STEP_ROPE_ATTN's (its rope op i, its gate op). */
void norm_gemv_args(struct run_ctx *r, const struct step *st, struct gemv_args &a);
void rope_attn_args(struct run_ctx *r, int32_t i, int32_t gate, struct rope_args &ra, struct attn_args &a);
/* The decode attention's options as the default graphs apply them to a: attn_shared_kv,
 * attn_lanes (0: a row per warp), attn_stage (0: no ring). */
bool shared_kv_on(const struct cuda_session *cs, const struct attn_args &a);
int32_t lanes_of(const struct cuda_session *cs, const struct attn_args &a);
int32_t stages_of(const struct cuda_session *cs, const struct attn_args &a);
/* One step of the decode program. */
qwenrt_status run_step(struct run_ctx *r, const struct step *st, struct qwenrt_error *err);
/* Enqueues one decode step (the program, or the plan op by op). */
qwenrt_status enqueue_decode(struct cuda_session *cs, struct qwenrt_error *err);
/* The attention variant for a graph of n decode steps from position pos: 1 (the cluster-merged
 * splits) where cl_mode says so for every one of them, else 0. */
int attn_variant(const struct cuda_session *cs, int32_t pos, int32_t n);
/* enqueue_decode (+ the token's pick, gen: enum gen_mode) steps times, as an executable graph. */
qwenrt_status capture(struct cuda_session *cs, int gen, int32_t steps, cudaGraphExec_t *out,
                      struct qwenrt_error *err);
/* A step's label in the decode profile and the time line. */
const char *step_label(const struct plan *p, const struct step *st);

/* session_options.cu */

/* The options that take a number, checked before any device work. */
qwenrt_status check_options(const struct cuda_options *o, struct qwenrt_error *err);
/* The session's picks where the options leave them open (each function's comment has the
 * measurements): gemv_smem's block shape and minimum grids, gemvq's rows per warp and shape
 * (returns whether gemvq asks for PDL), whether the 16-bit GEMVs want PDL, whether the prefill
 * takes the bf16 products, and in how many bf16 terms of x. */
void pick_gemv_smem_shape(struct cuda_session *cs);
int32_t pick_gemvq_rows(const struct cuda_session *cs);
bool pick_gemvq_shape(struct cuda_session *cs);
bool decode_pdl_applies(const struct plan *p);
bool fast_prefill_applies(const struct plan *p);
int32_t fast_x_terms(const struct cuda_options *o, const struct plan *p);

/* device_weights.cu */

/* Points cs->arena at the weights of cs->map (laid out by collect): the copy in *slot where it
 * fits this device and layout, else a new one uploaded here (after checking the device has
 * room for it), left in *slot when that is empty. mu and slot NULL: a copy of cs's own.
 * Sets cs->weights; nothing is held on error. */
qwenrt_status weights_acquire(struct cuda_session *cs, pthread_mutex_t *mu, struct cuda_weights **slot,
                              struct qwenrt_error *err);
/* Drops a session's hold on w; the last one frees the copy and empties its slot. NULL: nothing. */
void weights_release(struct cuda_weights *w);
/* The LM head's 8-bit copy of the rows at rows (in w's arena) for the screen: made on stream s
 * by the first session of w that asks (lm_screen_copy_build), then shared; NULL where it cannot be
 * made (a bound that is not finite, or no room: tried once for w) or for other rows. */
const struct lm_screen_copy *weights_screen_copy(struct cuda_weights *w, const void *rows, int32_t dtype, int32_t N,
                                                 int32_t K, int64_t row_bytes, cudaStream_t s);

/* cuda_batch.cu */

/* Frees the batched step's buffers, graph and streams of the session that led it. */
void batch_free(struct cuda_session *cs);

#endif
