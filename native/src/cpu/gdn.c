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

void rm_gdn_recurrent(const rm_gdn_head * h, float * S) {
    const int32_t dk = h->d_k, dv = h->d_v;
    float u[1024];   /* d_v <= 1024 (checked at load) */
    for (int32_t t = 0; t < h->n_tok; t++) {
        const float * q = h->q + t * h->qk_stride, * k = h->k + t * h->qk_stride, * v = h->v + t * h->v_stride;
        const float decay = expf(h->g[t * h->gb_stride]), beta = h->beta[t * h->gb_stride];
        for (int32_t j = 0; j < dv; j++) {
            u[j] = 0.0f;
        }
        for (int32_t i = 0; i < dk; i++) {   /* S <- decay S; u = S^T k */
            float * row = S + (int64_t) i * dv;
            for (int32_t j = 0; j < dv; j++) {
                row[j] *= decay;
                u[j] += row[j] * k[i];
            }
        }
        for (int32_t j = 0; j < dv; j++) {
            u[j] = beta * (v[j] - u[j]);
        }
        float * o = h->o + t * h->o_stride;
        for (int32_t j = 0; j < dv; j++) {
            o[j] = 0.0f;
        }
        for (int32_t i = 0; i < dk; i++) {   /* S <- S + k u^T; o = S^T q */
            float * row = S + (int64_t) i * dv;
            for (int32_t j = 0; j < dv; j++) {
                row[j] += k[i] * u[j];
                o[j] += row[j] * q[i];
            }
        }
    }
}

int64_t rm_gdn_chunk_scratch(int32_t d_k, int32_t d_v) {
    (void) d_k;
    const int64_t C = RM_GDN_CHUNK;
    return C                /* G: cumulative log-decay */
           + 2 * C * C      /* k.k and q.k */
           + 2 * C * d_v;   /* u, and S0^T q */
}

/* One chunk of c tokens starting at row t0. */
static void chunk(const rm_gdn_head * h, int32_t t0, int32_t c, float * S, float * scratch) {
    const int32_t dk = h->d_k, dv = h->d_v, C = RM_GDN_CHUNK;
    float * G = scratch, * KK = G + C, * QK = KK + C * C, * U = QK + C * C, * R = U + C * dv;
    const float * q0 = h->q + t0 * h->qk_stride, * k0 = h->k + t0 * h->qk_stride;
    float acc = 0.0f;
    for (int32_t t = 0; t < c; t++) {
        acc += h->g[(t0 + t) * h->gb_stride];
        G[t] = acc;
    }
    for (int32_t t = 0; t < c; t++) {   /* the lower triangles of k k^T and q k^T */
        const float * kt = k0 + t * h->qk_stride, * qt = q0 + t * h->qk_stride;
        for (int32_t s = 0; s <= t; s++) {
            const float * ks = k0 + s * h->qk_stride;
            float dkk = 0.0f, dqk = 0.0f;
            for (int32_t i = 0; i < dk; i++) {
                dkk += kt[i] * ks[i];
                dqk += qt[i] * ks[i];
            }
            KK[t * C + s] = dkk;
            QK[t * C + s] = dqk;
        }
    }
    for (int32_t t = 0; t < c; t++) {   /* U = S0^T k, R = S0^T q */
        const float * kt = k0 + t * h->qk_stride, * qt = q0 + t * h->qk_stride;
        float * ut = U + t * dv, * rt = R + t * dv;
        memset(ut, 0, sizeof(float) * (size_t) dv);
        memset(rt, 0, sizeof(float) * (size_t) dv);
        for (int32_t i = 0; i < dk; i++) {
            const float * row = S + (int64_t) i * dv;
            for (int32_t j = 0; j < dv; j++) {
                ut[j] += row[j] * kt[i];
                rt[j] += row[j] * qt[i];
            }
        }
    }
    for (int32_t t = 0; t < c; t++) {   /* forward substitution for u_t */
        const float beta = h->beta[(t0 + t) * h->gb_stride], et = expf(G[t]);
        const float * vt = h->v + (t0 + t) * h->v_stride;
        float * ut = U + t * dv;
        for (int32_t j = 0; j < dv; j++) {
            ut[j] = beta * (vt[j] - et * ut[j]);
        }
        for (int32_t s = 0; s < t; s++) {
            const float a = beta * KK[t * C + s] * expf(G[t] - G[s]);
            const float * us = U + s * dv;
            for (int32_t j = 0; j < dv; j++) {
                ut[j] -= a * us[j];
            }
        }
    }
    for (int32_t t = 0; t < c; t++) {   /* outputs */
        float * o = h->o + (t0 + t) * h->o_stride;
        const float et = expf(G[t]);
        const float * rt = R + t * dv;
        for (int32_t j = 0; j < dv; j++) {
            o[j] = et * rt[j];
        }
        for (int32_t s = 0; s <= t; s++) {
            const float a = QK[t * C + s] * expf(G[t] - G[s]);
            const float * us = U + s * dv;
            for (int32_t j = 0; j < dv; j++) {
                o[j] += a * us[j];
            }
        }
    }
    const float ec = expf(G[c - 1]);   /* the state after the chunk */
    for (int32_t i = 0; i < dk; i++) {
        float * row = S + (int64_t) i * dv;
        for (int32_t j = 0; j < dv; j++) {
            row[j] *= ec;
        }
    }
    for (int32_t s = 0; s < c; s++) {
        const float * ks = k0 + s * h->qk_stride;
        const float * us = U + s * dv;
        const float e = expf(G[c - 1] - G[s]);
        for (int32_t i = 0; i < dk; i++) {
            float * row = S + (int64_t) i * dv;
            const float a = e * ks[i];
            for (int32_t j = 0; j < dv; j++) {
                row[j] += a * us[j];
            }
        }
    }
}

void rm_gdn_chunked(const rm_gdn_head * h, float * S, float * scratch) {
    for (int32_t t0 = 0; t0 < h->n_tok; t0 += RM_GDN_CHUNK) {
        const int32_t c = h->n_tok - t0 < RM_GDN_CHUNK ? h->n_tok - t0 : RM_GDN_CHUNK;
        chunk(h, t0, c, S, scratch);
    }
}

void rm_gdn_gated_norm(float * y, const float * z, const float * w, int64_t n_rows, int64_t n, float eps) {
    for (int64_t r = 0; r < n_rows; r++) {
        float * v = y + r * n;
        const float * zr = z + r * n;
        double ss = 0.0;
        for (int64_t i = 0; i < n; i++) {
            ss += (double) v[i] * v[i];
        }
        const float f = 1.0f / sqrtf((float) (ss / (double) n) + eps);
        for (int64_t i = 0; i < n; i++) {
            v[i] = v[i] * f * w[i] * silu(zr[i]);
        }
    }
}
