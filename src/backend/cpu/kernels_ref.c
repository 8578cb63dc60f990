/*
 * kernels_ref.c — the reference CPU kernels of every plan op: plain loops, f32 accumulation,
 * obviously right. Read top to bottom, they are the model maths of
 * ../shared/docs/qwen-architecture.md §2. Faster variants are checked against these.
 * Loops over independent tokens/heads are split across OpenMP threads; the maths per element
 * stays the plain formula.
 */
#include <math.h>
#include <omp.h>
#include <string.h>

#include "backend/cpu/cpu_backend.h"
#include "backend/cpu/matmul.h"
#include "quant/quant.h"

#define BUF(ex, id) ((ex)->bufs[(id)])
#define WIDTH(ex, id) ((ex)->plan->bufs[(id)].width)

static inline float silu(float x) { return x / (1.0f + expf(-x)); }
static inline float sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
static inline float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* out[t] = E[ids[t]]   E: [n_vocab][n_embd] any dtype */
void embed_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    int32_t w = WIDTH(ex, op->out);
    size_t row_bytes = op->w->nbytes / (size_t)op->w->ne[1];
    for (int32_t t = 0; t < ex->T; t++)
        quant_dequantize_row(op->w->dtype, (const uint8_t *)op->w->data + (size_t)ex->ids[t] * row_bytes,
                             BUF(ex, op->out) + (size_t)t * w, w);
}

/* y = x / sqrt(mean(x²) + eps) ⊙ w, over groups of `group` elements (w has `group` entries) */
static void rmsnorm_row(float *y, const float *x, const float *w, int32_t n, float eps)
{
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float scale = 1.0f / sqrtf(ss / (float)n + eps);
    for (int32_t i = 0; i < n; i++)
        y[i] = x[i] * scale * w[i];
}

void rmsnorm_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    int32_t win = WIDTH(ex, op->in), wout = WIDTH(ex, op->out);
    int32_t groups = win / op->group;
#pragma omp parallel for num_threads(ex->n_threads) if (ex->T > 1)
    for (int32_t t = 0; t < ex->T; t++)
        for (int32_t g = 0; g < groups; g++)
            rmsnorm_row(BUF(ex, op->out) + (size_t)t * wout + g * op->group,
                        BUF(ex, op->in) + (size_t)t * win + g * op->group, op->vec, op->group, op->eps);
}

/* out = in · Wᵀ through the best matmul variant for W's dtype (or the one the op names). */
void matmul_op(const struct plan_op *op, struct cpu_exec *ex)
{
    const struct cpu_matmul_variant *v = cpu_matmul_pick(op->w->dtype, ex->cpu_features, NULL);
    if (op->kernel && strncmp(op->kernel, "matmul.", 7) == 0) {
        const struct cpu_matmul_variant *forced = cpu_matmul_pick(op->w->dtype, ex->cpu_features, op->kernel);
        if (forced)
            v = forced;
    }
    struct cpu_matmul_args a = {
        .y = BUF(ex, op->out), .x = BUF(ex, op->in), .w = op->w->data, .wtype = op->w->dtype,
        .T = ex->T, .K = op->w->ne[0], .N = op->w->ne[1], .ldx = WIDTH(ex, op->in),
        .ldy = WIDTH(ex, op->out), .w_row_bytes = op->w->nbytes / (size_t)op->w->ne[1],
        .n_threads = ex->n_threads,
    };
    v->fn(&a);
}

/* out += in */
void add_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    size_t n = (size_t)ex->T * (size_t)WIDTH(ex, op->out);
    float *y = BUF(ex, op->out);
    const float *x = BUF(ex, op->in);
    for (size_t i = 0; i < n; i++)
        y[i] += x[i];
}

/* RoPE angles of one position: cos/sin of pos · theta^(-2i/n_rot) for i < n_rot/2. */
static void rope_angles(float *c, float *s, int32_t n_rot, int32_t pos, float theta)
{
    for (int32_t i = 0; i < n_rot / 2; i++) {
        double ang = (double)pos * pow((double)theta, -2.0 * (double)i / (double)n_rot);
        c[i] = (float)cos(ang);
        s[i] = (float)sin(ang);
    }
}

/* Rotate-half (NEOX) RoPE on the first n_rot dims: pairs (i, i + n_rot/2). Dims past n_rot
 * pass through. */
static void rope_head(float *x, int32_t n_rot, const float *c, const float *s)
{
    int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        float a = x[i], b = x[i + half];
        x[i] = a * c[i] - b * s[i];
        x[i + half] = b * c[i] + a * s[i];
    }
}

/* q (out, heads q_stride apart) and k (in) in place: per-head RMSNorm, then RoPE. */
void qk_norm_rope_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    int32_t hd = op->head_dim, wq = WIDTH(ex, op->out), wk = WIDTH(ex, op->in);
#pragma omp parallel for num_threads(ex->n_threads) if (ex->T > 1)
    for (int32_t t = 0; t < ex->T; t++) {
        float c[512], s[512]; /* n_rot/2 <= head_dim/2 <= 512 (hparams_validate) */
        rope_angles(c, s, op->n_rot, ex->pos0 + t, op->rope_theta);
        for (int32_t h = 0; h < op->n_head; h++) {
            float *q = BUF(ex, op->out) + (size_t)t * wq + (size_t)h * op->q_stride;
            rmsnorm_row(q, q, op->vec, hd, op->eps);
            rope_head(q, op->n_rot, c, s);
        }
        for (int32_t h = 0; h < op->n_head_kv; h++) {
            float *k = BUF(ex, op->in) + (size_t)t * wk + (size_t)h * hd;
            rmsnorm_row(k, k, op->vec2, hd, op->eps);
            rope_head(k, op->n_rot, c, s);
        }
    }
}

/* Attention: out = attn output [T][n_head*hd], in = q (heads q_stride apart), in2 = k, in3 = v.
 * Appends k, v to the layer's cache at pos0.., then for each token t and query head h:
 * softmax(q·Kᵀ/sqrt(hd)) over positions 0..pos0+t of kv head h / (n_head/n_head_kv), times V.
 * An f16 cache (kv_f16) is read one head row at a time through kv_load. */
void attention_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    struct seq_state *s = ex->state;
    int32_t hd = op->head_dim, kvw = s->kv_width, group = op->n_head / op->n_head_kv, l = op->layer;
    for (int32_t t = 0; t < ex->T; t++) {
        kv_store_row(s, l, false, ex->pos0 + t, BUF(ex, op->in2) + (size_t)t * WIDTH(ex, op->in2));
        kv_store_row(s, l, true, ex->pos0 + t, BUF(ex, op->in3) + (size_t)t * WIDTH(ex, op->in3));
    }
    float scale = 1.0f / sqrtf((float)hd);
    int32_t n_pos = ex->pos0 + ex->T, wq = WIDTH(ex, op->in), wo = WIDTH(ex, op->out);
#pragma omp parallel num_threads(ex->n_threads)
    {
        float *scores = ex->scratch + (size_t)n_pos * (size_t)omp_get_thread_num();
#pragma omp for collapse(2) schedule(dynamic, 1)
        for (int32_t t = 0; t < ex->T; t++) {
            for (int32_t h = 0; h < op->n_head; h++) {
                const float *q = BUF(ex, op->in) + (size_t)t * wq + (size_t)h * op->q_stride;
                float *o = BUF(ex, op->out) + (size_t)t * wo + (size_t)h * hd;
                int32_t kvh = h / group, last = ex->pos0 + t;
                float mx = -INFINITY, sum = 0.0f, row[QR_KV_ROW_MAX];
                for (int32_t p = 0; p <= last; p++) {
                    const float *k = row;
                    if (s->kv_f16)
                        kv_load(s, l, false, p, kvh * hd, hd, row);
                    else
                        k = s->k_cache[l] + (size_t)p * kvw + (size_t)kvh * hd;
                    float dot = 0.0f;
                    for (int32_t d = 0; d < hd; d++)
                        dot += q[d] * k[d];
                    scores[p] = dot * scale;
                    mx = scores[p] > mx ? scores[p] : mx;
                }
                for (int32_t p = 0; p <= last; p++) {
                    scores[p] = expf(scores[p] - mx);
                    sum += scores[p];
                }
                memset(o, 0, (size_t)hd * sizeof(float));
                for (int32_t p = 0; p <= last; p++) {
                    const float *v = row;
                    if (s->kv_f16)
                        kv_load(s, l, true, p, kvh * hd, hd, row);
                    else
                        v = s->v_cache[l] + (size_t)p * kvw + (size_t)kvh * hd;
                    float w = scores[p] / sum;
                    for (int32_t d = 0; d < hd; d++)
                        o[d] += w * v[d];
                }
            }
        }
    }
}

/* out[h][d] *= sigmoid(gate), gate = in[h*q_stride + head_dim + d] (Qwen3.5 q_proj layout). */
void sigmoid_gate_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    int32_t hd = op->head_dim, wo = WIDTH(ex, op->out), wg = WIDTH(ex, op->in);
    for (int32_t t = 0; t < ex->T; t++)
        for (int32_t h = 0; h < op->n_head; h++) {
            float *o = BUF(ex, op->out) + (size_t)t * wo + (size_t)h * hd;
            const float *g = BUF(ex, op->in) + (size_t)t * wg + (size_t)h * op->q_stride + hd;
            for (int32_t d = 0; d < hd; d++)
                o[d] *= sigmoid(g[d]);
        }
}

/* out = silu(out) ⊙ in */
void swiglu_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    size_t n = (size_t)ex->T * (size_t)WIDTH(ex, op->out);
    float *g = BUF(ex, op->out);
    const float *u = BUF(ex, op->in);
    for (size_t i = 0; i < n; i++)
        g[i] = silu(g[i]) * u[i];
}

/* Causal depthwise conv over the conv_dim channels of out (in place), kernel conv_k, taps
 * vec[ch][j] with tap conv_k-1 on the current token; the layer's conv state holds the previous
 * conv_k-1 inputs (zeros at the start). Then SiLU. */
void gdn_conv_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    struct seq_state *s = ex->state;
    int32_t C = s->conv_dim, K = op->conv_k, R = K - 1, w = WIDTH(ex, op->out);
    float *win = ex->scratch; /* [(R + T)][C]: state rows then this run's inputs */
    float *state = s->conv_state[op->layer];
    memcpy(win, state, (size_t)R * C * sizeof(float));
    for (int32_t t = 0; t < ex->T; t++)
        memcpy(win + (size_t)(R + t) * C, BUF(ex, op->out) + (size_t)t * w, (size_t)C * sizeof(float));
#pragma omp parallel for num_threads(ex->n_threads) if (ex->T > 1)
    for (int32_t t = 0; t < ex->T; t++)
        for (int32_t ch = 0; ch < C; ch++) {
            float acc = 0.0f;
            for (int32_t j = 0; j < K; j++)
                acc += op->vec[(size_t)ch * K + j] * win[(size_t)(t + j) * C + ch];
            BUF(ex, op->out)[(size_t)t * w + ch] = silu(acc);
        }
    memcpy(state, win + (size_t)ex->T * C, (size_t)R * C * sizeof(float));
}

static void l2norm(float *x, int32_t n)
{
    float ss = 0.0f;
    for (int32_t i = 0; i < n; i++)
        ss += x[i] * x[i];
    float r = 1.0f / sqrtf(ss + 1e-6f);
    for (int32_t i = 0; i < n; i++)
        x[i] *= r;
}

/* One token of one value head: decay, read, delta update, readout with the new state.
 * S: [dk][dv]; q, k: [dk] (normalised, q scaled); v: [dv]. */
static void delta_step(float *S, float *o, const float *q, const float *k, const float *v,
                       float beta, float decay, int32_t dk, int32_t dv)
{
    for (int32_t i = 0; i < dk * dv; i++)
        S[i] *= decay;
    for (int32_t c = 0; c < dv; c++) {
        float m = 0.0f;
        for (int32_t r = 0; r < dk; r++)
            m += S[r * dv + c] * k[r];
        float delta = beta * (v[c] - m);
        float acc = 0.0f;
        for (int32_t r = 0; r < dk; r++) {
            S[r * dv + c] += k[r] * delta;
            acc += S[r * dv + c] * q[r];
        }
        o[c] = acc;
    }
}

/* Gated DeltaNet core, token by token (the recurrent form).
 * in = conv output [T][q(Hk*dk) | k(Hk*dk) | v(Hv*dv)], in2 = b [T][Hv], in3 = a [T][Hv],
 * out = o [T][Hv*dv]; vec2 = dt_bias [Hv], vec3 = ssm_a = -exp(A_log) [Hv].
 * beta = sigmoid(b), g = ssm_a * softplus(a + dt_bias), decay = exp(g). */
void gdn_core_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    int32_t Hk = op->n_k_heads, Hv = op->n_v_heads, dk = op->k_dim, dv = op->v_dim;
    int32_t r = Hv / Hk, wi = WIDTH(ex, op->in), wo = WIDTH(ex, op->out);
    float *S0 = ex->state->ssm_state[op->layer];
    float qscale = 1.0f / sqrtf((float)dk);
#pragma omp parallel for num_threads(ex->n_threads)
    for (int32_t j = 0; j < Hv; j++) {
        int32_t kh = op->v_head_tiled ? j % Hk : j / r;
        float q[1024], k[1024]; /* dk <= 1024 (hparams_validate) */
        float *S = S0 + (size_t)j * dk * dv;
        for (int32_t t = 0; t < ex->T; t++) {
            const float *row = BUF(ex, op->in) + (size_t)t * wi;
            memcpy(q, row + (size_t)kh * dk, (size_t)dk * sizeof(float));
            memcpy(k, row + (size_t)Hk * dk + (size_t)kh * dk, (size_t)dk * sizeof(float));
            l2norm(q, dk);
            l2norm(k, dk);
            for (int32_t i = 0; i < dk; i++)
                q[i] *= qscale;
            const float *v = row + (size_t)2 * Hk * dk + (size_t)j * dv;
            float beta = sigmoid(BUF(ex, op->in2)[(size_t)t * WIDTH(ex, op->in2) + j]);
            float a = BUF(ex, op->in3)[(size_t)t * WIDTH(ex, op->in3) + j];
            float decay = expf(op->vec3[j] * softplus(a + op->vec2[j]));
            delta_step(S, BUF(ex, op->out) + (size_t)t * wo + (size_t)j * dv, q, k, v, beta, decay, dk, dv);
        }
    }
}

/* Per value head: out = out / sqrt(mean(out²) + eps) ⊙ w ⊙ silu(z), z = in. */
void gated_rmsnorm_ref(const struct plan_op *op, struct cpu_exec *ex)
{
    int32_t dv = op->v_dim, wo = WIDTH(ex, op->out), wz = WIDTH(ex, op->in);
    for (int32_t t = 0; t < ex->T; t++)
        for (int32_t j = 0; j < op->n_v_heads; j++) {
            float *o = BUF(ex, op->out) + (size_t)t * wo + (size_t)j * dv;
            const float *z = BUF(ex, op->in) + (size_t)t * wz + (size_t)j * dv;
            rmsnorm_row(o, o, op->vec, dv, op->eps);
            for (int32_t d = 0; d < dv; d++)
                o[d] *= silu(z[d]);
        }
}

/* logits = x · Eᵀ for every position (all_logits) or only the last one. */
void logits_op(const struct plan_op *op, struct cpu_exec *ex)
{
    int32_t rows = ex->all_logits ? ex->T : 1, first = ex->T - rows;
    struct cpu_matmul_args a = {
        .y = BUF(ex, op->out), .x = BUF(ex, op->in) + (size_t)first * WIDTH(ex, op->in),
        .w = op->w->data, .wtype = op->w->dtype, .T = rows, .K = op->w->ne[0], .N = op->w->ne[1],
        .ldx = WIDTH(ex, op->in), .ldy = WIDTH(ex, op->out),
        .w_row_bytes = op->w->nbytes / (size_t)op->w->ne[1], .n_threads = ex->n_threads,
    };
    cpu_matmul_pick(op->w->dtype, ex->cpu_features, NULL)->fn(&a);
}
