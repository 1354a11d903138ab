/* cpu/deltanet.c - the middle of a Gated DeltaNet layer on the CPU backend (backend.h's gdn; the
 * layer's projections are in deltanet.c, the math of its steps in gdn.c). */
#include <math.h>
#include <string.h>

#include "types.h"
#include "cpu_ops.h"
#include "dispatch.h"
#include "gdn.h"

/* transformers' l2norm: x / sqrt(sum x^2 + 1e-6) */
#define GDN_L2_EPS 1e-6f

/* softplus as torch computes it (linear above 20) */
static float softplus(float x) { return x > 20.0f ? x : log1pf(expf(x)); }

/* beta = sigmoid(b), g = -exp(A_log) * softplus(a + dt_bias), per token and value head. */
static void gates(const rm_gdn_args * a) {
    const float * A = (const float *) a->a->data, * dt = (const float *) a->dt_bias->data;
    const int64_t NV = a->n_v, r = a->n_v / a->n_k;
    for (int64_t t = 0; t < a->n_tok; t++) {
        const float * ba = a->ba + t * 2 * NV;
        for (int64_t v = 0; v < NV; v++) {
            /* fused: per key head, its r b's then its r a's */
            const int64_t ib = a->fused_ba ? (v / r) * 2 * r + v % r : v, ia = a->fused_ba ? ib + r : NV + v;
            a->beta[t * NV + v] = 1.0f / (1.0f + expf(-ba[ib]));
            a->g[t * NV + v] = A[v] * softplus(ba[ia] + dt[v]);
        }
    }
}

typedef struct conv_task {
    const rm_gdn_args * a;
    const float *       w;        /* the filters as floats */
    int64_t             cd;       /* conv_dim */
} conv_task;

/* The causal conv of each sequence over this thread's slice of the channels (whole groups of eight). */
static void conv_run(void * ctx, int ith, int nth) {
    const conv_task * task = ctx;
    const rm_gdn_args * a = task->a;
    const int64_t cd = task->cd;
    int64_t lo, hi;
    rm_split((cd + 7) / 8, ith, nth, &lo, &hi);
    lo *= 8;
    hi = hi * 8 < cd ? hi * 8 : cd;
    for (int32_t r = 0; r < a->n_seqs && lo < hi; r++) {
        const rm_gdn_seq * seq = &a->seqs_host[r];
        const int64_t at = (int64_t) seq->row0 * cd + lo;
        rm_cpu_gdn_conv()(a->conv_out + at, a->mixed + at, seq->n, hi - lo, cd, seq->conv_state + lo,
                          task->w + lo * a->d_conv, a->d_conv);
    }
}

/* The delta rule of the value heads [lo, hi) of this thread's share, for each sequence in turn at
 * its own positions (a head's scratch is this thread's alone): its chunks are aligned to
 * positions, so each token's output is what the sequence alone gives it, however the step cut it;
 * then the gated norm of these heads' outputs. */
static void heads_run(void * ctx, int ith, int nth) {
    const rm_gdn_args * a = ctx;
    const int64_t nk = a->n_k, nv = a->n_v, dk = a->d_k, dv = a->d_v, kd = nk * dk, di = nv * dv, cd = 2 * kd + di;
    const int64_t chunk_floats = rm_gdn_chunk_scratch(a->d_k, a->d_v), per_head = rm_gdn_state_floats(a->d_k, a->d_v);
    int64_t lo, hi;
    rm_split(nv, ith, nth, &lo, &hi);
    for (int64_t v = lo; v < hi; v++) {
        const int64_t kh = a->tiled ? v % nk : v / (nv / nk);
        for (int32_t r = 0; r < a->n_seqs; r++) {
            const rm_gdn_seq * seq = &a->seqs_host[r];
            const float * row = a->conv_out + (int64_t) seq->row0 * cd;
            const int64_t t0 = seq->row0;
            const rm_gdn_head head = {row + kh * dk, row + kd + kh * dk, cd, row + 2 * kd + v * dv, cd,
                                      a->g + t0 * nv + v, a->beta + t0 * nv + v, nv, a->core + t0 * di + v * dv, di,
                                      seq->n, (int32_t) dk, (int32_t) dv};
            rm_cpu_gdn_rule()(&head, seq->pos, seq->ssm_state + v * per_head, a->chunk + v * chunk_floats);
        }
    }
    for (int32_t t = 0; t < a->n_tok && lo < hi; t++) {
        const int64_t at = t * di + lo * dv;
        rm_gdn_gated_norm(a->core + at, a->z + at, (const float *) a->norm->data, hi - lo, dv, a->eps,
                          a->gate_sigmoid);
    }
}

void rm_cpu_gdn(rm_pool * pool, const rm_gdn_args * a) {
    const int64_t kd = (int64_t) a->n_k * a->d_k, cd = 2 * kd + (int64_t) a->n_v * a->d_v;
    gates(a);
    /* the filters as floats (F32 in the file: as they are; F16: converted), then the convolution
     * over the states, the channels shared among the threads */
    const rm_weight * cw = a->conv1d;
    const float * filters = (const float *) cw->data;
    if (cw->type != RM_TYPE_F32 || cw->row_bytes != sizeof(float) * (uint64_t) a->d_conv) {
        const rm_type_traits * tt = rm_type_traits_get(cw->type);
        for (int64_t c = 0; c < cd; c++) {
            tt->to_float(cw->data + (uint64_t) c * cw->row_bytes, a->conv_w + c * a->d_conv, a->d_conv);
        }
        filters = a->conv_w;
    }
    conv_task ct = {a, filters, cd};
    rm_pool_run(pool, conv_run, &ct);
    for (int64_t t = 0; t < a->n_tok; t++) {   /* unit q and k per key head, q scaled by 1/sqrt(d_k) */
        float * row = a->conv_out + t * cd;
        rm_gdn_l2norm(row, a->n_k, a->d_k, a->d_k, GDN_L2_EPS, 1.0f / sqrtf((float) a->d_k));
        rm_gdn_l2norm(row + kd, a->n_k, a->d_k, a->d_k, GDN_L2_EPS, 1.0f);
    }
    rm_pool_run(pool, heads_run, (void *) a);
}
