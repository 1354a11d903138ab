/* gdn.c - the Gated DeltaNet layer's host math (gdn.h). */
#include "gdn.h"

#include <math.h>
#include <string.h>

static float silu(float x) { return x / (1.0f + expf(-x)); }

void rm_gdn_conv(float * out, const float * x, int32_t n_tok, int64_t n_ch, int64_t stride, float * state,
                 const float * w, int32_t d_conv) {
    const int32_t hist = d_conv - 1;
    for (int32_t t = 0; t < n_tok; t++) {
        float * y = out + (int64_t) t * stride;
        for (int64_t c = 0; c < n_ch; c++) {
            const float * wc = w + c * d_conv;
            float acc = 0.0f;
            for (int32_t i = 0; i < d_conv; i++) {
                const int32_t src = t - hist + i;   /* < 0: from the state */
                const float xv = src < 0 ? state[(int64_t) (hist + src) * stride + c] : x[(int64_t) src * stride + c];
                acc += wc[i] * xv;
            }
            y[c] = silu(acc);
        }
    }
    rm_gdn_conv_keep(x, n_tok, n_ch, stride, state, hist);
}

void rm_gdn_conv_keep(const float * x, int32_t n_tok, int64_t n_ch, int64_t stride, float * state, int32_t hist) {
    /* the last hist inputs, oldest first: the state's tail, then x */
    const size_t row = sizeof(float) * (size_t) n_ch;
    for (int32_t r = 0; r < hist; r++) {
        const int32_t src = n_tok - hist + r;   /* < 0: row n_tok + r of the state */
        memmove(state + (int64_t) r * stride, src < 0 ? state + (int64_t) (n_tok + r) * stride : x + (int64_t) src * stride,
                row);
    }
}

void rm_gdn_l2norm(float * x, int64_t n_rows, int64_t stride, int64_t n, float eps, float scale) {
    for (int64_t r = 0; r < n_rows; r++) {
        float * v = x + r * stride;
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) {
            ss += (double) v[i] * v[i];
        }
        const float f = scale / sqrtf((float) ss + eps);
        for (int64_t i = 0; i < n; i++) {
            v[i] *= f;
        }
    }
}

/* ---- the delta rule's vector steps in plain loops, then the skeleton over them ---- */

static float gdn_dot(const float * a, const float * b, int32_t n) {
    float acc = 0.0f;
    for (int32_t i = 0; i < n; i++) {
        acc += a[i] * b[i];
    }
    return acc;
}

static void gdn_matvec2(const float * S, const float * k, const float * q, int32_t dk, int32_t dv, float * u, float * r) {
    memset(u, 0, sizeof(float) * (size_t) dv);
    memset(r, 0, sizeof(float) * (size_t) dv);
    for (int32_t i = 0; i < dk; i++) {
        const float * row = S + (int64_t) i * dv;
        for (int32_t j = 0; j < dv; j++) {
            u[j] += row[j] * k[i];
            r[j] += row[j] * q[i];
        }
    }
}

static void gdn_urow(int32_t n, float beta, float e, const float * v, float * u) {
    for (int32_t j = 0; j < n; j++) {
        u[j] = beta * (v[j] - e * u[j]);
    }
}

static void gdn_scale(int32_t n, float a, const float * x, float * y) {
    for (int32_t j = 0; j < n; j++) {
        y[j] = a * x[j];
    }
}

static void gdn_axpy(int32_t n, float a, const float * x, float * y) {
    for (int32_t j = 0; j < n; j++) {
        y[j] += a * x[j];
    }
}

#define GDN_RULE_NAME gdn_rule_plain
#define GDN_DOT       gdn_dot
#define GDN_MATVEC2   gdn_matvec2
#define GDN_UROW      gdn_urow
#define GDN_SCALE     gdn_scale
#define GDN_AXPY      gdn_axpy
#include "gdn_rule.h"

void rm_gdn_rule(const rm_gdn_head * h, int32_t pos, float * state, float * scratch) {
    gdn_rule_plain(h, pos, state, scratch);
}

void rm_gdn_gated_norm(float * y, const float * z, const float * w, int64_t n_rows, int64_t n, float eps,
                       int sigmoid) {
    for (int64_t r = 0; r < n_rows; r++) {
        float * v = y + r * n;
        const float * zr = z + r * n;
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) {
            ss += (double) v[i] * v[i];
        }
        const float f = 1.0f / sqrtf((float) (ss / (double) n) + eps);
        for (int64_t i = 0; i < n; i++) {
            const float gate = sigmoid ? 1.0f / (1.0f + expf(-zr[i])) : silu(zr[i]);
            v[i] = v[i] * f * w[i] * gate;
        }
    }
}
