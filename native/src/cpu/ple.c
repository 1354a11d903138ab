/* cpu/ple.c - PLE's gate and dilated conv (qwen4exp) on the CPU backend (backend.h's ple_gate and
 * ple_conv; the layer is in layers/ple.c). The gate's threads take tokens in turn; the conv's take
 * channels in turn, each running a channel over every sequence's rows, so a channel's sums are
 * made in one order whatever the step holds. */
#include <math.h>
#include <stdint.h>

#include "cpu_ops.h"

typedef struct gate_task {
    float *       out;
    const float * key, * query, * value;
    int64_t       n_tok, hc, n;
} gate_task;

static void gate_rows(void * ctx, int ith, int nth) {
    const gate_task * t = ctx;
    const float inv = 1.0f / sqrtf((float) t->n);
    for (int64_t i = ith; i < t->n_tok; i += nth) {
        const float * v = t->value + i * t->n;
        for (int64_t c = 0; c < t->hc; c++) {
            const int64_t at = (i * t->hc + c) * t->n;
            float dot = 0.0f;
            for (int64_t d = 0; d < t->n; d++) {
                dot += t->key[at + d] * t->query[at + d];
            }
            const float g = dot * inv, mag = sqrtf(fmaxf(fabsf(g), 1e-6f));
            const float gate = 1.0f / (1.0f + expf(-(g < 0.0f ? -mag : g > 0.0f ? mag : 0.0f)));
            for (int64_t d = 0; d < t->n; d++) {
                t->out[at + d] = gate * v[d];
            }
        }
    }
}

void rm_cpu_ple_gate(rm_pool * pool, float * out, const float * key, const float * query, const float * value,
                     int64_t n_tok, int64_t hc, int64_t n) {
    gate_task t = {out, key, query, value, n_tok, hc, n};
    rm_pool_run(pool, gate_rows, &t);
}

/* Channels ith, ith + nth, ...: each sequence's outputs from the state and the step's rows, then
 * the state moved on by the step's rows. */
static void conv_channels(void * ctx, int ith, int nth) {
    const rm_ple_conv_args * a = ctx;
    const int64_t W = a->width, K = a->kernel, D = a->dilation, S = (K - 1) * D;
    const float * taps = (const float *) a->conv1d->data;
    for (int64_t c = ith; c < W; c += nth) {
        const float * w = taps + c * K;
        for (int32_t r = 0; r < a->n_seqs; r++) {
            const rm_ple_conv_seq * q = &a->seqs_host[r];
            const float * x = a->x + (int64_t) q->row0 * W + c;
            float * st = q->state + c;
            for (int64_t t = 0; t < q->n; t++) {
                float sum = 0.0f;
                for (int64_t j = 0; j < K; j++) {
                    const int64_t p = t - (K - 1 - j) * D;   /* the step's row, or before it: the state's */
                    sum += w[j] * (p >= 0 ? x[p * W] : st[(S + p) * W]);
                }
                a->out[((int64_t) q->row0 + t) * W + c] += sum / (1.0f + expf(-sum));
            }
            const int64_t n = q->n;
            for (int64_t i = 0; i < S; i++) {   /* row i of the new state: position n - S + i of the step */
                const int64_t p = n - S + i;
                st[i * W] = p >= 0 ? x[p * W] : st[(i + n) * W];
            }
        }
    }
}

void rm_cpu_ple_conv(rm_pool * pool, const rm_ple_conv_args * a) {
    rm_pool_run(pool, conv_channels, (void *) a);
}
