/* cpu/norm_rope.c - the host math of RMSNorm and RoPE (backend.h), which the CPU backend's ops
 * and the ops in files of their own (cpu/qsa.c) share: a unit of its own, below them all. */
#include <math.h>

#include "backend.h"

/* The sum of squares in eight partial sums (element i in sum i mod 8, which a compiler keeps in
 * one vector register) added in a fixed order: one chain of n dependent adds took a 2048-wide row
 * about as long as the rest of the norm. */
void rm_rmsnorm(float * y, const float * x, const float * w, int64_t n, float eps) {
    double part[8] = {0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        for (int k = 0; k < 8; k++) {
            part[k] += (double) x[i + k] * x[i + k];
        }
    }
    for (int k = 0; i < n; i++, k++) {
        part[k] += (double) x[i] * x[i];
    }
    const double ss = ((part[0] + part[4]) + (part[1] + part[5])) + ((part[2] + part[6]) + (part[3] + part[7]));
    const float scale = 1.0f / sqrtf((float) (ss / (double) n) + eps);
    for (int64_t i = 0; i < n; i++) {
        y[i] = w ? x[i] * scale * w[i] : x[i] * scale;
    }
}

void rm_rope(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, float base, int neox) {
    rm_rope_div(x, n_head, head_dim, n_rot, pos, base, neox, NULL);
}

void rm_rope_div(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t pos, float base, int neox,
                 const float * div) {
    const int32_t half = n_rot / 2;
    for (int32_t i = 0; i < half; i++) {
        const float inv_freq = 1.0f / powf(base, (float) (2 * i) / (float) n_rot) / (div ? div[i] : 1.0f);
        const float angle = (float) pos * inv_freq;
        rm_rope_turn(x, n_head, head_dim, n_rot, i, cosf(angle), sinf(angle), neox);
    }
}

void rm_rope_turn(float * x, int32_t n_head, int32_t head_dim, int32_t n_rot, int32_t i, float c, float s, int neox) {
    const int32_t a = neox ? i : 2 * i, b = neox ? i + n_rot / 2 : 2 * i + 1;
    for (int32_t h = 0; h < n_head; h++) {
        float * v = x + (int64_t) h * head_dim;
        const float x0 = v[a], x1 = v[b];
        v[a] = x0 * c - x1 * s;
        v[b] = x0 * s + x1 * c;
    }
}
