/* gdn_x86.h - internal: the Gated DeltaNet layer's delta-rule step and causal conv in 256-bit
 * vectors (rm_gdn_recurrent_fn, rm_gdn_conv_fn of dispatch.h); their scalar twins are
 * rm_gdn_recurrent and rm_gdn_conv (cpu/gdn.c). Included by vec_dot_avx2.c and vec_dot_avx512.c,
 * so each set compiles them with its own flags. The same sums in the same order per lane as the
 * twins, with multiply-adds fused: the results agree to float rounding, not bit for bit. */
#ifndef RM_CPU_GDN_X86_H
#define RM_CPU_GDN_X86_H

#include <immintrin.h>
#include <math.h>

#include "gdn.h"

/* The recurrent form, eight value columns at a time: for each block of columns j, the decayed
 * state's rows give u = S^T k in one register, then S + k u^T and o = S^T q in a second pass.
 * d_v not a multiple of 8: the scalar twin. */
static void gdn_recurrent_x86(const rm_gdn_head * h, float * S) {
    const int32_t dk = h->d_k, dv = h->d_v;
    if (dv % 8 != 0) {
        rm_gdn_recurrent(h, S);
        return;
    }
    for (int32_t t = 0; t < h->n_tok; t++) {
        const float * q = h->q + t * h->qk_stride, * k = h->k + t * h->qk_stride, * v = h->v + t * h->v_stride;
        const __m256 decay = _mm256_set1_ps(expf(h->g[t * h->gb_stride])), beta = _mm256_set1_ps(h->beta[t * h->gb_stride]);
        float * o = h->o + t * h->o_stride;
        for (int32_t j = 0; j < dv; j += 8) {
            __m256 u = _mm256_setzero_ps();
            for (int32_t i = 0; i < dk; i++) {   /* S <- decay S; u = S^T k */
                float * row = S + (int64_t) i * dv + j;
                const __m256 r = _mm256_mul_ps(_mm256_loadu_ps(row), decay);
                _mm256_storeu_ps(row, r);
                u = _mm256_fmadd_ps(r, _mm256_set1_ps(k[i]), u);
            }
            u = _mm256_mul_ps(beta, _mm256_sub_ps(_mm256_loadu_ps(v + j), u));
            __m256 acc = _mm256_setzero_ps();
            for (int32_t i = 0; i < dk; i++) {   /* S <- S + k u^T; o = S^T q */
                float * row = S + (int64_t) i * dv + j;
                const __m256 r = _mm256_fmadd_ps(_mm256_set1_ps(k[i]), u, _mm256_loadu_ps(row));
                _mm256_storeu_ps(row, r);
                acc = _mm256_fmadd_ps(r, _mm256_set1_ps(q[i]), acc);
            }
            _mm256_storeu_ps(o + j, acc);
        }
    }
}

/* The causal conv, eight channels at a time with their taps in registers (d_conv <= 8); silu on
 * the sums as the twin computes it. Other shapes: the scalar twin. */
static void gdn_conv_x86(float * out, const float * x, int32_t n_tok, int64_t n_ch, float * state, const float * w,
                         int32_t d_conv) {
    if (n_ch % 8 != 0 || d_conv < 1 || d_conv > 8) {
        rm_gdn_conv(out, x, n_tok, n_ch, state, w, d_conv);
        return;
    }
    const int32_t hist = d_conv - 1;
    for (int64_t c = 0; c < n_ch; c += 8) {
        __m256 taps[8];
        for (int32_t i = 0; i < d_conv; i++) {
            taps[i] = _mm256_set_ps(w[(c + 7) * d_conv + i], w[(c + 6) * d_conv + i], w[(c + 5) * d_conv + i],
                                    w[(c + 4) * d_conv + i], w[(c + 3) * d_conv + i], w[(c + 2) * d_conv + i],
                                    w[(c + 1) * d_conv + i], w[c * d_conv + i]);
        }
        for (int32_t t = 0; t < n_tok; t++) {
            __m256 acc = _mm256_setzero_ps();
            for (int32_t i = 0; i < d_conv; i++) {
                const int32_t src = t - hist + i;   /* < 0: from the state */
                const float * xs = src < 0 ? state + (int64_t) (hist + src) * n_ch : x + (int64_t) src * n_ch;
                acc = _mm256_fmadd_ps(taps[i], _mm256_loadu_ps(xs + c), acc);
            }
            float * y = out + (int64_t) t * n_ch + c;
            _mm256_storeu_ps(y, acc);
            for (int l = 0; l < 8; l++) {
                y[l] = y[l] / (1.0f + expf(-y[l]));
            }
        }
    }
    rm_gdn_conv_keep(x, n_tok, n_ch, state, hist);
}

#endif
